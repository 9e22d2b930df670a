#!/usr/bin/env bash
# Runs envoy_rls_check.py, a client of Envoy's rate limit service (RLS v3)
# built from Envoy's published protos (PyPI `xds-protos`), against a
# throwaway `leasehold dev` cluster serving ratelimit.yaml on its escrow
# nodes (mutual TLS): a virtual environment with the pinned packages, the
# cluster (3 members, escrow nodes eu and us) started on free ports, the
# check, and the cluster stopped again. Prints PASS or FAIL and exits
# non-zero if any expectation fails.
#
# Usage: bash docs/examples/python/run-rls.sh [--binary PATH]   (from anywhere)
#   --binary  the leasehold binary (default: target/debug/leasehold of this repository)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
binary="$root/target/debug/leasehold"
nodes=3
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    *) echo "usage: $0 [--binary PATH]" >&2; exit 2 ;;
  esac
done
label="docs/examples/python RLS"
# shellcheck source=common.sh
. "$here/common.sh"
make_venv

# Free ports for the members (base .. base+nodes-1) and the escrow nodes
# eu and us (the two after).
port="$(free_ports "$((nodes + 2))")"
[ -n "$port" ] || fail "no $((nodes + 2)) free consecutive ports"
escrow_port=$((port + nodes))
"$binary" dev --data-dir "$work/cluster" --base-port "$port" --nodes "$nodes" \
  --escrow-base-port "$escrow_port" --ratelimit-config "$here/ratelimit.yaml" --ratelimit-response-headers \
  > "$work/cluster.log" 2>&1 &
cluster_pid=$!
certs="$work/cluster/certs"

# Ready when both escrow nodes report Envoy's RateLimitService SERVING to
# their region's service certificate (`dev` starts them once the cluster
# is initialised and the policies of ratelimit.yaml are set): 30 s at most.
ready=""
deadline=$((SECONDS + 30))
while [ "$SECONDS" -lt "$deadline" ]; do
  kill -0 "$cluster_pid" 2>/dev/null || fail "leasehold dev exited"
  if [ -f "$certs/service-app-us.key" ]; then
    ready=yes
    for region in eu us; do
      p=$escrow_port
      [ "$region" = us ] && p=$((escrow_port + 1))
      "$binary" health --endpoint "127.0.0.1:$p" --service envoy.service.ratelimit.v3.RateLimitService \
        --ca "$certs/ca.pem" --cert "$certs/service-app-$region.pem" --cert-key "$certs/service-app-$region.key" \
        --timeout-ms 500 >/dev/null 2>&1 || { ready=""; break; }
    done
    [ -n "$ready" ] && break
  fi
  sleep 0.2
done
[ -n "$ready" ] || fail "the escrow nodes did not serve RLS within 30 s"

# The rule `unpoliced` loses the policy `dev` set for it: the check expects
# its descriptors to be refused NO_POLICY.
members=""
for i in $(seq 0 $((nodes - 1))); do members="${members:+$members,}127.0.0.1:$((port + i))"; done
"$binary" policy delete --prefix "rls:edge/unpoliced/" --endpoint "$members" \
  --ca "$certs/ca.pem" --cert "$certs/operator-admin.pem" --cert-key "$certs/operator-admin.key" \
  >> "$work/cluster.log" 2>&1 || fail "leasehold policy delete rls:edge/unpoliced/"

if "$py" "$here/envoy_rls_check.py" --eu "127.0.0.1:$escrow_port" --us "127.0.0.1:$((escrow_port + 1))" \
  --certs "$certs" --without-policy unpoliced; then
  echo "PASS: docs/examples/python RLS (${SECONDS}s)"
else
  fail "the check failed"
fi
