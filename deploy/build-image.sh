#!/usr/bin/env bash
# Builds the `leasehold:local` container image without pulling anything: one
# `leasehold` binary plus the shared libraries it links against, FROM scratch.
# The image is also tagged `leasehold:<version>` (the binary's `--version`)
# and carries the OCI labels (version, revision, licenses): a registry push
# takes it as it is (`docker tag leasehold:0.1.0 REGISTRY/leasehold:0.1.0`).
#
#   bash deploy/build-image.sh                         # cargo build --release (reuses target/release), leasehold:local
#   bash deploy/build-image.sh --binary target/debug/leasehold   # an existing binary, no cargo at all
#   bash deploy/build-image.sh --profile dev --image leasehold:dev
#
# --binary PATH   use this binary as it is (also LEASEHOLD_BINARY)
# --profile NAME  cargo profile to build with when no binary is given
#                 (default release; `cargo build` reuses what is already built)
# --image TAG     image tag (also IMAGE; default leasehold:local)
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-leasehold:local}
BINARY=${LEASEHOLD_BINARY:-}
PROFILE=release
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) BINARY=${2:?--binary needs a path}; shift 2 ;;
    --profile) PROFILE=${2:?--profile needs a name}; shift 2 ;;
    --image) IMAGE=${2:?--image needs a tag}; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [ -z "$BINARY" ]; then
  cargo build --profile "$PROFILE" -p leasehold-node --bin leasehold
  case "$PROFILE" in
    dev|test) BINARY=target/debug/leasehold ;;
    bench) BINARY=target/release/leasehold ;;
    *) BINARY=target/$PROFILE/leasehold ;;
  esac
fi
if [ ! -x "$BINARY" ]; then
  echo "build-image.sh: $BINARY is not an executable file" >&2
  exit 1
fi

STAGE=$(mktemp -d "${TMPDIR:-/tmp}/leasehold-image.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
ROOT=$STAGE/rootfs
mkdir -p "$ROOT/usr/local/bin" "$ROOT/tmp" "$ROOT/etc" "$STAGE/datadir"
cp "$BINARY" "$ROOT/usr/local/bin/leasehold"
# The dynamic loader and every library the binary links against.
ldd "$BINARY" | awk '/=>/ {print $3} /ld-linux/ {print $1}' | while read -r lib; do
  [ -f "$lib" ] || continue
  mkdir -p "$ROOT$(dirname "$lib")"
  cp -L "$lib" "$ROOT$lib"
done
echo "leasehold:x:65532:65532::/data:/usr/local/bin/leasehold" > "$ROOT/etc/passwd"
echo "leasehold:x:65532:" > "$ROOT/etc/group"
chmod 1777 "$ROOT/tmp"
touch "$STAGE/datadir/.keep"
cp deploy/docker/Dockerfile "$STAGE/Dockerfile"
VERSION=$("$BINARY" --version | awk '{print $2}')
case "$VERSION" in
  ''|*[!0-9A-Za-z.+-]*) echo "build-image.sh: $BINARY --version gave no version" >&2; exit 1 ;;
esac
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if ! docker build -t "$IMAGE" -t "leasehold:$VERSION" --build-arg "VERSION=$VERSION" \
    --build-arg "REVISION=$REVISION" "$STAGE" > "$STAGE/build.log" 2>&1; then
  cat "$STAGE/build.log" >&2
  echo "build-image.sh: docker build failed" >&2
  exit 1
fi
echo "built $IMAGE and leasehold:$VERSION from $BINARY ($(du -h "$BINARY" | cut -f1) binary)"
