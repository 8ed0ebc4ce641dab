/*
 * alloc_internal.h — the shim's one allocation helper beyond libc's.
 * Private to shim/src; not installed.
 *
 * The shim allocates with the process's own malloc (whatever the host
 * program links: glibc, jemalloc, tcmalloc...): a library must not choose
 * the allocator of the program it is linked into (see the README's
 * Dependencies). Only sluice's own programs link mimalloc.
 */
#ifndef SLUICE_SHIM_ALLOC_INTERNAL_H
#define SLUICE_SHIM_ALLOC_INTERNAL_H

#include <stdlib.h>
#include <string.h>

/* `size` zeroed bytes aligned to `align` (a power of two, a multiple of sizeof(void *)),
 * for free(); NULL when out of memory. Cache-line alignment keeps a loop's or a fleet's
 * hot atomics off the lines of whatever malloc put next to them. */
static inline void *sluice__zalloc_aligned(size_t size, size_t align)
{
    void *p = NULL;
    if (posix_memalign(&p, align, size ? size : 1) != 0)
        return NULL;
    memset(p, 0, size);
    return p;
}

#endif
