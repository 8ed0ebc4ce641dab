/*
 * Two sluice-proxy processes naming one Redis (--redis) share one cap: the
 * provider's own in-flight counter never passes the fleet's limit, where
 * two proxies alone would each run their own jumpstart (5 + 5 > 8).
 */
#include "e2e/redis_fixture.h"
#include "proxy_fixture.h"

#define MAX 8       /* --active: the most the fleet's shared limit may reach */
#define CLIENTS 32  /* per proxy */
#define RUN_MS 3000

static struct px px_b;

static void setup(void)
{
    fx_setup();
    rfx_start();
}

static void teardown(void)
{
    px_stop(&px_main);
    px_stop(&px_b);
    rfx_teardown();
}

Test(proxy_fleet, two_proxies_sharing_one_redis_respect_one_cap, .init = setup, .fini = teardown,
     .timeout = 30)
{
    /* A provider that never refuses: only the fleet keeps the calls down. */
    fx_start(&(struct fx_provider){.mode = "queue", .cap = 100, .median_ms = 40,
                                   .fixed_latency = true});
    char upstream[64], redis[64], active[8];
    snprintf(upstream, sizeof upstream, "http://127.0.0.1:%d", fx_sim.port);
    rfx_url(redis, sizeof redis);
    snprintf(active, sizeof active, "%d", MAX);
    const char *args[] = {"--upstream", upstream, "--node", RFX_NODE, "--redis", redis,
                          "--active", active, "--state", "off", NULL};
    cr_assert_eq(px_start(&px_main, args), 0);
    cr_assert_eq(px_start(&px_b, args), 0);
    static struct px_reply replies[2 * CLIENTS];
    CURL *e[2 * CLIENTS];
    CURLM *m = curl_multi_init();
    for (int i = 0; i < 2 * CLIENTS; i++) {
        e[i] = px_easy(i < CLIENTS ? &px_main : &px_b, "/v1/chat/completions", FX_REQUEST, NULL,
                       &replies[i]);
        curl_multi_add_handle(m, e[i]);
    }
    long served[2] = {0, 0}, other = 0;
    for (int64_t end = fx_now_ms() + RUN_MS; fx_now_ms() < end;) {
        int running;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            CURL *done = msg->easy_handle;
            long status = 0;
            curl_easy_getinfo(done, CURLINFO_RESPONSE_CODE, &status);
            for (int i = 0; i < 2 * CLIENTS; i++)
                if (e[i] == done) {
                    if (status == 200)
                        served[i >= CLIENTS]++;
                    else
                        other++;
                }
            curl_multi_remove_handle(m, done);
            curl_multi_add_handle(m, done); /* again, at once */
        }
        curl_multi_poll(m, NULL, 0, 20, NULL);
    }
    for (int i = 0; i < 2 * CLIENTS; i++) {
        curl_multi_remove_handle(m, e[i]);
        curl_easy_cleanup(e[i]);
    }
    curl_multi_cleanup(m);
    struct fx_stats s = fx_stats();
    cr_assert_gt(served[0], 0, "the first proxy served nothing");
    cr_assert_gt(served[1], 0, "the second proxy served nothing");
    cr_assert_eq(other, 0, "every call waits for the fleet's permit; none is refused");
    cr_assert_leq(s.peak_in_flight, MAX, "the provider saw %ld calls at once: the cap was not shared",
                  s.peak_in_flight);
}
