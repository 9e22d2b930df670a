#!/usr/bin/env bash
# Runs the Python client example against a throwaway `leasehold dev`
# cluster (mutual TLS): a virtual environment with the pinned packages,
# stubs generated from proto/leasehold.proto, the cluster started on a free
# port, the example, and the cluster stopped again. Prints PASS or FAIL and
# exits non-zero if any expectation fails.
#
# Usage: bash docs/examples/python/run.sh [--binary PATH] [--nodes N]   (from anywhere)
#   --binary  the leasehold binary (default: target/debug/leasehold of this repository)
#   --nodes   members of the dev cluster, 1 to 9 (default 1). With more than
#             one the example is pointed at a follower first, so it must
#             follow the leader hint.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
binary="$root/target/debug/leasehold"
nodes=1
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --nodes) nodes="$2"; shift 2 ;;
    *) echo "usage: $0 [--binary PATH] [--nodes N]" >&2; exit 2 ;;
  esac
done
label="docs/examples/python"
# shellcheck source=common.sh
. "$here/common.sh"
make_venv
mkdir -p "$work/stubs"
"$py" -m grpc_tools.protoc -I "$root/proto/proto" \
  --python_out="$work/stubs" --grpc_python_out="$work/stubs" "$root/proto/proto/leasehold.proto" \
  || fail "grpc_tools.protoc"

# Free ports for the members.
port="$(free_ports "$nodes")"
[ -n "$port" ] || fail "no $nodes free consecutive ports"
"$binary" dev --data-dir "$work/cluster" --base-port "$port" --escrow-base-port 0 --nodes "$nodes" \
  > "$work/cluster.log" 2>&1 &
cluster_pid=$!
certs="$work/cluster/certs"

# Members, the last first: with several, the first one asked is a follower.
endpoints=()
for i in $(seq "$nodes" -1 1); do endpoints+=(--endpoint "localhost:$((port + i - 1))"); done

# Ready when every member reports leasehold.v1.Coordinator SERVING
# (initialised, and a leader known): 30 s at most.
ready=""
deadline=$((SECONDS + 30))
while [ "$SECONDS" -lt "$deadline" ]; do
  kill -0 "$cluster_pid" 2>/dev/null || fail "leasehold dev exited"
  if [ -f "$certs/operator-admin.key" ]; then
    ready=yes
    for i in $(seq 1 "$nodes"); do
      "$binary" health --endpoint "127.0.0.1:$((port + i - 1))" --service leasehold.v1.Coordinator \
        --ca "$certs/ca.pem" --cert "$certs/operator-admin.pem" --cert-key "$certs/operator-admin.key" \
        --timeout-ms 500 >/dev/null 2>&1 || { ready=""; break; }
    done
    [ -n "$ready" ] && break
  fi
  sleep 0.2
done
[ -n "$ready" ] || fail "the cluster was not SERVING within 30 s"

if PYTHONPATH="$work/stubs" "$py" "$here/leasehold_client.py" "${endpoints[@]}" --certs "$certs"; then
  echo "PASS: docs/examples/python (${SECONDS}s)"
else
  fail "the example failed"
fi
