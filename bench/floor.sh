#!/usr/bin/env bash
# The floor that the fsync before each acknowledgement puts under the
# latency-bound rows against Debian's NATS 2.9 (which acknowledges from
# memory): one run of fsync_probe.py, then compare.sh on those rows twice,
# Wharf's data on disk and then on tmpfs (NATS on disk both times), then
# floor.py's table (its docstring says how it is worked out).
#
#   SKIP_BUILD=1 REPS=3 bench/floor.sh | tee bench/results/floor-$(date -u +%Y%m%d).txt
#
# The two compare.sh runs land in bench/results/<stamp>-disk and
# <stamp>-tmpfs like any other.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STAMP=$(date -u +%Y%m%d-%H%M%S)
PROBE_DIR=$(mktemp -d /tmp/wharf-floor.XXXXXX)
trap 'rm -rf "$PROBE_DIR"' EXIT
export REPS=${REPS:-3}
export ONLY="pub_sync queue_batch1 queue_batch1_acknext"

echo "# bench/floor.sh at $(date -u +%FT%TZ) on $(git -C "$ROOT" rev-parse --short HEAD), $(uname -r), $(nproc) cores, REPS=$REPS"
{
  python3 "$ROOT/bench/fsync_probe.py" "$PROBE_DIR" 1
  python3 "$ROOT/bench/fsync_probe.py" "$PROBE_DIR" 3
} | tee "$PROBE_DIR/probe.txt"
STAMP="$STAMP-disk" "$ROOT/bench/compare.sh"
SKIP_BUILD=1 WHARF_TMPFS=1 STAMP="$STAMP-tmpfs" "$ROOT/bench/compare.sh"
echo
python3 "$ROOT/bench/floor.py" "$ROOT/bench/results/$STAMP-disk.json" \
  "$ROOT/bench/results/$STAMP-tmpfs.json" "$PROBE_DIR/probe.txt"
