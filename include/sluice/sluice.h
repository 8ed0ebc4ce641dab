/*
 * sluice.h — umbrella header for the sluice core.
 *
 * sluice keeps a program's parallel requests to remote model providers
 * within what each provider can take. This header includes the whole core.
 *
 * Contents, one header per concept, by layer, lowest first. A header
 * includes only headers listed above it, and this file includes them in
 * this order. The shim (shim/include/sluice/) builds on the whole core.
 *   portability
 *     sluice/cc.h        portability macros, SLUICE_SOME optionals, allocator hook
 *     sluice/status.h    status codes, sluice_strerror, sluice_status_name
 *     sluice/time.h      absolute CLOCK_MONOTONIC deadlines, clock hook
 *   waiting
 *     sluice/park.h      futex wait/wake on a waiter's own word
 *     sluice/cancel.h    cancel tokens
 *   primitives
 *     sluice/ring.h      bounded MPMC ring of pointers
 *     sluice/gate.h      FIFO permit gate: deadlines, cancel, async waiters, moving limit
 *   policy
 *     sluice/policy.h    ceiling-discovery policy interface: samples, windows, verdicts
 *     sluice/policy/fixed.h     never moves (non-adaptive nodes)
 *     sluice/policy/aimd.h      additive increase, multiplicative decrease
 *     sluice/policy/gradient.h  long/short latency-ratio controller
 *     sluice/policy/vegas.h     queue estimate L·(1 − minRTT/RTT)
 *     sluice/policy/discover.h  the default: slow start, probing, backoff on overload or knee
 *   pool
 *     sluice/events.h    discovery event feed: bounded per-node ring, JSON Lines
 *     sluice/store.h     lock records, the store interface, an in-memory store
 *     sluice/window_recorder.h  lock-free two-buffer recorder of an open window's totals
 *     sluice/effects.h   effects combiner: store saves, events, grants after the lock
 *     sluice/discovery.h per-node probing/backoff/locked state machine, status line
 *     sluice/service_time.h     how long calls take: expected service time, histograms
 *     sluice/pool_state.h       a pool's descriptions, limits, defaults; struct sluice_pool
 *     sluice/pool_admit.h       immediate admission: admit, leave
 *     sluice/pool_hold.h        Retry-After holds, waited out permit in hand
 *     sluice/pool_linger.h      lingering permits of abandoned calls, their reaper and watcher
 *     sluice/pool_deadlines.h   deadline rules: predicted wait, standing queue, start rule
 *     sluice/pool_call.h        a generation call: blocking and async begin, end, abandon
 *     sluice/pool.h      one backend's pool: create, close, stats; includes the pool_*.h above
 *   engine
 *     sluice/engine.h    backend registry: presets, validation, O(1) lookup by ID
 *     sluice/run.h       run lifecycle: admit, prepare, generate, validate, repair
 *
 * Compile-time options:
 *   SLUICE_PARK_SPIN   pauses the next waiter in line spins before it parks
 *                      in the kernel (default 256)
 *   SLUICE_DISCOVERY_DRAIN_SPIN  pauses a window's closer spins for samples still
 *                      adding to it before it yields to them (default 1024)
 *   SLUICE_SPIN_BACKOFF_MAX  longest pause run of a contended spinlock before it
 *                      yields the CPU (default 64)
 *
 * Feature macros: the core calls clock_gettime and syscall(2); compile with
 *   _DEFAULT_SOURCE or _GNU_SOURCE (the CMake and pkg-config targets add it;
 *   a strict -std=c11 build without it stops at one #error saying so).
 *
 * Link: the core is header-only; link Concurrency Kit (-lck), -pthread and
 * -lm, or use the CMake target sluice::core / pkg-config sluice-core.
 *
 * Threads and callbacks: every blocking wait takes an absolute deadline and a
 * cancel token (cancel wins over the deadline and over a close). Async
 * waiters' callbacks (gate, pool) run exactly once, on the thread that
 * settles them, from the outermost sluice frame on that thread (never
 * nested). Store calls and event callbacks run after locks are dropped and
 * permits released (sluice_discovery_flush), one at a time per node.
 *
 * Example — at most 4 calls in flight, FIFO, with a 2 s deadline:
 *
 *   struct sluice_gate *gate;
 *   sluice_gate_create(&(struct sluice_gate_desc){ .limit = 4 }, &gate);
 *   struct timespec dl;
 *   if (sluice_gate_acquire(gate, sluice_deadline_in(&dl, 2 * SLUICE_NS_PER_SEC), NULL) == SLUICE_OK) {
 *       call_the_model();
 *       sluice_gate_release(gate);
 *   }
 */
#ifndef SLUICE_H
#define SLUICE_H

#include "cc.h"
#include "status.h"
#include "time.h"
#include "park.h"
#include "cancel.h"
#include "ring.h"
#include "gate.h"
#include "policy.h"
#include "policy/fixed.h"
#include "policy/aimd.h"
#include "policy/gradient.h"
#include "policy/vegas.h"
#include "policy/discover.h"
#include "events.h"
#include "store.h"
#include "window_recorder.h"
#include "effects.h"
#include "discovery.h"
#include "service_time.h"
#include "pool_state.h"
#include "pool_admit.h"
#include "pool_hold.h"
#include "pool_linger.h"
#include "pool_deadlines.h"
#include "pool_call.h"
#include "pool.h"
#include "engine.h"
#include "run.h"

#endif
