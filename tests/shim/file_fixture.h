/*
 * file_fixture.h — files as the state-file tests handle them: write bytes
 * to a path (spit), and count the temporary files a rewrite leaves in a
 * directory (a durable save leaves none). Used by tests/shim/statefile.c,
 * tests/e2e/statefile.c (through statefile_fixture.h) and
 * tests/e2e/crash_statefile.c.
 */
#ifndef SLUICE_TESTS_SHIM_FILE_FIXTURE_H
#define SLUICE_TESTS_SHIM_FILE_FIXTURE_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Write `len` bytes of `text` to `path` (created or truncated). */
static inline void spit(const char *path, const char *text, size_t len)
{
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "%s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(text, 1, len, fp), len);
    fclose(fp);
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
