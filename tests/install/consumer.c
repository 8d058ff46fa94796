/* Builds against an installed npyload, found with find_package or
 * pkg-config, and reads a file's header through the public API. */
#include <npyload.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    npyload_loader *L;
    if (npyload_loader_create(&L) != 0)
        return 1;
    npyload_loader_destroy(L);
    if (argc > 1) {
        npyload_header h;
        char err[256];
        if (npyload_read_header(argv[1], &h, err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        printf("%s %s ndim=%d\n", npyload_version_string(), h.descr, h.ndim);
    }
    return 0;
}
