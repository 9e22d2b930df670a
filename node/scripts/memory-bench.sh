#!/usr/bin/env bash
# Memory and disk of one member against the number of live windows: a
# single `leasehold serve` (release, fsync on), a policy with a 10-minute
# window, then `leasehold bench --keys N` until N keys each hold a live
# window; prints the member's RSS, the data directory's size and the live
# windows it reports. One JSON line per N.
#
#   cargo build --release -p leasehold-node --bin leasehold
#   node/scripts/memory-bench.sh [N...]            (default: 1000 100000 1000000)
set -euo pipefail
LEVELS=("${@:-1000 100000 1000000}")
read -r -a LEVELS <<<"${LEVELS[*]}"
BIN="${LEASEHOLD_BIN:-target/release/leasehold}"
ADDR="127.0.0.1:${PORT:-7601}"
WORK="$(mktemp -d)"
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

for n in "${LEVELS[@]}"; do
  data="$WORK/member-$n"
  "$BIN" serve --insecure --id 1 --listen "$ADDR" --data-dir "$data" 2>>"$WORK/member.log" &
  PID=$!
  "$BIN" cluster init --insecure --endpoint "$ADDR" --wait-secs 20 --member "1=$ADDR" >/dev/null
  "$BIN" policy set --insecure --endpoint "$ADDR" --prefix mem/ --limit 1000 --window-ms 600000 >/dev/null
  idle_rss=$(awk '/VmRSS/ {print $2}' "/proc/$PID/status")
  # Enough time for every key to be leased at least once (≥ 30 k leases/s).
  secs=$(( n / 30000 + 3 ))
  "$BIN" bench --insecure --endpoint "$ADDR" --region mem --key mem/k --keys "$n" --no-setup \
    --connections 1 --concurrency 4 --batch 64 --duration-secs "$secs" --output json >"$WORK/bench.json"
  windows=$("$BIN" cluster status --insecure --endpoint "$ADDR" --output json |
    jq '[.. | objects | select(has("live_windows")) | .live_windows] | max')
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$PID/status")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$PID/status")
  disk=$(du -sk "$data" | cut -f1)
  jq -cn --argjson n "$n" --argjson windows "$windows" --argjson idle "$idle_rss" \
    --argjson rss "$rss" --argjson hwm "$hwm" --argjson disk "$disk" --slurpfile b "$WORK/bench.json" \
    '{keys: $n, live_windows: $windows, leases: $b[0].leases, leases_per_sec: ($b[0].leases_per_sec|floor),
      rss_mib_idle: ($idle/1024|floor), rss_mib: ($rss/1024|floor), peak_rss_mib: ($hwm/1024|floor),
      data_dir_mib: ($disk/1024|floor)}'
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
done
