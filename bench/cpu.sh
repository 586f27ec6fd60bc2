#!/usr/bin/env bash
# CPU time and context switches per message of a three-node Wharf cluster,
# one build after another, at the same workload.
#
#   bench/cpu.sh "--pub 1 --duration 10s --size 128" /tmp/wharf-old target/release/wharf
#   SERVER_FLAGS="--worker-threads 1" bench/cpu.sh "..." target/release/wharf
#
# For each binary it starts a fresh cluster on 127.0.0.1:7501-7503, runs
# `wharf bench` with the given flags, and after 3 s counts the three
# servers' task-clock and context switches for 6 s (`perf stat`, software
# events, which work where hardware counters do not). It prints the bench's
# rate (consume side when there are workers) and the counts per message.
# On a machine whose speed varies from run to run, context switches per
# message are the steadiest of these figures. Needs `perf` (linux-perf).
set -euo pipefail
FLAGS=$1; shift
SERVER_FLAGS=${SERVER_FLAGS:-}
PEERS=1=127.0.0.1:7501,2=127.0.0.1:7502,3=127.0.0.1:7503
SERVERS=127.0.0.1:7501,127.0.0.1:7502,127.0.0.1:7503
PIDS=()
RUN=""
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  [ -n "$RUN" ] && rm -rf "$RUN"
}
trap cleanup EXIT

for bin in "$@"; do
  RUN=$(mktemp -d /tmp/wharf-cpu.XXXXXX)
  PIDS=()
  for i in 1 2 3; do
    # shellcheck disable=SC2086
    "$bin" server --node-id "$i" --listen "127.0.0.1:750$i" --data "$RUN/n$i" \
      --peers "$PEERS" $SERVER_FLAGS >"$RUN/n$i.log" 2>&1 &
    PIDS+=($!)
  done
  "$bin" --server "$SERVERS" --retry-for 30s cluster status >/dev/null
  # shellcheck disable=SC2086
  "$bin" --server "$SERVERS" --retry-for 10s bench $FLAGS --json --quiet >"$RUN/bench.json" 2>"$RUN/bench.err" &
  bench=$!
  sleep 3
  perf stat -e task-clock,context-switches -p "${PIDS[0]},${PIDS[1]},${PIDS[2]}" \
    -o "$RUN/stat.txt" -- sleep 6
  wait "$bench"
  python3 - "$bin" "$RUN/stat.txt" "$RUN/bench.json" <<'PY'
import json, re, sys
stat = open(sys.argv[2]).read()
ms = float(re.search(r"([\d,.]+)\s+msec task-clock", stat).group(1).replace(",", ""))
cs = int(re.search(r"([\d,]+)\s+context-switches", stat).group(1).replace(",", ""))
r = json.load(open(sys.argv[3]))
side = r["consume"] if r.get("consume") else r["publish"]
rate = side["msgs_per_s"]
print(f"{sys.argv[1]:<36} {rate:>9.0f} msgs/s  cpu {ms * 1000 / 6 / rate:7.1f} us/msg"
      f"  context switches {cs / 6 / rate:6.1f}/msg")
PY
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$RUN"
done
