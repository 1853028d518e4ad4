"""The GitOps examples (examples/gitops/) as Flux and Argo CD read them: their objects, and each
Argo CD application's sync wave."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tests.support.paths import ROOT

GITOPS = ROOT / "examples" / "gitops"
FLUX, ARGOCD = GITOPS / "flux", GITOPS / "argocd"
POLICY = GITOPS / "policies" / "qemu-rs.yaml"
RENDERS = GITOPS / "renders"
CLI = [sys.executable, "-m", "kata_sizing.cli"]
# Namespaces a cluster has before anything of kata-sizing is applied: Kubernetes' own, and the
# one Flux's or Argo CD's install creates.
EMPTY_CLUSTER_NAMESPACES = {"default", "kube-system", "flux-system", "argocd"}
NOT_OBJECTS = {"values", "health"}  # Helm values and Lua, beside the objects


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def objects(directory: Path) -> list[dict]:
    """Every object of the YAML files under `directory`, as Flux's generated kustomization or
    an Argo CD directory source would read them."""
    return [doc for path in sorted(directory.rglob("*.yaml"))
            if not NOT_OBJECTS & set(path.parts) and path.name != "kustomization.yaml"  # kustomize's, not an object
            for doc in documents(path)]


def wave(application: dict) -> int:
    return int(application["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"])
