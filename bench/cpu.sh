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
. "$(dirname "$0")/lib.sh"
wharf_addrs 750
RUN=""
trap 'stop_wharf_nodes; [ -z "$RUN" ] || rm -rf "$RUN"' EXIT

for bin in "$@"; do
  RUN=$(mktemp -d /tmp/wharf-cpu.XXXXXX)
  # shellcheck disable=SC2086
  start_wharf_cluster "$bin" "$RUN/n" $SERVER_FLAGS
  # shellcheck disable=SC2086
  "$bin" --server "$WHARF_SERVERS" --retry-for 10s bench $FLAGS --json --quiet >"$RUN/bench.json" 2>"$RUN/bench.err" &
  bench=$!
  sleep 3
  perf stat -e task-clock,context-switches -p "${WHARF_PID[1]},${WHARF_PID[2]},${WHARF_PID[3]}" \
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
  stop_wharf_nodes
  rm -rf "$RUN"
  RUN=""
done
