#!/usr/bin/env bash
# What the disk costs: the latency-bound workloads on a three-node Wharf
# cluster whose data is on this machine's disk, then on one whose data is on
# tmpfs (/dev/shm), where fdatasync returns at once. Everything else (the
# binary, the journal and its syncs, sled, the Raft path, gRPC) is the same.
#
#   SKIP_BUILD=1 REPS=3 bench/tmpfs.sh | tee bench/results/tmpfs-$(date -u +%Y%m%d).txt
#
# Each rep starts a fresh cluster on each medium in turn (127.0.0.1:7701-7703)
# and runs every workload once on it; the table gives each workload's rate
# and latencies per rep, then the medians. tmpfs is not a way to run Wharf:
# nothing there survives a power loss. It shows how much of each figure
# is the fsync that Wharf waits for before it acknowledges.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPS=${REPS:-3}
WHARF=${WHARF:-$ROOT/target/release/wharf}
. "$ROOT/bench/lib.sh"
wharf_addrs 770
RUN=""
RESULTS=$(mktemp /tmp/wharf-tmpfs-results.XXXXXX)
trap 'stop_wharf_nodes; [ -z "$RUN" ] || rm -rf "$RUN"; rm -f "$RESULTS"' EXIT

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  (cd "$ROOT" && cargo build --release -p wharf 2>&1 | tail -1) >&2
fi

# lib.sh's workload_flags names these.
WORKLOADS=(pub_sync queue_batch1 queue_batch1_acknext e2e_rate200)
echo "# $(date -u +%FT%TZ) $(git -C "$ROOT" rev-parse --short HEAD) $(uname -r) $(nproc) cores" | tee -a "$RESULTS"
echo "# disk: $(df -h /tmp | tail -1 | awk '{print $1, $2}'); tmpfs: /dev/shm"

for rep in $(seq 1 "$REPS"); do
  for medium in disk tmpfs; do
    if [ "$medium" = disk ]; then RUN=$(mktemp -d /tmp/wharf-tmpfs-disk.XXXXXX); else RUN=$(mktemp -d /dev/shm/wharf-tmpfs.XXXXXX); fi
    start_wharf_cluster "$WHARF" "$RUN/n"
    for name in "${WORKLOADS[@]}"; do
      flags=$(workload_flags "$name")
      # shellcheck disable=SC2086
      "$WHARF" --server "$WHARF_SERVERS" --retry-for 10s bench $flags --json --quiet >"$RUN/r.json"
      python3 - "$RUN/r.json" "$rep" "$medium" "$name" <<'PY' | tee -a "$RESULTS"
import json, sys
r = json.load(open(sys.argv[1]))
pub, con = r.get("publish") or {}, r.get("consume") or {}
side = con or pub
ack = pub.get("ack_latency_us") or {}
e2e = con.get("e2e_latency_us") or {}
print(json.dumps({"rep": int(sys.argv[2]), "medium": sys.argv[3], "workload": sys.argv[4],
                  "msgs_per_s": round(side["msgs_per_s"]),
                  "ack_p50_us": ack.get("p50"), "ack_p99_us": ack.get("p99"),
                  "e2e_p50_us": e2e.get("p50"), "e2e_p99_us": e2e.get("p99")}))
PY
    done
    stop_wharf_nodes
    rm -rf "$RUN"
    RUN=""
  done
done

python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("\nmedians | disk | tmpfs | tmpfs/disk")
print("--- | ---: | ---: | ---:")
for w in dict.fromkeys(r["workload"] for r in rows):
    for k in ("msgs_per_s", "ack_p50_us", "ack_p99_us", "e2e_p50_us", "e2e_p99_us"):
        m = {}
        for medium in ("disk", "tmpfs"):
            v = [r[k] for r in rows if r["workload"] == w and r["medium"] == medium and r[k] is not None]
            m[medium] = statistics.median(v) if v else None
        if m["disk"] is None:
            continue
        ratio = f"{m['tmpfs'] / m['disk']:.2f}" if m["disk"] else "-"
        print(f"{w} {k} | {m['disk']:,.0f} | {m['tmpfs']:,.0f} | {ratio}")
PY
