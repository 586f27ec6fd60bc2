#!/usr/bin/env bash
# Where a node's heap goes: the three nodes of a cluster on
# 127.0.0.1:7791-7793 run under heaptrack while MSGS 128 B messages are
# published (4 publishers, window 256, R3; the bench deletes its stream at
# the end), then another MSGS are filled into a stream and drained by 3
# workers pulling batches of 100. For each node it prints heaptrack's peak
# heap and peak RSS, and the Wharf call sites that held the most of the
# heap at its peak (bench/heap_sites.py).
#
# Needs heaptrack (`apt-get install heaptrack`) and a binary with line
# tables: the debug build has them, the release build does not.
#
#   bench/heap.sh                      # 300,000 each, target/debug/wharf
#   WHARF=/tmp/wharf-dbg bench/heap.sh 100000
#   KEEP_DIR=/tmp/heap bench/heap.sh   # keep the heaptrack files there
#   STEPS=queue SERVER_FLAGS="--cache-mb 16" bench/heap.sh 1000000
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath "${WHARF:-$ROOT/target/debug/wharf}")
MSGS=${1:-300000}
TOP=${TOP:-12}
STEPS=${STEPS:-publish queue}
read -r -a FLAGS <<<"${SERVER_FLAGS:-}"
command -v heaptrack >/dev/null || { echo "heaptrack not found" >&2; exit 1; }
. "$ROOT/bench/lib.sh"
bench_run_dir heap
OUT=${KEEP_DIR:-$RUN}
mkdir -p "$OUT"
wharf_addrs 779

for id in 1 2 3; do
  heaptrack -o "$OUT/node$id" "$BIN" server --node-id "$id" \
    --listen "127.0.0.1:${WHARF_PORT_BASE}$id" --data "$RUN/n$id" --peers "$WHARF_PEERS" \
    "${FLAGS[@]}" >>"$RUN/n$id.log" 2>&1 &
  WHARF_PID[$id]=$!
done
"$BIN" --server "$WHARF_SERVERS" --retry-for 120s cluster status >/dev/null
for step in $STEPS; do
  case $step in
    publish) flags=(--stream HEAPPUB --pub 4 --window 256) ;;
    queue) flags=(--stream HEAPQ --pub 0 --sub 3 --batch 100) ;;
    *) echo "unknown step $step (publish, queue)" >&2; exit 1 ;;
  esac
  "$BIN" --server "$WHARF_SERVERS" bench "${flags[@]}" --msgs "$MSGS" --size 128 --quiet |
    grep -E '^(Publish|Consume):'
done
# TERM, not KILL, and to the servers alone: heaptrack's wrapper script has
# the same arguments, and a wrapper that is signalled kills its
# interpreter on the way out, leaving its file cut short. So only the
# wrapper's child that is the server (-P), whose exit lets the interpreter
# finish and the wrapper end.
for id in 1 2 3; do
  pkill -TERM -P "${WHARF_PID[$id]}" -f -- "--data $RUN/n$id( |\$)" || true
done
for id in 1 2 3; do wait "${WHARF_PID[$id]}" || true; done
WHARF_PID=()

for id in 1 2 3; do
  file=$(ls "$OUT/node$id".zst "$OUT/node$id".gz 2>/dev/null | head -1 || true)
  echo "== node $id ($file)"
  # Exits non-zero on a file with no heap at its peak (one cut short).
  python3 "$ROOT/bench/heap_sites.py" "$file" "$TOP"
done
