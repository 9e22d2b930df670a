#!/usr/bin/env bash
# Runs the Python client example against a throwaway `leasehold dev`
# cluster (one member, mutual TLS): a virtual environment with the pinned
# packages, stubs generated from proto/leasehold.proto, the example, and
# the cluster stopped again. Exits non-zero if any expectation fails.
#
# Usage: bash docs/examples/python/run.sh [--binary PATH]   (from anywhere)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
binary="$root/target/debug/leasehold"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    *) echo "usage: $0 [--binary PATH]" >&2; exit 2 ;;
  esac
done
[ -x "$binary" ] || { echo "no leasehold binary at $binary (cargo build first)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "python3 is required" >&2; exit 2; }

work="$(mktemp -d)"
cluster_pid=""
cleanup() {
  if [ -n "$cluster_pid" ]; then
    kill "$cluster_pid" 2>/dev/null || true
    wait "$cluster_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
mkdir -p "$work/stubs"
"$work/venv/bin/python" -m grpc_tools.protoc -I "$root/proto/proto" \
  --python_out="$work/stubs" --grpc_python_out="$work/stubs" "$root/proto/proto/leasehold.proto"

# A free base port: ask the kernel, then use it (a race with another
# process is possible but harmless: the cluster then fails to start).
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
"$binary" dev --data-dir "$work/cluster" --base-port "$port" --escrow-base-port 0 --nodes 1 \
  > "$work/cluster.log" 2>&1 &
cluster_pid=$!
certs="$work/cluster/certs"
for _ in $(seq 1 100); do
  if [ -f "$certs/operator-admin.key" ] && "$binary" health --endpoint "127.0.0.1:$port" \
      --service leasehold.v1.Coordinator --ca "$certs/ca.pem" \
      --cert "$certs/operator-admin.pem" --cert-key "$certs/operator-admin.key" \
      --timeout-ms 500 >/dev/null 2>&1; then
    break
  fi
  if ! kill -0 "$cluster_pid" 2>/dev/null; then
    echo "leasehold dev exited:" >&2; cat "$work/cluster.log" >&2; exit 1
  fi
  sleep 0.2
done

if PYTHONPATH="$work/stubs" "$work/venv/bin/python" "$here/leasehold_client.py" \
    --endpoint "localhost:$port" --certs "$certs"; then
  echo "PASS: docs/examples/python"
else
  echo "FAIL: docs/examples/python (cluster log follows)" >&2
  tail -n 40 "$work/cluster.log" >&2
  exit 1
fi
