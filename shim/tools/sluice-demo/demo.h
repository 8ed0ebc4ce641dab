/*
 * demo.h — what the files of sluice-demo share (main.c opens with the
 * program's manual): its constants, options and run state, and the
 * functions one file calls in another, each documented where it is defined.
 *
 *   options.c  the command line and its help
 *   svg.c      the timeline plot
 *   main.c     setting up, the run, what the person sees, the end
 */
#ifndef SLUICE_DEMO_DEMO_H
#define SLUICE_DEMO_DEMO_H

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <sluice/admin.h>
#include <sluice/curl.h>
#include <sluice/sluice.h>
#include <sluice/statefile.h>

/* The simulator is found next to this program, else where the build put it
 * (main.c's start_simulator sets it). */
extern const char *demo_sim_path;
#define SLUICE_PROVIDER_SIM_PATH demo_sim_path
#include "sluice-provider-sim/sim_process.h"
#include "tool.h"

#define PROG "sluice-demo"
#define NODE "cloud:demo"
#define CAP_ENV "SLUICE_DEMO_CAP"
#define CAP_DEFAULT 52
#define CAP_MAX 2000
#define EVENTS_MAX 4096
#define SAMPLES_MAX 20000
#define TICK_MS 50
#define BAR_MAX 30

struct options {
    unsigned cap;          /* the simulator's hidden cap */
    const char *cap_from;  /* where cap came from, for the banner */
    double seconds;        /* traffic time, longer if no lock yet */
    long requests;         /* budget (0 = none) */
    unsigned clients;      /* requests kept outstanding */
    double median_ms;      /* the simulator's median service time */
    double timeout_s;      /* wall-clock limit of the run */
    const char *state;     /* the demo's state file */
    const char *svg;       /* the timeline plot */
    unsigned admin_port;   /* 8400 by default; 0 = any free port */
    bool hold;             /* keep serving the page after the run */
    bool plain;            /* periodic lines even on a terminal */
};

struct sample {
    double t_s;
    uint32_t limit, in_flight;
    long overloads; /* 429s so far */
};

struct demo {
    const struct options *o;
    struct sluice_engine *engine;
    struct sluice_curl_loop *loop;
    struct sluice_statefile *state;
    struct sluice_admin *admin;
    struct sim_process sim;
    char url[96];        /* the simulator's chat endpoint */
    char admin_url[64];  /* "http://127.0.0.1:8400" */
    char sluicectl[PATH_MAX];
    CURL **easy;         /* one request per client */
    struct curl_slist *headers;
    int64_t t0_ns;       /* when the first request was submitted */
    /* Written on the loop thread, read by the main thread. */
    atomic_long submitted, ok, overloaded, failed;
    atomic_bool stopping;
    /* Events, appended by the event callback; printed and plotted by the main thread. */
    pthread_mutex_t mu;
    struct sluice_event events[EVENTS_MAX];
    size_t n_events, printed;
    bool restored;       /* a "restore" event: the lock came from the state file */
    uint32_t cleared_ceiling, cleared_cap; /* a saved lock of another cap, cleared */
    struct sample *samples;
    size_t n_samples;
    bool tty;
    int cols;            /* terminal width */
};

/* Seconds from the first request to t_ns (0 before it). */
static inline double since_start_s(const struct demo *d, int64_t t_ns)
{
    double s = (double)(t_ns - d->t0_ns) / 1e9;
    return s > 0 ? s : 0;
}

/* options.c */
int parse_options(int argc, char **argv, struct options *o);

/* svg.c */
const char *plot_path(const struct demo *d, char *buf, size_t size);
int write_svg(const struct demo *d, uint32_t ceiling);

#endif /* SLUICE_DEMO_DEMO_H */
