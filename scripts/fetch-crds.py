#!/usr/bin/env python3
"""Fetch the CustomResourceDefinitions of Flux, Argo CD, the Prometheus Operator and cert-manager
into .tools/crds/, so the tests can create them on the real control plane and check every GitOps
example and every optional object of the chart against the schemas those projects really serve.

Each project's CRDs come from its Go module zip at a pinned version, served by the Go module
proxy (GOPROXY, default https://proxy.golang.org), and the zip is checked against its pinned
go.sum hash (h1, Go's dirhash) before anything is read from it. A zip already in Go's module
download cache is used from there: after the first fetch nothing is downloaded again. The fetched
files are never committed (.tools/ is ignored).

Usage: fetch-crds.py DEST   (DEST/<project>/*.yaml and DEST/VERSIONS, one line per module)
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

# Flux v2.9.5's controllers (the versions its manifests/crds/kustomization.yaml pins), Argo CD,
# the Prometheus Operator and cert-manager: module, version, go.sum hash, and the CRDs of the
# kinds the examples and the chart use.
MODULES = [
    ("flux", "github.com/fluxcd/source-controller", "v1.9.5",
     "h1:MFPyCodUi9hZIMaKDsC/rYbNoyzpvrAdrPVixj7W9F0=",
     ["config/crd/bases/source.toolkit.fluxcd.io_gitrepositories.yaml",
      "config/crd/bases/source.toolkit.fluxcd.io_ocirepositories.yaml"]),
    ("flux", "github.com/fluxcd/kustomize-controller", "v1.9.5",
     "h1:/XY2zy3K7fntyppEXIHG7oRMzmfgIt50eJzUfaPX1Kc=",
     ["config/crd/bases/kustomize.toolkit.fluxcd.io_kustomizations.yaml"]),
    ("flux", "github.com/fluxcd/helm-controller", "v1.6.4",
     "h1:u/Ew7LehrwDQaE/NqWdaB3XnNDCxRGDcp1FZl7RKj4g=",
     ["config/crd/bases/helm.toolkit.fluxcd.io_helmreleases.yaml"]),
    ("argocd", "github.com/argoproj/argo-cd/v3", "v3.6.2",
     "h1:t6RQrVV4hg9M0+lPMsUvi9e4RnYV9dE99/guXGxG6Lc=", ["manifests/crds/application-crd.yaml"]),
    ("prometheus-operator", "github.com/prometheus-operator/prometheus-operator", "v0.94.0",
     "h1:VxMKzqr8Xqw5/QInNT7a3B5XInPnHqE7SD2UIdwKpRM=",
     ["example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
             "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"]),
    ("cert-manager", "github.com/cert-manager/cert-manager", "v1.21.2",
     "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68=",
     ["deploy/crds/cert-manager.io_certificates.yaml", "deploy/crds/cert-manager.io_issuers.yaml"]),
]


def escape(module: str) -> str:
    """The proxy's case encoding: an upper-case letter becomes '!' and its lower case."""
    return "".join("!" + c.lower() if c.isupper() else c for c in module)


def dirhash(archive: zipfile.ZipFile) -> str:
    """Go's h1 hash of a module zip (golang.org/x/mod/sumdb/dirhash.Hash1)."""
    summary = "".join(f"{hashlib.sha256(archive.read(name)).hexdigest()}  {name}\n"
                      for name in sorted(archive.namelist()))
    return "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()


def go_cache_zip(module: str, version: str) -> Path | None:
    if shutil.which("go") is None:
        return None
    cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False).stdout.strip()
    path = Path(cache) / "cache" / "download" / escape(module) / "@v" / f"{version}.zip"
    return path if cache and path.is_file() else None


def module_zip(module: str, version: str) -> bytes:
    cached = go_cache_zip(module, version)
    if cached is not None:
        return cached.read_bytes()
    proxy = next((p for p in os.environ.get("GOPROXY", "").replace("|", ",").split(",")
                  if p.startswith(("https://", "http://"))), "https://proxy.golang.org")
    url = f"{proxy.rstrip('/')}/{escape(module)}/@v/{version}.zip"
    with urllib.request.urlopen(url, timeout=300) as response:
        return response.read()


def fetch(dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    versions = []
    for project, module, version, expected, wanted in MODULES:
        archive = zipfile.ZipFile(io.BytesIO(module_zip(module, version)))
        actual = dirhash(archive)
        if actual != expected:
            sys.exit(f"fetch-crds: {module}@{version}: zip hash {actual}, pinned {expected}")
        prefix = f"{module}@{version}/"
        target = dest / project
        target.mkdir(parents=True, exist_ok=True)
        for want in wanted:
            if prefix + want not in archive.namelist():
                sys.exit(f"fetch-crds: {module}@{version} has no {want}")
            (target / want.rsplit("/", 1)[1]).write_bytes(archive.read(prefix + want))
        versions.append(f"{project} {module} {version}")
    (dest / "VERSIONS").write_text("\n".join(versions) + "\n")


if __name__ == "__main__":
    fetch(Path(sys.argv[1] if len(sys.argv) > 1 else ".tools/crds"))
