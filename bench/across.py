#!/usr/bin/env python3
"""Medians across several bench/compare.sh runs: one table per NATS setup.

    bench/across.py bench/results/<stamp>.json [more .json ...]

Each file is a run's summary as bench/summarize.py writes it (medians of that
run's reps, the Wharf/NATS ratio per row). Runs are grouped by the NATS side
(version, and whether it fsyncs before acknowledging); runs with a setting
that changes what is compared (Wharf on tmpfs, the servers or clients held
to a thread count, the vCPUs kept awake) are left out and named, so the
table stays the default-against-default comparison. For each row it prints
how many runs had it, the median of the runs' Wharf and NATS medians, the
median of their ratios, the ratios' range, and in how many runs Wharf was at
least as good. A run that lacked a row (a run of some workloads only) does
not count for it. Standard library only.
"""

import json
import statistics
import sys

from summarize import fmt

# Settings in raw/machine.txt under which a run is not a default-against-default one.
NOT_DEFAULT = {
    "WHARF_TMPFS": "0",
    "THREADS_PER_NODE": "",
    "CLIENT_THREADS": "",
    "KEEP_CPUS_AWAKE": "0",
}


def setting(machine, name):
    """A setting of raw/machine.txt; None where the run did not record it
    (runs before the setting existed ran at its default)."""
    for line in machine.splitlines():
        if line.startswith(name + "="):
            return line.split("=", 1)[1].strip()
    return None


def nats_side(machine):
    version = "?"
    for line in machine.splitlines():
        if line.startswith("nats-server:"):
            version = line.split(":", 1)[1].strip().lstrip("v")
    fsyncs = setting(machine, "NATS_SYNC_ALWAYS") == "1"
    return f"NATS {version}" + (" with sync_interval: always" if fsyncs else ", no fsync before ack")


def main():
    paths = sys.argv[1:]
    if not paths or paths[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr if not paths else sys.stdout)
        return 1 if not paths else 0
    groups = {}
    for path in paths:
        try:
            with open(path) as fh:
                run = json.load(fh)
        except (OSError, json.JSONDecodeError) as e:
            print(f"across.py: cannot read {path}: {e}", file=sys.stderr)
            return 1
        machine = run.get("machine", "")
        off = [f"{k}={setting(machine, k)}" for k, default in NOT_DEFAULT.items()
               if setting(machine, k) not in (None, default)]
        if off:
            print(f"left out {run.get('stamp', path)}: {', '.join(off)}")
            continue
        groups.setdefault(nats_side(machine), []).append(run)

    for side, runs in groups.items():
        stamps = ", ".join(
            r["stamp"] + (f" at {setting(r.get('machine', ''), 'WHARF_CHECKOUT')}"
                          if setting(r.get("machine", ""), "WHARF_CHECKOUT") else "")
            for r in runs)
        print(f"\nWharf vs {side}: {len(runs)} run(s) ({stamps})\n")
        print("| workload | runs | Wharf | NATS | Wharf/NATS, median | range | runs Wharf at least as good |")
        print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
        order = []
        by_metric = {}
        for run in runs:
            for row in run["rows"]:
                if row.get("wharf") is None or row.get("nats") is None:
                    continue
                if row["metric"] not in by_metric:
                    order.append(row["metric"])
                by_metric.setdefault(row["metric"], []).append(row)
        for metric in order:
            rows = by_metric[metric]
            wharf = statistics.median(r["wharf"] for r in rows)
            nats = statistics.median(r["nats"] for r in rows)
            ratios = [r["ratio"] for r in rows if r.get("ratio") is not None]
            good = sum(1 for r in rows if r.get("wharf_better_or_equal"))
            if ratios:
                median_ratio = fmt(statistics.median(ratios))
                spread = f"{fmt(min(ratios))}-{fmt(max(ratios))}"
            else:
                median_ratio, spread = "-", "-"
            print(f"| {metric} | {len(rows)} | {fmt(wharf)} | {fmt(nats)} | {median_ratio} | {spread} | {good} of {len(rows)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
