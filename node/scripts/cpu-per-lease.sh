#!/usr/bin/env bash
# CPU per lease and single-lease latency of a three-member cluster, next to
# the floor the disk sets: one 4 KiB write + fdatasync on the same disk.
#
#   three `leasehold serve` processes on loopback, fsync on, plaintext;
#   `leasehold bench` with N callers (one Lease each in flight) over one
#   connection, 1 000 keys; the members' user+system CPU time is read from
#   /proc/PID/stat before and after each run and divided by the leases.
#
# Needs a release build, jq and python3:
#   cargo build --release -p leasehold-node --bin leasehold
#   node/scripts/cpu-per-lease.sh [CALLS_IN_FLIGHT...]  (default: 1 256)
#   BATCH=64 node/scripts/cpu-per-lease.sh 4 16          # LeaseBatch calls of 64
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

# The floor: 4 KiB writes into a preallocated file, each followed by
# fdatasync, in the directory the members write to; the median and the
# mean of 2 000 (a busy VM's flushes have a long tail, so the mean — what
# `dd oflag=dsync` reports — can be several times the median).
python3 - "$WORK/floor" <<'PY'
import json, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_TRUNC)
os.ftruncate(fd, 8 << 20)
os.fsync(fd)
block, took = b"x" * 4096, []
for i in range(2000):
    start = time.perf_counter()
    os.pwrite(fd, block, i * 4096)
    os.fdatasync(fd)
    took.append(time.perf_counter() - start)
os.close(fd)
os.unlink(sys.argv[1])
took.sort()
print(json.dumps({"disk_4k_write_fdatasync_p50_us": round(took[len(took) // 2] * 1e6),
                  "disk_4k_write_fdatasync_mean_us": round(sum(took) / len(took) * 1e6)}))
PY

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
    --keys "$KEYS" --no-setup --connections 1 --concurrency "$n" --batch "${BATCH:-1}" \
    --duration-secs "$DURATION" --output json)
  after=$(members_cpu_ticks)
  echo "$result" | jq -c --argjson ticks "$((after - before))" --argjson hz "$ticks_per_sec" \
    '{calls_in_flight: .concurrency, leases_per_call: .batch, leases_per_sec, p50_ms: .latency_ms.p50, p99_ms: .latency_ms.p99,
      errors, members_cpu_us_per_lease: (if .leases > 0 then ($ticks / $hz * 1e6 / .leases | floor) else null end)}'
done
