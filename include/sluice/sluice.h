/*
 * sluice.h — umbrella header for the sluice core.
 *
 * sluice keeps a program's parallel requests to remote model providers
 * within what each provider can take. This header includes the whole core.
 *
 * Contents (one header per concept, lowest layer first):
 *   sluice/cc.h        portability macros, SLUICE_SOME optionals, allocator hook
 *   sluice/status.h    status codes, sluice_strerror, sluice_status_name
 *   sluice/time.h      absolute CLOCK_MONOTONIC deadlines, clock hook
 *   sluice/cancel.h    cancel tokens
 *   sluice/park.h      spin-then-futex parking of one waiter
 *   sluice/ring.h      bounded MPMC ring of pointers
 *   sluice/gate.h      ticket-based FIFO permit gate
 *
 * Compile-time options:
 *   SLUICE_PARK_SPIN   spins before a waiter parks in the kernel (default 256)
 *
 * Feature macros: the core calls clock_gettime and syscall(2); compile with
 *   _DEFAULT_SOURCE or _GNU_SOURCE (the CMake and pkg-config targets add it).
 *
 * Link: the core is header-only; link Concurrency Kit (-lck) and -pthread,
 * or use the CMake target sluice::core / pkg-config sluice-core.
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

#include "sluice/cc.h"
#include "sluice/status.h"
#include "sluice/time.h"
#include "sluice/cancel.h"
#include "sluice/park.h"
#include "sluice/gate.h"

#endif
