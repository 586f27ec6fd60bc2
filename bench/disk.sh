#!/usr/bin/env bash
# Where a Wharf node's disk goes: publishes 1,000,000 messages of 128 B
# (window 256, R3) to a fresh three-node cluster on 127.0.0.1:7601-7603 in
# three steps (100,000, then 400,000, then 500,000) and after each prints
# the growth per node and node 1's largest paths (du, apparent bytes).
# bench/compare.sh measures 100,000 and scales; this checks that against a
# real million and names the parts (sled's files, the journal, snapshots).
#
#   bench/disk.sh [BINARY]          # default target/release/wharf
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath "${1:-$ROOT/target/release/wharf}")
. "$ROOT/bench/lib.sh"
bench_run_dir disk
wharf_addrs 760
start_wharf_cluster "$BIN" "$RUN/n"
nodes=("$RUN/n1" "$RUN/n2" "$RUN/n3")
sync
before=$(du -sbc "${nodes[@]}" | tail -1 | cut -f1)
total=0
for step in 100000 400000 500000; do
  "$BIN" --server "$WHARF_SERVERS" bench --stream DISK --pub 1 --window 256 --msgs "$step" \
    --size 128 --keep --json --quiet >"$RUN/bench.json"
  total=$((total + step))
  sleep 2
  sync
  after=$(du -sbc "${nodes[@]}" | tail -1 | cut -f1)
  echo "after $total messages: $(((after - before) / 3)) bytes per node ($(((after - before) / 3 / total)) per message)"
  (cd "$RUN/n1" && du -ab . | sort -n | tail -6)
done
