/*
 * client.c — the built-in chat-completions client (sluice/client.h).
 *
 * Request bodies are built and replies parsed with jansson; the conversation
 * is a jansson array that grows by two messages per repair. The response
 * body, the reply and every copied string come from malloc.
 */
#include <sluice/client.h>

#include "curl_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLUICE__CHAT_REPAIR_DEFAULT "That answer was rejected; answer again, correctly."

struct sluice_chat {
    char *base_url, *model, *api_key, *repair_prompt, *next_repair;
    long max_tokens;
    int64_t retry_after_max_ns;
    int (*validate)(void *ctx, struct sluice_chat *chat, unsigned attempt, bool *repair);
    void *validate_ctx;
    json_t *messages;
    CURL *easy;
    struct curl_slist *headers;
    char *body; /* the last response body */
    size_t body_len, body_cap;
    bool body_truncated;
    char *reply;
    struct sluice_curl_result result;
};

static char *sluice__dup(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Overwrite a secret before its memory goes back. */
static void sluice__wipe(char *s)
{
    if (s)
        explicit_bzero(s, strlen(s));
}

/* SLUICE_OK when `s` (may be NULL) is UTF-8, as a JSON string must be (jansson's own check:
 * json_string refuses anything else); SLUICE_EINVAL when not; SLUICE_ENOMEM. */
static int sluice__chat_utf8(const char *s)
{
    if (!s)
        return SLUICE_OK;
    json_t *checked = json_string(s);
    json_t *unchecked = checked ? NULL : json_string_nocheck(s);
    int status = checked ? SLUICE_OK : unchecked ? SLUICE_EINVAL : SLUICE_ENOMEM;
    json_decref(checked);
    json_decref(unchecked);
    return status;
}

/* The first text field of `d` that is not UTF-8, named in d->error. */
static int sluice__chat_check_text(const struct sluice_chat_desc *d)
{
    const struct {
        const char *name, *value;
    } fields[] = {{"model", d->model},
                  {"system", d->system},
                  {"prompt", d->prompt},
                  {"repair_prompt", d->repair_prompt}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        int status = sluice__chat_utf8(fields[i].value);
        if (status == SLUICE_EINVAL)
            return sluice__shim_fail(d->error, d->error_size,
                                     "sluice_chat_desc.%s is not valid UTF-8 (JSON strings must "
                                     "be; convert it, e.g. with iconv)",
                                     fields[i].name);
        if (status != SLUICE_OK)
            return status;
    }
    return SLUICE_OK;
}

static int sluice__chat_add(json_t *messages, const char *role, const char *content)
{
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    return m && json_array_append_new(messages, m) == 0 ? SLUICE_OK : SLUICE_ENOMEM;
}

static size_t sluice__chat_body(char *data, size_t size, size_t n, void *ctx)
{
    struct sluice_chat *c = (struct sluice_chat *)ctx;
    size_t bytes = size * n;
    if (bytes > SLUICE_CHAT_REPLY_MAX - c->body_len) {
        /* Past the cap nothing more is kept, so nothing more is read: a short count makes
         * curl end the transfer (CURLE_WRITE_ERROR) instead of draining an endless body. */
        c->body_truncated = true;
        return 0;
    }
    if (c->body_len + bytes + 1 > c->body_cap) {
        size_t cap = c->body_cap ? c->body_cap : 4096;
        while (cap < c->body_len + bytes + 1)
            cap *= 2;
        char *grown = realloc(c->body, cap);
        if (!grown)
            return 0; /* curl fails the transfer with CURLE_WRITE_ERROR */
        c->body = grown;
        c->body_cap = cap;
    }
    memcpy(c->body + c->body_len, data, bytes);
    c->body_len += bytes;
    c->body[c->body_len] = '\0';
    return bytes;
}

void sluice_chat_destroy(struct sluice_chat *c)
{
    if (!c)
        return;
    for (struct curl_slist *h = c->headers; h; h = h->next)
        sluice__wipe(h->data);
    curl_slist_free_all(c->headers);
    if (c->easy)
        curl_easy_cleanup(c->easy);
    sluice__wipe(c->api_key);
    json_decref(c->messages);
    free(c->base_url);
    free(c->model);
    free(c->api_key);
    free(c->repair_prompt);
    free(c->next_repair);
    free(c->body);
    free(c->reply);
    free(c);
}

/* The Authorization and Content-Type headers; the key's copies are wiped on the way. */
static struct curl_slist *sluice__chat_headers(const char *api_key)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (h && api_key && *api_key) {
        size_t n = strlen("Authorization: Bearer ") + strlen(api_key) + 1;
        char *line = malloc(n);
        struct curl_slist *more = NULL;
        if (line) {
            strcpy(line, "Authorization: Bearer ");
            strcat(line, api_key);
            more = curl_slist_append(h, line);
            explicit_bzero(line, n);
            free(line);
        }
        if (!more) {
            for (struct curl_slist *p = h; p; p = p->next)
                sluice__wipe(p->data);
            curl_slist_free_all(h);
            return NULL;
        }
        h = more;
    }
    return h;
}

int sluice_chat_create(const struct sluice_chat_desc *d, struct sluice_chat **out)
{
    *out = NULL;
    if (!d)
        return SLUICE_EINVAL;
    if (d->error && d->error_size)
        d->error[0] = '\0';
    if (!d->model || !d->prompt)
        return sluice__shim_fail(d->error, d->error_size,
                                 "%s is NULL (set sluice_chat_desc.%s%s)",
                                 !d->model ? "model" : "prompt", !d->model ? "model" : "prompt",
                                 !d->model ? ", e.g. \"openai/gpt-4o-mini\"" : "");
    int checked = sluice__chat_check_text(d);
    if (checked != SLUICE_OK)
        return checked;
    struct sluice_chat *c = calloc(1, sizeof *c);
    if (!c)
        return SLUICE_ENOMEM;
    const char *key = d->api_key;
    if (!key)
        key = getenv(SLUICE_CHAT_API_KEY_ENV);
    if (!key)
        key = getenv(SLUICE_CHAT_API_KEY_ENV_OPENROUTER);
    c->base_url = sluice__dup(d->base_url);
    c->model = sluice__dup(d->model);
    c->api_key = sluice__dup(key);
    c->repair_prompt =
        sluice__dup(d->repair_prompt ? d->repair_prompt : SLUICE__CHAT_REPAIR_DEFAULT);
    c->max_tokens = d->max_tokens;
    c->retry_after_max_ns = d->retry_after_max_ns;
    c->validate = d->validate;
    c->validate_ctx = d->validate_ctx;
    c->messages = json_array();
    c->easy = curl_easy_init();
    c->headers = sluice__chat_headers(c->api_key);
    sluice__curl_result_init(&c->result);
    int status = (!c->model || !c->repair_prompt || (d->base_url && !c->base_url) ||
                  (key && !c->api_key) || !c->messages || !c->easy || !c->headers)
                     ? SLUICE_ENOMEM
                     : SLUICE_OK;
    if (status == SLUICE_OK && d->system)
        status = sluice__chat_add(c->messages, "system", d->system);
    if (status == SLUICE_OK)
        status = sluice__chat_add(c->messages, "user", d->prompt);
    if (status != SLUICE_OK) {
        sluice_chat_destroy(c);
        return status;
    }
    curl_easy_setopt(c->easy, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, sluice__chat_body);
    curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->easy, CURLOPT_ACCEPT_ENCODING, "");
    /* A Content-Length above the cap is refused before its body (CURLE_FILESIZE_EXCEEDED);
     * an unknown length (chunked, compressed) is cut in sluice__chat_body. */
    curl_easy_setopt(c->easy, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)SLUICE_CHAT_REPLY_MAX);
    *out = c;
    return SLUICE_OK;
}

int sluice_chat_set_repair(struct sluice_chat *c, const char *message)
{
    int status = sluice__chat_utf8(message);
    if (status != SLUICE_OK)
        return status;
    char *copy = NULL;
    if (message && !(copy = strdup(message)))
        return SLUICE_ENOMEM;
    free(c->next_repair);
    c->next_repair = copy;
    return SLUICE_OK;
}

const char *sluice_chat_reply(const struct sluice_chat *c)
{
    return c->reply;
}

const struct sluice_curl_result *sluice_chat_result(const struct sluice_chat *c)
{
    return &c->result;
}

/* A repair resends the conversation with the rejected reply and the repair message. */
static int sluice__chat_extend(struct sluice_chat *c)
{
    int status = sluice__chat_add(c->messages, "assistant", c->reply ? c->reply : "");
    if (status == SLUICE_OK)
        status = sluice__chat_add(c->messages, "user",
                                  c->next_repair ? c->next_repair : c->repair_prompt);
    free(c->next_repair);
    c->next_repair = NULL;
    return status;
}

/* choices[0].message.content of a 2xx body, copied into c->reply. */
static int sluice__chat_parse(struct sluice_chat *c)
{
    json_t *root = c->body ? json_loadb(c->body, c->body_len, 0, NULL) : NULL;
    json_t *content = json_object_get(
        json_object_get(json_array_get(json_object_get(root, "choices"), 0), "message"), "content");
    int status = SLUICE_EIO;
    if (json_is_string(content)) {
        free(c->reply);
        c->reply = strndup(json_string_value(content), json_string_length(content));
        status = c->reply ? SLUICE_OK : SLUICE_ENOMEM;
    }
    json_decref(root);
    return status;
}

static int sluice__chat_generate(void *ctx, struct sluice_generation *gen)
{
    struct sluice_chat *c = (struct sluice_chat *)ctx;
    if (gen->attempt > 0 && sluice__chat_extend(c) != SLUICE_OK)
        return SLUICE_ENOMEM;
    const char *base = c->base_url ? c->base_url : gen->endpoint;
    if (!base)
        return SLUICE_EINVAL;
    size_t base_len = strlen(base);
    while (base_len && base[base_len - 1] == '/')
        base_len--;
    static const char path[] = "/chat/completions";
    char *url = malloc(base_len + sizeof path);
    json_t *req = json_pack("{s:s, s:O}", "model", c->model, "messages", c->messages);
    if (req && c->max_tokens > 0)
        json_object_set_new(req, "max_tokens", json_integer(c->max_tokens));
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!url || !body) {
        free(url);
        free(body);
        return SLUICE_ENOMEM;
    }
    memcpy(url, base, base_len);
    memcpy(url + base_len, path, sizeof path);
    curl_easy_setopt(c->easy, CURLOPT_URL, url);
    curl_easy_setopt(c->easy, CURLOPT_COPYPOSTFIELDS, body);
    free(url);
    free(body);
    c->body_len = 0;
    c->body_truncated = false;
    struct sluice_curl_call call = {.easy = c->easy,
                                    .deadline = gen->deadline,
                                    .cancel = gen->cancel,
                                    .retry_after_max_ns = c->retry_after_max_ns,
                                    .write = sluice__chat_body, /* error bodies are classified */
                                    .write_data = c};
    int status = sluice_curl_transfer(&call, &c->result);
    gen->outcome = c->result.outcome;
    gen->abandoned = c->result.abandoned;
    gen->retry_after_ns = c->result.hold_ns;
    if (c->body_truncated || c->result.curl_code == CURLE_FILESIZE_EXCEEDED) {
        snprintf(c->result.error, sizeof c->result.error,
                 "the response body passed SLUICE_CHAT_REPLY_MAX (%u bytes); the transfer was "
                 "ended (ask the provider for a shorter reply, e.g. max_tokens)",
                 SLUICE_CHAT_REPLY_MAX);
        return SLUICE_EIO;
    }
    if (status != SLUICE_OK)
        return status;
    if (c->result.kind != SLUICE_CURL_SUCCESS)
        return SLUICE_EIO;
    return sluice__chat_parse(c);
}

static int sluice__chat_validate(void *ctx, unsigned attempt, bool *repair)
{
    struct sluice_chat *c = (struct sluice_chat *)ctx;
    return c->validate ? c->validate(c->validate_ctx, c, attempt, repair) : SLUICE_OK;
}

const struct sluice_run_ops sluice_chat_ops = {
    .prepare = NULL,
    .generate = sluice__chat_generate,
    .validate = sluice__chat_validate,
};
