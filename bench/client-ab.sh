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
. "$(dirname "$0")/lib.sh"
bench_run_dir client-ab
wharf_addrs 731
start_wharf_cluster "$NEW" "$RUN/n"
for rep in $(seq 1 "$REPS"); do
  for which in OLD NEW; do
    bin=${!which}
    "$bin" --server "$WHARF_SERVERS" --retry-for 10s bench --stream "CLIENTAB$rep$which" \
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
