/*
 * sse.c — the server-sent-events parser (sluice/sse.h).
 *
 * Layout of the caller's buffer: the event's data at [0, data_len), one
 * byte kept free after it (the '\n' that joins the next data line, or the
 * NUL at dispatch), then the line being read. A finished `data` line's
 * value moves down to the end of the data, so an event costs no more room
 * than its data plus its longest line.
 */
#include <sluice/sse.h>

#include <string.h>

static const char sluice__sse_bom[] = "\xEF\xBB\xBF";

int sluice_sse_init(struct sluice_sse *p, const struct sluice_sse_desc *d)
{
    if (!p || !d || !d->buf || d->size < 3 || !d->on_event || d->line_max > d->size - 2)
        return SLUICE_EINVAL;
    memset(p, 0, sizeof *p);
    p->d = *d;
    SLUICE__DEFAULT(p->d.line_max, d->size - 2);
    p->first_line = true;
    p->error = "";
    return SLUICE_OK;
}

static int sluice__sse_fail(struct sluice_sse *p, const char *why)
{
    p->status = SLUICE_EIO;
    p->error = why;
    return SLUICE_EIO;
}

static char *sluice__sse_line(struct sluice_sse *p)
{
    return p->d.buf + p->data_len + 1;
}

/* The line so far is a byte-order mark that opens the stream. */
static bool sluice__sse_at_bom(const struct sluice_sse *p, size_t len)
{
    return p->first_line && p->line_len == len &&
           memcmp(p->d.buf + p->data_len + 1, sluice__sse_bom, len) == 0;
}

static int sluice__sse_dispatch(struct sluice_sse *p)
{
    int status = SLUICE_OK;
    if (p->has_data) {
        p->d.buf[p->data_len] = '\0';
        struct sluice_sse_event ev = {p->type, p->d.buf, p->data_len};
        p->events++;
        status = p->d.on_event(p->d.ctx, &ev);
    }
    p->data_len = 0;
    p->has_data = false;
    p->type[0] = '\0';
    return status;
}

/* One whole line (its end not included) is at sluice__sse_line(p). */
static int sluice__sse_end_line(struct sluice_sse *p)
{
    char *line = sluice__sse_line(p);
    size_t len = p->line_len;
    bool bom = p->first_line && len >= 3 && memcmp(line, sluice__sse_bom, 3) == 0;
    p->first_line = false;
    p->line_len = 0;
    if (p->comment) {
        p->comment = false;
        p->comments++;
        return SLUICE_OK;
    }
    if (bom) {
        line += 3;
        len -= 3;
    }
    if (len == 0)
        return sluice__sse_dispatch(p);
    const char *colon = memchr(line, ':', len);
    size_t name_len = colon ? (size_t)(colon - line) : len;
    const char *value = colon ? colon + 1 : line + len;
    size_t value_len = (size_t)(line + len - value);
    if (value_len && *value == ' ') {
        value++;
        value_len--;
    }
    if (name_len == 4 && memcmp(line, "data", 4) == 0) {
        if (p->has_data)
            p->d.buf[p->data_len++] = '\n';
        memmove(p->d.buf + p->data_len, value, value_len);
        p->data_len += value_len;
        p->has_data = true;
    } else if (name_len == 5 && memcmp(line, "event", 5) == 0) {
        if (value_len >= SLUICE_SSE_TYPE_MAX)
            return sluice__sse_fail(p, "an event type passed SLUICE_SSE_TYPE_MAX");
        memcpy(p->type, value, value_len);
        p->type[value_len] = '\0';
    }
    return SLUICE_OK;
}

/* One byte of a line. */
static int sluice__sse_byte(struct sluice_sse *p, char c)
{
    if (p->line_len == p->d.line_max)
        return sluice__sse_fail(p, "a line passed sluice_sse_desc.line_max");
    if (c == ':' && (p->line_len == 0 || sluice__sse_at_bom(p, 3)))
        p->comment = true;
    if (p->comment) { /* counted against line_max, never stored */
        p->line_len++;
        return SLUICE_OK;
    }
    /* The line, its data and the byte between them stay inside the buffer. */
    if (p->data_len + 1 + p->line_len + 1 > p->d.size)
        return sluice__sse_fail(p, "an event passed sluice_sse_desc.size (its data and the line "
                                   "being read)");
    sluice__sse_line(p)[p->line_len++] = c;
    return SLUICE_OK;
}

int sluice_sse_feed(struct sluice_sse *p, const char *data, size_t n)
{
    if (!p || (!data && n))
        return SLUICE_EINVAL;
    if (p->status != SLUICE_OK)
        return p->status;
    for (size_t i = 0; i < n; i++) {
        char c = data[i];
        int status = SLUICE_OK;
        if (c == '\n' && p->after_cr) {
            p->after_cr = false; /* the LF of a CRLF split across feeds, or not */
            continue;
        }
        p->after_cr = c == '\r';
        if (c == '\r' || c == '\n')
            status = sluice__sse_end_line(p);
        else
            status = sluice__sse_byte(p, c);
        if (status != SLUICE_OK)
            return status;
    }
    return SLUICE_OK;
}

bool sluice_sse_idle(const struct sluice_sse *p)
{
    return p && p->line_len == 0 && !p->comment && !p->has_data;
}

const char *sluice_sse_error(const struct sluice_sse *p)
{
    return p ? p->error : "sluice_sse is NULL";
}

size_t sluice_sse_events(const struct sluice_sse *p)
{
    return p ? p->events : 0;
}

size_t sluice_sse_comments(const struct sluice_sse *p)
{
    return p ? p->comments : 0;
}
