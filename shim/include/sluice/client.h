/*
 * sluice/client.h — the built-in model client: OpenAI-compatible chat
 * completions (POST {base}/chat/completions) as a sluice_run client.
 *
 * What it is: a `struct sluice_chat` holds one conversation (system
 * prompt, user prompt, the replies so far) and sluice_chat_ops is the
 * run's ops table for it, the same shape an injected client fills in, so
 * both get the same admission, permits, FIFO and discovery:
 *
 *   struct sluice_chat *chat;
 *   sluice_chat_create(&(struct sluice_chat_desc){
 *       .model = "openai/gpt-4o-mini", .prompt = "Say hi"}, &chat);
 *   struct sluice_run_result rr;
 *   sluice_run(engine, &(struct sluice_run_desc){
 *       .backend = "openrouter", .ops = &sluice_chat_ops, .ctx = chat}, &rr);
 *   puts(sluice_chat_reply(chat));
 *
 * The `openrouter` preset's endpoint is SLUICE_OPENROUTER_ENDPOINT, so with
 * SLUICE_API_KEY (or OPENROUTER_API_KEY) set this is a working, limited
 * (16 active) OpenRouter client with no other setup. The URL is the chat's
 * base_url when set, else the run's endpoint (its override, else the
 * backend's); an endpoint override keeps the backend's pool.
 *
 * Each generation is one sluice_curl_transfer inside the run's permit: the
 * response is classified by sluice_curl_classify and its outcome and
 * Retry-After become the generation's sample (a 429 backs discovery off
 * exactly as with sluice_curl_perform). Repairs: when the chat's validate
 * callback asks for one, the next generation resends the conversation with
 * the rejected reply and a repair message appended.
 *
 * Errors a generation returns (sluice_run reports them as SLUICE_ECLIENT
 * with the code in result.client_status): the transfer's status
 * (SLUICE_EIO, SLUICE_ETIMEDOUT, SLUICE_ECANCELED, SLUICE_ENOMEM), SLUICE_EIO
 * for a non-2xx answer or a 2xx body without choices[0].message.content
 * (sluice_chat_result says which), SLUICE_EINVAL when there is no URL
 * (sluice_chat_result's `error` says so). A run deadline not on
 * CLOCK_MONOTONIC never reaches the chat: sluice_run refuses it with
 * SLUICE_EINVAL itself, naming it in its result's `error`.
 * A response body longer than SLUICE_CHAT_REPLY_MAX ends the transfer as
 * soon as it passes the cap (a Content-Length above it before the body is
 * read), with SLUICE_EIO, sample IGNORE, and sluice_chat_result's `error`
 * saying so: an endless body never holds the run's permit.
 *
 * Streaming (sluice_chat_desc.stream): the request asks for
 * `"stream": true` with `"stream_options": {"include_usage": true}`, and a
 * 2xx text/event-stream answer is read as server-sent events
 * (sluice/sse.h) as it arrives: each chat.completion.chunk's
 * choices[0].delta.content goes to on_delta and is appended to the reply,
 * which sluice_chat_reply returns once the stream ended with `data: [DONE]`
 * or a finish_reason; the last chunk's `usage`, when sent, is
 * sluice_chat_usage. A non-2xx answer, or a provider that ignores "stream"
 * and answers one JSON body, is read as without streaming. Comments
 * (keep-alives such as ": OPENROUTER PROCESSING") are skipped.
 * The latency sample of a streamed generation is its time to first token:
 * from the transfer's start to the first event (comments excluded), in
 * gen->latency_ns and sluice_chat_result's latency_ns, because the whole
 * call's time measures the answer's length, not the provider's queue. A
 * non-streamed generation's sample stays the whole call.
 * An error that arrives mid-stream as an event (an `error` object, or
 * finish_reason "error", as OpenRouter, OpenAI and Anthropic send them)
 * ends the generation at once with SLUICE_EIO: sluice_curl_classify_event
 * (sluice/curl.h) gives the kind, the sample and any hold, as the error
 * response the event stands for (its code, 429 or "429", or a name such as
 * rate_limit_error), so a rate-limit event backs discovery off as a 429
 * response would; an error that names no status is SERVER_ERROR (sample
 * IGNORE). result.http_status stays the response's own (200);
 * result.error quotes the event. A stream
 * that breaks the SSE bounds (a line or event past SLUICE_CHAT_EVENT_MAX),
 * carries an event that is not JSON, or ends before [DONE] or a
 * finish_reason is SLUICE_EIO with result.error saying which (sample
 * IGNORE). The reply cap counts every byte of the stream, so an endless
 * stream ends at SLUICE_CHAT_REPLY_MAX as an endless body does. A token or
 * deadline that fires mid-stream aborts the transfer (the connection is
 * closed, so the provider sees it) like any other. A stream the client
 * stops itself (the reply cap, an SSE bound, an event it cannot read)
 * may still be generating at the provider, so it ends as a cancelled call
 * does: result.abandoned, sluice_pool_call_abandon_latency (counted in the
 * pool's cancels; the pool's linger mode decides whether its permit
 * lingers; its time to first token is discovery's sample), on either path.
 * A stream the provider ends with an error event is an ordinary end.
 *
 * The API key: from the description, else the environment variable
 * SLUICE_API_KEY, else OPENROUTER_API_KEY; sent only as the Authorization
 * header, never logged or put in an error message, and wiped from memory
 * when the chat is destroyed.
 *
 * The same chat runs on the curl loop too (sluice_chat_submit, below): the
 * request body, the response reading, the classification (headers and the
 * error body, through sluice_curl_request.write as through
 * sluice_curl_call.write) and the sample are the same code, so a 429
 * insufficient_quota is QUOTA on either path.
 *
 * Threads: one chat is one conversation: use it from one run at a time.
 * Different chats are independent. Memory comes from the process's malloc.
 */
#ifndef SLUICE_CLIENT_H
#define SLUICE_CLIENT_H

#include <sluice/curl.h>
#include <sluice/run.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SLUICE_CHAT_API_KEY_ENV "SLUICE_API_KEY"
#define SLUICE_CHAT_API_KEY_ENV_OPENROUTER "OPENROUTER_API_KEY"
#define SLUICE_CHAT_REPLY_MAX (16u << 20) /* bytes of response body read, at most */
#define SLUICE_CHAT_EVENT_MAX (1u << 20)  /* bytes of one streamed event (and of one line) */

struct sluice_chat;

/* A streamed reply's next piece of text (`len` bytes, NUL-terminated; it may hold NUL bytes
 * of its own). Runs on the thread running the generation (sluice_run's caller, or the curl
 * loop's thread with sluice_chat_submit), inside the transfer, while the call holds its
 * permit: keep it short. The text is valid during the call only. To stop the stream, fire
 * the call's cancel token (from here too); do not call other sluice_chat functions on this
 * chat from here. */
typedef void (*sluice_chat_delta_fn)(void *ctx, struct sluice_chat *chat, const char *text,
                                     size_t len);

/* Tokens the provider reported for the last generation; -1 = not reported. */
struct sluice_chat_usage {
    int64_t prompt_tokens;
    int64_t completion_tokens;
};

struct sluice_chat_desc {
    const char *base_url;      /* e.g. "https://api.openai.com/v1"; "/chat/completions" is appended
                                  (default: NULL = the run's endpoint) */
    const char *model;         /* required */
    const char *api_key;       /* (default: NULL = $SLUICE_API_KEY, else $OPENROUTER_API_KEY, else
                                  no Authorization header) */
    const char *system;        /* system message (default: none) */
    const char *prompt;        /* the user message (required) */
    long max_tokens;           /* (default: 0 = the provider's) */
    const char *repair_prompt; /* user message after a rejected reply (default: "That answer
                                  was rejected; answer again, correctly.") */
    /* Check generation `attempt`'s reply (sluice_chat_reply); as sluice_run_ops.validate
     * (default: NULL = accept every reply). */
    int (*validate)(void *ctx, struct sluice_chat *chat, unsigned attempt, bool *repair);
    void *validate_ctx;
    int64_t retry_after_max_ns; /* Retry-After clamp (default: 60 s) */
    enum sluice_curl_dialect dialect; /* the provider's rate-limit dialect (sluice/curl.h),
                                         on either path (default: AUTO = detect) */
    bool stream;                /* ask for a streamed answer (server-sent events); the first
                                   streamed answer allocates SLUICE_CHAT_EVENT_MAX bytes for
                                   the parser (after admission and the permit, kept until
                                   destroy), so a refused request pays nothing for it
                                   (default: false) */
    sluice_chat_delta_fn on_delta; /* each piece of a streamed reply (default: NULL = none) */
    void *delta_ctx;               /* passed to on_delta */
    char *error;                /* receives a message naming the field when create fails
                                   (default: NULL = no message); "" on success */
    size_t error_size;          /* bytes at error, NUL included (default: 0) */
};

/* Copies everything it needs. Returns SLUICE_OK, SLUICE_EINVAL (no model or prompt, or a
 * model, system, prompt or repair_prompt that is not UTF-8, which JSON strings must be:
 * desc->error names the field), or SLUICE_ENOMEM. */
int sluice_chat_create(const struct sluice_chat_desc *desc, struct sluice_chat **out);
void sluice_chat_destroy(struct sluice_chat *chat);

/* The run's ops table for a chat (ctx = the struct sluice_chat *). */
extern const struct sluice_run_ops sluice_chat_ops;

/* The last reply's content; NULL before the first successful generation. */
const char *sluice_chat_reply(const struct sluice_chat *chat);

/*
 * The chat's libcurl handle, for the transport options the chat client leaves alone: TLS
 * (CURLOPT_CAINFO for a provider behind a private CA, client certificates), a proxy, the
 * interface or a resolve override, timeouts. Set them after create and before the first
 * run or submit; they hold for every generation. The chat owns the rest: the URL, the
 * request body and headers, the write callback and its data, NOSIGNAL, ACCEPT_ENCODING and
 * the reply cap (MAXFILESIZE) are set by the client and must not be changed. NULL for NULL.
 */
CURL *sluice_chat_easy(struct sluice_chat *chat);

/* The last generation's transport result (HTTP status, kind, Retry-After, rate limits). */
const struct sluice_curl_result *sluice_chat_result(const struct sluice_chat *chat);

/* The last generation's `usage` (a streamed answer's last chunk, or a JSON answer's);
 * {-1, -1} before it or when the provider sent none. (Not named sluice_chat_usage: in
 * C++ a function of the struct's name hides it.) */
struct sluice_chat_usage sluice_chat_last_usage(const struct sluice_chat *chat);

/* ---- on the curl loop ---------------------------------------------------------------- */

/* A chat's completion on the loop: runs exactly once per accepted submission, on the loop
 * thread, after the last on_delta. `status` is what a sluice_run generation would have
 * returned, sluice_chat_result(chat) the transport result behind it (its `error` says why
 * when sluice or the chat client ended the call). Statuses, and no other: SLUICE_OK (the
 * reply is in sluice_chat_reply), SLUICE_EIO (a non-2xx answer, a bad or cut body or stream,
 * a transfer failure), SLUICE_ETIMEDOUT, SLUICE_ECANCELED, SLUICE_ECLOSED (the loop shut
 * down first), SLUICE_EINVAL (a deadline not normalised or not CLOCK_MONOTONIC), or
 * SLUICE_ENOMEM. The chat is the caller's again from here: it may be destroyed or submitted
 * again inside this call. */
typedef void (*sluice_chat_done_fn)(struct sluice_chat *chat, int status, void *data);

/* One chat generation submitted to a curl loop. Read during submit only, except as marked. */
struct sluice_chat_request {
    const char *backend;             /* backend ID (default: NULL = endpoint-only, unlimited) */
    const char *endpoint;            /* endpoint override; keeps the backend's pool (default:
                                        NULL = the backend's endpoint; the chat's base_url wins
                                        over either) */
    const struct timespec *deadline; /* whole call, queueing included; its value is copied
                                        (default: none) */
    const struct timespec *start_deadline; /* the first token (the answer's first byte) must
                                        have come by then, queueing included: what a streaming
                                        server bounds; its value is copied (default: none;
                                        see sluice_curl_call.start_deadline) */
    struct sluice_cancel *cancel;    /* kept: must outlive the request (default: none) */
    sluice_chat_done_fn done;        /* required */
    void *data;                      /* passed to done and cut */
    /* Answer at the deadline, read on (default: NULL = a generation still running at `deadline`
     * is cut there, and its permit lingers as the pool decides): as sluice_curl_request.cut.
     * Where the pool would keep the permit anyway, cut(chat, SLUICE_ETIMEDOUT, data) runs at
     * the deadline, with sluice_chat_result saying so (expired SLUICE_EXPIRED_CALL); the rest
     * of the answer is read and dropped (no delta follows, the reply stays as it was at the
     * cut) and the call ends when the provider ends it, its permit coming back then. `done`
     * follows, with how the transfer ended (SLUICE_OK: the provider finished it); the chat is
     * the loop's until then, and sluice_chat_result still says what cut said. */
    sluice_chat_done_fn cut;
};

/*
 * One generation of `chat` through the loop (sluice/curl.h), from any thread: the same
 * admission, permits, FIFO, deadline and cancel rules as sluice_curl_loop_submit, and the
 * same request body, streaming, response reading and discovery sample as a sluice_run
 * generation (one code path: a streamed call's sample is its time to first token, a 429
 * event mid-stream an overload). on_delta and `done` run on the loop thread. The chat is
 * the loop's until `done` runs: do not touch it meanwhile, nor submit it twice. Repairs
 * (the description's validate) are sluice_run's: here the caller reads the reply in `done`
 * and submits again (with sluice_chat_set_repair's message, as a new run) if it must.
 * Returns SLUICE_OK (then `done` runs exactly once) or, with `done` never called, as
 * sluice_curl_loop_submit: SLUICE_ECAPACITY, SLUICE_ELATE, SLUICE_EAGAIN, SLUICE_ECLOSED,
 * SLUICE_EINVAL (also for a backend the engine does not have, or no URL:
 * sluice_chat_result's `error` names which and what to set), or
 * SLUICE_ENOMEM (the request body could not be built). Refused, sluice_chat_result's
 * `status` is that code, never the previous generation's (with SLUICE_ELATE its `expired`
 * and `error` say which deadline the predicted wait leaves too little of).
 */
int sluice_chat_submit(struct sluice_curl_loop *loop, struct sluice_chat *chat,
                       const struct sluice_chat_request *req, uint64_t *id);

/* The repair message for the next repair only (copied); NULL = the description's.
 * Returns SLUICE_OK, SLUICE_EINVAL (message is not UTF-8; the chat is unchanged), or
 * SLUICE_ENOMEM. */
int sluice_chat_set_repair(struct sluice_chat *chat, const char *message);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_CLIENT_H */
