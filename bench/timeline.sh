#!/usr/bin/env bash
# Where one sync publish's time goes: a timeline of each publish through the
# stream's leader and its followers.
#
#   bench/timeline.sh                      # builds target/release/wharf --features timeline
#   SKIP_BUILD=1 WHARF=/tmp/wharf-timeline bench/timeline.sh
#   SERVER_FLAGS="--worker-threads 1" BENCH_FLAGS="--pub 1 --duration 10s" bench/timeline.sh
#   KEEP_DIR=/tmp/tl bench/timeline.sh    # and keep the nodes' files
#
# Starts three `wharf server` processes on 127.0.0.1:7401-7403, each with
# WHARF_TIMELINE set (crates/wharf-raft/src/timeline.rs), runs one sync
# publisher (`wharf bench --pub 1`, 5 s of 128 B messages unless
# BENCH_FLAGS says otherwise), stops the servers and prints the bench's
# rate and ack latency, then bench/timeline.py's table. Needs a build with
# the `timeline` feature: the default build has no marks. Everything runs
# on loopback; every process started here is stopped by pid on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHARF=${WHARF:-$ROOT/target/release/wharf}
SERVER_FLAGS=${SERVER_FLAGS:-}
BENCH_FLAGS=${BENCH_FLAGS:---pub 1 --duration 5s --size 128}
. "$ROOT/bench/lib.sh"
bench_run_dir timeline
wharf_addrs 740

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  (cd "$ROOT" && cargo build --release -p wharf --features timeline)
fi
# shellcheck disable=SC2086
WHARF_TIMELINE="$RUN/t" start_wharf_cluster "$WHARF" "$RUN/n" $SERVER_FLAGS
# shellcheck disable=SC2086
"$WHARF" --server "$WHARF_SERVERS" --retry-for 10s bench $BENCH_FLAGS --json --quiet >"$RUN/bench.json"
python3 - "$RUN/bench.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["publish"]
lat = p["ack_latency_us"]
print(f"bench: {p['msgs_per_s']:.0f} msgs/s, ack p50 {lat['p50']} us, p99 {lat['p99']} us")
PY
# kill -9 loses each server's last buffered marks (under 64 KiB): the
# publishes of the run's last moments are left out as incomplete.
stop_wharf_nodes
# KEEP_DIR=DIR keeps the nodes' timeline files for bench/timeline.py DIR.
if [ -n "${KEEP_DIR:-}" ]; then mkdir -p "$KEEP_DIR" && cp "$RUN"/t.* "$KEEP_DIR"/; fi
python3 "$ROOT/bench/timeline.py" "$RUN"
