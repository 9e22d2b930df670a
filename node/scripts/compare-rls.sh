#!/usr/bin/env bash
# Envoy's rate limit service (RLS v3, ShouldRateLimit) on one escrow node,
# next to the same descriptor limited the way envoyproxy/ratelimit limits
# it — one pipelined INCRBY key hits + EXPIRE key window round trip to one
# Redis per request — side by side in one run on one machine: a closed loop
# with N requests in flight over ONE connection, one descriptor
# (remote_address, <address>) per request, addresses spread over KEYS.
#
#   redis, no persistence   redis-server --save '' --appendonly no; the key
#                           <domain>_<key>_<value>_<window start>, OK while
#                           the count is at most LIMIT
#   leasehold escrow node   one `leasehold escrow --ratelimit-config`, region
#                           eu, plaintext, over three `leasehold serve`
#                           members on loopback (fsync on); rule
#                           remote_address: LIMIT requests per UNIT; the
#                           node's /metrics read before and after each run
#                           give the coordinator calls per 1 000 answers
#
# Each run also reports the CPU time per answer of the server side (Redis;
# the escrow node, and the three members apart) from /proc/PID/stat.
#
# Needs redis-server (Debian package `redis-server`), curl, jq and a
# release build:
#   cargo build --release -p leasehold-node --bin leasehold --example rls_load
#   node/scripts/compare-rls.sh [IN_FLIGHT...]          (default: 1 16 256)
# Environment: DURATION (s, 5), KEYS (1000), UNIT (second), LIMIT (1000),
# BATCH (the escrow node's --batch, 16), ESCROW_FLAGS (more escrow flags,
# e.g. --eoq), BASE_PORT (7521).
# Prints one JSON line per run (the Redis run first, then the escrow node's
# with its ratios to it); docs/benchmarks.md has the table.
set -euo pipefail

LEVELS=("${@:-1 16 256}")
read -r -a LEVELS <<<"${LEVELS[*]}"
BIN="${LEASEHOLD_BIN:-target/release/leasehold}"
LOAD="${RLS_LOAD_BIN:-target/release/examples/rls_load}"
DURATION="${DURATION:-5}"
KEYS="${KEYS:-1000}"
UNIT="${UNIT:-second}"
LIMIT="${LIMIT:-1000}"
BATCH="${BATCH:-16}"
read -r -a EXTRA <<<"${ESCROW_FLAGS:-}"
BASE_PORT="${BASE_PORT:-7521}"
REDIS_PORT=$((BASE_PORT + 10))
ESCROW="127.0.0.1:$((BASE_PORT + 3))"
METRICS="127.0.0.1:$((BASE_PORT + 4))"
for tool in redis-server redis-cli curl jq; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed" >&2; exit 2; }
done
[ -x "$BIN" ] && [ -x "$LOAD" ] || { echo "build first: see the header of $0" >&2; exit 2; }

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/redis"
redis-server --port "$REDIS_PORT" --dir "$WORK/redis" --daemonize no --save '' --appendonly no \
  >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
for _ in $(seq 1 50); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$REDIS_PORT" ping >/dev/null || { echo "redis did not start" >&2; exit 1; }

addr() { echo "127.0.0.1:$((BASE_PORT + $1 - 1))"; }
ENDPOINTS="$(addr 1),$(addr 2),$(addr 3)"
MEMBER_PIDS=()
for id in 1 2 3; do
  "$BIN" serve --insecure --id "$id" --listen "$(addr "$id")" --data-dir "$WORK/member-$id" \
    2>>"$WORK/members.log" &
  PIDS+=($!)
  MEMBER_PIDS+=($!)
done
"$BIN" cluster init --insecure --endpoint "$(addr 1)" --wait-secs 20 \
  --member "1=$(addr 1)" --member "2=$(addr 2)" --member "3=$(addr 3)" >/dev/null

cat >"$WORK/bench.yaml" <<EOF
domain: bench
descriptors:
  - key: remote_address
    rate_limit:
      unit: $UNIT
      requests_per_unit: $LIMIT
EOF
"$BIN" policy apply "$WORK/bench.yaml" --insecure --endpoint "$ENDPOINTS" >/dev/null

"$BIN" escrow --insecure --region eu --listen "$ESCROW" --coordinator "$ENDPOINTS" \
  --metrics-listen "$METRICS" --batch "$BATCH" --ratelimit-config "$WORK/bench.yaml" \
  "${EXTRA[@]}" 2>>"$WORK/escrow.log" &
ESCROW_PID=$!
PIDS+=("$ESCROW_PID")

# User + system CPU ticks of processes (fields 14 and 15 of /proc/PID/stat).
ticks_per_sec=$(getconf CLK_TCK)
cpu_ticks() {
  local total=0 pid
  for pid in "$@"; do
    total=$((total + $(sed 's/^.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }')))
  done
  echo "$total"
}

# The value of one unlabelled sample of the escrow node's /metrics.
metric() { curl -sf "http://$METRICS/metrics" | awk -v name="$1" '$1 == name { print $2 }'; }
for _ in $(seq 1 100); do
  [ "$(metric leasehold_escrow_coordinator_reachable 2>/dev/null)" = 1 ] && break
  sleep 0.1
done
[ "$(metric leasehold_escrow_coordinator_reachable)" = 1 ] ||
  { echo "escrow node not ready:" >&2; cat "$WORK/escrow.log" >&2; exit 1; }

# A short first run: every answer must be OK or OVER_LIMIT (a missing
# policy would be NO_POLICY errors).
check="$("$LOAD" --endpoint "$ESCROW" --in-flight 16 --keys "$KEYS" --duration-secs 1)"
if [ "$(jq .errors <<<"$check")" != 0 ]; then
  echo "the escrow node refused: $(jq -r .first_error <<<"$check")" >&2; exit 1
fi

# CPU µs per answer of `ticks` over the answers of the run on stdin.
CPU_PER_ANSWER='def cpu_us($ticks): if .answers > 0 then $ticks / $hz * 1e6 / .answers | floor else null end;'
for n in "${LEVELS[@]}"; do
  redis_cpu_before=$(cpu_ticks "$REDIS_PID")
  redis_run="$("$LOAD" --redis "127.0.0.1:$REDIS_PORT" --in-flight "$n" --keys "$KEYS" \
    --limit "$LIMIT" --unit "$UNIT" --duration-secs "$DURATION")"
  redis_cpu=$(($(cpu_ticks "$REDIS_PID") - redis_cpu_before))
  jq -c --argjson hz "$ticks_per_sec" --argjson cpu "$redis_cpu" "$CPU_PER_ANSWER"'
    {target, in_flight, answers_per_sec, p50_us: .latency_us.p50, p99_us: .latency_us.p99,
     ok, over_limit, errors, redis_cpu_us_per_answer: cpu_us($cpu)}' <<<"$redis_run"

  calls_before="$(metric leasehold_escrow_coordinator_calls_total)"
  rpcs_before="$(metric leasehold_escrow_lease_calls_total)"
  escrow_cpu_before=$(cpu_ticks "$ESCROW_PID")
  members_cpu_before=$(cpu_ticks "${MEMBER_PIDS[@]}")
  rls_run="$("$LOAD" --endpoint "$ESCROW" --in-flight "$n" --keys "$KEYS" --duration-secs "$DURATION")"
  escrow_cpu=$(($(cpu_ticks "$ESCROW_PID") - escrow_cpu_before))
  members_cpu=$(($(cpu_ticks "${MEMBER_PIDS[@]}") - members_cpu_before))
  sleep 0.2 # the keys' last counters reach the node's totals
  calls_after="$(metric leasehold_escrow_coordinator_calls_total)"
  rpcs_after="$(metric leasehold_escrow_lease_calls_total)"
  jq -c --argjson redis "$redis_run" --argjson hz "$ticks_per_sec" \
    --argjson escrow_cpu "$escrow_cpu" --argjson members_cpu "$members_cpu" \
    --argjson c0 "$calls_before" --argjson c1 "$calls_after" \
    --argjson l0 "$rpcs_before" --argjson l1 "$rpcs_after" \
    "$CPU_PER_ANSWER"'def r: . * 100 | round / 100;
     .answers as $answers |
     def per_1000: if $answers > 0 then . * 1000 / $answers | r else null end;
     {target, in_flight, answers_per_sec, p50_us: .latency_us.p50, p99_us: .latency_us.p99,
      ok, over_limit, errors,
      coordinator_calls_per_1000: ($c1 - $c0 | per_1000),
      lease_rpcs_per_1000: ($l1 - $l0 | per_1000),
      escrow_cpu_us_per_answer: cpu_us($escrow_cpu), members_cpu_us_per_answer: cpu_us($members_cpu),
      vs_redis: {answers_per_sec: (.answers_per_sec / $redis.answers_per_sec | r),
                 p50: (.latency_us.p50 / ([$redis.latency_us.p50, 1] | max) | r),
                 p99: (.latency_us.p99 / ([$redis.latency_us.p99, 1] | max) | r)}}' \
    <<<"$rls_run"
done
