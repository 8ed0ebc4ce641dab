#!/usr/bin/env python3
"""`sluicectl probe` through HAProxy while the backend stalls now and then.

    python3 bench/gateway_stalls.py --build build/test [--probes 10] [--stall-ms 50] [--json F]

The stage of tests/e2e/gateway_haproxy.c: sluice-provider-sim (100 ms median,
sigma 0.4, no cap in reach) behind HAProxy with `maxconn 10` and `timeout
queue 100ms`, so the cap to find is 10 and the band [8, 12.5]. Beside it a
staller stops the simulator and HAProxy (SIGSTOP) for --stall-ms at random
intervals of 0.1-0.9 s, then lets them go on (SIGCONT): what a loaded 2-core
CI runner does to them now and then, made common. Such a stall lengthens
every call in flight at once, at any concurrency, which a latency test can
read as a queue. CI's run at 55e962d locked at 6 (e2e.gateway_haproxy);
without stalls the same probe locked at 9-12 in 60 runs here.

Each probe runs as the test runs it (`--concurrency-max 64 --requests 20000
--timeout 25 --request-timeout 5`). Prints each lock with its event path,
then how many locked inside the band; --json writes the locks.
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from proxy_bench import Procs, free_port, wait_port  # noqa: E402

CAP = 10
BAND = (0.8 * CAP, 1.25 * CAP)


def haproxy_conf(tmp, port, backend):
    path = os.path.join(tmp, 'haproxy.cfg')
    with open(path, 'w') as f:
        f.write(f'''global
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout queue 100ms
frontend gateway
    bind 127.0.0.1:{port}
    default_backend slow
backend slow
    server sim 127.0.0.1:{backend} maxconn {CAP}
''')
    return path


def staller(pids, stall_s, stop):
    """Stop and continue pids at random intervals until `stop` is set."""
    rng = random.Random(1)
    while not stop.wait(rng.uniform(0.1, 0.9)):
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(stall_s)
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def probe(ctl, url):
    out = subprocess.run([ctl, 'probe', url, '--method', 'POST', '--json', '--concurrency-max',
                          '64', '--requests', '20000', '--timeout', '25', '--request-timeout',
                          '5'], capture_output=True, text=True, timeout=60).stdout
    j = json.loads(out)
    path = ' '.join('%s %d→%d' % (e['reason'], e['old_limit'], e['new_limit'])
                    for e in j['events'])
    return j['discovered_ceiling'] if j['locked'] else 0, path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--build', required=True, help='a build tree with shim/sluicectl')
    ap.add_argument('--probes', type=int, default=10)
    ap.add_argument('--stall-ms', type=int, default=50, help='0: no stalls')
    ap.add_argument('--json')
    opts = ap.parse_args()
    ctl = os.path.join(opts.build, 'shim', 'sluicectl')
    sim_bin = os.path.join(opts.build, 'shim', 'sluice-provider-sim')
    haproxy = next((p for p in ('/usr/sbin/haproxy', '/usr/bin/haproxy') if os.access(p, os.X_OK)),
                   None)
    for need, what in ((ctl, 'sluicectl'), (sim_bin, 'sluice-provider-sim'), (haproxy, 'haproxy')):
        if not need or not os.access(need, os.X_OK):
            sys.exit('gateway_stalls: %s not found (build the tree with --build; haproxy: '
                     'Debian\'s haproxy package)' % what)
    procs, stop = Procs(), threading.Event()
    locks = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            sim_port, gw_port = free_port(), free_port()
            sim = procs.start([sim_bin, '--quiet', '--port', str(sim_port), '--mode', 'reject',
                               '--cap', '100000', '--median-ms', '100'])
            gw = procs.start([haproxy, '-db', '-f', haproxy_conf(tmp, gw_port, sim_port)])
            wait_port(sim_port)
            wait_port(gw_port)
            if opts.stall_ms:
                threading.Thread(target=staller, args=([sim.pid, gw.pid], opts.stall_ms / 1e3,
                                                       stop), daemon=True).start()
            url = 'http://127.0.0.1:%d/v1/chat/completions' % gw_port
            print('cap %d behind HAProxy, stalls of %d ms; band [%g, %g]' % (CAP, opts.stall_ms,
                                                                           *BAND), flush=True)
            for i in range(opts.probes):
                lock, path = probe(ctl, url)
                locks.append(lock)
                inside = BAND[0] <= lock <= BAND[1]
                print('probe %d: %s %s' % (i + 1, ('locked at %d' % lock) if lock else 'no lock',
                                            '' if inside else '(OUTSIDE)'), flush=True)
                if not inside:
                    print('  path: %s' % path)
        finally:
            stop.set()
            time.sleep(opts.stall_ms / 1e3 + 0.05)
            for p in procs.procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
            procs.stop_all()
    inside = sum(BAND[0] <= x <= BAND[1] for x in locks)
    print('%d of %d probes locked inside [%g, %g]: %s' % (inside, len(locks), *BAND,
                                                          ' '.join(map(str, locks))))
    if opts.json:
        with open(opts.json, 'w') as f:
            json.dump({'cap': CAP, 'stall_ms': opts.stall_ms, 'locks': locks, 'inside': inside},
                      f)


if __name__ == '__main__':
    main()
