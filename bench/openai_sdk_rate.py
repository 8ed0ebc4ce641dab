#!/usr/bin/env python3
"""sluice-proxy driven by a client nobody here wrote: the OpenAI Node SDK, retrying.

    python3 bench/openai_sdk_rate.py --build build/test [--case rate|overload|stream] [--runs 3]
                                     [--seconds S] [--workers W] [--retries 2] [--json F]
                                     [--proxy-arg ARG ...] [--sim-arg ARG ...]

--case rate (the default; 45 s, 32 workers). Over loopback: sluice-provider-sim (100 ms median, sigma 0.4, no cap in reach) behind
nginx `limit_req rate=100r/s burst=10 nodelay` answering 429 without a Retry-After, and
sluice-proxy (defaults: discovery on, waiting 1024) in front of nginx. WORKERS closed-loop
callers on the official OpenAI Node SDK (openai from npm, BUILD/node/node_modules: the
test preset's bootstrap installs it) send chats through the proxy; the SDK retries each 429
RETRIES times with its own backoff (0.5 s doubling, jittered), so every attempt is one call
through the proxy, each holding a permit only while it runs. Issue 30's target: every run
locks inside [0.8, 1.25]·R·L (R·L = 100/s x the simulator's mean latency, 0.108 s) and no
lock is ever taken below it. Each run prints the lock, the lowest lock taken, the limit over
time, and the SDK's tallies (calls served, calls that failed after their retries, and why);
--json writes one row per run. Needs nginx and Node.js (the bench preset installs nginx).

--case overload (20 s, 64 workers). Issue 27's blocking case with the SDK as the caller:
sluice-provider-sim refusing past a cap of 24 (200 ms median, sigma 0.4), the SDK's
`timeout` at 250 ms (it aborts the request, so the proxy sees the client hang up, and it
retries that too), no deadline header: the proxy knows only what a hang-up tells it.
Beside it, in the same run, the oracle: the same proxy with --no-discovery --active 24
--waiting 0 (a 503 at once past the cap, which the SDK retries after its backoff). Target:
calls served >= 0.8x the oracle's and the limit >= 0.85·C at the end. --sim-arg passes more
to the simulator (--sim-arg=--abandoned --sim-arg=free: a provider that frees the slot of an
abandoned call). SLUICE_BENCH_TRACE=1 prints the adaptive proxy's events and, every half
second, its limit, queue and linger state (what the linger trial decided, and when).

--case stream (60 s, 32 workers). Streamed chats through the proxy, as a chat UI sends them:
sluice-provider-sim --stream refusing past a cap of 8, its headers and an SSE comment at once
and the first token after 300 ms (sigma 0.4), then answers of 30 tokens (median, sigma 1)
20 ms apart, about 1.3 s a stream; it keeps generating a stream whose client left (a hosted
API). The SDK's `timeout` is 5 s (its wait for the answer to begin), and every 4th chat is
stopped after its third chunk (a user pressing stop: the SDK aborts it). Beside it the
oracle, as in --case overload (--no-discovery --active 8 --waiting 0). Target: streams
served (completed and stopped) >= 0.8x the oracle's and the limit inside [0.85·C, C] at the
end; each side's time to first token (p50) is printed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from proxy_bench import Procs, free_port, wait_port  # noqa: E402
RATE = 100
MEAN_S = 0.1 * 2.718281828 ** (0.4 ** 2 / 2)  # lognormal, median 100 ms, sigma 0.4
RL = RATE * MEAN_S
CAP = 24
STREAM_CAP = 8
STREAM_SIM = ('--stream', '--median-ms', '300', '--token-ms', '20', '--answer-tokens', '30')
NODE = 'cloud:sim'

NGINX_CONF = '''worker_processes 1; error_log /dev/null; pid {d}/nginx.pid;
events {{ worker_connections 1024; }}
http {{ access_log off; client_body_temp_path {d}; proxy_temp_path {d};
  fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};
  limit_req_zone $binary_remote_addr zone=rate:1m rate={rate}r/s;
  upstream sim {{ server 127.0.0.1:{up}; keepalive 64; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ limit_req zone=rate burst=10 nodelay; limit_req_status 429;
      proxy_pass http://sim; proxy_http_version 1.1; proxy_set_header Connection ""; }} }} }}
'''


def die(msg):
    sys.exit('openai_sdk_rate.py: ' + msg)


def get_json(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read().decode())


def get_lines(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return [json.loads(line) for line in r.read().decode().splitlines() if line.strip()]


def start_proxy(procs, opts, upstream, extra=()):
    proxy = procs.start([os.path.join(opts.build, 'shim', 'sluice-proxy'), '--upstream',
                         upstream, '--node', NODE, '--state', 'off', '--listen', '127.0.0.1:0',
                         '--admin', '127.0.0.1:0', '--access-log', 'off', *extra],
                        stdout=subprocess.PIPE, stderr=None, text=True)
    return proxy.stdout.readline().strip(), proxy.stdout.readline().strip()


def start_sim(procs, opts, args):
    sim = procs.start([os.path.join(opts.build, 'shim', 'sluice-provider-sim'), '--quiet', *args,
                       *opts.sim_arg],
                      stdout=subprocess.PIPE, stderr=None, text=True)
    return int(sim.stdout.readline())


def drive(procs, opts, url, admin, node_modules, timeout_ms=0, stop_every=None):
    """Run the SDK's callers against url (streamed chats when stop_every is not None); poll
    the proxy's limit and events meanwhile."""
    env = dict(os.environ, NODE_PATH=node_modules)
    stream = [] if stop_every is None else [str(stop_every)]
    sdk = procs.start(['node', os.path.join(HERE, 'openai_sdk_rate.cjs'), url, str(opts.workers),
                       str(opts.seconds), str(opts.retries), str(timeout_ms), *stream],
                      stdout=subprocess.PIPE, stderr=None, env=env, text=True)
    events, after, limits, t0 = [], 0, [], time.time()
    while sdk.poll() is None:
        time.sleep(0.5)
        node = get_json(admin + '/compute/concurrency')['nodes'][0]
        limits.append((round(time.time() - t0, 1), node['limit'], node['state']))
        if os.environ.get('SLUICE_BENCH_TRACE'):
            print('  node %.1f %s' % (time.time() - t0, json.dumps(
                {k: node.get(k) for k in ('limit', 'in_flight', 'waiting', 'lingering', 'linger_now',
                                          'expected_service_ms', 'cancels_total', 'lingered_total',
                                          'overloads_total', 'start_deadline_ms')})))
        batch = get_lines('%s/compute/concurrency/events?node_id=%s&after=%d' % (admin, NODE, after))
        events += batch
        after = batch[-1]['seq'] if batch else after
    out = sdk.stdout.read()
    if sdk.returncode != 0:
        die('the SDK script failed (its stderr is above)')
    locks = [e['ceiling'] for e in events if e['event'] == 'lock' and e['ceiling']]
    return {'lock': limits[-1][1] if limits[-1][2] == 'locked' else 0, 'limit': limits[-1][1],
            'lowest': min(locks) if locks else 0, 'limits': limits, 'sdk': json.loads(out),
            'backoffs': [(e['old_limit'], e['new_limit'], e['reason']) for e in events
                         if e['event'] == 'backoff'], 'events': events}


def rate_run(opts, seed, node_modules):
    procs, tmp = Procs(), tempfile.mkdtemp(prefix='sluice-sdk-rate-')
    try:
        sim_port = start_sim(procs, opts, ['--mode', 'reject', '--cap', '100000', '--median-ms',
                                           '100', '--seed', str(seed)])
        ngx_port = free_port()
        conf = os.path.join(tmp, 'nginx.conf')
        with open(conf, 'w') as f:
            f.write(NGINX_CONF.format(d=tmp, rate=RATE, up=sim_port, port=ngx_port))
        procs.start(['nginx', '-p', tmp, '-c', conf, '-g', 'daemon off;'])
        try:
            wait_port(ngx_port, timeout=5)
        except RuntimeError:
            die('nginx did not start (is it installed? the bench preset installs it)')
        url, admin = start_proxy(procs, opts, 'http://127.0.0.1:%d' % ngx_port)
        return drive(procs, opts, url, admin, node_modules)
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def overload_run(opts, seed, node_modules):
    """The adaptive proxy, then the oracle, each against a fresh simulator."""
    stream = opts.case == 'stream'
    cap = STREAM_CAP if stream else CAP
    sim = ('--mode', 'reject', '--cap', str(cap), '--seed', str(seed),
           *(STREAM_SIM if stream else ('--median-ms', '200')))
    res = {}
    for name, extra in (('adaptive', tuple(opts.proxy_arg)),
                        ('oracle', ('--no-discovery', '--active', str(cap), '--waiting', '0'))):
        procs = Procs()
        try:
            sim_port = start_sim(procs, opts, list(sim))
            url, admin = start_proxy(procs, opts, 'http://127.0.0.1:%d' % sim_port, extra)
            res[name] = drive(procs, opts, url, admin, node_modules,
                              timeout_ms=5000 if stream else 250,
                              stop_every=4 if stream else None)
        finally:
            procs.stop_all()
    return res


def tally_text(s):
    stopped = ' (%d of them stopped by their user)' % s['stopped'] if s.get('stopped') else ''
    first = (', first token p50 %s ms p99 %s ms' % (s['ttft_p50_ms'], s['ttft_p99_ms'])
             if s.get('ttft_p50_ms') is not None else '')
    return 'SDK served %d%s, failed %d %s, p50 %s ms%s' % (
        s['ok'] + s.get('stopped', 0), stopped, s['failed'], json.dumps(s['statuses']),
        s['p50_ms'], first)


def report_rate(r, res):
    lo, hi = 0.8 * RL, 1.25 * RL
    ok = lo <= res['lock'] <= hi and (not res['lowest'] or res['lowest'] >= lo)
    trace = ' '.join('%g:%d' % (t, l) for t, l, _ in res['limits'][::6])
    print('run %d: lock %d, lowest %d (%s); %s' % (r, res['lock'], res['lowest'],
                                                 'in band' if ok else 'MISSED', tally_text(res['sdk'])))
    print('  limit (s:limit): %s' % trace)
    print('  backoffs: %s' % ', '.join('%d→%d %s' % b for b in res['backoffs']))
    return ok, dict(res, band=[lo, hi])


def report_overload(r, res, cap=CAP, top=None):
    """Target: served >= 0.8x the oracle's, the limit at the end >= 0.85·cap (and <= top)."""
    a, o = res['adaptive'], res['oracle']
    served = [s['sdk']['ok'] + s['sdk'].get('stopped', 0) for s in (a, o)]
    ratio = served[0] / served[1] if served[1] else 0.0
    ok = ratio >= 0.8 and a['limit'] >= 0.85 * cap and (top is None or a['limit'] <= top)
    trace = ' '.join('%g:%d' % (t, l) for t, l, _ in a['limits'][::4])
    print('run %d: served %.2f of the oracle, limit %d at the end (%s)' % (
        r, ratio, a['limit'], 'met' if ok else 'MISSED'))
    print('  adaptive: %s' % tally_text(a['sdk']))
    print('  oracle:   %s' % tally_text(o['sdk']))
    print('  limit (s:limit): %s' % trace)
    print('  backoffs: %s' % ', '.join('%d→%d %s' % b for b in a['backoffs']))
    if os.environ.get('SLUICE_BENCH_TRACE'):  # why the limit moved, for whoever tunes it
        for e in a['events']:
            print('  event %s' % json.dumps(e))
    return ok, dict(res, ratio=ratio)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--build', required=True, help='a build tree with shim/ and node/ (the test preset)')
    ap.add_argument('--case', choices=('rate', 'overload', 'stream'), default='rate')
    ap.add_argument('--runs', type=int, default=3)
    ap.add_argument('--seconds', type=int)
    ap.add_argument('--workers', type=int)
    ap.add_argument('--retries', type=int, default=2, help="the SDK's maxRetries (its default: 2)")
    ap.add_argument('--proxy-arg', action='append', default=[],
                    help="one more argument for the adaptive proxy (repeatable)")
    ap.add_argument('--sim-arg', action='append', default=[],
                    help="one more argument for the simulator, both runs (repeatable), e.g. "
                         "--sim-arg=--abandoned --sim-arg=free")
    ap.add_argument('--json', help='write the rows here')
    opts = ap.parse_args()
    rate = opts.case == 'rate'
    stream = opts.case == 'stream'
    opts.seconds = opts.seconds or (45 if rate else 60 if stream else 20)
    opts.workers = opts.workers or (32 if rate or stream else 64)
    node_modules = os.path.join(os.path.abspath(opts.build), 'node', 'node_modules')
    if not os.path.exists(os.path.join(node_modules, 'openai', 'package.json')):
        die('no OpenAI Node SDK in %s (cmake --workflow --preset test installs it)' % node_modules)
    for tool in ('nginx', 'node') if rate else ('node',):
        if not shutil.which(tool):
            die('%s is not installed' % tool)
    if rate:
        print('R·L %.1f, band [%.1f, %.1f]; %d workers, maxRetries %d, %d s a run'
              % (RL, 0.8 * RL, 1.25 * RL, opts.workers, opts.retries, opts.seconds))
    elif stream:
        print('cap %d, streams; %d workers, timeout 5 s, every 4th stopped, maxRetries %d, '
              '%d s a run' % (STREAM_CAP, opts.workers, opts.retries, opts.seconds))
    else:
        print('cap %d; %d workers, timeout 250 ms, maxRetries %d, %d s a run'
              % (CAP, opts.workers, opts.retries, opts.seconds))
    rows, met = [], 0
    for r in range(1, opts.runs + 1):
        res = (rate_run if rate else overload_run)(opts, 7100 + r, node_modules)
        if rate:
            ok, row = report_rate(r, res)
        elif stream:
            ok, row = report_overload(r, res, STREAM_CAP, STREAM_CAP)
        else:
            ok, row = report_overload(r, res)
        met += ok
        rows.append(dict(row, case=opts.case, run=r, met=ok, workers=opts.workers,
                         retries=opts.retries))
    print('%d of %d runs met the target' % (met, opts.runs))
    if opts.json:
        with open(opts.json, 'w') as f:
            json.dump(rows, f, indent=1)
    return 0 if met == opts.runs else 1


if __name__ == '__main__':
    sys.exit(main())
