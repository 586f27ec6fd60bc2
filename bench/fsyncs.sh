#!/usr/bin/env bash
# How busy the disk is under the latency-bound workloads: each one runs on a
# fresh three-node cluster (127.0.0.1:7801-7803) under
# `perf trace -s -e fdatasync -a`, and the script prints, per workload, the
# bench's rate and, for the nodes' journal syncs (which make every Raft
# append durable: on the `wharf-flusher` threads, and since c244e93 a
# follower's on its runtime's `tokio-rt-worker` threads when the journal is
# idle), their fdatasyncs per message, their mean fdatasync, and their
# fdatasync time per message (the three nodes summed) beside the time per message at the bench's rate: over 100%
# means two or more nodes were syncing at once, on this machine's one disk.
#
#   SKIP_BUILD=1 bench/fsyncs.sh | tee bench/results/fsyncs-$(date -u +%Y%m%d).txt
#
# Needs perf (Debian's linux-perf) with the syscalls tracepoints. The count
# includes the syncs of the queue workloads' unmeasured fill (3,000
# messages published with a window of 256). perf trace adds to the time of
# each traced fdatasync. Everything runs on loopback; the nodes are stopped
# on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHARF=${WHARF:-$ROOT/target/release/wharf}
WORKLOADS=${WORKLOADS:-pub_sync queue_batch1 queue_batch1_acknext}
. "$ROOT/bench/lib.sh"
bench_run_dir fsyncs
wharf_addrs 780

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  (cd "$ROOT" && cargo build --release -p wharf 2>&1 | tail -1) >&2
fi
command -v perf >/dev/null || { echo "fsyncs.sh: needs perf (apt-get install linux-perf)" >&2; exit 1; }

echo "# bench/fsyncs.sh at $(date -u +%FT%TZ) on $(git -C "$ROOT" rev-parse --short HEAD), $(uname -r), $(nproc) cores"
echo "| workload | msgs | msgs/s | us per msg | journal fdatasyncs per msg (of them inline) | mean fdatasync us | fdatasync us per msg | fdatasync time / time |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for name in $WORKLOADS; do
  rm -rf "$RUN"/n?
  start_wharf_cluster "$WHARF" "$RUN/n"
  flags=$(workload_flags "$name")
  # shellcheck disable=SC2086
  perf trace -s -e fdatasync -a -o "$RUN/trace.txt" -- \
    "$WHARF" --server "$WHARF_SERVERS" --retry-for 10s bench $flags --json --quiet >"$RUN/r.json"
  stop_wharf_nodes
  python3 - "$RUN/trace.txt" "$RUN/r.json" "$name" <<'PY'
import json, re, sys
trace, report, name = sys.argv[1:]
r = json.load(open(report))
side = r.get("consume") or r["publish"]
calls = inline = total_ms = 0.0
thread = None
for line in open(trace):
    m = re.match(r"\s*(\S+) \(\d+\), \d+ events", line)
    if m:
        thread = m.group(1)
        continue
    m = re.match(r"\s*fdatasync\s+(\d+)\s+\d+\s+([\d.]+)", line)
    # Only the servers sync on these threads (the bench client never does);
    # sled's own threads (`sled-io-*`) are left out, as is everything else.
    if m and thread in ("wharf-flusher", "tokio-rt-worker"):
        calls += int(m.group(1))
        total_ms += float(m.group(2))
        if thread == "tokio-rt-worker":
            inline += int(m.group(1))
msgs = side["msgs"]
per_msg_us = 1e6 / side["msgs_per_s"]
mean = total_ms * 1000 / calls if calls else 0
sync_per_msg_us = total_ms * 1000 / msgs
print(f"| {name} | {msgs:,} | {side['msgs_per_s']:,.0f} | {per_msg_us:,.0f} "
      f"| {calls / msgs:.2f} ({inline / msgs:.2f}) "
      f"| {mean:,.0f} | {sync_per_msg_us:,.0f} | {sync_per_msg_us / per_msg_us:.0%} |")
PY
done
