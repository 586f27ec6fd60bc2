#!/usr/bin/env bash
# A Wharf node's memory against the size of its page cache (`--cache-mb`):
# for each size given, a fresh three-node cluster on 127.0.0.1:7701-7703
# takes a million 128 B messages from 4 pipelined publishers (window 256,
# R3), then fills another stream with a million and drains it with 3
# workers pulling batches of 100, then publishes a million to a new stream
# three more times (each bench deletes its stream at the end). After each
# step it prints each server's peak and current RSS (VmHWM, VmRSS), and the
# rate of the first two, so a smaller cache's cost in speed shows beside
# what it saves, and memory that a deleted stream does not give back
# would show as growth from round to round.
#
#   bench/memory.sh                 # cache sizes 256 (the default), 64, 16
#   bench/memory.sh 128 32          # these sizes, MiB
#   WHARF=/tmp/wharf-x bench/memory.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath "${WHARF:-$ROOT/target/release/wharf}")
. "$ROOT/bench/lib.sh"
bench_run_dir memory
wharf_addrs 770
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(256 64 16)

rss() {
  local id
  for id in 1 2 3; do
    awk -v n="$id" '/^VmHWM/ {hwm = $2} /^VmRSS/ {rss = $2}
      END {printf "  node %s: peak %d MiB, now %d MiB\n", n, hwm / 1024, rss / 1024}' \
      "/proc/${WHARF_PID[$id]}/status"
  done
}

rate() {
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
side = r["consume"] if sys.argv[2] == "consume" else r["publish"]
rate, errors = side["msgs_per_s"], side.get("errors", 0)
print(f"  {sys.argv[2]}: {rate:,.0f} msgs/s, {errors} errors")' "$1" "$2"
}

for mb in "${SIZES[@]}"; do
  echo "== --cache-mb $mb"
  start_wharf_cluster "$BIN" "$RUN/c$mb-n" --cache-mb "$mb"
  "$BIN" --server "$WHARF_SERVERS" bench --stream MEMPUB --pub 4 --window 256 --msgs 1000000 \
    --size 128 --json --quiet >"$RUN/pub.json"
  rate "$RUN/pub.json" publish
  rss
  "$BIN" --server "$WHARF_SERVERS" bench --stream MEMQ --pub 0 --sub 3 --batch 100 --msgs 1000000 \
    --size 128 --json --quiet >"$RUN/queue.json"
  rate "$RUN/queue.json" consume
  rss
  # Each bench deletes its stream at the end: further streams of the same
  # size should reuse the freed memory, not add to it.
  for round in 1 2 3; do
    "$BIN" --server "$WHARF_SERVERS" bench --stream "MEMAGAIN$round" --pub 4 --window 256 \
      --msgs 1000000 --size 128 --json --quiet >"$RUN/again.json"
    echo "  another million published, stream deleted (round $round):"
    rss
  done
  stop_wharf_nodes
done
