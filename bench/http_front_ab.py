#!/usr/bin/env python3
"""The HTTP server A/B: sluice-proxy's own front end beside libmicrohttpd's, in one run.

    python3 bench/http_front_ab.py --build build/test [--seconds 5] [--repeats 3] [--json ab.json]

Three servers answer the same fixed chat.completion (238 bytes, no upstream)
to the same POST that proxy_bench.py sends:
  sluice-proxy    sluice-proxy-fixed: the proxy's own sources (listener, epoll
                  loop, parser, bounds, routing, writes) with a fixed answer in
                  place of upstream.c (bench/http_front/fixed_upstream.c)
  mhd-epoll       libmicrohttpd, one internal thread on epoll: the same shape
  mhd-thread      libmicrohttpd, a thread per connection
wrk drives each at 1 and at 64 connections; the repeats are interleaved (A, B,
C, A, B, C, ...) so that a change in the machine's load falls on every row,
and each figure is the median over the repeats. Also per row: the server's
CPU time per request at 64 connections (user + system, all its threads, over
the requests wrk counted: less sensitive to a busy machine than requests/s),
and its resident memory before and with 1000 idle kept-alive connections.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proxy_bench import Procs, free_port, rss_idle, wait_port, wrk, wrk_lua  # noqa: E402


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, every thread


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build/test", help="the CMake build folder")
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    fixed = os.path.join(a.build, "bench", "sluice-proxy-fixed")
    mhd = os.path.join(a.build, "bench", "http-front-mhd")
    for path in (fixed, mhd):
        if not os.access(path, os.X_OK):
            sys.exit("http_front_ab: %s not found (cmake --build %s --target %s)" % (
                path, a.build, os.path.basename(path)))
    tmp = tempfile.mkdtemp(prefix="sluice-http-ab-")
    lua = wrk_lua(tmp, "ab", {})
    hz = os.sysconf("SC_CLK_TCK")
    procs = Procs()
    servers = {}
    try:
        port = free_port()
        p = procs.start([fixed, "--upstream", "http://127.0.0.1:9", "--listen",
                         "127.0.0.1:%d" % port, "--admin", "off", "--state", "off",
                         "--access-log", "off", "--no-discovery", "--active", "4096"],
                        stdout=subprocess.PIPE)
        p.stdout.readline()
        servers["sluice-proxy"] = (port, p.pid)
        for mode in ("epoll", "thread"):
            p = procs.start([mhd, mode], stdout=subprocess.PIPE)
            servers["mhd-" + mode] = (int(p.stdout.readline().decode().rsplit(":", 1)[1]), p.pid)
        for port, _ in servers.values():
            wait_port(port)
        runs = {name: {"c1": [], "c64": [], "cpu": []} for name in servers}
        for name, (port, _) in servers.items():  # warm-up
            wrk("http://127.0.0.1:%d/v1/chat/completions" % port, 1, 1, lua)
        for _ in range(a.repeats):
            for name, (port, pid) in servers.items():
                url = "http://127.0.0.1:%d/v1/chat/completions" % port
                runs[name]["c1"].append(wrk(url, 1, a.seconds, lua))
                t0 = cpu_ticks(pid)
                r = wrk(url, 64, a.seconds, lua)
                runs[name]["cpu"].append((cpu_ticks(pid) - t0) / hz * 1e6 / (r["rps"] * a.seconds))
                runs[name]["c64"].append(r)
            print("  repeat done", file=sys.stderr)
        rows = []
        for name, (port, pid) in servers.items():
            r = runs[name]
            row = {"impl": name,
                   "c1_p50_us": statistics.median(x["p50_us"] for x in r["c1"]),
                   "c1_p99_us": statistics.median(x["p99_us"] for x in r["c1"]),
                   "c1_rps": statistics.median(x["rps"] for x in r["c1"]),
                   "c64_rps": statistics.median(x["rps"] for x in r["c64"]),
                   "c64_p99_us": statistics.median(x["p99_us"] for x in r["c64"]),
                   "c64_errors": sum(x["errors"] + x["non2xx"] for x in r["c64"]),
                   "c64_cpu_us_per_req": statistics.median(r["cpu"]),
                   "c64_rps_all": [x["rps"] for x in r["c64"]]}
            row.update(rss_idle(port, [pid]))
            rows.append(row)
    finally:
        procs.stop_all()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print("\nload average at the end: %s" % " ".join(load))
    print("%-14s %9s %9s %9s %10s %9s %12s %14s" % (
        "impl", "c1 p50", "c1 p99", "c1 req/s", "c64 req/s", "c64 p99", "CPU/req c64",
        "RSS 0 -> 1000"))
    for r in rows:
        print("%-14s %7.0fus %7.0fus %9.0f %10.0f %7.0fus %10.1fus %6d -> %d KiB" % (
            r["impl"], r["c1_p50_us"], r["c1_p99_us"], r["c1_rps"], r["c64_rps"],
            r["c64_p99_us"], r["c64_cpu_us_per_req"], r["rss_before_kb"], r["rss_1000_idle_kb"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"load": load, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
