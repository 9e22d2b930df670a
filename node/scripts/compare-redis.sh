#!/usr/bin/env bash
# Leasehold next to the single Redis it replaces, side by side in one run on
# one machine: the same lease (≤ L tokens per key per window), a closed
# loop with N requests in flight over ONE client connection, 1 000 keys.
#
#   redis, no persistence   redis-server --save '' --appendonly no, Lua lease script
#   redis, AOF fsync always redis-server --appendonly yes --appendfsync always
#   etcd, 3 members         (when `etcd` is installed: Debian `etcd-server`)
#                           three etcd processes on loopback, fsync on; an
#                           optimistic Txn per lease (compare mod_revision,
#                           put the new count, else read back and retry),
#                           N leases in flight over one HTTP/2 connection
#   leasehold, 3 members    three `leasehold serve` processes on loopback,
#                           fsync on, plaintext (like the Redis runs); N
#                           callers with one Lease each, and the same N
#                           leases in flight as LeaseBatch calls of up to 64,
#                           and N callers leasing through the client's lease
#                           coalescer (bench --coalesce)
#
# Needs redis-server (Debian package `redis-server`), a release build and
# jq:
#   cargo build --release -p leasehold-node --bin leasehold --example redis_lease_load \
#     --example etcd_lease_load
#   node/scripts/compare-redis.sh [IN_FLIGHT...]        (default: 1 16 256 1024)
# Prints one JSON line per run; docs/benchmarks.md has the table.
set -euo pipefail

LEVELS=("${@:-1 16 256 1024}")
read -r -a LEVELS <<<"${LEVELS[*]}"
BIN="${LEASEHOLD_BIN:-target/release/leasehold}"
LOAD="${REDIS_LOAD_BIN:-target/release/examples/redis_lease_load}"
ETCD_LOAD="${ETCD_LOAD_BIN:-target/release/examples/etcd_lease_load}"
DURATION="${DURATION:-5}"
KEYS="${KEYS:-1000}"
BASE_PORT="${BASE_PORT:-7501}"
command -v redis-server >/dev/null || { echo "redis-server is not installed" >&2; exit 2; }
[ -x "$BIN" ] && [ -x "$LOAD" ] || { echo "build first: see the header of $0" >&2; exit 2; }

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

redis() { # name port flags...
  local name="$1" port="$2"; shift 2
  mkdir -p "$WORK/$name"
  redis-server --port "$port" --dir "$WORK/$name" --daemonize no --save '' "$@" \
    >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 50); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "redis $name did not start" >&2; exit 1
}
redis redis-no-persistence 6391 --appendonly no
redis redis-aof-always 6392 --appendonly yes --appendfsync always

ETCD=0
if command -v etcd >/dev/null && [ -x "$ETCD_LOAD" ]; then
  ETCD=1
  cluster="e1=http://127.0.0.1:2491,e2=http://127.0.0.1:2492,e3=http://127.0.0.1:2493"
  for i in 1 2 3; do
    etcd --name "e$i" --data-dir "$WORK/etcd-$i" \
      --listen-client-urls "http://127.0.0.1:239$i" --advertise-client-urls "http://127.0.0.1:239$i" \
      --listen-peer-urls "http://127.0.0.1:249$i" --initial-advertise-peer-urls "http://127.0.0.1:249$i" \
      --initial-cluster "$cluster" --initial-cluster-state new >"$WORK/etcd-$i.log" 2>&1 &
    PIDS+=($!)
  done
  sleep 3
else
  echo "etcd or $ETCD_LOAD missing: etcd left out" >&2
fi

addr() { echo "127.0.0.1:$((BASE_PORT + $1 - 1))"; }
ENDPOINTS="$(addr 1),$(addr 2),$(addr 3)"
for id in 1 2 3; do
  "$BIN" serve --insecure --id "$id" --listen "$(addr "$id")" --data-dir "$WORK/member-$id" \
    2>>"$WORK/members.log" &
  PIDS+=($!)
done
"$BIN" cluster init --insecure --endpoint "$(addr 1)" --wait-secs 20 \
  --member "1=$(addr 1)" --member "2=$(addr 2)" --member "3=$(addr 3)" >/dev/null
"$BIN" policy set --insecure --endpoint "$ENDPOINTS" --prefix lease: \
  --limit 281474976710656 --window-ms 60000 >/dev/null

for n in "${LEVELS[@]}"; do
  for target in redis-no-persistence:6391 redis-aof-always:6392; do
    "$LOAD" --addr "127.0.0.1:${target#*:}" --in-flight "$n" --keys "$KEYS" \
      --duration-secs "$DURATION" |
      jq -c --arg t "${target%%:*}" '{target: $t, in_flight, leases_per_sec, p50_ms: .latency_ms.p50, p99_ms: .latency_ms.p99}'
  done
  if [ "$ETCD" = 1 ]; then
    "$ETCD_LOAD" --endpoint 127.0.0.1:2391 --in-flight "$n" --keys "$KEYS" --duration-secs "$DURATION" |
      jq -c '{target: "etcd-3-members", in_flight, leases_per_sec, p50_ms: .latency_ms.p50, p99_ms: .latency_ms.p99, txn_attempts}'
  fi
  # The same number of leases in flight: N callers with one Lease each,
  # and ceil(N / 64) callers with LeaseBatch calls of min(N, 64) leases.
  batch=$(( n < 64 ? n : 64 ))
  for shape in "$n 1" "$(( (n + batch - 1) / batch )) $batch"; do
    read -r callers items <<<"$shape"
    "$BIN" bench --insecure --endpoint "$ENDPOINTS" --region bench --key lease: --keys "$KEYS" \
      --no-setup --connections 1 --concurrency "$callers" --batch "$items" \
      --duration-secs "$DURATION" --output json |
      jq -c --arg t "leasehold-batch-$items" --arg n "$n" \
        '{target: $t, in_flight: ($n|tonumber), calls_in_flight: .concurrency, leases_per_sec, p50_ms: .latency_ms.p50, p99_ms: .latency_ms.p99, errors}'
  done
  # N callers with one lease each, through the client's lease coalescer
  # (what a CoordinatorSource does with strict checks).
  "$BIN" bench --insecure --endpoint "$ENDPOINTS" --region bench --key lease: --keys "$KEYS" \
    --no-setup --connections 1 --concurrency "$n" --coalesce \
    --duration-secs "$DURATION" --output json |
    jq -c --arg n "$n" \
      '{target: "leasehold-coalesced", in_flight: ($n|tonumber), leases_per_sec, p50_ms: .latency_ms.p50, p99_ms: .latency_ms.p99, errors}'
done
