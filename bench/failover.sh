#!/usr/bin/env bash
# Wharf's failover gap alone: kill -9 of the stream leader under sync
# publishing, repeated, with the server flags given.
#
#   bench/failover.sh                                  # 5 runs, default Raft timing
#   RUNS=3 SERVER_FLAGS="--election-min-ms 500 --election-max-ms 1000" bench/failover.sh
#   WHARF=target/debug/wharf bench/failover.sh         # another binary
#
# Each run starts a fresh three-node cluster on 127.0.0.1:7201-7203, runs
# `wharf bench --pub 1 --duration 12s` (sync publishes, a fresh R3 stream),
# kills the stream's leader with SIGKILL after 4 s, and prints the bench's
# longest gap between two publish acks (`max_ack_gap_ms`) and its error
# count. Everything runs on loopback; every process is stopped on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHARF=${WHARF:-$ROOT/target/release/wharf}
RUNS=${RUNS:-5}
SERVER_FLAGS=${SERVER_FLAGS:-}
. "$ROOT/bench/lib.sh"
bench_run_dir failover
wharf_addrs 720

echo "run max_ack_gap_ms errors acked_msgs (flags: ${SERVER_FLAGS:-defaults})"
gaps=()
for run in $(seq 1 "$RUNS"); do
  dir="$RUN/run$run"
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  start_wharf_cluster "$WHARF" "$dir/n" $SERVER_FLAGS
  "$WHARF" --server "$WHARF_SERVERS" bench --pub 1 --duration 12s --size 128 --json --quiet \
    >"$dir/bench.json" 2>"$dir/bench.err" &
  bench=$!
  sleep 4
  leader=$("$WHARF" --server "$WHARF_SERVERS" cluster status --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(next(g["leader"] for g in s["groups"] if g["kind"] == "stream"))')
  kill -9 "${WHARF_PID[$leader]}"
  wait "${WHARF_PID[$leader]}" 2>/dev/null || true
  unset "WHARF_PID[$leader]"
  wait "$bench" || true
  python3 - "$dir/bench.json" "$run" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
p = r["publish"]
print(sys.argv[2], p["max_ack_gap_ms"], p.get("errors", 0), p.get("acked", p.get("msgs", "?")))
EOF
  stop_wharf_nodes
done
