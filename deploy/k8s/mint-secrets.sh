#!/usr/bin/env bash
# Mints the certificates deploy/k8s mounts and writes them as Kubernetes
# Secrets, so the manifests run with mutual TLS as they are:
#
#   deploy/k8s/mint-secrets.sh --out DIR [--binary PATH] [--members N] [--regions eu,us]
#                              [--namespace NS] [--ip IP,...] [--days N]
#   kubectl apply -f DIR/secrets.yaml && kubectl apply -k deploy/k8s
#
# Secrets (each with the CA certificate `ca.pem`):
#   leasehold-member-certs            member-1.pem/.key … member-N.pem/.key (default N = 3)
#   leasehold-escrow-<region>-certs   region-<region>.pem/.key, per region (default eu)
#   leasehold-operator-certs          operator-admin.pem/.key (the init Job)
# Server names in every server certificate: leasehold-<i>.leasehold (also
# with .<namespace>.svc and .svc.cluster.local when --namespace is given),
# leasehold-client, leasehold-escrow-<region> and leasehold-escrow-<region>-nodes;
# --ip adds addresses (tests use 127.0.0.1).
#
# DIR/certs keeps the files. DIR/certs/ca.key is the cluster's trust root:
# move it offline. Run again with the same DIR to re-issue every certificate
# from the same CA (rotation: the members reload them without a restart);
# certificates of services (`service/<name>@<region>`) come from the same CA:
#   leasehold certs mint --out svc --ca-cert DIR/certs/ca.pem --ca-key DIR/certs/ca.key \
#     --services checkout@eu
# --binary PATH   the leasehold binary (default: $LEASEHOLD_BINARY, else `leasehold` on PATH)
set -euo pipefail

OUT=""
BINARY=${LEASEHOLD_BINARY:-leasehold}
MEMBERS=3
REGIONS=eu
NAMESPACE=""
IPS=""
DAYS=365
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    --binary) BINARY=${2:?--binary needs a path}; shift 2 ;;
    --members) MEMBERS=${2:?--members needs a count}; shift 2 ;;
    --regions) REGIONS=${2:?--regions needs a list}; shift 2 ;;
    --namespace) NAMESPACE=${2:?--namespace needs a name}; shift 2 ;;
    --ip) IPS=${2:?--ip needs addresses}; shift 2 ;;
    --days) DAYS=${2:?--days needs a number}; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "mint-secrets.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || { echo "mint-secrets.sh: --out DIR is required" >&2; exit 2; }
case "$MEMBERS" in ''|*[!0-9]*|0) echo "mint-secrets.sh: --members must be a count ≥ 1" >&2; exit 2 ;; esac

CERTS="$OUT/certs"
mkdir -p "$CERTS"
chmod 700 "$CERTS"

member_ids=$(seq -s, 1 "$MEMBERS")
names="leasehold-client"
for i in $(seq 0 $((MEMBERS - 1))); do
  names="$names,leasehold-$i.leasehold"
  if [ -n "$NAMESPACE" ]; then
    names="$names,leasehold-$i.leasehold.$NAMESPACE.svc,leasehold-$i.leasehold.$NAMESPACE.svc.cluster.local"
  fi
done
IFS=, read -r -a regions <<<"$REGIONS"
for region in "${regions[@]}"; do
  names="$names,leasehold-escrow-$region,leasehold-escrow-$region-nodes"
done

mint=("$BINARY" certs mint --out "$CERTS" --members "$member_ids" --regions "$REGIONS"
      --operators admin --dns "$names" --days "$DAYS")
[ -n "$IPS" ] && mint+=(--ip "$IPS")
if [ -f "$CERTS/ca.pem" ] && [ -f "$CERTS/ca.key" ]; then
  mint+=(--ca-cert "$CERTS/ca.pem" --ca-key "$CERTS/ca.key")
fi
"${mint[@]}" >/dev/null

# secret NAME FILE...: one Secret of the files (by their base names) and ca.pem.
secret() {
  local name=$1; shift
  echo "---"
  echo "apiVersion: v1"
  echo "kind: Secret"
  echo "metadata:"
  echo "  name: $name"
  [ -n "$NAMESPACE" ] && echo "  namespace: $NAMESPACE"
  echo "  labels: { app.kubernetes.io/name: leasehold }"
  echo "type: Opaque"
  echo "data:"
  for file in ca.pem "$@"; do
    echo "  $file: $(base64 -w0 <"$CERTS/$file")"
  done
}

{
  echo "# Made by deploy/k8s/mint-secrets.sh: the certificates deploy/k8s mounts."
  member_files=()
  for id in $(seq 1 "$MEMBERS"); do member_files+=("member-$id.pem" "member-$id.key"); done
  secret leasehold-member-certs "${member_files[@]}"
  for region in "${regions[@]}"; do
    secret "leasehold-escrow-$region-certs" "region-$region.pem" "region-$region.key"
  done
  secret leasehold-operator-certs operator-admin.pem operator-admin.key
} >"$OUT/secrets.yaml"
chmod 600 "$OUT/secrets.yaml"
echo "wrote $OUT/secrets.yaml (apply it, then kubectl apply -k deploy/k8s); keep $CERTS/ca.key offline"
