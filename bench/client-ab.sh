#!/usr/bin/env bash
# Two bench clients against one cluster: what a change to `wharf bench`
# itself (not to the server) does to the open-loop figures.
#
#   bench/client-ab.sh SERVER_AND_NEW_CLIENT OLD_CLIENT    # 3 reps each, in turn
#
# Starts three servers of the first binary on 127.0.0.1:7311-7313, then runs
# the open-loop workload of bench/compare.sh (rate 200, window 64, 3 workers
# at batch 1, 10 s) with the old client, then the new one, REPS times, each
# on a stream of its own, and prints each run's ack and end-to-end p50/p99
# (us). bench/results/pacer-20261204.txt is its output for the pacer change.
set -euo pipefail
NEW=$(realpath "$1"); OLD=$(realpath "$2")
REPS=${REPS:-3}
RUN=$(mktemp -d /tmp/wharf-client-ab.XXXXXX)
PEERS=1=127.0.0.1:7311,2=127.0.0.1:7312,3=127.0.0.1:7313
SERVERS=127.0.0.1:7311,127.0.0.1:7312,127.0.0.1:7313
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$RUN"
}
trap cleanup EXIT
for i in 1 2 3; do
  "$NEW" server --node-id "$i" --listen "127.0.0.1:731$i" --data "$RUN/n$i" --peers "$PEERS" \
    >"$RUN/n$i.log" 2>&1 &
  PIDS+=($!)
done
"$NEW" --server "$SERVERS" --retry-for 30s cluster status >/dev/null
for rep in $(seq 1 "$REPS"); do
  for which in OLD NEW; do
    bin=${!which}
    "$bin" --server "$SERVERS" --retry-for 10s bench --stream "CLIENTAB$rep$which" \
      --pub 1 --window 64 --sub 3 --batch 1 --rate 200 --duration 10s --size 128 --json --quiet \
      >"$RUN/$which.$rep.json"
    python3 - "$which" "$rep" "$RUN/$which.$rep.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[3]))
p, e = r["publish"]["ack_latency_us"], r["consume"]["e2e_latency_us"]
print(f'{sys.argv[1]} rep {sys.argv[2]}: ack p50 {p["p50"]} p99 {p["p99"]}  e2e p50 {e["p50"]} p99 {e["p99"]}')
PY
  done
done
