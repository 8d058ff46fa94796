/* The XML of S3's answers, parsed by expat: ListObjectsV2 pages (for
 * npyload_remote_list.c) and error bodies (for npyload_remote_xfer.c's
 * messages). Below both: it calls neither. */
#include "npyload_remote_impl.h"

#include <expat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void on_start(void *ud, const XML_Char *name, const XML_Char **atts)
{
    xml_state *s = ud;
    (void)atts;
    s->depth++;
    if (s->depth <= 4)
        snprintf(s->path[s->depth - 1], sizeof s->path[0], "%s", name);
    s->tlen = 0;
    s->text[0] = 0;
}

static void on_text(void *ud, const XML_Char *t, int len)
{
    xml_state *s = ud;
    size_t n = (size_t)len;
    if (s->tlen + n >= sizeof s->text)
        n = sizeof s->text - 1 - s->tlen;
    memcpy(s->text + s->tlen, t, n);
    s->tlen += n;
    s->text[s->tlen] = 0;
}

static void on_end(void *ud, const XML_Char *name)
{
    xml_state *s = ud;
    if (s->depth == 3 && strcmp(s->path[1], "Contents") == 0 && strcmp(name, "Key") == 0) {
        if (s->nkeys == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 256;
            char **k = realloc(s->keys, cap * sizeof *k);
            if (!k) {
                s->oom = 1;
                goto out;
            }
            s->keys = k;
            s->cap = cap;
        }
        if (!(s->keys[s->nkeys] = strdup(s->text)))
            s->oom = 1;
        else
            s->nkeys++;
    } else if (s->depth == 2 && strcmp(name, "IsTruncated") == 0) {
        s->truncated = strcmp(s->text, "true") == 0;
    } else if (s->depth == 2 && strcmp(name, "NextContinuationToken") == 0) {
        snprintf(s->token, sizeof s->token, "%.1023s", s->text);
    } else if (s->depth == 2 && strcmp(s->path[0], "Error") == 0 && strcmp(name, "Code") == 0) {
        snprintf(s->code, sizeof s->code, "%.95s", s->text);
    } else if (s->depth == 2 && strcmp(s->path[0], "Error") == 0 &&
               strcmp(name, "Message") == 0) {
        snprintf(s->message, sizeof s->message, "%.199s", s->text);
    }
out:
    s->depth--;
    s->tlen = 0;
    s->text[0] = 0;
}

int npyl_remote_xml_parse(xml_state *s, const char *body, size_t len)
{
    XML_Parser p = XML_ParserCreate(NULL);
    if (!p)
        return -1;
    XML_SetUserData(p, s);
    XML_SetElementHandler(p, on_start, on_end);
    XML_SetCharacterDataHandler(p, on_text);
    int ok = XML_Parse(p, body, (int)len, 1) == XML_STATUS_OK;
    XML_ParserFree(p);
    return ok ? 0 : -1;
}

void npyl_remote_xml_error(const char *body, size_t len, char *buf, size_t buflen)
{
    buf[0] = 0;
    if (!body || len == 0 || len > INT32_MAX)
        return;
    xml_state *s = calloc(1, sizeof *s);
    if (!s)
        return;
    if (npyl_remote_xml_parse(s, body, len) == 0 && s->code[0])
        snprintf(buf, buflen, "%s%s%s", s->code, s->message[0] ? ": " : "", s->message);
    free(s);
}
