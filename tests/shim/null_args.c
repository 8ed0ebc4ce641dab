/*
 * A first integrator's slips: every public shim function that takes a
 * pointer answers a NULL one with SLUICE_EINVAL (a message in the
 * description's error buffer where it has one), or a NULL / zero / empty
 * answer for a getter, or nothing for a destroy or close: never a crash.
 * Each test is one header's functions; Criterion runs each in its own
 * process, so the first crash names the family. (The fleet's are in
 * fleet_null_args.c, built only with hiredis.)
 */
#include <criterion/criterion.h>
#include <string.h>

#include <sluice/admin.h>
#include <sluice/client.h>
#include <sluice/curl.h>
#include <sluice/sse.h>
#include <sluice/statefile.h>

#include "common.h"

/* desc->error names the argument when `out` is NULL. */
#define EXPECT_OUT_NAMED(err) cr_expect(strstr(err, "out is NULL"), "message: \"%s\"", err)

/* An engine with only the built-in backend, for the descriptions that need one. */
static struct sluice_engine *plain_engine(void)
{
    struct sluice_engine *e;
    cr_assert_eq(sluice_engine_create(&(struct sluice_engine_desc){0}, &e), SLUICE_OK);
    return e;
}

Test(null_args, curl_transport_and_classification)
{
    struct sluice_curl_result res;
    enum sluice_curl_dialect dialect;
    cr_expect_eq(sluice_curl_dialect_parse("openai", NULL), SLUICE_EINVAL);
    cr_expect_eq(sluice_curl_dialect_parse(NULL, &dialect), SLUICE_EINVAL);
    /* "Any input is safe": no response classifies as an empty one, and out may be NULL. */
    enum sluice_curl_kind empty = sluice_curl_classify(&(struct sluice_curl_response){0}, &res);
    cr_expect_eq(sluice_curl_classify(NULL, &res), empty);
    cr_expect_eq(sluice_curl_classify(&(struct sluice_curl_response){0}, NULL), empty);
    cr_expect_eq(sluice_curl_stated_rate(NULL), 0);
    cr_expect_eq(sluice_curl_transfer(NULL, NULL), SLUICE_EINVAL);
    cr_expect_eq(sluice_curl_transfer(NULL, &res), SLUICE_EINVAL);
    cr_expect_eq(sluice_curl_perform(NULL, "x", NULL, NULL, NULL, &res), SLUICE_EINVAL);
    cr_expect_eq(sluice_curl_perform_call(NULL, NULL, NULL), SLUICE_EINVAL);
}

Test(null_args, curl_loop)
{
    struct sluice_engine *e = plain_engine();
    char err[128] = "untouched";
    struct sluice_curl_loop *loop = (struct sluice_curl_loop *)1;
    cr_expect_eq(sluice_curl_loop_create(NULL, &loop), SLUICE_EINVAL);
    cr_expect_null(loop);
    cr_expect_eq(sluice_curl_loop_create(&(struct sluice_curl_loop_desc){.engine = e, .error = err,
                                                                         .error_size = sizeof err},
                                         NULL),
                 SLUICE_EINVAL);
    EXPECT_OUT_NAMED(err);
    cr_expect_eq(sluice_curl_loop_submit(NULL, NULL, NULL), SLUICE_EINVAL);
    cr_expect_eq(sluice_curl_loop_cancel(NULL, 1), SLUICE_EINVAL);
    cr_expect_eq(sluice_curl_loop_action(NULL, CURL_SOCKET_TIMEOUT, 0), SLUICE_EINVAL);
    cr_expect_eq(sluice_curl_loop_stats(NULL).live, 0);
    cr_expect_null(sluice_curl_loop_engine(NULL));
    sluice_curl_loop_close(NULL);
    sluice_curl_loop_destroy(NULL);
    sluice_engine_destroy(e);
}

Test(null_args, chat_client)
{
    char err[128] = "untouched";
    struct sluice_chat *chat = (struct sluice_chat *)1;
    cr_expect_eq(sluice_chat_create(NULL, &chat), SLUICE_EINVAL);
    cr_expect_null(chat);
    cr_expect_eq(sluice_chat_create(&(struct sluice_chat_desc){.model = "m", .prompt = "p",
                                                               .error = err,
                                                               .error_size = sizeof err},
                                    NULL),
                 SLUICE_EINVAL);
    EXPECT_OUT_NAMED(err);
    cr_expect_null(sluice_chat_reply(NULL));
    cr_expect_null(sluice_chat_result(NULL));
    cr_expect_eq(sluice_chat_last_usage(NULL).prompt_tokens, -1, "none known, as client.h says");
    cr_expect_eq(sluice_chat_last_usage(NULL).completion_tokens, -1);
    cr_expect_eq(sluice_chat_set_repair(NULL, "fix it"), SLUICE_EINVAL);
    cr_expect_eq(sluice_chat_submit(NULL, NULL, NULL, NULL), SLUICE_EINVAL);
    sluice_chat_destroy(NULL);
}

Test(null_args, state_file)
{
    char err[128] = "untouched", buf[64] = "untouched";
    struct sluice_lock_record rec = {0};
    cr_expect_eq(sluice_statefile_open(&(struct sluice_statefile_desc){.path = "/nonexistent/x.json",
                                                                       .error = err,
                                                                       .error_size = sizeof err},
                                       NULL),
                 SLUICE_EINVAL);
    EXPECT_OUT_NAMED(err);
    cr_expect_null(sluice_statefile_path(NULL));
    cr_expect_eq(sluice_statefile_last_error(NULL, buf, sizeof buf), 0);
    cr_expect_str_eq(buf, "");
    cr_expect_eq(sluice_statefile_default_path(NULL, 10), SLUICE_EINVAL);
    cr_expect_eq(sluice_statefile_load(NULL, "x", &rec), SLUICE_EINVAL);
    cr_expect_eq(sluice_statefile_save(NULL, "x", &rec), SLUICE_EINVAL);
    cr_expect_eq(sluice_statefile_clear(NULL, "x"), SLUICE_EINVAL);
    cr_expect_eq(sluice_statefile_sync(NULL, "x"), SLUICE_EINVAL);
    cr_expect_eq(sluice_statefile_foreach(NULL, NULL, NULL), SLUICE_EINVAL);
    /* No callbacks, so an engine refuses them and says why, instead of crashing later. */
    struct sluice_store_ops ops = sluice_statefile_ops(NULL);
    cr_expect(!ops.load && !ops.save && !ops.clear);
    sluice_statefile_close(NULL);
}

Test(null_args, admin_endpoint)
{
    struct sluice_engine *e = plain_engine();
    char err[128] = "untouched";
    struct sluice_admin *a = (struct sluice_admin *)1;
    cr_expect_eq(sluice_admin_start(NULL, &a), SLUICE_EINVAL);
    cr_expect_null(a);
    cr_expect_eq(sluice_admin_start(&(struct sluice_admin_desc){.engine = e, .error = err,
                                                                .error_size = sizeof err},
                                    NULL),
                 SLUICE_EINVAL);
    EXPECT_OUT_NAMED(err);
    cr_expect_eq(sluice_admin_port(NULL), 0);
    cr_expect_null(sluice_admin_status_json(NULL));
    cr_expect_null(sluice_admin_metrics(NULL));
    sluice_admin_stop(NULL);
    sluice_engine_destroy(e);
}

Test(null_args, sse_parser)
{
    struct sluice_sse sse;
    cr_expect_eq(sluice_sse_init(NULL, NULL), SLUICE_EINVAL);
    cr_expect_eq(sluice_sse_init(&sse, NULL), SLUICE_EINVAL);
    cr_expect_eq(sluice_sse_feed(NULL, "data: x\n\n", 9), SLUICE_EINVAL);
    cr_expect(!sluice_sse_idle(NULL));
    cr_expect_str_neq(sluice_sse_error(NULL), "", "a NULL parser is not a healthy stream");
    cr_expect_eq(sluice_sse_events(NULL), 0);
    cr_expect_eq(sluice_sse_comments(NULL), 0);
}
