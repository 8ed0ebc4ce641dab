/*
 * strbuf_internal.h — a growable NUL-terminated string on malloc, what the
 * admin endpoint builds its bodies in and the state file builds a rewrite
 * in. Private to shim/src; not installed.
 *
 * Errors are sticky: once an allocation fails the buffer keeps `oom` set
 * and ignores every later append, so a writer appends unconditionally and
 * checks once at the end (sluice__strbuf_take, or `oom` itself). A
 * zeroed struct is an empty buffer; `p` is NULL until the first append and
 * is free()d by whoever ends up holding it.
 */
#ifndef SLUICE_SHIM_STRBUF_INTERNAL_H
#define SLUICE_SHIM_STRBUF_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

struct sluice__strbuf {
    char *p;    /* malloc, NUL-terminated once anything was appended; else NULL */
    size_t len; /* bytes before the NUL */
    size_t cap; /* bytes allocated at p */
    bool oom;   /* an allocation failed: the content is incomplete */
};

/* Append n bytes of s (which may hold NULs). */
void sluice__strbuf_put(struct sluice__strbuf *b, const char *s, size_t n);

/* Append the string s. */
void sluice__strbuf_puts(struct sluice__strbuf *b, const char *s);

/* Append printf-formatted text, of any length. */
void sluice__strbuf_printf(struct sluice__strbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The string, now the caller's to free(): "" (allocated) when nothing was appended, NULL
 * (what was built is freed) when an allocation failed. */
char *sluice__strbuf_take(struct sluice__strbuf *b);

#endif
