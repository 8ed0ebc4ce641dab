/*
 * strbuf.c — the shim's growable string (strbuf_internal.h): bodies of the
 * admin endpoint's answers and the state file's rewritten text.
 */
#define _GNU_SOURCE
#include "strbuf_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first allocation: most admin bodies and state files fit in it. */
#define STRBUF_FIRST_CAP 1024

void sluice__strbuf_put(struct sluice__strbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : STRBUF_FIRST_CAP;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void sluice__strbuf_puts(struct sluice__strbuf *b, const char *s)
{
    sluice__strbuf_put(b, s, strlen(s));
}

void sluice__strbuf_printf(struct sluice__strbuf *b, const char *fmt, ...)
{
    /* Formatted on the stack when it fits (every metric line does), else on the heap. */
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        sluice__strbuf_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sluice__strbuf_put(b, big, (size_t)n);
    free(big);
}

char *sluice__strbuf_take(struct sluice__strbuf *b)
{
    if (b->oom || !b->p) {
        free(b->p);
        return b->oom ? NULL : strdup("");
    }
    return b->p;
}
