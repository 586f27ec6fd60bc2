#!/usr/bin/env bash
# One workload many times on ONE cluster: does a rep's figure depend on where
# the stream's and consumer's leaders landed, or drift as streams come and go?
#
#   SKIP_BUILD=1 bench/reps.sh queue_batch1            # 10 reps of 5 s
#   REPS=6 DUR=3s WHARF=/tmp/wharf-x bench/reps.sh e2e_rate200
#
# Starts three `wharf server` processes on 127.0.0.1:7901-7903, then for each
# rep runs the workload (lib.sh's workload_flags, as compare.sh does) with
# `--keep`, prints its headline figure (consume msgs/s when it has workers,
# else publish msgs/s), the p50/p99/max latencies it measured and its errors,
# the node leading the stream and consumer groups and their Raft terms (a
# term above 1 means the group held an election after its first), each
# server's RSS and thread count and the data directories' size, then deletes the stream (and with it the consumer)
# before the next rep, as each compare.sh and ab.sh run does on a fresh
# cluster. Everything runs on loopback; the nodes are stopped on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHARF=${WHARF:-$ROOT/target/release/wharf}
WORKLOAD=${1:?usage: bench/reps.sh WORKLOAD (a name of lib.sh workload_flags)}
REPS=${REPS:-10}
DUR=${DUR:-5s}
. "$ROOT/bench/lib.sh"
workload_flags "$WORKLOAD" "$DUR" >/dev/null
bench_run_dir reps
wharf_addrs 790

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  (cd "$ROOT" && cargo build --release -p wharf 2>&1 | tail -1) >&2
fi
start_wharf_cluster "$WHARF" "$RUN/n"

echo "# bench/reps.sh $WORKLOAD at $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(cd "$ROOT" && git rev-parse --short HEAD), $(uname -r), $(nproc) cores, REPS=$REPS DUR=$DUR"
echo "| rep | msgs/s | latency p50 / p99 / max us | errors | stream leader (term) | consumer leader (term) | RSS MiB (n1 n2 n3) | threads | data MiB |"
echo "| ---: | ---: | --- | ---: | --- | --- | --- | --- | ---: |"
for rep in $(seq 1 "$REPS"); do
  # shellcheck disable=SC2046
  "$WHARF" --server "$WHARF_SERVERS" --retry-for 10s bench $(workload_flags "$WORKLOAD" "$DUR") \
    --json --quiet --keep >"$RUN/bench.json"
  rate=$(bench_headline "$RUN/bench.json")
  latency=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
out, errors = [], 0
for side, key in (("publish", "ack_latency_us"), ("consume", "e2e_latency_us")):
    errors += (r.get(side) or {}).get("errors", 0)
    lat = (r.get(side) or {}).get(key)
    if lat:
        name = "ack" if side == "publish" else "e2e"
        out.append("%s %s / %s / %s" % (name, lat["p50"], lat["p99"], lat["max"]))
print("; ".join(out) or "-", "|", errors)' "$RUN/bench.json")
  leaders=$("$WHARF" --server "$WHARF_SERVERS" cluster status --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
lead = {g["kind"]: "%s (%s)" % (g["leader"], g["term"]) for g in s["groups"] if g["name"].startswith("BENCH")}
print(lead.get("stream", "-"), "|", lead.get("consumer", "-"))')
  rss="" threads=""
  for id in 1 2 3; do
    pid=${WHARF_PID[$id]}
    rss+="$(awk '/^VmRSS/ {printf "%d", $2 / 1024}' "/proc/$pid/status") "
    threads+="$(ls "/proc/$pid/task" | wc -l) "
  done
  data=$(du -sm "$RUN" | cut -f1)
  echo "| $rep | $rate | $latency | $leaders | ${rss% } | ${threads% } | $data |"
  "$WHARF" --server "$WHARF_SERVERS" stream rm BENCH >/dev/null
done
