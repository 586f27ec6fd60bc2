#!/usr/bin/env bash
# Validate the Kubernetes manifests in deploy/k8s against the Kubernetes API
# schemas (strict: unknown fields are errors), with kubernetes-validate from
# PyPI, for the oldest and newest Kubernetes versions we support.
#
#   deploy/k8s/validate.sh
#   WHARF_K8S_VERSIONS="1.31.0" deploy/k8s/validate.sh
#
# kubernetes-validate is installed into a virtualenv (target/k8s-validate-venv
# by default, WHARF_K8S_VENV to move it) the first time; later runs reuse it.
# gRPC probes need Kubernetes 1.27+; we check 1.29 (the oldest schema set the
# package ships) and the newest.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${WHARF_K8S_VENV:-$repo/target/k8s-validate-venv}
versions=${WHARF_K8S_VERSIONS:-1.29.0 1.37.0}
pkg=${WHARF_K8S_VALIDATE_PKG:-kubernetes-validate==1.37.0}
kv=$venv/bin/kubernetes-validate

if [[ ! -x $kv ]]; then
    echo "installing $pkg into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$pkg"
fi

shopt -s nullglob
manifests=("$repo"/deploy/k8s/*.yaml)
(( ${#manifests[@]} > 0 )) || { echo "no manifests in deploy/k8s" >&2; exit 1; }

# The validator must reject what it should: a misspelled field fails.
bad=$(mktemp "${TMPDIR:-/tmp}/wharf-k8s-bad.XXXXXX.yaml")
trap 'rm -f "$bad"' EXIT
cat >"$bad" <<'EOF'
apiVersion: v1
kind: Service
metadata: {name: bad}
spec:
  publishNotReadyAdresses: true
  ports: [{port: 7001}]
EOF
if "$kv" --strict --quiet "$bad" >/dev/null 2>&1; then
    echo "kubernetes-validate accepted a misspelled field; not trusting it" >&2
    exit 1
fi

status=0
for v in $versions; do
    echo "== Kubernetes $v" >&2
    "$kv" --strict -k "$v" "${manifests[@]}" || status=1
done
if (( status != 0 )); then
    echo "manifest validation failed" >&2
fi
exit $status
