#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fopencookie */
#endif
#include <criterion/criterion.h>
#include <sluice/events.h>

#include <stdlib.h>

static struct sluice_event make_event(uint32_t old_limit, uint32_t new_limit)
{
    struct sluice_event ev;
    memset(&ev, 0, sizeof ev);
    ev.t_ns = 1000 * old_limit;
    ev.wall_ms = 1700000000000;
    ev.kind = SLUICE_EVENT_PROBE;
    ev.cause = SLUICE_CAUSE_ADDITIVE;
    ev.old_limit = old_limit;
    ev.new_limit = new_limit;
    ev.in_flight = old_limit;
    return ev;
}

Test(events, ring_drops_the_oldest_and_never_blocks_the_writer)
{
    struct sluice_event_slot slots[8];
    struct sluice_event_ring ring;
    cr_assert_eq(sluice_event_ring_init(&ring, slots, 8, "cloud:x"), SLUICE_OK);
    /* Nobody reads: the writer still pushes 20 events without waiting. */
    for (uint32_t i = 1; i <= 20; i++) {
        struct sluice_event ev = make_event(i, i + 1);
        cr_assert_eq(sluice_event_ring_push(&ring, &ev), i);
    }
    cr_assert_eq(sluice_event_ring_count(&ring), 20);
    struct sluice_event out[32];
    uint64_t cursor = 0, dropped = 0;
    size_t n = sluice_event_ring_read(&ring, &cursor, out, 32, &dropped);
    cr_assert_eq(n, 8, "the ring keeps its capacity's worth");
    cr_assert_eq(dropped, 12, "the 12 oldest were dropped");
    for (size_t i = 0; i < n; i++) {
        cr_expect_eq(out[i].seq, 13 + i, "oldest first");
        cr_expect_eq(out[i].old_limit, 13 + i);
        cr_assert_str_eq(out[i].node, "cloud:x");
    }
    cr_assert_eq(cursor, 20);
    cr_assert_eq(sluice_event_ring_read(&ring, &cursor, out, 32, &dropped), 0, "caught up");
    struct sluice_event last;
    cr_assert(sluice_event_ring_last(&ring, &last));
    cr_assert_eq(last.seq, 20);
    cr_assert_eq(last.new_limit, 21);
}

Test(events, reader_resumes_from_its_cursor_in_small_batches)
{
    struct sluice_event_slot slots[16];
    struct sluice_event_ring ring;
    sluice_event_ring_init(&ring, slots, 16, "n");
    for (uint32_t i = 1; i <= 10; i++) {
        struct sluice_event ev = make_event(i, i);
        sluice_event_ring_push(&ring, &ev);
    }
    struct sluice_event out[3];
    uint64_t cursor = 0, dropped = 0, seen = 0;
    size_t n;
    while ((n = sluice_event_ring_read(&ring, &cursor, out, 3, &dropped)) > 0)
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(out[i].seq, ++seen);
    cr_assert_eq(seen, 10);
    cr_assert_eq(dropped, 0);
}

Test(events, ring_rejects_a_capacity_that_is_not_a_power_of_two)
{
    struct sluice_event_slot slots[6];
    struct sluice_event_ring ring;
    cr_assert_eq(sluice_event_ring_init(&ring, slots, 6, "n"), SLUICE_EINVAL);
}

Test(events, json_line_has_every_field_and_one_newline)
{
    struct sluice_event ev = make_event(52, 46);
    ev.seq = 7;
    ev.node = "cloud:default_ollama";
    ev.kind = SLUICE_EVENT_BACKOFF;
    ev.cause = SLUICE_CAUSE_RETRY_AFTER;
    ev.in_flight = 50;
    ev.ceiling = 52;
    char buf[512];
    size_t n = sluice_event_format_json(&ev, buf, sizeof buf);
    cr_assert_eq(n, strlen(buf));
    cr_assert_str_eq(buf, "{\"seq\":7,\"t_ns\":52000,\"wall_ms\":1700000000000,"
                          "\"node\":\"cloud:default_ollama\",\"event\":\"backoff\","
                          "\"reason\":\"retry_after\","
                          "\"why\":\"an overload that carried Retry-After\","
                          "\"old_limit\":52,\"new_limit\":46,"
                          "\"in_flight\":50,\"ceiling\":52}\n");
}

Test(events, json_escapes_quotes_backslashes_controls_and_bad_utf8)
{
    struct sluice_event ev = make_event(1, 2);
    /* quote, backslash, newline, tab, 0x01, DEL, valid UTF-8 (é, 🔒), a lone
     * continuation byte, a truncated 3-byte sequence and an overlong '/' */
    ev.node = "a\"b\\c\nd\te\x01" "f\x7f" "\xc3\xa9\xf0\x9f\x94\x92" "\x80" "\xe2\x82" "\xc0\xaf";
    char buf[512];
    sluice_event_format_json(&ev, buf, sizeof buf);
    const char *want = "\"node\":\"a\\\"b\\\\c\\nd\\te\\u0001f\\u007f\xc3\xa9\xf0\x9f\x94\x92"
                       "\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\",";
    cr_assert_not_null(strstr(buf, want), "got %s", buf);
    /* Nothing below 0x20 survives unescaped: the record stays one line. */
    for (const char *p = buf; *p; p++)
        cr_assert(*p == '\n' ? p[1] == '\0' : (unsigned char)*p >= 0x20);
}

Test(events, json_into_a_short_buffer_truncates_like_snprintf)
{
    struct sluice_event ev = make_event(3, 4);
    ev.node = "node";
    char full[512], small[16];
    size_t need = sluice_event_format_json(&ev, full, sizeof full);
    memset(small, 'x', sizeof small);
    size_t got = sluice_event_format_json(&ev, small, sizeof small);
    cr_assert_eq(got, need, "returns the full length");
    cr_assert_eq(strlen(small), sizeof small - 1, "terminated inside the buffer");
    cr_assert_eq(strncmp(small, full, sizeof small - 1), 0);
    cr_assert_eq(sluice_event_format_json(&ev, NULL, 0), need, "size 0 only measures");
}

Test(events, ring_writes_json_lines_to_a_file)
{
    struct sluice_event_slot slots[4];
    struct sluice_event_ring ring;
    sluice_event_ring_init(&ring, slots, 4, "cloud:\"q\"");
    for (uint32_t i = 1; i <= 3; i++) {
        struct sluice_event ev = make_event(i, i + 1);
        sluice_event_ring_push(&ring, &ev);
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    uint64_t cursor = 1;
    cr_assert_eq(sluice_event_ring_write_json(f, &ring, &cursor), 2);
    fclose(f);
    int lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    cr_assert_eq(lines, 2);
    cr_assert(strncmp(text, "{\"seq\":2,", 9) == 0, "starts after the cursor: %s", text);
    cr_assert_not_null(strstr(text, "\"node\":\"cloud:\\\"q\\\"\""));
    cr_assert_eq(cursor, 3);
    free(text);
}

/* A FILE whose every write pushes another event: a writer that never stops. */
struct chasing_file {
    struct sluice_event_ring *ring;
    uint64_t pushed;
};

static ssize_t push_on_write(void *cookie, const char *buf, size_t size)
{
    (void)buf;
    struct chasing_file *c = (struct chasing_file *)cookie;
    struct sluice_event ev = make_event(1, 2);
    sluice_event_ring_push(c->ring, &ev);
    c->pushed++;
    return (ssize_t)size;
}

Test(events, write_json_stops_at_the_events_present_when_it_started, .timeout = 10)
{
    struct sluice_event_slot slots[8];
    struct sluice_event_ring ring;
    sluice_event_ring_init(&ring, slots, 8, "n");
    for (uint32_t i = 1; i <= 5; i++) {
        struct sluice_event ev = make_event(i, i);
        sluice_event_ring_push(&ring, &ev);
    }
    struct chasing_file chase = {&ring, 0};
    cookie_io_functions_t io = {NULL, push_on_write, NULL, NULL};
    FILE *f = fopencookie(&chase, "w", io);
    cr_assert_not_null(f);
    setvbuf(f, NULL, _IONBF, 0); /* every record reaches push_on_write at once */
    uint64_t cursor = 0;
    cr_assert_eq(sluice_event_ring_write_json(f, &ring, &cursor), 5);
    cr_assert_eq(cursor, 5, "the cursor stops where the ring stood at the start");
    cr_assert_gt(chase.pushed, 0, "the writer kept pushing meanwhile");
    cr_assert_eq(sluice_event_ring_count(&ring), 5 + chase.pushed);
    fclose(f);
}

Test(events, kind_and_cause_names_are_stable)
{
    cr_assert_str_eq(sluice_event_kind_name(SLUICE_EVENT_PROBE), "probe");
    cr_assert_str_eq(sluice_event_kind_name(SLUICE_EVENT_BACKOFF), "backoff");
    cr_assert_str_eq(sluice_event_kind_name(SLUICE_EVENT_RECOVERY), "recovery");
    cr_assert_str_eq(sluice_event_kind_name(SLUICE_EVENT_LOCK), "lock");
    cr_assert_str_eq(sluice_event_kind_name(SLUICE_EVENT_EXPIRY), "expiry");
    cr_assert_str_eq(sluice_event_kind_name(SLUICE_EVENT_RESTORE), "restore");
    cr_assert_str_eq(sluice_event_kind_name(SLUICE_EVENT_CLEAR), "clear");
    cr_assert_str_eq(sluice_event_kind_name(SLUICE_EVENT_STORE), "store");
    cr_assert_str_eq(sluice_cause_name(SLUICE_CAUSE_LATENCY), "latency");
    cr_assert_str_eq(sluice_cause_name(SLUICE_CAUSE_OVERLOAD), "overload");
    cr_assert_str_eq(sluice_cause_name(SLUICE_CAUSE_STORE_ERROR), "store_error");
    cr_assert_str_eq(sluice_cause_name(SLUICE_CAUSE_INVALID_RECORD), "invalid_record");
    cr_assert_str_eq(sluice_cause_name(SLUICE_CAUSE_EXPIRY_CAPPED), "expiry_capped");
}

#include <pthread.h>

#include "common.h"

/* The README's table of causes (between its causes markers) has a row for every cause,
 * saying what sluice_cause_text says, and none for a cause that does not exist: a new cause
 * cannot reach the page unexplained, nor the README drift from the events' "why". */
Test(events, every_cause_is_in_the_readme_table)
{
    char *table = test_source_part("README.md", "<!-- causes", "<!-- end of causes -->");
    bool rows[SLUICE_CAUSE_COUNT] = {false};
    int n_rows = 0;
    for (char *row = strstr(table, "\n| `"); row; row = strstr(row + 1, "\n| `")) {
        char name[32], text[256];
        cr_assert_eq(sscanf(row, "\n| `%31[a-z_]` | %255[^|\n]", name, text), 2,
                     "README.md: a causes row: %.40s", row + 1);
        for (size_t len = strlen(text); len && text[len - 1] == ' ';)
            text[--len] = '\0';
        int c = 0;
        while (c < SLUICE_CAUSE_COUNT && strcmp(sluice_cause_name((enum sluice_cause)c), name))
            c++;
        cr_expect_lt(c, SLUICE_CAUSE_COUNT, "README.md's causes table names `%s`, no cause", name);
        if (c < SLUICE_CAUSE_COUNT) {
            rows[c] = true;
            cr_expect_str_eq(text, sluice_cause_text((enum sluice_cause)c),
                             "README.md's row for `%s` says what sluice_cause_text does", name);
        }
        n_rows++;
    }
    for (int c = 0; c < SLUICE_CAUSE_COUNT; c++)
        cr_expect(rows[c], "README.md's causes table has no row for `%s`",
                  sluice_cause_name((enum sluice_cause)c));
    cr_expect_eq(n_rows, SLUICE_CAUSE_COUNT, "one row per cause");
}

/* SLUICE_EVENT_JSON_MAX holds the longest line: every cause and kind, the largest numbers,
 * and a node id of SLUICE_NODE_ID_MAX-1 control bytes (each escaped as \u00XX). */
Test(events, every_event_line_fits_sluice_event_json_max)
{
    char node[SLUICE_NODE_ID_MAX];
    memset(node, 0x01, sizeof node - 1);
    node[sizeof node - 1] = '\0';
    struct sluice_event ev = {.seq = UINT64_MAX, .t_ns = INT64_MIN, .wall_ms = INT64_MIN,
                              .node = node, .old_limit = UINT32_MAX, .new_limit = UINT32_MAX,
                              .in_flight = UINT32_MAX, .ceiling = UINT32_MAX};
    for (int k = 0; k <= SLUICE_EVENT_HINT; k++)
        for (int c = 0; c < SLUICE_CAUSE_COUNT; c++) {
            ev.kind = (enum sluice_event_kind)k;
            ev.cause = (enum sluice_cause)c;
            size_t n = sluice_event_format_json(&ev, NULL, 0);
            cr_expect_lt(n, SLUICE_EVENT_JSON_MAX, "%s %s: %zu bytes",
                         sluice_event_kind_name(ev.kind), sluice_cause_name(ev.cause), n);
        }
}

/* Events whose fields are all functions of seq, so a torn copy would show. */
static struct sluice_event stamped_event(uint64_t seq)
{
    struct sluice_event ev = make_event((uint32_t)seq, (uint32_t)(seq * 3));
    ev.t_ns = (int64_t)seq * 7;
    ev.in_flight = (uint32_t)(seq % 1000);
    ev.ceiling = (uint32_t)(seq ^ 0x5a5a);
    return ev;
}

struct ring_reader {
    struct sluice_event_ring *ring;
    _Atomic(bool) *done;
    uint64_t read, torn;
};

static void *read_ring(void *arg)
{
    struct ring_reader *r = (struct ring_reader *)arg;
    struct sluice_event out[8];
    uint64_t cursor = 0, dropped = 0;
    for (;;) {
        bool finished = atomic_load(r->done);
        size_t n = sluice_event_ring_read(r->ring, &cursor, out, 8, &dropped);
        for (size_t i = 0; i < n; i++) {
            struct sluice_event want = stamped_event(out[i].seq);
            r->torn += out[i].old_limit != want.old_limit || out[i].new_limit != want.new_limit ||
                       out[i].t_ns != want.t_ns || out[i].in_flight != want.in_flight ||
                       out[i].ceiling != want.ceiling;
        }
        r->read += n;
        if (finished && n == 0)
            return NULL;
    }
}

Test(events, concurrent_readers_never_see_a_torn_event)
{
    struct sluice_event_slot slots[16];
    struct sluice_event_ring ring;
    sluice_event_ring_init(&ring, slots, 16, "n");
    _Atomic(bool) done = false;
    struct ring_reader readers[2] = {{&ring, &done, 0, 0}, {&ring, &done, 0, 0}};
    pthread_t tids[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&tids[i], NULL, read_ring, &readers[i]);
    uint64_t total = SCALED(200000);
    for (uint64_t seq = 1; seq <= total; seq++) {
        struct sluice_event ev = stamped_event(seq);
        sluice_event_ring_push(&ring, &ev);
    }
    atomic_store(&done, true);
    for (int i = 0; i < 2; i++) {
        pthread_join(tids[i], NULL);
        cr_expect_eq(readers[i].torn, 0, "reader %d copied %" PRIu64 " torn events", i,
                     readers[i].torn);
        cr_assert_gt(readers[i].read, 0);
    }
}
