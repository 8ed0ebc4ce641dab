/*
 * A real client nobody here wrote: the official OpenAI Node SDK (`openai`
 * from npm, installed into the build tree by the presets' bootstrap, see
 * cmake/SluiceBootstrap.cmake) with its baseURL at sluice-proxy does a plain
 * and a streamed chat against the simulator (whose stream ends after its
 * [DONE] is read, when the SDK has hung up), and surfaces the proxy's own
 * refusal (status and message) as its APIError. Skipped, saying why, where
 * Node.js or the SDK is not installed.
 */
#include "proxy_fixture.h"

#ifndef SLUICE_NODE_MODULES
#define SLUICE_NODE_MODULES ""
#endif
#ifndef SLUICE_PROXY_SDK_SCRIPT
#error "SLUICE_PROXY_SDK_SCRIPT must name tests/e2e/proxy_openai.cjs (tests/CMakeLists.txt sets it)"
#endif
#define SCRIPT SLUICE_PROXY_SDK_SCRIPT

static void setup(void)
{
    fx_setup();
}

static void teardown(void)
{
    px_stop(&px_main);
    fx_teardown();
}

TestSuite(proxy_openai_node, .init = setup, .fini = teardown, .timeout = 60);

static void need_node_and_sdk(void)
{
    char pkg[512];
    snprintf(pkg, sizeof pkg, "%s/openai/package.json", SLUICE_NODE_MODULES);
    if (system("node --version > /dev/null 2>&1") != 0)
        cr_skip_test("Node.js is not installed (the test preset's bootstrap installs nodejs)");
    if (access(pkg, R_OK) != 0)
        cr_skip_test("the OpenAI Node SDK is not in %s (the test preset's bootstrap installs it)",
                     SLUICE_NODE_MODULES);
}

/* Run the script in `mode` against the proxy; its exit status, its stdout in out. */
static int run_sdk(const char *mode, char *out, size_t size)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "NODE_PATH='%s' node '%s' '%s' %s", SLUICE_NODE_MODULES, SCRIPT,
             px_main.url, mode);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    size_t n = fread(out, 1, size - 1, f);
    out[n] = '\0';
    int status = pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void start(bool stream)
{
    /* The stream's body ends long after its [DONE]: the SDK stops reading at [DONE] and hangs
     * up, as it does whenever the body's last chunk comes in a packet of its own. */
    px_sim_start(stream ? &(struct fx_provider){.mode = "reject", .cap = 8, .median_ms = 5,
                                                .stream = true, .answer_tokens = 4, .token_ms = 5}
                        : &(struct fx_provider){.mode = "reject", .cap = 8, .median_ms = 5},
                 stream ? (const char *[]){"--stream-end-ms", "60000", NULL} : NULL);
    char upstream[64];
    snprintf(upstream, sizeof upstream, "http://127.0.0.1:%d", fx_sim.port);
    const char *args[] = {"--upstream", upstream, "--node", "cloud:sim", "--state", "off", NULL};
    cr_assert_eq(px_start(&px_main, args), 0);
}

Test(proxy_openai_node, plain_and_streamed_chats_through_the_proxy)
{
    need_node_and_sdk();
    start(true);
    char out[4096];
    cr_assert_eq(run_sdk("chat", out, sizeof out), 0, "the SDK failed (its stderr is above)");
    json_t *root = json_loads(out, 0, NULL);
    cr_assert_not_null(root, "not JSON: %s", out);
    cr_assert_gt(json_integer_value(json_object_get(root, "chunks")), 1);
    cr_assert_eq(fx_stats().ok, 2, "one plain and one streamed call reached the provider");
    json_decref(root);
    /* The SDK's hang-up after [DONE] ended a successful call, not a cancelled one. */
    WAIT_UNTIL(px_node_count(&px_main, "cloud:sim", "requests_total") == 2);
    cr_assert_eq(px_node_count(&px_main, "cloud:sim", "cancels_total"), 0,
                 "the streamed call was heard as a cancel");
    cr_assert_eq(px_node_count(&px_main, "cloud:sim", "lingered_total"), 0);
}

Test(proxy_openai_node, the_sdk_surfaces_the_proxys_own_refusal)
{
    need_node_and_sdk();
    start(false);
    sim_process_stop(&fx_sim); /* the upstream stops answering: the proxy's 502 */
    char out[4096];
    cr_assert_eq(run_sdk("error", out, sizeof out), 0, "the SDK failed (its stderr is above)");
    json_t *root = json_loads(out, 0, NULL);
    cr_assert_not_null(root, "not JSON: %s", out);
    cr_assert_eq(json_integer_value(json_object_get(root, "status")), 502);
    cr_assert_not_null(strstr(json_string_value(json_object_get(root, "message")), "did not answer"),
                       "the SDK's message is not the proxy's: %s", out);
    json_decref(root);
}
