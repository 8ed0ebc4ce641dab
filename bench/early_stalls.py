#!/usr/bin/env python3
"""A reject test over HTTP while the simulator stalls in its first windows.

    python3 bench/early_stalls.py --build build/test [--test loop|perform] [--runs 12]
                                  [--stalls 3] [--stall-ms 60] [--after-s 0 0.15]

Runs tests/e2e/curl_loop.c's reject test (200 submissions from 4 threads,
a reject cap of 24, 20 ms calls), or with --test perform
tests/e2e/curl_perform.c's (56 blocking callers, a reject cap of 24, 40 ms
calls), --runs times. For each run a staller waits for the test's
sluice-provider-sim to start, sleeps a uniform draw from --after-s (0-0.15 s),
then stops it (SIGSTOP) --stalls times for --stall-ms, 30 ms apart. That
lands the stalls on slow start's first levels, before the no-queue latency
(s0) has its calls: what a loaded CI runner does when a test starts beside
others. gateway_stalls.py's random gaps rarely hit those windows. With
--after-s 0.4 1.2 they land on the first cuts instead, where refusals race
the window closes. Prints each run's lock and event path, then how many
locked at 24.
"""
import argparse
import os
import random
import re
import signal
import subprocess
import threading
import time


def staller(sim, stalls, stall_s, after, stop):
    seen = set()
    while not stop.is_set():
        out = subprocess.run(['pgrep', '-f', '^' + sim], capture_output=True, text=True).stdout
        for pid in (int(p) for p in out.split()):
            if pid in seen:
                continue
            seen.add(pid)
            time.sleep(random.uniform(*after))
            for _ in range(stalls):
                try:
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(stall_s)
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    break
                time.sleep(0.03)
        time.sleep(0.005)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--build', required=True, help='a build folder with the tests (build/test)')
    ap.add_argument('--test', choices=('loop', 'perform'), default='loop')
    ap.add_argument('--runs', type=int, default=12)
    ap.add_argument('--stalls', type=int, default=3)
    ap.add_argument('--stall-ms', type=float, default=60)
    ap.add_argument('--after-s', type=float, nargs=2, default=(0.0, 0.15), metavar=('LO', 'HI'),
                    help='when the first stall comes, after the simulator starts')
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    test = os.path.join(build, 'tests', 'test_e2e_curl_' + a.test)
    sim = os.path.join(build, 'shim', 'sluice-provider-sim')
    for path in (test, sim):
        if not os.access(path, os.X_OK):
            raise SystemExit(f'{path} is not built: build the test preset first')
    stop = threading.Event()
    t = threading.Thread(target=staller, args=(sim, a.stalls, a.stall_ms / 1000, a.after_s, stop),
                         daemon=True)
    t.start()
    locks = []
    for k in range(a.runs):
        r = subprocess.run([test, '--filter=*reject_mode*'], capture_output=True, text=True)
        prefix = f'curl_{a.test} discovery'
        line = next((x for x in r.stderr.splitlines() if x.startswith(prefix)), '')
        m = re.search(r'ceiling (\d+)', line)
        locks.append(int(m.group(1)) if m and 'locked' in line else None)
        print(f'run {k + 1}: {line or r.stderr[-300:]}', flush=True)
    stop.set()
    at_cap = sum(1 for x in locks if x == 24)
    print(f'{at_cap} of {a.runs} runs locked at 24: {" ".join(str(x) for x in locks)}')


if __name__ == '__main__':
    main()
