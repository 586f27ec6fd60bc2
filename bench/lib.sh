# What the bench scripts share: a three-node Wharf cluster on loopback,
# started from a given binary and stopped by pid on exit. Sourced, not run.
#
#   . "$(dirname "$0")/lib.sh"
#   bench_run_dir ab                     # RUN=/tmp/wharf-ab.XXXXXX, removed on exit
#   wharf_addrs 730                      # nodes on 127.0.0.1:7301-7303
#   start_wharf_cluster "$bin" "$RUN/n" --worker-threads 1
#   ... "$bin" --server "$WHARF_SERVERS" bench ...
#   stop_wharf_nodes                     # kill -9 and wait; the exit trap does it too
#
# Each script has ports of its own (compare 710x, failover 720x, ab 730x,
# client-ab 731x, timeline 740x, cpu 750x, disk 760x, tmpfs 770x, fsyncs
# 780x), so two can run at once. Nothing here reaches past 127.0.0.1.

# Node id -> pid of each running `wharf server` started here.
declare -A WHARF_PID=()

# bench_run_dir NAME: a fresh temporary directory in RUN, and an exit trap
# that stops the nodes and removes it. A script that sets its own trap calls
# stop_wharf_nodes there.
bench_run_dir() {
  RUN=$(mktemp -d "/tmp/wharf-$1.XXXXXX")
  trap 'stop_cpu_spinners; stop_wharf_nodes; rm -rf "$RUN"' EXIT
}

# wharf_addrs BASE: node i listens on 127.0.0.1:${BASE}i. Sets
# WHARF_SERVERS (client --server) and WHARF_PEERS (server --peers).
wharf_addrs() {
  WHARF_PORT_BASE=$1
  WHARF_SERVERS="127.0.0.1:${1}1,127.0.0.1:${1}2,127.0.0.1:${1}3"
  WHARF_PEERS="1=127.0.0.1:${1}1,2=127.0.0.1:${1}2,3=127.0.0.1:${1}3"
}

# start_wharf_node BIN ID PREFIX [server flags...]: node ID in the
# background, its data in ${PREFIX}ID, its log appended to ${PREFIX}ID.log.
# Variables set in front of the call (WHARF_TIMELINE=... start_wharf_node)
# reach the server's environment.
start_wharf_node() {
  local bin=$1 id=$2 prefix=$3
  shift 3
  "$bin" server --node-id "$id" --listen "127.0.0.1:${WHARF_PORT_BASE}$id" \
    --data "$prefix$id" --peers "$WHARF_PEERS" "$@" >>"$prefix$id.log" 2>&1 &
  WHARF_PID[$id]=$!
}

# start_wharf_cluster BIN PREFIX [server flags...]: nodes 1-3, then waits
# (60 s at most) until the cluster answers `cluster status`.
start_wharf_cluster() {
  local bin=$1 prefix=$2 id
  shift 2
  for id in 1 2 3; do start_wharf_node "$bin" "$id" "$prefix" "$@"; done
  "$bin" --server "$WHARF_SERVERS" --retry-for 60s cluster status >/dev/null
}

# stop_wharf_nodes [SIGNAL]: signals every node started here (KILL unless
# told) and waits for it to exit.
stop_wharf_nodes() {
  local sig=${1:-KILL} id
  for id in "${!WHARF_PID[@]}"; do kill "-$sig" "${WHARF_PID[$id]}" 2>/dev/null || true; done
  for id in "${!WHARF_PID[@]}"; do wait "${WHARF_PID[$id]}" 2>/dev/null || true; done
  WHARF_PID=()
}

# workload_flags NAME [DURATION]: the `wharf bench` flags (which the NATS
# driver takes too) of one of the named workloads that compare.sh, ab.sh and
# tmpfs.sh run; DURATION (default 5s) for the timed ones. e2e_rateN is the
# open loop at N msgs/s.
workload_flags() {
  local dur=${2:-5s}
  case $1 in
    pub_sync) echo "--pub 1 --duration $dur --size 128" ;;
    pub_async_w256) echo "--pub 1 --window 256 --duration $dur --size 128" ;;
    queue_batch1) echo "--pub 0 --sub 3 --batch 1 --msgs 3000 --size 128" ;;
    queue_batch1_acknext) echo "--pub 0 --sub 3 --batch 1 --ack-next --msgs 3000 --size 128" ;;
    queue_batch100) echo "--pub 0 --sub 3 --batch 100 --msgs 10000 --size 128" ;;
    e2e_rate[1-9]*)
      echo "--pub 1 --window 64 --sub 3 --batch 1 --rate ${1#e2e_rate} --duration $dur --size 128" ;;
    *) echo "unknown workload $1" >&2; return 1 ;;
  esac
}

# keep_cpus_awake: one busy loop per core at SCHED_IDLE priority, so that no
# vCPU halts while the servers wait on each other. A SCHED_IDLE task runs
# only when nothing else is runnable, so it takes no time from the brokers;
# what it removes is the hypervisor's cost of waking a halted vCPU on each
# hand-off between threads (docs/BENCHMARKS.md, "What the disk and the idle vCPUs cost").
# stop_cpu_spinners ends them; the exit trap of bench_run_dir does too.
CPU_SPINNER_PIDS=()
keep_cpus_awake() {
  local _core
  for _core in $(seq 1 "$(nproc)"); do
    chrt -i 0 bash -c 'while :; do :; done' &
    CPU_SPINNER_PIDS+=($!)
  done
}
stop_cpu_spinners() {
  local p
  for p in "${CPU_SPINNER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${CPU_SPINNER_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  CPU_SPINNER_PIDS=()
}

# bench_headline FILE: the headline rate of a `wharf bench --json` report
# (consume msgs/s when it had workers, else publish msgs/s), rounded.
bench_headline() {
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
side = r["consume"] if r.get("consume") else r["publish"]
print(round(side["msgs_per_s"]))' "$1"
}
