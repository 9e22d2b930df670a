#!/usr/bin/env bash
# Measures leader failover as clients see it: three `leasehold serve`
# processes on loopback, a lease load from `leasehold bench`, then the
# leader is killed with SIGKILL mid-run. The bench's "longest gap between
# successful leases" is the time from the last grant of the old leader to
# the first grant of the new one.
#
#   cargo build --release -p leasehold-node
#   node/scripts/failover-bench.sh [ROUNDS]
#   MEMBER_CONFIG=member.toml node/scripts/failover-bench.sh [ROUNDS]   # other Raft timing
set -euo pipefail

ROUNDS="${1:-3}"
BIN="${LEASEHOLD_BIN:-target/release/leasehold}"
BASE_PORT="${BASE_PORT:-7301}"
CONCURRENCY="${CONCURRENCY:-16}"
WORK="$(mktemp -d)"
# Plaintext on loopback: the CLI calls below need no certificates.
export LEASEHOLD_INSECURE=true
declare -A PIDS

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

addr() { echo "127.0.0.1:$((BASE_PORT + $1 - 1))"; }
start() {
  "$BIN" serve --insecure --id "$1" --listen "$(addr "$1")" --data-dir "$WORK/node-$1" \
    ${MEMBER_CONFIG:+--config "$MEMBER_CONFIG"} 2>>"$WORK/node-$1.log" &
  PIDS[$1]=$!
}

for id in 1 2 3; do start "$id"; done
ENDPOINTS="$(addr 1),$(addr 2),$(addr 3)"
"$BIN" cluster init --endpoint "$(addr 1)" --wait-secs 20 \
  --member "1=$(addr 1)" --member "2=$(addr 2)" --member "3=$(addr 3)" >/dev/null

for round in $(seq 1 "$ROUNDS"); do
  "$BIN" bench --endpoint "$ENDPOINTS" --concurrency "$CONCURRENCY" --duration-secs 8 \
    --key "failover/round-$round" --output json >"$WORK/bench-$round.json" &
  BENCH=$!
  sleep 3
  LEADER=""
  for id in 1 2 3; do
    LEADER="$("$BIN" cluster status --endpoint "$(addr "$id")" --output json 2>/dev/null | jq -r '.current_leader // empty')" && [ -n "$LEADER" ] && break
  done
  kill -9 "${PIDS[$LEADER]}"
  wait "${PIDS[$LEADER]}" 2>/dev/null || true
  wait "$BENCH"
  jq -c --arg leader "$LEADER" '{round: '"$round"', killed_leader: ($leader|tonumber), longest_gap_ms, errors, leases, leases_per_sec}' "$WORK/bench-$round.json"
  start "$LEADER"   # back as a follower for the next round
  sleep 2
done
