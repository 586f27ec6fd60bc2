#!/usr/bin/env bash
# Wharf builds side by side: the same workloads on each, in turn.
#
#   bench/ab.sh /tmp/wharf-before target/release/wharf     # 3 reps each
#   REPS=5 WORKLOADS="pub_sync queue_batch1" bench/ab.sh A B C
#
# For each repetition and workload it starts a fresh three-node cluster of
# the first binary (A) on 127.0.0.1:7301-7303, runs the workload with that
# binary's own `wharf bench`, stops it, then does the same with B and so on;
# each repetition rotates which build goes first. It prints each run's
# headline figure (consume msgs/s when there are workers, else publish
# msgs/s) and the medians. The workloads are those of bench/compare.sh
# (lib.sh's workload_flags).
# Everything runs on loopback; every process started here is stopped by pid
# on exit.
set -euo pipefail

BINS=()
for b in "$@"; do BINS+=("$(realpath "$b")"); done
[ ${#BINS[@]} -ge 2 ] || { echo "usage: bench/ab.sh BINARY_A BINARY_B [BINARY_C ...]" >&2; exit 1; }
LABELS=(A B C D E F)
REPS=${REPS:-3}
WORKLOADS=${WORKLOADS:-"pub_sync pub_async_w256 queue_batch1 queue_batch100"}
SERVER_FLAGS=${SERVER_FLAGS:-}
. "$(dirname "$0")/lib.sh"
bench_run_dir ab
wharf_addrs 730

# run_one label binary workload rep: prints "label workload rep msgs_per_s"
run_one() {
  local label=$1 bin=$2 workload=$3 rep=$4
  local dir="$RUN/$label.$workload.$rep"
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  start_wharf_cluster "$bin" "$dir/n" $SERVER_FLAGS
  # shellcheck disable=SC2046
  if "$bin" --server "$WHARF_SERVERS" --retry-for 10s bench $(workload_flags "$workload") --json --quiet \
    >"$dir/bench.json" 2>"$dir/bench.err"; then
    echo "$label $workload $rep $(bench_headline "$dir/bench.json")"
  else
    echo "$label $workload $rep FAILED"
    cat "$dir/bench.err" >&2
  fi
  stop_wharf_nodes
}

results="$RUN/results.txt"
for rep in $(seq 1 "$REPS"); do
  for w in $WORKLOADS; do
    n=${#BINS[@]}
    for k in $(seq 0 $((n - 1))); do
      i=$(((k + rep - 1) % n))
      run_one "${LABELS[$i]}" "${BINS[$i]}" "$w" "$rep" | tee -a "$results"
    done
  done
done

for i in "${!BINS[@]}"; do echo "${LABELS[$i]} = ${BINS[$i]}"; done
python3 - "$results" <<'EOF'
import sys, statistics
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 4 and f[3] != "FAILED":
        runs.setdefault((f[1], f[0]), []).append(int(f[3]))
labels = sorted(dict.fromkeys(k[1] for k in runs))
head = "".join(f" {l + ' msgs/s':>10} {l + '/A':>6}" for l in labels)
print(f"{'workload':<16}{head}   (medians of msgs/s; /A = ratio to A's median)")
for w in dict.fromkeys(k[0] for k in runs):
    base = statistics.median(runs[(w, "A")]) if runs.get((w, "A")) else 0
    row = ""
    for l in labels:
        v = runs.get((w, l), [])
        m = statistics.median(v) if v else 0
        row += f" {m:>10.0f} {(f'{m / base:.2f}' if base else '-'):>6}"
    print(f"{w:<16}{row}   " + "  ".join(f"{l} {runs.get((w, l), [])}" for l in labels))
EOF
