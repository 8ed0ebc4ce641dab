/* An embedder of the shim: an adaptive backend persisted in a state file,
 * and one blocking request through sluice_curl_perform. Nothing listens on
 * 127.0.0.1:1, so the request must come back as a transport failure. */
#include <stdio.h>

#include <sluice/curl.h>
#include <sluice/sluice.h>
#include <sluice/statefile.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: consumer_shim STATE_FILE\n");
        return 2;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct sluice_statefile *state;
    if (sluice_statefile_open(&(struct sluice_statefile_desc){.path = argv[1]}, &state) != SLUICE_OK)
        return 1;
    struct sluice_store_ops store = sluice_statefile_ops(state);
    struct sluice_discovery_desc discover = {0};
    struct sluice_backend_desc cloud = {.id = "cloud:x", .active = 8, .discovery = &discover};
    struct sluice_engine *engine;
    char error[256];
    if (sluice_engine_create(&(struct sluice_engine_desc){.backends = &cloud, .n_backends = 1,
                                                          .store = &store, .error = error,
                                                          .error_size = sizeof error},
                             &engine) != SLUICE_OK) {
        fprintf(stderr, "consumer_shim: %s\n", error);
        return 1;
    }
    CURL *easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, "http://127.0.0.1:1/");
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    struct sluice_curl_result r;
    int status = sluice_curl_perform(engine, "cloud:x", easy, NULL, NULL, &r);
    int ok = status == SLUICE_EIO && r.kind == SLUICE_CURL_TRANSPORT;
    printf("consumer_shim: %s (%s, %s)\n", ok ? "ok" : "failed", sluice_status_name(status),
           sluice_curl_kind_name(r.kind));
    curl_easy_cleanup(easy);
    sluice_engine_close(engine);
    sluice_engine_destroy(engine);
    sluice_statefile_close(state);
    curl_global_cleanup();
    return ok ? 0 : 1;
}
