/*
 * stream_server_process.h — start and stop examples/stream_server.c (the
 * streaming chat service on libuv) from tests/e2e/stream_service.c and
 * bench/stream_service_cases.c, beside the provider simulator.
 *
 *   static struct sim_process sim, server;
 *   sim_process_start(&sim, sim_args);                       // the simulator, as usual
 *   stream_server_start(&server, &sim, (const char *[]){"--fixed", "2", NULL});
 *   char url[96];
 *   sim_process_url(&server, "/chat?q=hi", url, sizeof url);
 *   ...
 *   sim_process_stop(&server);                               // SIGTERM; 0 = a clean exit
 *
 * The server prints its port as its first line and takes --port and
 * --quiet, as the simulator does, so sim_process.h's launcher runs it with
 * every guarantee it gives the simulator (bounded start, the port line, the
 * first accepted connection, PR_SET_PDEATHSIG, the atexit reaper, SIGTERM
 * then SIGKILL). That launcher runs the program its path macro names: here
 * the macro names a variable that holds the simulator's path, except while
 * stream_server_start runs. Include this header before anything else that
 * includes sim_process.h.
 *
 * Needs SLUICE_PROVIDER_SIM_PATH and SLUICE_STREAM_SERVER_PATH (the
 * example's binary; tests/CMakeLists.txt and bench/CMakeLists.txt set both).
 * Threads: as sim_process.h (one thread starts and stops).
 */
#ifndef SLUICE_TESTKIT_STREAM_SERVER_PROCESS_H
#define SLUICE_TESTKIT_STREAM_SERVER_PROCESS_H

#ifdef SLUICE_TOOLS_SIM_PROCESS_H
#error "include stream_server_process.h before sluice-provider-sim/sim_process.h"
#endif
#ifndef SLUICE_STREAM_SERVER_PATH
#error "SLUICE_STREAM_SERVER_PATH must name the example_stream_server binary"
#endif

static const char *stream_server__launch = SLUICE_PROVIDER_SIM_PATH;
#undef SLUICE_PROVIDER_SIM_PATH
#define SLUICE_PROVIDER_SIM_PATH stream_server__launch
#include "sluice-provider-sim/sim_process.h"

#define STREAM_SERVER_MAX_FLAGS 16

/*
 * Start the example server in front of the simulator `sim` (its base URL
 * http://127.0.0.1:PORT/v1), with its `flags` (NULL-terminated; may be NULL),
 * e.g. {"--fixed", "12", NULL}. sim_process_start's result.
 */
static inline int stream_server_start(struct sim_process *server, const struct sim_process *sim,
                                      const char *const flags[])
{
    char base[96];
    const char *args[STREAM_SERVER_MAX_FLAGS + 2];
    int n = 0;
    for (const char *const *f = flags; f && *f; f++) {
        if (n == STREAM_SERVER_MAX_FLAGS) {
            fprintf(stderr, "stream_server_start: more than %d flags\n", STREAM_SERVER_MAX_FLAGS);
            return -1;
        }
        args[n++] = *f;
    }
    args[n++] = sim_process_url(sim, "/v1", base, sizeof base);
    args[n] = NULL;
    const char *sim_path = stream_server__launch;
    stream_server__launch = SLUICE_STREAM_SERVER_PATH;
    int rc = sim_process_start(server, args);
    stream_server__launch = sim_path;
    return rc;
}

#endif
