#!/usr/bin/env bash
# Shards (ADR 0025) measured on one machine, two modes:
#
#   throughput [S...]   for each shard count S (default 1 2 4 8): a fresh
#                       3-member cluster on loopback (release, fsync on,
#                       plaintext), the slots spread evenly over S shards
#                       (each on the three members; shard s is formed by
#                       its s mod 3-th replica, so the leaders spread),
#                       then `bench` with LeaseBatch calls of 64 at
#                       IN_FLIGHT leases in flight over KEYS keys; beside
#                       it, in the same run, Redis without persistence and
#                       its lease script at the same leases in flight.
#   memory [N]          N live windows (default 1 000 000) on 3 members
#                       holding one shard, then on 6 members whose keys
#                       are split over two shards of three replicas each
#                       (shard 0, on every member, keeps no slot): every
#                       member's RSS once each key holds a live window.
#   move [N]            what a split costs the callers while it runs: N
#                       keys (default 200 000) with a live window on 3
#                       members (one shard), then two `bench` runs over
#                       them of DURATION s each: one as is, one during
#                       which shard 0 splits (half its slots, N/2 keys'
#                       windows, to a new shard 1 on the same members) a
#                       third of the way in. For each: leases/s, latency
#                       percentiles, the longest gap between successful
#                       leases, failed batches; and how long the move ran
#                       (split to shard 1 serving all its slots).
#   cpu [BATCH]         what a shard's leader and a follower spend: 3
#                       members, shard 0 split into shard 1 on all three
#                       (half the slots each), `bench` with LeaseBatch
#                       calls of BATCH (default 64) at IN_FLIGHT leases in
#                       flight over KEYS keys for DURATION s; every
#                       member's user + system CPU from /proc/PID/stat,
#                       less what it spends idle over as long. A member
#                       leading neither shard follows both: its CPU per
#                       lease is a follower's; a leader's is what its
#                       member spends beyond following the other shard.
#                       Prints CPU-ms per 1 000 leases, leader and follower.
#
# Needs a release build, redis-server (throughput) and jq:
#   cargo build --release -p leasehold-node --bin leasehold --example redis_lease_load
#   node/scripts/shard-bench.sh throughput 1 2 4 8
#   node/scripts/shard-bench.sh memory 1000000
#   DURATION=9 node/scripts/shard-bench.sh move 200000
# Prints one JSON line per run; docs/benchmarks.md has the tables.
set -euo pipefail

MODE="${1:-throughput}"
shift || true
BIN="${LEASEHOLD_BIN:-target/release/leasehold}"
LOAD="${REDIS_LOAD_BIN:-target/release/examples/redis_lease_load}"
DURATION="${DURATION:-5}"
# SERVE_ARGS: extra flags for every member's `serve` (e.g. --config FILE).
KEYS="${KEYS:-10000}"
IN_FLIGHT="${IN_FLIGHT:-1024}"
BASE_PORT="${BASE_PORT:-7701}"
SLOTS=16384
[ -x "$BIN" ] || { echo "build first: see the header of $0" >&2; exit 2; }

WORK="$(mktemp -d)"
PIDS=()
stop_all() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
}
cleanup() { stop_all; rm -rf "$WORK"; }
trap cleanup EXIT

addr() { echo "127.0.0.1:$((BASE_PORT + $1 - 1))"; }
MEMBER_PIDS=()

# start_cluster N: N members, formed, with a policy on `lease:`.
start_cluster() {
  local n="$1" run="$WORK/run-$RANDOM" members=()
  MEMBER_PIDS=()
  for id in $(seq 1 "$n"); do
    # shellcheck disable=SC2086 # SERVE_ARGS: extra flags, split on spaces.
    "$BIN" serve --insecure --id "$id" --listen "$(addr "$id")" --data-dir "$run/member-$id" \
      ${SERVE_ARGS:-} 2>>"$WORK/members.log" &
    PIDS+=($!)
    MEMBER_PIDS+=($!)
    members+=(--member "$id=$(addr "$id")")
  done
  ENDPOINTS="$(for id in $(seq 1 "$n"); do printf '%s,' "$(addr "$id")"; done)"
  ENDPOINTS="${ENDPOINTS%,}"
  "$BIN" cluster init --insecure --endpoint "$(addr 1)" --wait-secs 20 "${members[@]}" >/dev/null
  "$BIN" policy set --insecure --endpoint "$ENDPOINTS" --prefix lease: \
    --limit 281474976710656 --window-ms 600000 >/dev/null
}

shard() { "$BIN" shard "$1" --insecure --endpoint "$ENDPOINTS" "${@:2}" >/dev/null; }

# wait_until_owned SHARD SLOTS MEMBER: the placement, as MEMBER (a replica
# of SHARD: only a replica knows its leader) answers it, shows SHARD owning
# SLOTS slots and a leader for it (its group formed); the keys arrive with
# the last part of the move, a moment later.
wait_until_owned() {
  for _ in $(seq 1 200); do
    if "$BIN" shard list --insecure --endpoint "$(addr "$3")" --output json 2>>"$WORK/shard-list.log" |
      jq -e --argjson s "$1" --argjson n "$2" \
        '.shards[] | select(.id == $s and .slots == $n and .leader_id != null)' >/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "shard $1 never owned $2 slots" >&2
  exit 1
}

throughput() {
  command -v redis-server >/dev/null || { echo "redis-server is not installed" >&2; exit 2; }
  [ -x "$LOAD" ] || { echo "build first: see the header of $0" >&2; exit 2; }
  local levels=("${@:-1 2 4 8}")
  read -r -a levels <<<"${levels[*]}"
  redis-server --port 6393 --dir "$WORK" --daemonize no --save '' --appendonly no \
    >"$WORK/redis.log" 2>&1 &
  PIDS+=($!)
  local redis_pid=$!
  for _ in $(seq 1 50); do redis-cli -p 6393 ping >/dev/null 2>&1 && break; sleep 0.1; done
  local batch=64 callers=$(( (IN_FLIGHT + 63) / 64 ))
  for s in "${levels[@]}"; do
    start_cluster 3
    local block=$(( SLOTS / s ))
    for i in $(seq 1 $(( s - 1 ))); do
      local end=$(( i == s - 1 ? SLOTS : (i + 1) * block ))
      shard add --shard "$i" --replicas 1,2,3
      shard move --start $(( i * block )) --end "$end" --to "$i"
    done
    for i in $(seq 1 $(( s - 1 ))); do
      wait_until_owned "$i" $(( i == s - 1 ? SLOTS - i * block : block )) 1
    done
    # One short run first: the client learns the placement, the shards
    # their first windows.
    "$BIN" bench --insecure --endpoint "$ENDPOINTS" --region bench --key lease: --keys "$KEYS" \
      --no-setup --concurrency "$callers" --batch "$batch" --duration-secs 1 --output json >/dev/null
    "$BIN" bench --insecure --endpoint "$ENDPOINTS" --region bench --key lease: --keys "$KEYS" \
      --no-setup --concurrency "$callers" --batch "$batch" --duration-secs "$DURATION" --output json |
      jq -c --argjson s "$s" \
        '{target: "leasehold", shards: $s, in_flight: (.concurrency * 64), leases_per_sec: (.leases_per_sec|floor), p50_ms: .latency_ms.p50, p99_ms: .latency_ms.p99, errors}'
    "$LOAD" --addr 127.0.0.1:6393 --in-flight "$IN_FLIGHT" --keys "$KEYS" --duration-secs "$DURATION" |
      jq -c --argjson s "$s" '{target: "redis-no-persistence", beside_shards: $s, in_flight, leases_per_sec: (.leases_per_sec|floor), p50_ms: .latency_ms.p50, p99_ms: .latency_ms.p99}'
    for pid in "${MEMBER_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${MEMBER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=("$redis_pid")
  done
}

# rss_line LABEL: one JSON line with every member's RSS (MiB).
rss_line() {
  local rss=()
  for pid in "${MEMBER_PIDS[@]}"; do
    rss+=("$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$pid/status")")
  done
  local live=()
  for id in $(seq 1 "${#MEMBER_PIDS[@]}"); do
    live+=("$("$BIN" cluster status --insecure --endpoint "$(addr "$id")" --output json |
      jq '[.live_windows] + [.shards[].live_windows] | add')")
  done
  jq -cn --arg layout "$1" --argjson n "$2" --argjson secs "$3" \
    --argjson rss "[$(IFS=,; echo "${rss[*]}")]" --argjson live "[$(IFS=,; echo "${live[*]}")]" \
    --slurpfile b "$WORK/fill.json" \
    '{layout: $layout, keys: $n, fill_secs: $secs, leases: $b[0].leases, errors: $b[0].errors,
      live_windows_per_member: $live, rss_mib_per_member: $rss, rss_mib_max: ($rss | max),
      rss_mib_sum: ($rss | add)}'
}

# fill N: every one of N keys gets a live window (LeaseBatch calls of 64,
# four callers walking the keys), timed.
fill() {
  local n="$1" start end
  start=$(date +%s)
  # At ≥ 20 k leases/s every key is leased at least once.
  RUST_LOG="${BENCH_LOG:-warn}" "$BIN" bench --insecure --endpoint "$ENDPOINTS" --region mem --key lease: --keys "$n" \
    --no-setup --concurrency 4 --batch 64 --duration-secs $(( n / 20000 + 3 )) --output json \
    >"$WORK/fill.json"
  end=$(date +%s)
  echo $(( end - start ))
}

memory() {
  local n="${1:-1000000}" secs
  start_cluster 3
  secs=$(fill "$n")
  rss_line "3 members, 1 shard (shard 0 on all three)" "$n" "$secs"
  stop_all
  start_cluster 6
  shard add --shard 1 --replicas 1,2,3
  shard add --shard 2 --replicas 4,5,6
  shard move --start 0 --end $(( SLOTS / 2 )) --to 1
  shard move --start $(( SLOTS / 2 )) --end "$SLOTS" --to 2
  wait_until_owned 1 $(( SLOTS / 2 )) 1
  wait_until_owned 2 $(( SLOTS / 2 )) 4
  # Optionally let the moves finish before the fill (batches sent while
  # a shard forms are refused and counted as errors).
  sleep "${SETTLE_SECS:-0}"
  secs=$(fill "$n")
  rss_line "6 members, shards 1 on 1-3 and 2 on 4-6" "$n" "$secs"
}

# bench_line LABEL N: DURATION s of `bench` over N keys (LeaseBatch calls
# of 64, four callers), one JSON line.
bench_line() {
  "$BIN" bench --insecure --endpoint "$ENDPOINTS" --region mem --key lease: --keys "$2" \
    --no-setup --concurrency 4 --batch 64 --duration-secs "$DURATION" --output json |
    jq -c --arg run "$1" '{run: $run, leases_per_sec: (.leases_per_sec|floor), p50_ms: .latency_ms.p50,
      p99_ms: .latency_ms.p99, max_ms: .latency_ms.max, longest_gap_ms: (.longest_gap_ms|floor),
      failed_batches: .errors}'
}

# serving_slots SHARD MEMBER: the slots SHARD serves on MEMBER (0 if it
# does not host it yet).
serving_slots() {
  "$BIN" cluster status --insecure --endpoint "$(addr "$2")" --output json 2>/dev/null |
    jq --argjson s "$1" '[.shards[] | select(.id == $s) | .owned_slots] | add // 0'
}

move() {
  local n="${1:-200000}"
  start_cluster 3
  fill "$n" >/dev/null
  bench_line "no move" "$n"
  (
    sleep "$(( DURATION / 3 ))"
    local started ended
    started=$(date +%s%N)
    shard split --shard 0 --into 1 --replicas 1,2,3
    until [ "$(serving_slots 1 1)" = $(( SLOTS / 2 )) ]; do sleep 0.05; done
    ended=$(date +%s%N)
    jq -cn --argjson ms $(( (ended - started) / 1000000 )) --argjson keys "$n" \
      '{run: "the split", moved_slots: 8192, keys: $keys, split_to_serving_ms: $ms}'
  ) >"$WORK/split.json" &
  local splitter=$!
  bench_line "split a third of the way in" "$n"
  wait "$splitter"
  cat "$WORK/split.json"
}

# cpu_ticks: every member's user + system CPU so far, clock ticks, one line.
cpu_ticks() {
  for pid in "${MEMBER_PIDS[@]}"; do awk '{printf "%d ", $14 + $15}' "/proc/$pid/stat"; done
}

# shard_leader SHARD: SHARD's leader as member 1 (a replica of both) names it.
shard_leader() {
  "$BIN" shard list --insecure --endpoint "$(addr 1)" --output json |
    jq --argjson s "$1" '.shards[] | select(.id == $s) | .leader_id'
}

cpu() {
  local batch="${1:-64}" callers
  callers=$(( (IN_FLIGHT + batch - 1) / batch ))
  start_cluster 3
  shard split --shard 0 --into 1 --replicas 1,2,3
  wait_until_owned 1 $(( SLOTS / 2 )) 1
  "$BIN" bench --insecure --endpoint "$ENDPOINTS" --region cpu --key lease: --keys "$KEYS" \
    --no-setup --concurrency "$callers" --batch "$batch" --duration-secs 1 --output json >/dev/null
  local idle_0 idle_1 busy_0 busy_1
  idle_0=$(cpu_ticks); sleep "$DURATION"; idle_1=$(cpu_ticks)
  busy_0=$(cpu_ticks)
  "$BIN" bench --insecure --endpoint "$ENDPOINTS" --region cpu --key lease: --keys "$KEYS" \
    --no-setup --concurrency "$callers" --batch "$batch" --duration-secs "$DURATION" --output json \
    >"$WORK/cpu.json"
  busy_1=$(cpu_ticks)
  jq -cn --argjson l0 "$(shard_leader 0)" --argjson l1 "$(shard_leader 1)" \
    --argjson tck "$(getconf CLK_TCK)" --argjson batch "$batch" \
    --argjson i0 "[${idle_0// /,}0]" --argjson i1 "[${idle_1// /,}0]" \
    --argjson b0 "[${busy_0// /,}0]" --argjson b1 "[${busy_1// /,}0]" \
    --slurpfile b "$WORK/cpu.json" '
    ($b[0].leases) as $n
    | [range(0; 3) | (($b1[.] - $b0[.]) - ($i1[.] - $i0[.])) / $tck] as $cpu
    | [range(0; 3) | select(. + 1 != $l0 and . + 1 != $l1)][0] as $f
    | ($cpu[$f] / $n) as $follower
    | [range(0; 3) | select(. + 1 == $l0 or . + 1 == $l1)
        | if (. + 1 == $l0 and . + 1 == $l1) then $cpu[.] / $n
          else ($cpu[.] - $follower * $n / 2) / ($n / 2) end] as $leader
    | {batch: $batch, in_flight: ($b[0].concurrency * $batch), leases: $n,
       leases_per_sec: ($b[0].leases_per_sec | floor), leader_of_shard_0: $l0,
       leader_of_shard_1: $l1, member_cpu_s: ($cpu | map(. * 100 | round / 100)),
       leader_cpu_ms_per_1000: ($leader | map(. * 1e8 | round / 100)),
       follower_cpu_ms_per_1000: ($follower * 1e8 | round / 100)}'
}

case "$MODE" in
  throughput) throughput "$@" ;;
  memory) memory "$@" ;;
  move) move "$@" ;;
  cpu) cpu "$@" ;;
  *) echo "usage: $0 throughput [SHARDS...] | memory [WINDOWS] | move [KEYS] | cpu [BATCH]" >&2; exit 2 ;;
esac
