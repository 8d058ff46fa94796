/* A small HTTP/1.1 file server for the C tests of remote shards (the
 * Python tests use SeaweedFS; the C tests and the TSan stress driver run
 * without Python): GET with Range, ETag (from inode, size and mtime) and
 * If-Match, keep-alive, a thread per connection, and injected faults (503
 * SlowDown answers, connections closed without an answer) and hostile
 * modes (requests never answered, S3 listings that never end). Not a
 * production server: tests only. */
#include "tu_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 256

struct tu_http {
    char root[1024];
    int lfd, port;
    pthread_t acceptor;
    _Atomic int stop;
    _Atomic int fail503, failclose;
    _Atomic uint64_t requests;
    _Atomic int hold, held;   /* tu_http_hold: on; requests held now */
    _Atomic int stall, listing;
    _Atomic uint64_t stalled, pages, heads;
    pthread_mutex_t mu;
    pthread_t threads[MAX_CONNS];
    int fds[MAX_CONNS];
    _Atomic int ended[MAX_CONNS]; /* the slot's thread is done: reusable */
    int nthreads;
};

typedef struct conn {
    tu_http *h;
    int fd;
    int slot;
} conn;

static int send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int reply(int fd, int code, const char *status, const char *extra, const char *body,
                 int close_after)
{
    char head[1024];
    size_t bl = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Length: %zu\r\n%s%s\r\n", code, status, bl,
                     extra ? extra : "", close_after ? "Connection: close\r\n" : "");
    if (send_all(fd, head, (size_t)n) || (bl && send_all(fd, body, bl)))
        return -1;
    return 0;
}

/* A listing page of the hostile modes (tu_http_listing). */
static int serve_listing(tu_http *h, int fd, const char *query)
{
    uint64_t page = atomic_fetch_add(&h->pages, 1);
    int mode = atomic_load(&h->listing);
    char asked[128] = "";
    const char *t = strstr(query, "continuation-token=");
    if (t)
        sscanf(t + 19, "%127[^&]", asked);
    char body[8192], tok[160];
    size_t n = (size_t)snprintf(body, sizeof body,
                                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>"
                                "<ListBucketResult><IsTruncated>true</IsTruncated>");
    if (mode == TU_LIST_SAME_TOKEN)
        snprintf(tok, sizeof tok, "%s", asked[0] ? asked : "tok-0");
    else
        snprintf(tok, sizeof tok, "tok-%llu", (unsigned long long)page + 1);
    for (int k = 0; mode != TU_LIST_SAME_TOKEN && k < 10; k++)
        n += (size_t)snprintf(body + n, sizeof body - n,
                              "<Contents><Key>p/x_%012llu.npy</Key><Size>1</Size></Contents>",
                              (unsigned long long)(mode == TU_LIST_FRESH ? page * 10 + k
                                                                         : (uint64_t)k));
    n += (size_t)snprintf(body + n, sizeof body - n,
                          "<NextContinuationToken>%s</NextContinuationToken>"
                          "</ListBucketResult>", tok);
    return reply(fd, 200, "OK", "Content-Type: application/xml\r\n", body, 0);
}

/* One request on fd: 0 to go on, -1 to close. */
static int serve_one(tu_http *h, int fd, char *req)
{
    atomic_fetch_add(&h->requests, 1);
    if (atomic_load(&h->hold)) {
        /* Held until released, at most 5 s. */
        atomic_fetch_add(&h->held, 1);
        for (int i = 0; i < 5000 && atomic_load(&h->hold) && !atomic_load(&h->stop); i++) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        atomic_fetch_sub(&h->held, 1);
    }
    char method[8], path[1024];
    if (sscanf(req, "%7s %1023s", method, path) != 2)
        return -1;
    if (atomic_load(&h->stall)) {
        atomic_fetch_add(&h->stalled, 1);
        while (atomic_load(&h->stall) && !atomic_load(&h->stop))
            usleep(20000);
        return -1; /* never answered */
    }
    const char *query = strchr(path, '?');
    if (query && strstr(query, "list-type=2") && atomic_load(&h->listing) != TU_LIST_NONE)
        return serve_listing(h, fd, query);
    if (atomic_load(&h->failclose) > 0 && atomic_fetch_sub(&h->failclose, 1) > 0)
        return -1;
    if (atomic_load(&h->fail503) > 0 && atomic_fetch_sub(&h->fail503, 1) > 0) {
        reply(fd, 503, "Slow Down", "Content-Type: application/xml\r\n",
              "<?xml version=\"1.0\"?><Error><Code>SlowDown</Code><Message>Please reduce "
              "your request rate.</Message></Error>", 1);
        return -1;
    }
    char *q = strchr(path, '?');
    if (q)
        *q = 0;
    char file[2200];
    snprintf(file, sizeof file, "%s%s", h->root, path);
    int ffd = strstr(path, "..") ? -1 : open(file, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (ffd < 0 || fstat(ffd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (ffd >= 0)
            close(ffd);
        return reply(fd, 404, "Not Found", "Content-Type: application/xml\r\n",
                     "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>The "
                     "specified key does not exist.</Message></Error>", 0);
    }
    char etag[80];
    snprintf(etag, sizeof etag, "\"%llx-%llx-%llx\"", (unsigned long long)st.st_ino,
             (unsigned long long)st.st_size,
             (unsigned long long)st.st_mtim.tv_sec * 1000000000ull +
                 (unsigned long long)st.st_mtim.tv_nsec);
    uint64_t size = (uint64_t)st.st_size, a = 0, b = size ? size - 1 : 0;
    int ranged = 0;
    for (char *line = strstr(req, "\r\n"); line && line[2]; line = strstr(line + 2, "\r\n")) {
        char *l = line + 2;
        if (strncasecmp(l, "Range: bytes=", 13) == 0) {
            unsigned long long x, y;
            int k = sscanf(l + 13, "%llu-%llu", &x, &y);
            if (k >= 1) {
                ranged = 1;
                a = x;
                if (x == 0)
                    atomic_fetch_add(&h->heads, 1);
                if (k == 2 && y < b)
                    b = y;
            }
        } else if (strncasecmp(l, "If-Match: ", 10) == 0) {
            char *e = strstr(l, "\r\n");
            size_t n = e ? (size_t)(e - l - 10) : strlen(l + 10);
            if (n != strlen(etag) || strncmp(l + 10, etag, n) != 0) {
                close(ffd);
                return reply(fd, 412, "Precondition Failed", NULL, "", 0);
            }
        }
    }
    char extra[512];
    if (ranged && (a >= size)) {
        snprintf(extra, sizeof extra, "Content-Range: bytes */%" PRIu64 "\r\n", size);
        close(ffd);
        return reply(fd, 416, "Range Not Satisfiable", extra, "", 0);
    }
    uint64_t len = size ? b - a + 1 : 0;
    char head[1024];
    int n;
    if (ranged)
        n = snprintf(head, sizeof head,
                     "HTTP/1.1 206 Partial Content\r\nContent-Length: %" PRIu64
                     "\r\nContent-Range: bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64
                     "\r\nETag: %s\r\n\r\n", len, a, b, size, etag);
    else
        n = snprintf(head, sizeof head,
                     "HTTP/1.1 200 OK\r\nContent-Length: %" PRIu64 "\r\nETag: %s\r\n\r\n",
                     len, etag);
    int rc = strcmp(method, "HEAD") == 0 || send_all(fd, head, (size_t)n) ? -1 : 0;
    char buf[65536];
    for (uint64_t off = a; rc == 0 && off < a + len;) {
        size_t want = a + len - off < sizeof buf ? (size_t)(a + len - off) : sizeof buf;
        ssize_t r = pread(ffd, buf, want, (off_t)off);
        if (r <= 0 || send_all(fd, buf, (size_t)r)) {
            rc = -1;
            break;
        }
        off += (uint64_t)r;
    }
    close(ffd);
    return rc;
}

static void *conn_main(void *arg)
{
    conn c = *(conn *)arg;
    free(arg);
    char buf[16384];
    size_t have = 0;
    for (;;) {
        char *end = NULL;
        while (!(end = have ? strstr(buf, "\r\n\r\n") : NULL)) {
            if (atomic_load(&c.h->stop) || have + 1 >= sizeof buf)
                goto out;
            struct pollfd p = {c.fd, POLLIN, 0};
            int pr = poll(&p, 1, 100);
            if (pr == 0)
                continue;
            ssize_t r = recv(c.fd, buf + have, sizeof buf - 1 - have, 0);
            if (r <= 0)
                goto out;
            have += (size_t)r;
            buf[have] = 0;
        }
        size_t used = (size_t)(end - buf) + 4;
        end[2] = 0; /* the request's headers, each ending in \r\n */
        if (serve_one(c.h, c.fd, buf) != 0)
            goto out;
        memmove(buf, buf + used, have - used);
        have -= used;
        buf[have] = 0;
    }
out:
    shutdown(c.fd, SHUT_RDWR);
    atomic_store(&c.h->ended[c.slot], 1);
    return NULL;
}

static void *accept_main(void *arg)
{
    tu_http *h = arg;
    while (!atomic_load(&h->stop)) {
        struct pollfd p = {h->lfd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int fd = accept(h->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_mutex_lock(&h->mu);
        conn *c = malloc(sizeof *c);
        /* A slot: a new one, or one whose connection ended (its thread
         * joined and its socket closed), so that a long test is not cut
         * off after MAX_CONNS connections. */
        int slot = h->nthreads < MAX_CONNS ? h->nthreads : -1;
        for (int i = 0; slot < 0 && i < h->nthreads; i++) {
            int e = atomic_load(&h->ended[i]);
            if (e == 1) {
                pthread_join(h->threads[i], NULL);
                close(h->fds[i]);
            }
            if (e)
                slot = i;
        }
        if (!c || slot < 0) {
            pthread_mutex_unlock(&h->mu);
            free(c);
            close(fd);
            continue;
        }
        c->h = h;
        c->fd = fd;
        c->slot = slot;
        h->fds[slot] = fd;
        atomic_store(&h->ended[slot], 0);
        if (pthread_create(&h->threads[slot], NULL, conn_main, c) == 0) {
            if (slot == h->nthreads)
                h->nthreads++;
        } else {
            free(c);
            close(fd);
            if (slot < h->nthreads) { /* a reused slot: keep it reusable */
                h->fds[slot] = -1;
                atomic_store(&h->ended[slot], 2);
            }
        }
        pthread_mutex_unlock(&h->mu);
    }
    return NULL;
}

int tu_http_start(tu_http **out, const char *root)
{
    tu_http *h = calloc(1, sizeof *h);
    if (!h)
        return -1;
    snprintf(h->root, sizeof h->root, "%s", root);
    pthread_mutex_init(&h->mu, NULL);
    h->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (h->lfd < 0 || bind(h->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(h->lfd, 128) != 0 || getsockname(h->lfd, (struct sockaddr *)&a, &al) != 0) {
        if (h->lfd >= 0)
            close(h->lfd);
        free(h);
        return -1;
    }
    h->port = ntohs(a.sin_port);
    if (pthread_create(&h->acceptor, NULL, accept_main, h) != 0) {
        close(h->lfd);
        free(h);
        return -1;
    }
    *out = h;
    return 0;
}

int tu_http_port(const tu_http *h) { return h->port; }

void tu_http_faults(tu_http *h, int n503, int nclose)
{
    atomic_store(&h->fail503, n503);
    atomic_store(&h->failclose, nclose);
}

uint64_t tu_http_requests(tu_http *h) { return atomic_load(&h->requests); }

void tu_http_hold(tu_http *h, int on) { atomic_store(&h->hold, on); }

int tu_http_held(tu_http *h) { return atomic_load(&h->held); }

uint64_t tu_http_heads(tu_http *h) { return atomic_load(&h->heads); }

void tu_http_stall(tu_http *h, int on) { atomic_store(&h->stall, on); }

uint64_t tu_http_stalled(tu_http *h) { return atomic_load(&h->stalled); }

void tu_http_listing(tu_http *h, int mode) { atomic_store(&h->listing, mode); }

uint64_t tu_http_pages(tu_http *h) { return atomic_load(&h->pages); }

void tu_http_stop(tu_http *h)
{
    if (!h)
        return;
    atomic_store(&h->stop, 1);
    pthread_join(h->acceptor, NULL);
    for (int i = 0; i < h->nthreads; i++) {
        if (atomic_load(&h->ended[i]) != 2)
            pthread_join(h->threads[i], NULL);
        if (h->fds[i] >= 0)
            close(h->fds[i]);
    }
    close(h->lfd);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
