#!/usr/bin/env python3
"""Summarize one bench/compare.sh run: medians per workload, Wharf/NATS ratio.

    bench/summarize.py bench/results/<stamp>

Reads <stamp>/raw/<workload>.<broker>.<rep>.json (the JSON reports of
`wharf bench --json` and `nats-bench-driver bench --json`, one shape), plus the
disk and memory files compare.sh writes, prints one table, and writes
<stamp>.json (every figure and the runs it is the median of) and <stamp>.svg
(a chart of the ratios) next to the <stamp> directory. Standard library only.
"""

import glob
import json
import math
import os
import statistics
import sys

# (workload, label, path in the report, which way is better)
METRICS = [
    ("pub_sync", "sync publish, msgs/s", ("publish", "msgs_per_s"), "higher"),
    ("pub_sync", "sync publish, ack p50 us", ("publish", "ack_latency_us", "p50"), "lower"),
    ("pub_sync", "sync publish, ack p99 us", ("publish", "ack_latency_us", "p99"), "lower"),
    ("pub_async_w256", "async publish (window 256), msgs/s", ("publish", "msgs_per_s"), "higher"),
    ("pub_async_w256", "async publish (window 256), ack p99 us", ("publish", "ack_latency_us", "p99"), "lower"),
    ("queue_batch1", "work queue, 3 workers, batch 1, msgs/s", ("consume", "msgs_per_s"), "higher"),
    ("queue_batch1_acknext", "work queue, 3 workers, batch 1, acks with the next pull, msgs/s", ("consume", "msgs_per_s"), "higher"),
    ("queue_batch100", "work queue, 3 workers, batch 100, msgs/s", ("consume", "msgs_per_s"), "higher"),
    # e2e_rate<N> rows go here, one set per rate run (open_loop_metrics)
    ("failover", "failover, longest ack gap ms", ("publish", "max_ack_gap_ms"), "lower"),
    ("failover", "failover, publish errors", ("publish", "errors"), "lower"),
]
OPEN_LOOP_AT = METRICS.index(next(m for m in METRICS if m[0] == "failover"))


def open_loop_metrics(rate):
    """The rows of one open-loop run at `rate` msgs/s (compare.sh's e2e_rate<rate>)."""
    w = f"e2e_rate{rate}"
    return [
        (w, f"{rate} msgs/s open loop, ack p50 us", ("publish", "ack_latency_us", "p50"), "lower"),
        (w, f"{rate} msgs/s open loop, ack p99 us", ("publish", "ack_latency_us", "p99"), "lower"),
        (w, f"{rate} msgs/s open loop, end-to-end p50 us", ("consume", "e2e_latency_us", "p50"), "lower"),
        (w, f"{rate} msgs/s open loop, end-to-end p99 us", ("consume", "e2e_latency_us", "p99"), "lower"),
    ]


def metrics_for(runs):
    """METRICS, with the open-loop rows of every rate the run has, by rate."""
    rates = sorted({int(w[len("e2e_rate"):]) for (w, _) in runs
                    if w.startswith("e2e_rate") and w[len("e2e_rate"):].isdigit()})
    open_loop = [row for rate in rates for row in open_loop_metrics(rate)]
    return METRICS[:OPEN_LOOP_AT] + open_loop + METRICS[OPEN_LOOP_AT:]


def dig(report, path):
    v = report
    for k in path:
        if not isinstance(v, dict) or v.get(k) is None:
            return None
        v = v[k]
    return v


def load(raw):
    runs = {}
    for f in sorted(glob.glob(os.path.join(raw, "*.*.*.json"))):
        name, broker, rep = os.path.basename(f)[: -len(".json")].split(".", 2)
        if not rep.isdigit():
            continue
        with open(f) as fh:
            try:
                report = json.load(fh)
            except json.JSONDecodeError:
                report = {"failed": True}
        runs.setdefault((name, broker), []).append(report)
    return runs


def fmt(v):
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.2f}".rstrip("0").rstrip(".")


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError):
        return None


def main():
    args = sys.argv[1:]
    if args in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: bench/summarize.py bench/results/<stamp>", file=sys.stderr)
        return 1
    out_dir = os.path.abspath(args[0])
    raw = os.path.join(out_dir, "raw")
    runs = load(raw)
    if not runs:
        # Writing a table of empty rows would look like a run that measured nothing.
        print(f"summarize.py: no run reports under {raw}", file=sys.stderr)
        return 1
    rows = []
    for workload, label, path, better in metrics_for(runs):
        entry = {"workload": workload, "metric": label, "better": better}
        for broker in ("wharf", "nats"):
            values = [dig(r, path) for r in runs.get((workload, broker), [])]
            values = [v for v in values if v is not None]
            entry[broker + "_runs"] = values
            entry[broker] = statistics.median(values) if values else None
        w, n = entry["wharf"], entry["nats"]
        entry["ratio"] = round(w / n, 3) if w is not None and n else None
        if entry["ratio"] is not None:
            entry["wharf_better_or_equal"] = entry["ratio"] >= 1 if better == "higher" else entry["ratio"] <= 1
        elif w is not None and n is not None:
            # NATS at zero: no ratio, but the medians still compare (0 errors each is a tie).
            entry["wharf_better_or_equal"] = w >= n if better == "higher" else w <= n
        rows.append(entry)

    extras = {}
    for broker in ("wharf", "nats"):
        disk = read_json(os.path.join(raw, f"disk.{broker}.json"))
        if disk:
            used = disk["bytes_after"] - disk["bytes_before"]
            disk["bytes_per_million_msgs_all_nodes"] = round(used * 1_000_000 / disk["msgs"])
            disk["bytes_per_million_msgs_per_node"] = round(used * 1_000_000 / disk["msgs"] / disk["replicas"])
        mem = read_json(os.path.join(raw, f"memory.{broker}.json"))
        killed = read_json(os.path.join(raw, f"failover.{broker}.killed.json"))
        extras[broker] = {"disk": disk, "memory": mem, "failover_killed": killed}
    reps = max((len(v) for (w, _), v in runs.items() if w != "failover"), default=0)
    machine = ""
    try:
        with open(os.path.join(raw, "machine.txt")) as fh:
            machine = fh.read().strip()
    except OSError:
        pass

    print(f"\nWharf vs NATS JetStream, medians of {reps} run(s) (failover: 1 run)\n")
    print("| workload | Wharf | NATS | Wharf/NATS | better |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in rows:
        mark = "" if r.get("wharf_better_or_equal") is None else ("yes" if r["wharf_better_or_equal"] else "no")
        print(f"| {r['metric']} | {fmt(r['wharf'])} | {fmt(r['nats'])} | {fmt(r['ratio'])} | {r['better']} is better; Wharf at least as good: {mark} |")
    for broker in ("wharf", "nats"):
        e = extras[broker]
        if e["disk"]:
            print(f"\n{broker}: disk per million 128 B messages at R3: "
                  f"{e['disk']['bytes_per_million_msgs_per_node'] / 1e6:.0f} MB per node")
        if e["memory"]:
            kb = e["memory"]["vm_hwm_kb"]
            print(f"{broker}: peak RSS per server (MB): " + ", ".join(f"{v / 1024:.0f}" for v in kb.values()))

    nats_version, nats_fsyncs = nats_setup(machine)
    if nats_fsyncs:
        note = f"nats-server {nats_version} with sync_interval: always (fsync before ack); Wharf fsyncs on a majority first"
    else:
        note = f"nats-server {nats_version} acknowledges before fsync; Wharf fsyncs on a majority first"
    threads = machine_setting(machine, "THREADS_PER_NODE")
    if threads:
        note += f"; every server on {threads} thread(s) (Wharf --worker-threads, NATS GOMAXPROCS)"
    client_threads = machine_setting(machine, "CLIENT_THREADS")
    if client_threads:
        note += f"; both bench clients on {client_threads} runtime thread(s) (TOKIO_WORKER_THREADS)"
    if "KEEP_CPUS_AWAKE=1" in machine:
        note += "; a SCHED_IDLE busy loop per core kept the vCPUs from halting (KEEP_CPUS_AWAKE=1)"
    wharf_tmpfs = machine_setting(machine, "WHARF_TMPFS") == "1"
    if wharf_tmpfs:
        note = note.replace("Wharf fsyncs on a majority first",
                            "Wharf's data was on tmpfs, where its fsyncs cost nothing (WHARF_TMPFS=1)")
    stamp = os.path.basename(out_dir)
    summary = {"stamp": stamp, "reps": reps, "machine": machine, "rows": rows, "extras": extras,
               "note": note}
    with open(out_dir + ".json", "w") as fh:
        json.dump(summary, fh, indent=2)
    with open(out_dir + ".svg", "w") as fh:
        fh.write(chart(rows, reps, nats_version, nats_fsyncs, wharf_tmpfs))
    print(f"\nwrote {out_dir}.json and {out_dir}.svg")


def machine_setting(machine, name):
    """A setting recorded in raw/machine.txt, such as THREADS_PER_NODE ('' when
    the run left it at its default)."""
    for line in machine.splitlines():
        if line.startswith(name + "="):
            return line.split("=", 1)[1].strip()
    return ""


def nats_setup(machine):
    """(version, fsyncs before ack) of the NATS side, from raw/machine.txt."""
    version = "2.9"
    for line in machine.splitlines():
        if line.startswith("nats-server: v"):
            version = line.split(": v", 1)[1].strip()
    return version, "NATS_SYNC_ALWAYS=1" in machine


def chart(rows, reps, nats_version="2.9", nats_fsyncs=False, wharf_tmpfs=False):
    """Horizontal bars of Wharf's advantage (log2 scale, > 1 = Wharf better)."""
    rows = [r for r in rows if r.get("ratio")]
    left, width, bar_h, top = 330, 420, 22, 50
    height = top + len(rows) * (bar_h + 8) + 50
    span = 5  # 2^-5 .. 2^5
    mid = left + width / 2

    def x(v):
        return mid + max(-span, min(span, math.log2(v))) / span * (width / 2)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 80}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="20" font-size="14" font-weight="bold">Wharf vs NATS JetStream {nats_version} '
           f'(3 nodes, R3, loopback, 2 cores; medians of {reps} runs)</text>',
           '<text x="10" y="38" fill="#555">Bar = how many times better Wharf is (log scale); '
           'left of 1x = NATS better. '
           + ('Wharf on tmpfs (its fsyncs cost nothing), NATS on disk.' if wharf_tmpfs
              else 'Both fsync before acking (NATS sync_interval: always).' if nats_fsyncs
              else 'NATS acks before fsync, Wharf after.') + '</text>']
    for i, r in enumerate(rows):
        adv = r["ratio"] if r["better"] == "higher" else 1 / r["ratio"]
        y = top + i * (bar_h + 8)
        x0, x1 = sorted((mid, x(adv)))
        color = "#2e7d32" if adv >= 1 else "#c62828"
        out.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{r["metric"]}</text>')
        out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="{bar_h}" fill="{color}"/>')
        label = f"{adv:.2f}x"
        tx = x1 + 4 if adv >= 1 else x0 - 4
        anchor = "start" if adv >= 1 else "end"
        out.append(f'<text x="{tx:.1f}" y="{y + 15}" text-anchor="{anchor}">{label}</text>')
    axis_y = top + len(rows) * (bar_h + 8) + 5
    out.append(f'<line x1="{mid}" y1="{top - 5}" x2="{mid}" y2="{axis_y}" stroke="black"/>')
    for p in range(-span, span + 1, 1):
        tx = mid + p / span * (width / 2)
        out.append(f'<line x1="{tx:.1f}" y1="{axis_y}" x2="{tx:.1f}" y2="{axis_y + 4}" stroke="black"/>')
        if p % 2 == 1 or p == 0 or abs(p) == span:
            lab = f"{2 ** p:g}x" if p >= 0 else f"1/{2 ** -p:g}"
            out.append(f'<text x="{tx:.1f}" y="{axis_y + 18}" text-anchor="middle">{lab}</text>')
    out.append("</svg>\n")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
