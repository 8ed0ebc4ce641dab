/*
 * output.c — how sluicectl prints: text made safe for a terminal, tables with
 * columns padded to their widest cell (emoji count two columns), durations,
 * dates and JSON.
 */
#define _GNU_SOURCE
#include "sluicectl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Terminal columns of a UTF-8 string: emoji count 2, and so does a narrow symbol that
 * U+FE0F asks to show as one (⚠️, U+26A0 U+FE0F); other variation selectors and joiners
 * count 0; a byte that starts no UTF-8 sequence (a cell cut mid-character) counts 1 and
 * ends nothing. */
static int display_width(const char *s)
{
    int w = 0, last = 0; /* the columns of the last character counted */
    for (const char *p = s; *p;) {
        size_t n = sluice_utf8_len(p);
        const unsigned char *u = (const unsigned char *)p;
        uint32_t cp = n <= 1 ? u[0] : (uint32_t)(u[0] & (0x7f >> n));
        for (size_t i = 1; i < n; i++)
            cp = cp << 6 | (u[i] & 0x3f);
        p += n ? n : 1;
        if (cp == 0xfe0f && last == 1) {
            w++;
            last = 2;
        }
        if (cp == 0xfe0f || cp == 0x200d)
            continue;
        last = cp >= 0x1f300 && cp <= 0x1faff ? 2 : 1;
        w += last;
    }
    return w;
}

/*
 * Text from a state file or an endpoint, made safe to print (malloc'd, NULL when out
 * of memory): a control character a terminal would act on (C0, DEL, C1) becomes
 * \u00XX and a byte that is not UTF-8 \xXX, so an escape sequence shows instead of
 * retitling or clearing the terminal. Newlines stay where keep_newlines. In JSON text
 * the \u00XX form is the same string, so --json output means what it meant.
 */
char *text_clean(const char *s, bool keep_newlines)
{
    size_t cap = strlen(s) * 6 + 1, o = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    for (const char *p = s; *p;) {
        size_t n = sluice_utf8_len(p);
        const unsigned char *u = (const unsigned char *)p;
        bool control = n == 1 ? (u[0] < 0x20 && !(keep_newlines && u[0] == '\n')) || u[0] == 0x7f
                              : n == 2 && u[0] == 0xc2 && u[1] < 0xa0;
        if (!n)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02X", u[0]);
        else if (control)
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", n == 1 ? u[0] : u[1]);
        else {
            memcpy(out + o, p, n);
            o += n;
        }
        p += n ? n : 1;
    }
    out[o] = '\0';
    return out;
}

/* fputs(text_clean(s)). */
void put_clean(const char *s, bool keep_newlines, FILE *to)
{
    char *t = text_clean(s, keep_newlines);
    fputs(t ? t : "(out of memory)", to);
    free(t);
}

/* An endpoint's {"error", "fix"} as one clean line; returns EXIT_FAIL. */
int fail_answer(const char *err, const char *fix)
{
    char *e = text_clean(err, false), *f = text_clean(fix ? fix : "", false);
    int rc = fail("%s%s%s", e ? e : "(out of memory)", f && *f ? " — " : "", f ? f : "");
    free(e);
    free(f);
    return rc;
}

void print_cell(const char *s, int width)
{
    fputs(s, stdout);
    int pad = width - display_width(s);
    for (pad = pad > 0 ? pad : 1; pad > 0; pad--) /* a cell too wide still ends in a space */
        fputc(' ', stdout);
}

void format_left(int64_t s, char *buf, size_t size)
{
    if (s <= 0)
        snprintf(buf, size, "expired");
    else if (s >= 3600)
        snprintf(buf, size, "%" PRId64 "h %02" PRId64 "m", s / 3600, s % 3600 / 60);
    else if (s >= 60)
        snprintf(buf, size, "%" PRId64 "m %02" PRId64 "s", s / 60, s % 60);
    else
        snprintf(buf, size, "%" PRId64 "s", s);
}

void format_time(int64_t epoch_s, char *buf, size_t size)
{
    time_t t = (time_t)epoch_s;
    struct tm tm;
    if (epoch_s <= 0 || !localtime_r(&t, &tm))
        snprintf(buf, size, "-");
    else
        strftime(buf, size, "%Y-%m-%d %H:%M:%S %Z", &tm);
}

void table_add(struct table *t, const char *const *row)
{
    if (t->rows == t->cap) {
        int cap = t->cap ? t->cap * 2 : 64;
        char *(*cells)[TABLE_COLS_MAX] = realloc(t->cells, (size_t)cap * sizeof *cells);
        if (!cells) {
            t->lost = true;
            return;
        }
        t->cells = cells;
        t->cap = cap;
    }
    for (int c = 0; c < t->cols; c++)
        t->cells[t->rows][c] = text_clean(row[c] ? row[c] : "", false);
    t->rows++;
}

void table_free(struct table *t)
{
    for (int r = 0; r < t->rows; r++)
        for (int c = 0; c < t->cols; c++)
            free(t->cells[r][c]);
    free(t->cells);
    t->cells = NULL;
    t->rows = t->cap = 0;
}

/* Print and free the rows; EXIT_FAIL (after saying so) when a row could not be kept. */
int table_print(struct table *t)
{
    int width[TABLE_COLS_MAX] = {0};
    for (int r = 0; r < t->rows; r++)
        for (int c = 0; c < t->cols; c++) {
            int w = display_width(t->cells[r][c] ? t->cells[r][c] : "?");
            if (w > width[c])
                width[c] = w;
        }
    for (int r = 0; r < t->rows; r++) {
        for (int c = 0; c < t->cols; c++) {
            const char *cell = t->cells[r][c] ? t->cells[r][c] : "?";
            if (c == t->cols - 1)
                fputs(cell, stdout);
            else
                print_cell(cell, width[c] + 2);
        }
        fputc('\n', stdout);
    }
    table_free(t);
    return t->lost ? fail("out of memory: some nodes are missing from the table") : EXIT_OK;
}

void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) {
        put_clean(s, true, stdout); /* jansson leaves DEL and C1 raw */
        putchar('\n');
        free(s);
    }
}
