#!/usr/bin/env bash
# Builds the `leasehold:local` container image without pulling anything:
# release binary + the shared libraries it needs, in a FROM-scratch image.
#
#   bash deploy/build-image.sh            # builds leasehold:local
#   IMAGE=leasehold:dev bash deploy/build-image.sh
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-leasehold:local}
cargo build --release -p leasehold-node -p leasehold-chaos
ROOT=deploy/docker/rootfs
rm -rf "$ROOT"
mkdir -p "$ROOT/usr/local/bin" "$ROOT/tmp" "$ROOT/etc" deploy/docker/datadir
cp target/release/leasehold "$ROOT/usr/local/bin/"
cp target/release/leasehold-chaos "$ROOT/usr/local/bin/" 2>/dev/null || true
# Copy the dynamic loader and every library the binaries link against.
for bin in "$ROOT"/usr/local/bin/*; do
  ldd "$bin" | awk '/=>/ {print $3} /ld-linux/ {print $1}' | while read -r lib; do
    [ -f "$lib" ] || continue
    mkdir -p "$ROOT$(dirname "$lib")"
    cp -L "$lib" "$ROOT$lib"
  done
done
echo "leasehold:x:65532:65532::/data:/usr/local/bin/leasehold" > "$ROOT/etc/passwd"
echo "leasehold:x:65532:" > "$ROOT/etc/group"
chmod 1777 "$ROOT/tmp"
touch deploy/docker/datadir/.keep
docker build -t "$IMAGE" -f deploy/docker/Dockerfile deploy/docker
echo "built $IMAGE"
