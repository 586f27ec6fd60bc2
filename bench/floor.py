#!/usr/bin/env python3
"""What the fsync before each acknowledgement leaves of the latency-bound
rows against a NATS that does not fsync (bench/floor.sh runs it).

    python3 bench/floor.py DISK_RUN.json TMPFS_RUN.json FSYNC_PROBE.txt

DISK_RUN.json and TMPFS_RUN.json are compare.sh summaries (ONLY the rows
below) with Wharf's data on disk and on tmpfs (WHARF_TMPFS=1); NATS ran on
disk in both. FSYNC_PROBE.txt is fsync_probe.py's output, one writer and
three, on the disk the servers use.

Each row is a loop of `clients` clients, each waiting on its own request at
a time, and each turn of a client's loop waits on `commits` Raft commits in
turn: a sync publish on one; a batch-1 worker acking each message on two
(the delivery, then the ack); with the ack riding the next pull, on one. A
commit cannot be acknowledged before at least one node's fdatasync has
ended (two of three must have synced, and they overlap at best). So:

- cycle = clients / msgs_per_s, the time of one turn of one client's loop;
- if Wharf's path apart from the disk were exactly as short as NATS' whole
  cycle, its cycle would be NATS' plus `commits` fdatasyncs, and its ratio at
  most nats / (nats + commits * fsync): the ceiling;
- to reach 1.0, everything Wharf does apart from the disk must fit in
  nats - commits * fsync: the budget, set beside Wharf's cycle on tmpfs
  (everything but the fdatasyncs, which return at once there).

fsync is the probe's p50 of a 400-byte overwrite and fdatasync, with one
writer alone (the cheapest) and with three at once (as the three nodes of
a cluster on this one disk sync together).
"""
import json
import re
import statistics
import sys

ROWS = [
    # workload, clients, commits per turn, label
    ("pub_sync", 1, 1, "sync publish"),
    ("queue_batch1", 3, 2, "batch-1 queue, ack each"),
    ("queue_batch1_acknext", 3, 1, "batch-1 queue, ack next"),
]


def rate_runs(summary, workload, broker):
    for row in summary["rows"]:
        if row["workload"] == workload and row["metric"].endswith("msgs/s"):
            return row[broker + "_runs"]
    return []


def probe_p50(text, writers):
    """Median over the probe's lines of overwrite p50s with this many writers."""
    values = [int(m.group(1)) for m in
              re.finditer(rf"^overwrite\s+x{writers}\s+p50\s+(\d+) us", text, re.M)]
    if not values:
        raise SystemExit(f"floor.py: no 'overwrite x{writers}' line in the probe output")
    return statistics.median(values)


def cycle_us(runs, clients):
    return clients * 1e6 / statistics.median(runs)


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        return 1
    disk, tmpfs = (json.load(open(p)) for p in sys.argv[1:3])
    probe = open(sys.argv[3]).read()
    fsync = {1: probe_p50(probe, 1), 3: probe_p50(probe, 3)}
    print(f"fdatasync p50: {fsync[1]:.0f} us with one writer, {fsync[3]:.0f} us with three at once\n")
    print("| row | NATS cycle us | Wharf cycle us, disk | Wharf cycle us, tmpfs "
          "| measured ratio | ceiling, 1 writer | ceiling, 3 writers "
          "| budget us, 1 writer | tmpfs cycle / budget |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for workload, clients, commits, label in ROWS:
        nats_runs = rate_runs(disk, workload, "nats") + rate_runs(tmpfs, workload, "nats")
        disk_runs = rate_runs(disk, workload, "wharf")
        tmpfs_runs = rate_runs(tmpfs, workload, "wharf")
        if not (nats_runs and disk_runs and tmpfs_runs):
            print(f"| {label} | (no runs in the summaries) |")
            continue
        nats = cycle_us(nats_runs, clients)
        on_disk = cycle_us(disk_runs, clients)
        on_tmpfs = cycle_us(tmpfs_runs, clients)
        ceiling = {w: nats / (nats + commits * f) for w, f in fsync.items()}
        budget = nats - commits * fsync[1]
        over = f"{on_tmpfs / budget:.2f}" if budget > 0 else "no budget"
        print(f"| {label} | {nats:,.0f} | {on_disk:,.0f} | {on_tmpfs:,.0f} | {nats / on_disk:.2f} "
              f"| {ceiling[1]:.2f} | {ceiling[3]:.2f} | {budget:,.0f} | {over} |")
    print("\nNATS cycles pool the NATS runs of both summaries (medians); "
          f"{len(rate_runs(disk, 'pub_sync', 'nats'))} + "
          f"{len(rate_runs(tmpfs, 'pub_sync', 'nats'))} runs of each row.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
