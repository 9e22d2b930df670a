#!/usr/bin/env bash
# Proves deploy/ works as written: builds the image FROM scratch from an
# already built binary (nothing is pulled), brings up deploy/compose (three
# members, two regions of two escrow nodes each, mutual TLS), forms the
# cluster, sets policies, leases through every escrow node from a load client
# while it `docker kill`s the leader, cuts a member off with `docker network
# disconnect` and kills one of eu's escrow nodes for good, restarts
# everything, and checks:
#   - Σ admitted ≤ L in every window (the load client sums what its
#     limiters were granted per window, over both regions);
#   - every acknowledged grant kept (the coordinator's window total after the
#     restart ≥ the grants it acknowledged before);
#   - both regions admitted (eu through its other node after the kill; the
#     load client prints each region's longest pause);
#   - leases through the escrow nodes work again after the restart;
#   - Envoy's rate limit service on all four escrow nodes, asked as Envoy
#     asks it (service certificate `envoy` of each region): Σ OK ≤ L per
#     window over both regions, with the draft RateLimit headers;
#   - a backup saved from the host with the copied certificates reads back
#     (`leasehold snapshot save`, `snapshot inspect`);
#   - every container is healthy (`leasehold health`) and serves /metrics.
# Prints each step; exits non-zero on the first failed check (the /metrics
# step reports and fails at the end, after the other checks have run).
# Cleans up (containers, volumes, network, images) on exit.
#
#   bash deploy/test-compose.sh [--binary PATH] [--load-client PATH] [--keep]
#
# --binary PATH       the leasehold binary (also LEASEHOLD_BINARY; default
#                     target/debug/leasehold when present, else it is built)
# --load-client PATH  the compose_load example (also LEASEHOLD_LOAD_CLIENT;
#                     default: target/debug/examples/compose_load, brought
#                     up to date with cargo build)
# --keep              leave the cluster running for inspection
set -euo pipefail
cd "$(dirname "$0")/.."

BINARY=${LEASEHOLD_BINARY:-}
LOAD_CLIENT=${LEASEHOLD_LOAD_CLIENT:-}
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) BINARY=${2:?--binary needs a path}; shift 2 ;;
    --load-client) LOAD_CLIENT=${2:?--load-client needs a path}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "test-compose.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# The load's shape. L per 1 s window through both escrow nodes; the kept
# key's window (31 days, the longest a policy may have) outlives the run.
LIMIT=200
LOAD_SECS=36
# Seconds into the load; who to kill or cut is looked up LOOKUP_AHEAD
# seconds earlier (a CLI container starts slowly on a loaded machine).
KILL_AT=8 RESTART_AT=15 CUT_AT=20 HEAL_AT=27 LOOKUP_AHEAD=4
# One of eu's two escrow nodes dies for the rest of the load: eu's clients
# move on to the other (the load client reports eu's longest pause).
ESCROW_KILL_AT=30

RUN_ID="$$$(date +%s)"
PROJECT="leaseholdci${RUN_ID}"
IMAGE="leasehold:ci-${RUN_ID}"
LOAD_IMAGE="leasehold-load:ci-${RUN_ID}"
COMPOSE_FILE=deploy/compose/docker-compose.yml
NETWORK="${PROJECT}_default"
CERTS_VOLUME="${PROJECT}_certs"
LOAD_KEY="load/${RUN_ID}"
KEPT_KEY="kept/${RUN_ID}"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/leasehold-compose.XXXXXX")
STARTED=$(date +%s)
FAILED_STEP=""

step() { FAILED_STEP="$*"; printf '\n==> [%3ss] %s\n' "$(( $(date +%s) - STARTED ))" "$*"; }
info() { printf '    %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

compose() { docker-compose -p "$PROJECT" -f "$COMPOSE_FILE" "$@"; }
# The compose file's `cli` service, as `docker run` (a second faster than
# `docker-compose run`, which matters while faults are timed).
cli() {
  docker run --rm --network "$NETWORK" -v "$CERTS_VOLUME:/certs:ro" \
    -e LEASEHOLD_CA=/certs/ca.pem -e LEASEHOLD_CERT=/certs/operator-admin.pem \
    -e LEASEHOLD_KEY=/certs/operator-admin.key -e LEASEHOLD_ENDPOINT=n1:7100,n2:7100,n3:7100 \
    "$IMAGE" "$@"
}
# docker-compose's progress lines without the unfinished ones.
quiet() { { tr -d '\r' | grep -v -e '\.\.\. *$' -e '^$' || true; } | sed 's/^/    /'; }
container() { compose ps -q "$1"; }
load_client() { docker run --rm --network "$NETWORK" -v "$CERTS_VOLUME:/certs:ro" "$LOAD_IMAGE" "$@"; }

cleanup() {
  local status=$?
  if [ "$status" -ne 0 ] && [ -n "$FAILED_STEP" ]; then
    echo "---- failed during: $FAILED_STEP; last log lines of each container:" >&2
    for service in n1 n2 n3 escrow-eu escrow-eu-2 escrow-us escrow-us-2 init; do
      id=$(container "$service" 2>/dev/null || true)
      [ -n "$id" ] || continue
      echo "---- $service" >&2
      docker logs --tail 15 "$id" 2>&1 | cut -c1-300 >&2 || true
    done
  fi
  if [ "$KEEP" = 1 ]; then
    echo "kept: LEASEHOLD_IMAGE=$IMAGE docker-compose -p $PROJECT -f $COMPOSE_FILE --profile cli down -v;" \
      "docker rm -v ${PROJECT}-load; docker rmi $IMAGE $LOAD_IMAGE; rm -r $WORK" >&2
    exit "$status"
  else
    docker rm -f -v "${PROJECT}-load" >/dev/null 2>&1 || true
    compose --profile cli down -v --remove-orphans >/dev/null 2>&1 || true
    docker rmi -f "$LOAD_IMAGE" "$IMAGE" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v docker >/dev/null || fail "docker is required"
command -v docker-compose >/dev/null || fail "docker-compose is required"
command -v curl >/dev/null || fail "curl is required"

step "binaries"
if [ -z "$BINARY" ] && [ -x target/debug/leasehold ]; then
  BINARY=target/debug/leasehold
fi
if [ -z "$BINARY" ]; then
  info "no target/debug/leasehold: cargo build --workspace --bin leasehold"
  cargo build --workspace --bin leasehold
  BINARY=target/debug/leasehold
fi
if [ -z "$LOAD_CLIENT" ]; then
  # The test run builds the example only as a test harness; cargo builds the
  # binary from the same compiled dependencies. `--workspace` resolves
  # features as the workspace-wide test run did, so those are reused (with
  # `-p leasehold-node` alone the features differ and most of the tree is
  # rebuilt: 211 s instead of 37 s on 2 cores).
  if command -v cargo >/dev/null; then
    info "cargo build --workspace --example compose_load"
    cargo build --quiet --workspace --example compose_load
  fi
  LOAD_CLIENT=target/debug/examples/compose_load
fi
[ -x "$BINARY" ] || fail "$BINARY is not an executable file"
[ -x "$LOAD_CLIENT" ] || fail "$LOAD_CLIENT is not an executable file"
info "leasehold:    $BINARY ($(date -r "$BINARY" '+%F %T'))"
info "load client:  $LOAD_CLIENT ($(date -r "$LOAD_CLIENT" '+%F %T'))"
METRICS=1
serve_help=$("$BINARY" serve --help) || fail "$BINARY serve --help failed"
escrow_help=$("$BINARY" escrow --help) || fail "$BINARY escrow --help failed"
if ! grep -q -- '--metrics-listen' <<<"$serve_help" || ! grep -q -- '--metrics-listen' <<<"$escrow_help"; then
  METRICS=0
  info "this leasehold has no --metrics-listen: running the compose file without it;"
  info "the /metrics step will fail"
  sed -e 's/ *"--metrics-listen", "[^"]*",//' "$COMPOSE_FILE" > "$WORK/docker-compose.yml"
  COMPOSE_FILE="$WORK/docker-compose.yml"
  if grep -q -- '--metrics-listen' "$COMPOSE_FILE"; then
    fail "could not take --metrics-listen out of the compose file"
  fi
fi

step "image $IMAGE FROM scratch (nothing pulled)"
bash deploy/build-image.sh --binary "$BINARY" --image "$IMAGE" 2>&1 | sed 's/^/    /'
mkdir -p "$WORK/load/lib"
cp "$LOAD_CLIENT" "$WORK/load/compose_load"
# The load client links the libraries leasehold links; refuse a mismatch.
missing=$(comm -13 <(ldd "$BINARY" | awk '{print $1}' | sort) <(ldd "$LOAD_CLIENT" | awk '{print $1}' | sort))
[ -z "$missing" ] || fail "the load client links libraries the image lacks: $missing"
cat > "$WORK/load/Dockerfile" <<EOF
FROM $IMAGE
COPY compose_load /usr/local/bin/compose_load
HEALTHCHECK NONE
ENTRYPOINT ["/usr/local/bin/compose_load"]
EOF
docker build --quiet -t "$LOAD_IMAGE" "$WORK/load" > "$WORK/load-build.log" 2>&1 \
  || { cat "$WORK/load-build.log" >&2; fail "building $LOAD_IMAGE"; }
info "built $LOAD_IMAGE (the image plus the load client)"
[ "$(docker image inspect -f '{{json .Config.Healthcheck.Test}}' "$IMAGE")" = '["CMD","/usr/local/bin/leasehold","health"]' ] \
  || fail "the image has no HEALTHCHECK running leasehold health"
# What a registry push takes as it is: the version tag of the binary, the
# OCI labels, an unprivileged user.
version=$("$BINARY" --version | awk '{print $2}')
[ "$(docker image inspect -f '{{.Id}}' "leasehold:$version")" = "$(docker image inspect -f '{{.Id}}' "$IMAGE")" ] \
  || fail "the image is not also tagged leasehold:$version"
[ "$(docker image inspect -f '{{index .Config.Labels "org.opencontainers.image.version"}}' "$IMAGE")" = "$version" ] \
  || fail "the image's org.opencontainers.image.version label is not $version"
[ "$(docker image inspect -f '{{.Config.User}}' "$IMAGE")" = "65532:65532" ] \
  || fail "the image does not run as 65532:65532"
info "tagged leasehold:$version, OCI labels, user 65532"

export LEASEHOLD_IMAGE="$IMAGE"
# JSON log lines (checked below), and published ports the kernel hands out
# free, so this run collides with nothing else on the host.
export LEASEHOLD_LOG_FORMAT=json
read -r LEASEHOLD_N1_PORT LEASEHOLD_N2_PORT LEASEHOLD_N3_PORT LEASEHOLD_ESCROW_EU_PORT \
  LEASEHOLD_ESCROW_EU_2_PORT LEASEHOLD_ESCROW_US_PORT LEASEHOLD_ESCROW_US_2_PORT < <(python3 -c '
import socket
held = [socket.socket() for _ in range(7)]
for s in held:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))
')
export LEASEHOLD_N1_PORT LEASEHOLD_N2_PORT LEASEHOLD_N3_PORT LEASEHOLD_ESCROW_EU_PORT \
  LEASEHOLD_ESCROW_EU_2_PORT LEASEHOLD_ESCROW_US_PORT LEASEHOLD_ESCROW_US_2_PORT

wait_healthy() {
  local deadline=$(( $(date +%s) + $1 )) service id state pending
  while :; do
    pending=""
    for service in n1 n2 n3 escrow-eu escrow-eu-2 escrow-us escrow-us-2; do
      id=$(container "$service")
      state=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id")
      [ "$state" = healthy ] || pending="$pending $service=$state"
    done
    [ -z "$pending" ] && return 0
    [ "$(date +%s)" -lt "$deadline" ] || fail "not healthy after $1 s:$pending"
    sleep 1
  done
}

leader_id() {
  { cli cluster status --output json 2>/dev/null || true; } | grep -o '"current_leader":[0-9]*' | head -1 | cut -d: -f2 || true
}

step "compose up: certificates, 3 members, cluster init, 2 escrow nodes per region (mutual TLS)"
compose up -d 2>&1 | quiet
init_id=$(container init)
[ "$(docker inspect -f '{{.State.ExitCode}}' "$init_id")" = 0 ] || fail "cluster init exited non-zero"
docker logs "$init_id" 2>&1 | tail -3 | sed 's/^/    init: /'
wait_healthy 60
info "every member serves leasehold.v1.Coordinator, every escrow node leasehold.v1.Escrow (HEALTHCHECK: leasehold health)"

step "cluster status (docker-compose run --rm cli) and policies"
compose run --rm -T cli cluster status 2>&1 | quiet
cli policy set --prefix load/ --limit "$LIMIT" --window-ms 1000 | sed 's/^/    /'
cli policy set --prefix kept/ --limit 1000000 --window-ms 2678400000 | sed 's/^/    /'

step "the operator's way in: certificates on the host, a region's cli, JSON logs"
docker cp "$(container n1)":/certs "$WORK/host-certs" >/dev/null
"$BINARY" cluster status --endpoint "127.0.0.1:$LEASEHOLD_N1_PORT" --ca "$WORK/host-certs/ca.pem" \
  --cert "$WORK/host-certs/operator-admin.pem" --cert-key "$WORK/host-certs/operator-admin.key" \
  > "$WORK/host-status.out" 2>&1 || { sed 's/^/    /' "$WORK/host-status.out"; fail "cluster status from the host with the copied certificates"; }
info "docker cp n1:/certs, then leasehold cluster status on 127.0.0.1:$LEASEHOLD_N1_PORT from the host: ok"
compose run --rm -T cli-eu lease --key load/cli-eu --region eu --tokens 1 > "$WORK/cli-eu.out" 2>&1 \
  || { sed 's/^/    /' "$WORK/cli-eu.out"; fail "lease through the cli-eu service"; }
info "docker-compose run --rm cli-eu lease: $(grep -v '^$' "$WORK/cli-eu.out" | tail -1)"
docker logs "$(container n1)" 2>&1 | tail -5 > "$WORK/n1.log"
python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1]) if l.strip()]' "$WORK/n1.log" \
  || { sed 's/^/    /' "$WORK/n1.log"; fail "LEASEHOLD_LOG_FORMAT=json: n1's log lines are not JSON"; }
info "LEASEHOLD_LOG_FORMAT=json: n1 logs JSON objects"

step "load for ${LOAD_SECS} s through eu's and us's escrow nodes, with direct leases of $KEPT_KEY"
docker run -d --name "${PROJECT}-load" --network "$NETWORK" -v "$CERTS_VOLUME:/certs:ro" "$LOAD_IMAGE" \
  load --escrow eu=escrow-eu:7200,escrow-eu-2:7200 --escrow us=escrow-us:7200,escrow-us-2:7200 \
  --coordinator n1:7100,n2:7100,n3:7100 --key "$LOAD_KEY" --limit "$LIMIT" \
  --duration-secs "$LOAD_SECS" --kept-key "$KEPT_KEY" >/dev/null
LOAD_START=$(date +%s)
at() { local wait=$(( LOAD_START + $1 - $(date +%s) )); [ "$wait" -le 0 ] || sleep "$wait"; }

at $(( KILL_AT - LOOKUP_AHEAD ))
step "docker kill the leader"
leader=$(leader_id)
[ -n "$leader" ] || fail "no leader found"
at "$KILL_AT"
docker kill "$(container "n$leader")" >/dev/null
info "killed n$leader (member $leader) at load +$(( $(date +%s) - LOAD_START )) s"
at "$RESTART_AT"
docker start "$(container "n$leader")" >/dev/null
info "restarted n$leader at load +$(( $(date +%s) - LOAD_START )) s"

at $(( CUT_AT - LOOKUP_AHEAD ))
step "cut a member off: docker network disconnect"
leader=$(leader_id)
cut=""
for id in 1 2 3; do [ "$id" != "$leader" ] && { cut=$id; break; }; done
[ -n "$cut" ] || fail "no follower to cut off"
at "$CUT_AT"
docker network disconnect "$NETWORK" "$(container "n$cut")"
info "n$cut (a follower; member ${leader:-?} leads) off the network at load +$(( $(date +%s) - LOAD_START )) s"
at "$HEAL_AT"
docker network connect --alias "n$cut" "$NETWORK" "$(container "n$cut")"
info "n$cut reconnected at load +$(( $(date +%s) - LOAD_START )) s"

at "$ESCROW_KILL_AT"
step "docker kill one of eu's two escrow nodes (escrow-eu) for the rest of the load"
docker kill "$(container escrow-eu)" >/dev/null
info "killed escrow-eu at load +$(( $(date +%s) - LOAD_START )) s; eu's clients go on through escrow-eu-2"

step "load results: Σ admitted ≤ L = $LIMIT per window"
load_status=$(docker wait "${PROJECT}-load")
docker logs "${PROJECT}-load" > "$WORK/load.out" 2>&1
sed 's/^/    /' "$WORK/load.out"
[ "$load_status" = 0 ] || fail "the load client found a violation (above)"
read -r _ acked_key acked_window acked_tokens < <(grep '^ACKNOWLEDGED ' "$WORK/load.out") || true
[ -n "${acked_tokens:-}" ] || fail "the load client reported no acknowledged grants"

step "restart everything (all members at once)"
compose stop 2>&1 | quiet
compose up -d 2>&1 | quiet
wait_healthy 90
info "all healthy again"

step "every acknowledged grant kept"
if ! load_client verify --coordinator n1:7100,n2:7100,n3:7100 --key "$acked_key" \
  --window-start-ms "$acked_window" --acknowledged "$acked_tokens" 2>&1 | sed 's/^/    /'; then
  fail "acknowledged grants were not kept"
fi

step "a backup from the host (leasehold snapshot save, then inspect)"
"$BINARY" snapshot save --output json \
  --endpoint "127.0.0.1:$LEASEHOLD_N1_PORT,127.0.0.1:$LEASEHOLD_N2_PORT,127.0.0.1:$LEASEHOLD_N3_PORT" \
  --ca "$WORK/host-certs/ca.pem" --cert "$WORK/host-certs/operator-admin.pem" \
  --cert-key "$WORK/host-certs/operator-admin.key" --out "$WORK/compose.backup" \
  > "$WORK/backup.out" 2>&1 || { sed 's/^/    /' "$WORK/backup.out"; fail "snapshot save from the host"; }
"$BINARY" snapshot inspect "$WORK/compose.backup" > "$WORK/inspect.out" 2>&1 \
  || { sed 's/^/    /' "$WORK/inspect.out"; fail "snapshot inspect of the saved backup"; }
grep -q '"linearizable":true' "$WORK/backup.out" || { sed 's/^/    /' "$WORK/backup.out"; fail "the backup was not taken on the leader"; }
info "$(sed 's/^/saved: /' "$WORK/backup.out" | cut -c1-220)"
info "$(cut -c1-220 "$WORK/inspect.out")"

step "leases through the escrow nodes after the restart"
load_client load --escrow eu=escrow-eu:7200,escrow-eu-2:7200 --escrow us=escrow-us:7200,escrow-us-2:7200 \
  --coordinator n1:7100,n2:7100,n3:7100 --key "$LOAD_KEY" --limit "$LIMIT" \
  --duration-secs 4 --kept-key "$KEPT_KEY" > "$WORK/after.out" 2>&1 || { sed 's/^/    /' "$WORK/after.out"; fail "load after the restart"; }
{ grep '^region ' "$WORK/after.out" || true; } | sed 's/^/    /'

step "Envoy's rate limit service (RLS v3) on all four escrow nodes: Σ OK ≤ 10 per 1 s window"
docker run --rm --network "$NETWORK" -v "$CERTS_VOLUME:/certs:ro" \
  -v "$PWD/deploy/config/ratelimit.example.yaml:/etc/leasehold/ratelimit/messaging.yaml:ro" \
  -e LEASEHOLD_CA=/certs/ca.pem -e LEASEHOLD_CERT=/certs/operator-admin.pem \
  -e LEASEHOLD_KEY=/certs/operator-admin.key -e LEASEHOLD_ENDPOINT=n1:7100,n2:7100,n3:7100 \
  "$IMAGE" policy apply /etc/leasehold/ratelimit/messaging.yaml 2>&1 | sed 's/^/    /'
sleep 3 # the escrow nodes read policies every 2 s
load_client rls --escrow eu=escrow-eu:7200,escrow-eu-2:7200 --escrow us=escrow-us:7200,escrow-us-2:7200 \
  --domain messaging --entry remote_address=192.0.2.7 --limit 10 --window-ms 1000 \
  --duration-secs 4 > "$WORK/rls.out" 2>&1 || { sed 's/^/    /' "$WORK/rls.out"; fail "RLS through the escrow nodes"; }
grep '^RLS ' "$WORK/rls.out" | sed 's/^/    /'

step "scrape /metrics of every container"
metrics_failures=0
for target in n1:7101 n2:7101 n3:7101 escrow-eu:7201 escrow-eu-2:7201 escrow-us:7201 escrow-us-2:7201; do
  service=${target%%:*} port=${target##*:}
  if [ "$METRICS" = 0 ]; then
    info "$service: FAIL (this leasehold binary has no --metrics-listen; passes once the metrics endpoint is merged)"
    metrics_failures=$(( metrics_failures + 1 ))
    continue
  fi
  published=$(compose port "$service" "$port" 2>/dev/null || true)
  if [ -z "$published" ] || ! curl -fsS --max-time 5 "http://$published/metrics" > "$WORK/metrics-$service" 2>"$WORK/curl-$service"; then
    info "$service: FAIL (GET http://${published:-<unpublished>}/metrics: $(cat "$WORK/curl-$service" 2>/dev/null))"
    metrics_failures=$(( metrics_failures + 1 ))
    continue
  fi
  families=$(grep -c '^# TYPE ' "$WORK/metrics-$service" || true)
  if [ "$families" -eq 0 ]; then
    info "$service: FAIL (/metrics answered without any '# TYPE' line)"
    metrics_failures=$(( metrics_failures + 1 ))
  else
    info "$service: $families metric families, e.g. $(grep '^# TYPE ' "$WORK/metrics-$service" | head -3 | awk '{print $3}' | paste -sd' ' -)"
  fi
done

step "summary"
info "image FROM scratch, compose up, init, policies, leader kill, network cut, full restart, backup, RLS: passed"
info "Σ admitted ≤ L in every window; all $acked_tokens acknowledged tokens of key $acked_key kept"
info "total $(( $(date +%s) - STARTED )) s"
if [ "$metrics_failures" -gt 0 ]; then
  FAILED_STEP=""
  fail "/metrics: $metrics_failures of 5 containers did not serve metrics"
fi
FAILED_STEP=""
echo "PASS"
