#!/usr/bin/env bash
# CPU per lease and single-lease latency of a three-member cluster, next to
# the floor the disk sets: one 4 KiB write + fdatasync on the same disk.
#
#   three `leasehold serve` processes on loopback, fsync on, plaintext;
#   `leasehold bench` with N callers (one Lease each in flight) over one
#   connection, 1 000 keys; the members' user+system CPU time is read from
#   /proc/PID/stat before and after each run and divided by the leases.
#
# Needs a release build and jq:
#   cargo build --release -p leasehold-node --bin leasehold
#   node/scripts/cpu-per-lease.sh [IN_FLIGHT...]        (default: 1 256)
# Prints the disk floor, then one JSON line per run.
set -euo pipefail

LEVELS=("${@:-1 256}")
read -r -a LEVELS <<<"${LEVELS[*]}"
BIN="${LEASEHOLD_BIN:-target/release/leasehold}"
DURATION="${DURATION:-10}"
KEYS="${KEYS:-1000}"
BASE_PORT="${BASE_PORT:-7601}"
[ -x "$BIN" ] || { echo "build first: see the header of $0" >&2; exit 2; }
command -v jq >/dev/null || { echo "jq is not installed" >&2; exit 2; }

WORK="$(mktemp -d "${TMPDIR:-/var/tmp}/leasehold-cpu.XXXXXX")"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# The floor: 4 KiB writes, each followed by a flush of the data (O_DSYNC),
# in the directory the members write to.
floor_us=$(dd if=/dev/zero of="$WORK/floor" bs=4k count=2000 oflag=dsync 2>&1 |
  awk '/copied/ { for (i = 1; i <= NF; i++) if ($i == "s,") print int($(i-1) * 1e6 / 2000) }')
rm -f "$WORK/floor"
echo "{\"disk_4k_write_fdatasync_us\": $floor_us}"

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

ticks_per_sec=$(getconf CLK_TCK)
members_cpu_ticks() {
  local total=0 pid
  for pid in "${PIDS[@]}"; do
    # Fields 14 and 15 of /proc/PID/stat (after the parenthesised name).
    total=$((total + $(sed 's/^.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }')))
  done
  echo "$total"
}

for n in "${LEVELS[@]}"; do
  before=$(members_cpu_ticks)
  result=$("$BIN" bench --insecure --endpoint "$ENDPOINTS" --region bench --key lease: \
    --keys "$KEYS" --no-setup --connections 1 --concurrency "$n" \
    --duration-secs "$DURATION" --output json)
  after=$(members_cpu_ticks)
  echo "$result" | jq -c --argjson ticks "$((after - before))" --argjson hz "$ticks_per_sec" \
    '{in_flight: .concurrency, leases_per_sec, p50_ms: .latency_ms.p50, p99_ms: .latency_ms.p99,
      errors, members_cpu_us_per_lease: (if .leases > 0 then ($ticks / $hz * 1e6 / .leases | floor) else null end)}'
done
