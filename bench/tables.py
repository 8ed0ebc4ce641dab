#!/usr/bin/env python3
"""Render sluice-bench --json output as the Markdown tables in bench/RESULTS.md.

usage: bench/tables.py bench.json [discovery.json]
"""
import json
import sys


def fmt_ns(v):
    if v is None:
        return ""
    if v >= 1e6:
        return f"{v / 1e6:.2f} ms"
    if v >= 1e3:
        return f"{v / 1e3:.1f} µs"
    return f"{v:.1f} ns"


def fmt_rate(v):
    if v is None:
        return ""
    return f"{v / 1e6:.2f} M/s" if v >= 1e5 else f"{v / 1e3:.1f} k/s"


def primitives(rows):
    order = []
    for r in rows:
        key = (r["case"], r["threads"])
        if key not in order:
            order.append(key)
    print("| case | threads | impl | median | p99 | throughput | p99.9 wait | max wait | sluice ahead by |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case, threads in order:
        group = [r for r in rows if r["case"] == case and r["threads"] == threads]
        ours = next((r for r in group if r["impl"] == "sluice"), None)
        for r in group:
            ratio = ""
            if ours and r is not ours and ours.get("ops_per_s") and r.get("ops_per_s"):
                ratio = f"×{ours['ops_per_s'] / r['ops_per_s']:.2f}"
            print(f"| `{case}` | {threads} | {r['impl']} | {fmt_ns(r.get('median_ns'))} | "
                  f"{fmt_ns(r.get('p99_ns'))} | {fmt_rate(r.get('ops_per_s'))} | "
                  f"{fmt_ns(r.get('p999_ns'))} | {fmt_ns(r.get('max_wait_ns'))} | {ratio} |")


def columns(rows):
    """The implementations and the cases, each in the order they first appear."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    return impls, cases


def discovery(rows):
    robust_rows = [r for r in rows if r["case"].startswith("discovery.robust.")]
    rows = [r for r in rows if not r["case"].startswith("discovery.robust.")]
    impls, cases = columns(rows)
    print("Each cell: goodput ratio / reject share / p99 latency (s); the locked")
    print("ceiling and true cap are in the first column.\n")
    print("| scenario (cap → sluice ceiling) | " + " | ".join(impls) + " |")
    print("|---|" + "---|" * len(impls))
    for case in cases:
        by = {r["impl"]: r for r in rows if r["case"] == case}
        d = by.get("discover", {})
        head = f"`{case.removeprefix('discovery.')}` ({d.get('true_cap', 0):.3g} → {d.get('locked_ceiling', 0):.3g})"
        cells = []
        for impl in impls:
            r = by.get(impl)
            cells.append("" if r is None else
                         f"{r['goodput_ratio']:.3f} / {r['reject_share']:.3f} / {r['p99_latency_s']:.1f}")
        print(f"| {head} | " + " | ".join(cells) + " |")
    if robust_rows:
        print()
        robust(robust_rows)


def robust(rows):
    """One row per mode and cap; per implementation: seeds outside the band
    (or missing the scenario's target) / median goodput / worst goodput /
    p99 over the oracle's."""
    impls, cases = columns(rows)
    seeds = int(rows[0]["seeds"])
    print(f"Each cell: seeds outside the band (of {seeds}) / median goodput / worst goodput /")
    print("p99 ÷ the oracle's.\n")
    print("| mode, cap | " + " | ".join(impls) + " |")
    print("|---|" + "---|" * len(impls))
    for case in cases:
        by = {r["impl"]: r for r in rows if r["case"] == case}
        cells = []
        for impl in impls:
            r = by.get(impl)
            cells.append("" if r is None else
                         f"{r['outside_band']:g} / {r['gp_median']:.3f} / {r['gp_worst']:.3f} / "
                         f"{r['p99_ratio']:.2f}")
        print(f"| `{case.removeprefix('discovery.robust.')}` | " + " | ".join(cells) + " |")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip())
    for path in sys.argv[1:]:
        with open(path) as f:
            rows = json.load(f)
        if rows and rows[0]["case"].startswith("discovery."):
            discovery(rows)
        else:
            primitives(rows)
        print()


if __name__ == "__main__":
    main()
