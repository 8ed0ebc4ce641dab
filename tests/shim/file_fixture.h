/*
 * file_fixture.h — files as the state-file tests handle them: write bytes
 * to a path (spit), read them back (slurp), and count the temporary files
 * a rewrite leaves in a directory (a durable save leaves none). Used by
 * tests/shim/statefile.c, tests/e2e/statefile.c (through
 * statefile_fixture.h), tests/e2e/crash_statefile.c and tests/e2e/sluicectl.c.
 */
#ifndef SLUICE_TESTS_SHIM_FILE_FIXTURE_H
#define SLUICE_TESTS_SHIM_FILE_FIXTURE_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Write `len` bytes of `text` to `path` (created or truncated). */
static inline void spit(const char *path, const char *text, size_t len)
{
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "%s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(text, 1, len, fp), len);
    fclose(fp);
}

/* The file's bytes (up to 1 MiB) as a NUL-terminated string to free, and their count in
 * *len (NULL: not wanted); NULL where the file cannot be opened. */
static inline char *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (len)
        *len = 0;
    if (!fp)
        return NULL;
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, fp);
    fclose(fp);
    if (len)
        *len = n;
    return buf;
}

/* Files in `d` whose name holds ".tmp." (a rewrite's temporary file). */
static inline int count_tmp_files(const char *d)
{
    DIR *dp = opendir(d);
    int n = 0;
    for (struct dirent *e; dp && (e = readdir(dp));)
        n += strstr(e->d_name, ".tmp.") != NULL;
    if (dp)
        closedir(dp);
    return n;
}

#endif
