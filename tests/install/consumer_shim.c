/* An embedder of the shim: an adaptive backend persisted in a state file,
 * and one blocking request through sluice_curl_perform. Nothing listens on
 * 127.0.0.1:1, so the request must come back as a transport failure. And
 * linking the shim the documented way leaves the process's allocator alone:
 * malloc, as this program and every library it loads resolve it, is libc's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sluice/curl.h>
#include <sluice/sluice.h>
#include <sluice/statefile.h>

/* The object `fn` lives in. */
static const char *defined_in(void *fn)
{
    Dl_info info;
    return fn && dladdr(fn, &info) && info.dli_fname ? info.dli_fname : "(unknown)";
}

/* malloc as this program calls it and as the dynamic linker binds it for libraries. Under
 * a sanitizer its allocator is malloc (in its runtime or the program); else it is libc. */
static int malloc_is_the_hosts(void)
{
    void *(*volatile mine)(size_t) = malloc;
    const char *objects[] = {defined_in((void *)mine), defined_in(dlsym(RTLD_DEFAULT, "malloc"))};
    for (int i = 0; i < 2; i++) {
        const char *base = strrchr(objects[i], '/') ? strrchr(objects[i], '/') + 1 : objects[i];
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
        int ok = strstr(base, "mimalloc") == NULL;
#else
        int ok = strncmp(base, "libc.so", 7) == 0;
#endif
        if (!ok) {
            fprintf(stderr, "consumer_shim: malloc resolves to %s, not libc: linking the shim "
                            "replaced the process's allocator\n",
                    objects[i]);
            return 0;
        }
    }
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: consumer_shim STATE_FILE\n");
        return 2;
    }
    if (!malloc_is_the_hosts())
        return 1;
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
