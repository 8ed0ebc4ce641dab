/*
 * The server-sent-events parser (sluice/sse.h): fragmentation never changes
 * the events, comments and multi-line data follow the standard, and every
 * bound ends the stream with SLUICE_EIO and a message instead of dropping
 * bytes.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <sluice/sse.h>

#define MAX_EVENTS 16

struct seen {
    int n;
    char type[MAX_EVENTS][SLUICE_SSE_TYPE_MAX];
    char data[MAX_EVENTS][256];
    size_t len[MAX_EVENTS];
    int stop_at; /* return SLUICE_ECANCELED from this event on (0 = never) */
};

static int on_event(void *ctx, const struct sluice_sse_event *ev)
{
    struct seen *s = ctx;
    cr_assert_lt(s->n, MAX_EVENTS);
    cr_assert_lt(ev->data_len, sizeof s->data[0]);
    cr_assert_eq(ev->data[ev->data_len], '\0', "data is NUL-terminated");
    snprintf(s->type[s->n], sizeof s->type[0], "%s", ev->type);
    memcpy(s->data[s->n], ev->data, ev->data_len + 1);
    s->len[s->n] = ev->data_len;
    s->n++;
    return s->stop_at && s->n >= s->stop_at ? SLUICE_ECANCELED : SLUICE_OK;
}

static void start(struct sluice_sse *p, struct seen *s, char *buf, size_t size, size_t line_max)
{
    memset(s, 0, sizeof *s);
    cr_assert_eq(sluice_sse_init(p, &(struct sluice_sse_desc){.buf = buf,
                                                              .size = size,
                                                              .line_max = line_max,
                                                              .on_event = on_event,
                                                              .ctx = s}),
                 SLUICE_OK);
}

/* A stream with every feature: BOM, comments, CRLF, lone CR, multi-line data, a type. */
static const char stream[] = "\xEF\xBB\xBF: OPENROUTER PROCESSING\r\n"
                             "\r\n"
                             "data: {\"a\":1}\n\n"
                             "event: error\r"
                             "data:first\r\n"
                             "data:  second\n"
                             "data\n"
                             "id: 7\nretry: 10\nunknown: x\n"
                             "\n"
                             ": keep-alive\n"
                             "data: [DONE]\r\n\r\n";

static void assert_stream_events(const struct seen *s)
{
    cr_assert_eq(s->n, 3, "three events, got %d", s->n);
    cr_assert_str_eq(s->type[0], "");
    cr_assert_str_eq(s->data[0], "{\"a\":1}");
    cr_assert_str_eq(s->type[1], "error");
    cr_assert_str_eq(s->data[1], "first\n second\n", "one leading space dropped, lines joined "
                                                   "by LF, a bare `data` adds an empty line");
    cr_assert_str_eq(s->type[2], "", "the type is reset after each event");
    cr_assert_str_eq(s->data[2], "[DONE]");
}

Test(sse, every_split_point_gives_the_same_events_as_the_whole_stream)
{
    size_t n = sizeof stream - 1;
    for (size_t cut = 0; cut <= n; cut++) {
        char buf[512];
        struct sluice_sse p;
        struct seen s;
        start(&p, &s, buf, sizeof buf, 0);
        cr_assert_eq(sluice_sse_feed(&p, stream, cut), SLUICE_OK, "cut at %zu", cut);
        cr_assert_eq(sluice_sse_feed(&p, stream + cut, n - cut), SLUICE_OK, "cut at %zu", cut);
        assert_stream_events(&s);
        cr_assert_eq(sluice_sse_comments(&p), 2, "both comments counted (cut at %zu)", cut);
        cr_assert(sluice_sse_idle(&p));
    }
}

Test(sse, one_byte_at_a_time_gives_the_same_events_as_the_whole_stream)
{
    char buf[512];
    struct sluice_sse p;
    struct seen s;
    start(&p, &s, buf, sizeof buf, 0);
    for (size_t i = 0; i < sizeof stream - 1; i++)
        cr_assert_eq(sluice_sse_feed(&p, stream + i, 1), SLUICE_OK, "byte %zu", i);
    assert_stream_events(&s);
    cr_assert_eq(sluice_sse_events(&p), 3);
}

Test(sse, a_line_past_line_max_ends_the_stream_with_eio_for_good)
{
    char buf[256];
    struct sluice_sse p;
    struct seen s;
    start(&p, &s, buf, sizeof buf, 16);
    cr_assert_eq(sluice_sse_feed(&p, "data: fits\n\n", 12), SLUICE_OK);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(sluice_sse_feed(&p, "data: 0123456789abcdef\n\n", 24), SLUICE_EIO);
    cr_assert(strstr(sluice_sse_error(&p), "line_max"), "message: %s", sluice_sse_error(&p));
    cr_assert_eq(sluice_sse_feed(&p, "data: ok\n\n", 10), SLUICE_EIO, "the error is sticky");
    cr_assert_eq(s.n, 1, "nothing after the bound is dispatched");
}

Test(sse, a_line_of_exactly_line_max_bytes_is_accepted)
{
    char buf[256];
    struct sluice_sse p;
    struct seen s;
    start(&p, &s, buf, sizeof buf, 16);
    cr_assert_eq(sluice_sse_feed(&p, "data:0123456789a\n\n", 18), SLUICE_OK); /* 16 bytes */
    cr_assert_eq(s.n, 1);
    cr_assert_str_eq(s.data[0], "0123456789a");
    cr_assert_str_eq(sluice_sse_error(&p), "");
}

Test(sse, an_event_whose_data_passes_the_buffer_ends_the_stream_with_eio)
{
    char buf[32];
    struct sluice_sse p;
    struct seen s;
    start(&p, &s, buf, sizeof buf, 0);
    const char *in = "data: 0123456789\ndata: 0123456789\ndata: 0123456789\n\n";
    cr_assert_eq(sluice_sse_feed(&p, in, strlen(in)), SLUICE_EIO);
    cr_assert(strstr(sluice_sse_error(&p), "sluice_sse_desc.size"), "message: %s",
              sluice_sse_error(&p));
    cr_assert_eq(s.n, 0);
}

Test(sse, comments_of_any_length_up_to_line_max_take_no_room)
{
    char buf[8]; /* an event of 4 data bytes at most, but a comment up to line_max */
    struct sluice_sse p;
    struct seen s;
    start(&p, &s, buf, sizeof buf, 6);
    cr_assert_eq(sluice_sse_feed(&p, ":abcde\n:\ndata:x\n\n", 17), SLUICE_OK);
    cr_assert_eq(s.n, 1);
    cr_assert_str_eq(s.data[0], "x");
    cr_assert_eq(sluice_sse_comments(&p), 2);
    cr_assert_eq(sluice_sse_feed(&p, ":abcdefg\n", 9), SLUICE_EIO, "line_max bounds comments too");
}

Test(sse, an_event_type_longer_than_the_bound_is_eio)
{
    char buf[256];
    struct sluice_sse p;
    struct seen s;
    start(&p, &s, buf, sizeof buf, 0);
    char line[SLUICE_SSE_TYPE_MAX + 16];
    snprintf(line, sizeof line, "event: %0*d\n", SLUICE_SSE_TYPE_MAX, 0);
    cr_assert_eq(sluice_sse_feed(&p, line, strlen(line)), SLUICE_EIO);
    cr_assert(strstr(sluice_sse_error(&p), "SLUICE_SSE_TYPE_MAX"));
}

Test(sse, an_event_cut_by_the_end_of_the_stream_is_never_dispatched)
{
    char buf[64];
    struct sluice_sse p;
    struct seen s;
    start(&p, &s, buf, sizeof buf, 0);
    cr_assert_eq(sluice_sse_feed(&p, "data: whole\n\ndata: cut\n", 23), SLUICE_OK);
    cr_assert_eq(s.n, 1);
    cr_assert_not(sluice_sse_idle(&p), "the parser knows an event is half read");
    cr_assert(sluice_sse_feed(&p, "\n", 1) == SLUICE_OK && s.n == 2 && sluice_sse_idle(&p));
    /* A blank line with no data line before it dispatches nothing. */
    cr_assert_eq(sluice_sse_feed(&p, "event: x\n\n\n", 11), SLUICE_OK);
    cr_assert_eq(s.n, 2);
}

Test(sse, an_empty_data_line_is_an_event_with_empty_data)
{
    char buf[64];
    struct sluice_sse p;
    struct seen s;
    start(&p, &s, buf, sizeof buf, 0);
    cr_assert_eq(sluice_sse_feed(&p, "data:\n\n", 7), SLUICE_OK);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.len[0], 0);
}

Test(sse, a_callback_error_stops_the_feed_and_is_returned)
{
    char buf[64];
    struct sluice_sse p;
    struct seen s;
    start(&p, &s, buf, sizeof buf, 0);
    s.stop_at = 1;
    cr_assert_eq(sluice_sse_feed(&p, "data: a\n\ndata: b\n\n", 18), SLUICE_ECANCELED);
    cr_assert_eq(s.n, 1, "the bytes after the event were not parsed");
}

Test(sse, init_refuses_a_description_it_cannot_honour)
{
    char buf[8];
    struct sluice_sse p;
    struct sluice_sse_desc d = {.buf = buf, .size = sizeof buf, .on_event = on_event};
    cr_assert_eq(sluice_sse_init(&p, &d), SLUICE_OK);
    d.line_max = sizeof buf - 1;
    cr_assert_eq(sluice_sse_init(&p, &d), SLUICE_EINVAL, "line_max beyond what buf holds");
    d.line_max = 0;
    d.size = 2;
    cr_assert_eq(sluice_sse_init(&p, &d), SLUICE_EINVAL);
    d.size = sizeof buf;
    d.on_event = NULL;
    cr_assert_eq(sluice_sse_init(&p, &d), SLUICE_EINVAL);
    d.on_event = on_event;
    d.buf = NULL;
    cr_assert_eq(sluice_sse_init(&p, &d), SLUICE_EINVAL);
}
