/* Helpers shared by the virtual-time discovery scenarios in tests/sim/. */
#ifndef SLUICE_TESTS_SIM_COMMON_H
#define SLUICE_TESTS_SIM_COMMON_H

#include <criterion/criterion.h>

#include "provider_sim.h"

/*
 * How many seeds of a sweep of n to run: all of them, and the first fifth under
 * AddressSanitizer (GCC's __SANITIZE_ADDRESS__), which runs these sweeps three to
 * four times slower. Virtual time makes every seed's result the same in both
 * builds, so the plain build, which runs them all, holds each sweep to its
 * bound, and a sweep's bound on seeds outside stays the whole sweep's: its first
 * fifth cannot miss more. Under ASan the sweeps are there for memory errors and
 * undefined behaviour, which the first fifth reaches as well.
 */
#ifdef __SANITIZE_ADDRESS__
#define SIM_SWEEP(n) ((n) / 5)
#else
#define SIM_SWEEP(n) (n)
#endif

/* One simulated node: provider, callers, gate and discovery, with its events. */
struct scenario {
    struct sim *sim;
    struct sluice_discovery *disc;
    struct sim_trace trace;
    double rtt_s; /* the provider's mean round trip without queueing */
};

/* Closed-loop callers saturating the cap: twice as many callers as the cap,
 * plus a few, so demand always exceeds what the provider takes. */
static inline void scenario_start(struct scenario *sc, struct sim_config cfg,
                                  struct sluice_discovery_desc desc)
{
    memset(sc, 0, sizeof *sc);
    if (!cfg.workers && !cfg.open_rate)
        cfg.workers = 2 * cfg.cap + 8;
    sc->sim = sim_create(&cfg);
    if (!desc.node_id)
        desc.node_id = "cloud:default_ollama";
    sc->disc = sim_discovery(sc->sim, &desc, &sc->trace);
    cr_assert_not_null(sc->disc, "discovery description rejected");
    sc->rtt_s = sim_round_trip_s(&sc->sim->cfg);
    sim_start(sc->sim);
}

static inline void scenario_stop(struct scenario *sc)
{
    sluice_discovery_destroy(sc->disc);
    sim_destroy(sc->sim);
    sim_trace_free(&sc->trace);
}

static inline struct sluice_discovery_status scenario_status(const struct scenario *sc)
{
    struct sluice_discovery_status st;
    sluice_discovery_snapshot(sc->disc, &st);
    return st;
}

static inline struct sim_config reject_config(uint32_t cap, uint64_t seed)
{
    struct sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.seed = seed;
    cfg.mode = SIM_REJECT;
    cfg.cap = cap;
    return cfg;
}

static inline struct sluice_discovery_desc default_desc(void)
{
    struct sluice_discovery_desc desc;
    memset(&desc, 0, sizeof desc);
    return desc;
}

#endif
