#!/usr/bin/env python3
"""sluice-proxy beside the C proxies it must keep up with, in one run.

    python3 bench/proxy_bench.py --build build/bench [--seconds 5] [--repeats 3] [--json proxy.json]

Against one zero-delay upstream (nginx `return 200` with a chat.completion
body), over loopback:
  direct          the floor: wrk straight at the upstream
  sluice-proxy    --no-discovery --active 4096 (the proxy's own cost), and
  sluice-proxy+d  with discovery on, as a user runs it
  nginx           proxy_pass, keepalive upstream, proxy_buffering off, 1 worker
  haproxy         mode http, http-reuse always, 1 thread
  portkey         Portkey's gateway (@portkey-ai/gateway, Node.js), when installed under
                  BUILD/portkey (see below): provider openai, custom host the upstream
Rows (medians over --repeats runs of wrk, each --seconds long):
  c1    concurrency 1: p50 and p99 latency; "added" = minus direct's
  c64   64 connections: requests/s and p99
  ttfb  a streamed answer (sluice-provider-sim --stream, first byte at once):
        time to the first byte over a kept-alive connection, p50 and p99;
        "added" = minus direct's
  rss   resident memory with 1000 idle kept-alive connections (each made one
        request), and before them
It prints a table with the ratios the issue sets as targets (added p99 over
nginx's, throughput over nginx's, TTFB added p99) and writes JSON rows.
The sluice-proxy is single-threaded; nginx and HAProxy get one worker / one
thread too, so the rows compare one core's worth of proxy each.
Needs nginx, haproxy and wrk (the bench preset's bootstrap installs them).
Portkey's row needs the gateway from npm (the network once; it runs without):
    npm install --prefix BUILD/portkey @portkey-ai/gateway@1.15.2
Its streamed answers fail on Node.js 20 (HTTP 500, "TypeError: immutable" in its
log: Portkey-AI/gateway#1389, #1550), so its TTFB columns say so.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BODY = ('{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"bench",'
        '"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},'
        '"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,'
        '"total_tokens":6}}')
REQUEST = '{"model":"bench","messages":[{"role":"user","content":"Say hi"}]}'
STREAM_REQUEST = '{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}'

WRK_LUA = r'''
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
-- headers
done = function(summary, latency, requests)
  io.write(string.format("JSON {\"p50_us\":%%d,\"p99_us\":%%d,\"rps\":%%.1f,\"errors\":%%d,\"non2xx\":%%d}\n",
    latency:percentile(50), latency:percentile(99),
    summary.requests / (summary.duration / 1e6),
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
''' % REQUEST


def portkey_headers(upstream_port):
    """What Portkey needs to send a chat to an OpenAI-compatible server of our own."""
    return {"x-portkey-provider": "openai",
            "x-portkey-custom-host": "http://127.0.0.1:%d/v1" % upstream_port,
            "Authorization": "Bearer sk-bench"}


def wrk_lua(tmp, name, headers):
    path = os.path.join(tmp, "post-%s.lua" % name)
    with open(path, "w") as f:
        f.write(WRK_LUA.replace("-- headers", "\n".join('wrk.headers["%s"] = "%s"' % kv
                                                         for kv in headers.items())))
    return path


def raw_request(body, headers):
    extra = "".join("%s: %s\r\n" % kv for kv in headers.items())
    return ("POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            "%sContent-Length: %d\r\n\r\n%s" % (extra, len(body), body)).encode()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nothing listens on port %d" % port)


class Procs:
    def __init__(self):
        self.procs = []

    def start(self, argv, **kw):
        p = subprocess.Popen(argv, stdout=kw.pop("stdout", subprocess.DEVNULL),
                             stderr=kw.pop("stderr", subprocess.DEVNULL), **kw)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def nginx_conf(tmp, port, upstream_port=None):
    body = BODY.replace("'", "\\'")
    if upstream_port is None:
        server = f'''
        location / {{ default_type application/json; return 200 '{body}'; }}'''
        upstream = ""
    else:
        upstream = f'''
    upstream up {{ server 127.0.0.1:{upstream_port}; keepalive 128; }}'''
        server = '''
        location / {
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }'''
    name = os.path.join(tmp, "nginx-%d" % port)
    os.makedirs(name, exist_ok=True)
    conf = f'''
worker_processes 1;
daemon off;
pid {name}/nginx.pid;
error_log {name}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    client_body_temp_path {name};
    proxy_temp_path {name};
    fastcgi_temp_path {name};
    uwsgi_temp_path {name};
    scgi_temp_path {name};{upstream}
    server {{
        listen 127.0.0.1:{port} reuseport backlog=4096;{server}
    }}
}}
'''
    path = os.path.join(name, "nginx.conf")
    with open(path, "w") as f:
        f.write(conf)
    return path


def haproxy_conf(tmp, port, upstream_port):
    path = os.path.join(tmp, "haproxy-%d.cfg" % port)
    with open(path, "w") as f:
        f.write(f'''
global
    nbthread 1
    maxconn 8192
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    http-reuse always
    option http-keep-alive
frontend fe
    bind 127.0.0.1:{port}
    default_backend be
backend be
    server up 127.0.0.1:{upstream_port} maxconn 4096
''')
    return path


def wrk(url, conns, seconds, lua):
    threads = 1 if conns == 1 else 2
    out = subprocess.run(["wrk", "-t%d" % threads, "-c%d" % conns, "-d%ds" % seconds, "-s", lua,
                          url], capture_output=True, text=True, check=True).stdout
    m = re.search(r"^JSON (.*)$", out, re.M)
    return json.loads(m.group(1))


def read_answer(sock, buf):
    """Read one HTTP/1.1 answer (Content-Length or chunked); return the leftover bytes."""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, rest = buf.split(b"\r\n\r\n", 1)
    m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
    if m:
        n = int(m.group(1))
        while len(rest) < n:
            rest += sock.recv(65536)
        return rest[n:]
    while not rest.endswith(b"0\r\n\r\n"):  # one request at a time: the last chunk ends it
        rest += sock.recv(65536)
    return b""


def ttfb(port, n, headers=None):
    """Time to the first byte of a streamed answer, on one kept-alive connection (µs); None
    when the answer is not a 200."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    req = raw_request(STREAM_REQUEST, headers or {})
    out, buf = [], b""
    for i in range(n + 20):
        t0 = time.perf_counter_ns()
        s.sendall(req)
        first = s.recv(65536)
        t1 = time.perf_counter_ns()
        if not first.startswith(b"HTTP/1.1 200 "):
            s.close()
            return None
        buf = read_answer(s, first)
        if i >= 20:  # warm-up: connections, caches
            out.append((t1 - t0) / 1000)
    s.close()
    out.sort()
    return {"p50_us": out[len(out) // 2], "p99_us": out[int(len(out) * 0.99)]}


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def rss_idle(port, pids, n=1000, headers=None):
    before = sum(rss_kb(p) for p in pids)
    socks = []
    req = raw_request(REQUEST, headers or {})
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(req)
        read_answer(s, b"")
        socks.append(s)
    time.sleep(0.5)
    after = sum(rss_kb(p) for p in pids)
    for s in socks:
        s.close()
    return {"rss_before_kb": before, "rss_1000_idle_kb": after}


def proc_tree(pid):
    """pid and its children (nginx's worker, haproxy's)."""
    pids = [pid]
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    if int(f.read().split(") ")[1].split()[1]) == pid:
                        pids.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return pids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build/bench", help="the CMake build folder (default build/bench)")
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ttfb-requests", type=int, default=2000)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--portkey", help="Portkey's start-server.js (default: under BUILD/portkey, "
                    "its row is left out when absent)")
    a = ap.parse_args()
    portkey = a.portkey or os.path.join(a.build, "portkey", "node_modules", "@portkey-ai",
                                        "gateway", "build", "start-server.js")
    proxy = os.path.join(a.build, "shim", "sluice-proxy")
    sim = os.path.join(a.build, "shim", "sluice-provider-sim")
    for tool in ("nginx", "haproxy", "wrk"):
        if not shutil.which(tool) and not os.path.exists("/usr/sbin/" + tool):
            sys.exit("proxy_bench: %s is not installed (apt-get install %s)" % (tool, tool))
    for path in (proxy, sim):
        if not os.access(path, os.X_OK):
            sys.exit("proxy_bench: %s not found (cmake --build %s)" % (path, a.build))
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    tmp = tempfile.mkdtemp(prefix="sluice-proxy-bench-")
    lua = wrk_lua(tmp, "plain", {})
    procs = Procs()
    try:
        up = free_port()
        procs.start([nginx, "-c", nginx_conf(tmp, up)])
        wait_port(up)
        sim_proc = procs.start([sim, "--port", "0", "--quiet", "--stream", "--median-ms", "0",
                                "--sigma", "0", "--cap", "100000", "--answer-tokens", "3",
                                "--answer-sigma", "0", "--token-ms", "1"],
                               stdout=subprocess.PIPE)
        sim_port = int(sim_proc.stdout.readline())
        targets = {}

        def add_sluice(name, extra):
            port = free_port()
            p = procs.start([proxy, "--upstream", "http://127.0.0.1:%d" % up, "--listen",
                             "127.0.0.1:%d" % port, "--admin", "off", "--state", "off",
                             "--access-log", "off"] + extra, stdout=subprocess.PIPE)
            p.stdout.readline()
            sport = free_port()
            procs.start([proxy, "--upstream", "http://127.0.0.1:%d" % sim_port, "--listen",
                              "127.0.0.1:%d" % sport, "--admin", "off", "--state", "off",
                              "--access-log", "off"] + extra, stdout=subprocess.PIPE)
            targets[name] = (port, p.pid, sport)

        targets["direct"] = (up, None, sim_port)
        add_sluice("sluice-proxy", ["--no-discovery", "--active", "4096"])
        add_sluice("sluice-proxy+d", [])
        port, sport = free_port(), free_port()
        p = procs.start([nginx, "-c", nginx_conf(tmp, port, up)])
        procs.start([nginx, "-c", nginx_conf(tmp, sport, sim_port)])
        targets["nginx"] = (port, p.pid, sport)
        port, sport = free_port(), free_port()
        p = procs.start([haproxy, "-f", haproxy_conf(tmp, port, up)])
        procs.start([haproxy, "-f", haproxy_conf(tmp, sport, sim_port)])
        targets["haproxy"] = (port, p.pid, sport)
        headers = {name: {} for name in targets}
        if os.path.exists(portkey):  # one process per upstream, as for the others
            port, sport = free_port(), free_port()
            p = procs.start(["node", portkey, "--port=%d" % port, "--headless"])
            procs.start(["node", portkey, "--port=%d" % sport, "--headless"])
            targets["portkey"] = (port, p.pid, sport)
            headers["portkey"] = portkey_headers(up)
            headers["portkey-stream"] = portkey_headers(sim_port)
        for port, _, sport in targets.values():
            wait_port(port)
            wait_port(sport)

        rows = []
        for name, (port, pid, sport) in targets.items():
            url = "http://127.0.0.1:%d/v1/chat/completions" % port
            lua = wrk_lua(tmp, name, headers[name])
            wrk(url, 1, 1, lua)  # warm-up: upstream connections, discovery's first windows
            c1 = [wrk(url, 1, a.seconds, lua) for _ in range(a.repeats)]
            c64 = [wrk(url, 64, a.seconds, lua) for _ in range(a.repeats)]
            t = [ttfb(sport, a.ttfb_requests, headers.get(name + "-stream"))
                 for _ in range(a.repeats)]
            t = [x for x in t if x] or [{"p50_us": None, "p99_us": None}]  # failed
            row = {"impl": name,
                   "c1_p50_us": statistics.median(r["p50_us"] for r in c1),
                   "c1_p99_us": statistics.median(r["p99_us"] for r in c1),
                   "c64_rps": statistics.median(r["rps"] for r in c64),
                   "c64_p99_us": statistics.median(r["p99_us"] for r in c64),
                   "c64_errors": sum(r["errors"] + r["non2xx"] for r in c64),
                   "ttfb_p50_us": t[0]["p50_us"] and statistics.median(r["p50_us"] for r in t),
                   "ttfb_p99_us": t[0]["p99_us"] and statistics.median(r["p99_us"] for r in t)}
            if pid:
                row.update(rss_idle(port, proc_tree(pid), headers=headers[name]))
            rows.append(row)
            print("  measured %s" % name, file=sys.stderr)
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)

    direct = rows[0]
    for r in rows:
        r["c1_added_p50_us"] = r["c1_p50_us"] - direct["c1_p50_us"]
        r["c1_added_p99_us"] = r["c1_p99_us"] - direct["c1_p99_us"]
        for q in ("p50", "p99"):
            t = r["ttfb_%s_us" % q]
            r["ttfb_added_%s_us" % q] = None if t is None else t - direct["ttfb_%s_us" % q]
    ng = next(r for r in rows if r["impl"] == "nginx")
    print("\n%-15s %9s %9s %9s %9s %10s %9s %9s %9s %9s %10s" % (
        "impl", "c1 p50", "c1 p99", "added p50", "added p99", "c64 req/s", "c64 errs", "c64 p99",
        "ttfb p50+", "ttfb p99+", "RSS 1000"))
    us = lambda v: "fails" if v is None else "%.0fus" % v  # noqa: E731
    for r in rows:
        print("%-15s %7.0fus %7.0fus %7.0fus %7.0fus %10.0f %9d %7.0fus %9s %9s %8s" % (
            r["impl"], r["c1_p50_us"], r["c1_p99_us"], r["c1_added_p50_us"], r["c1_added_p99_us"],
            r["c64_rps"], r["c64_errors"], r["c64_p99_us"], us(r["ttfb_added_p50_us"]),
            us(r["ttfb_added_p99_us"]),
            "%d KiB" % r["rss_1000_idle_kb"] if "rss_1000_idle_kb" in r else "-"))
    print("\ntargets (sluice-proxy against nginx):")
    for r in rows:
        if not r["impl"].startswith("sluice"):
            continue
        added = r["c1_added_p99_us"] / ng["c1_added_p99_us"] if ng["c1_added_p99_us"] > 0 else float("nan")
        print("  %-15s added p99 %.2fx nginx's (target <= 1.25), throughput %.2fx nginx's "
              "(target >= 0.8), TTFB added p99 %.0f us (target <= 300)%s" % (
                  r["impl"], added, r["c64_rps"] / ng["c64_rps"], r["ttfb_added_p99_us"],
                  "; its c64 runs had %d errors or non-2xx answers, so its req/s is not a "
                  "throughput" % r["c64_errors"] if r["c64_errors"] else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
