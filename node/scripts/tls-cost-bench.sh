#!/usr/bin/env bash
# What mutual TLS costs: the same three-member cluster (three `leasehold
# serve` processes on loopback, fsync on) measured with `leasehold bench`
# in plaintext (--insecure) and on mutual TLS, alternating, so both see the
# same machine. Prints one JSON line per run.
#
#   cargo build --release -p leasehold-node
#   node/scripts/tls-cost-bench.sh [ROUNDS] [CONCURRENCY...]
set -euo pipefail

ROUNDS="${1:-2}"
shift || true
LEVELS=("${@:-1 16 256}")
read -r -a LEVELS <<<"${LEVELS[*]}"
BIN="${LEASEHOLD_BIN:-target/release/leasehold}"
BASE_PORT="${BASE_PORT:-7401}"
DURATION="${DURATION:-8}"
WORK="$(mktemp -d)"
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

addr() { echo "127.0.0.1:$((BASE_PORT + $1 - 1))"; }
ENDPOINTS="$(addr 1),$(addr 2),$(addr 3)"
CERTS="$WORK/certs"
"$BIN" certs mint --out "$CERTS" --members 1,2,3 --regions bench --operators bench \
  --ip 127.0.0.1 --dns localhost >/dev/null

# start MODE: a fresh three-member cluster, initialised, with a bench policy.
start() {
  local mode="$1" data="$WORK/$1-$RANDOM"
  for id in 1 2 3; do
    local tls=(--insecure)
    if [ "$mode" = tls ]; then
      tls=(--tls-ca "$CERTS/ca.pem" --tls-cert "$CERTS/member-$id.pem" --tls-key "$CERTS/member-$id.key")
    fi
    "$BIN" serve "${tls[@]}" --id "$id" --listen "$(addr "$id")" --data-dir "$data/node-$id" \
      --join-members 1,2,3 2>>"$data.log" &
    PIDS+=($!)
  done
  as_operator "$mode" cluster init --endpoint "$(addr 1)" --wait-secs 20 \
    --member "1=$(addr 1)" --member "2=$(addr 2)" --member "3=$(addr 3)" >/dev/null
  as_operator "$mode" policy set --endpoint "$ENDPOINTS" --prefix bench/ \
    --limit 1000000000000 --window-ms 3600000 >/dev/null
}

stop() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
}

credentials() {
  if [ "$1" = tls ]; then
    echo --ca "$CERTS/ca.pem" --cert "$CERTS/$2.pem" --cert-key "$CERTS/$2.key"
  else
    echo --insecure
  fi
}
as_operator() { local mode="$1"; shift; "$BIN" "$@" $(credentials "$mode" operator-bench); }

for round in $(seq 1 "$ROUNDS"); do
  for mode in insecure tls; do
    start "$mode"
    for c in "${LEVELS[@]}"; do
      "$BIN" bench --endpoint "$ENDPOINTS" --concurrency "$c" --duration-secs "$DURATION" \
        --key "bench/$mode-$c" --no-setup --output json $(credentials "$mode" region-bench) |
        jq -c --arg mode "$mode" --arg round "$round" --arg c "$c" \
          '{round: ($round|tonumber), mode: $mode, concurrency: ($c|tonumber), leases_per_sec, p50_ms: .latency_ms.p50, p99_ms: .latency_ms.p99, errors}'
    done
    stop
  done
done
