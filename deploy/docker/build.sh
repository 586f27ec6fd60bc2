#!/usr/bin/env bash
# Build the static `wharf` binary and the `wharf:dev` image (FROM scratch).
#
#   deploy/docker/build.sh                 # builds wharf:dev
#   WHARF_IMAGE=wharf:1.2 deploy/docker/build.sh
#   WHARF_SKIP_CARGO=1 deploy/docker/build.sh   # reuse the last static binary
#
# The binary goes to its own target dir (target/static by default) so the
# static build does not invalidate the normal dev build. Nothing is pulled:
# the image has no base layer.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
image=${WHARF_IMAGE:-wharf:dev}
target_triple=x86_64-unknown-linux-gnu
target_dir=${WHARF_STATIC_TARGET_DIR:-$repo/target/static}
bin=$target_dir/$target_triple/release/wharf

if [[ -z ${WHARF_SKIP_CARGO:-} ]]; then
    echo "building static wharf binary in $target_dir" >&2
    (cd "$repo" && CARGO_TARGET_DIR=$target_dir \
        RUSTFLAGS='-C target-feature=+crt-static' \
        cargo build --release --target "$target_triple" -p wharf)
fi
[[ -x $bin ]] || { echo "no binary at $bin" >&2; exit 1; }

# A static-pie has no interpreter and needs no shared libraries; refuse to
# put anything else into an image that has no libc.
if command -v file >/dev/null; then
    desc=$(file -b "$bin")
    case $desc in
        *"dynamically linked"*) echo "$bin is dynamically linked: $desc" >&2; exit 1 ;;
    esac
fi

ctx=$(mktemp -d "${TMPDIR:-/tmp}/wharf-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
cp "$repo/deploy/docker/Dockerfile" "$ctx/Dockerfile"
cp "$bin" "$ctx/wharf"
strip "$ctx/wharf" 2>/dev/null || true
chmod 0555 "$ctx/wharf"
mkdir "$ctx/data"

docker build --quiet -t "$image" "$ctx" >/dev/null
size=$(docker image inspect -f '{{.Size}}' "$image")
echo "built $image ($((size / 1024 / 1024)) MiB, $size bytes)" >&2
