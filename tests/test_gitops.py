"""The GitOps paths of examples/gitops/: a Flux HelmRelease that takes the operator's values
ConfigMap with valuesFrom, Argo CD Applications with the overlay committed by
`kata-sizing render --values-only`. kubernetes-validate has no Flux or Argo CD schemas, so the
keys those controllers act on are checked against what the operator and the CLI really
produce, and the operator chart's values against the real helm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kata_sizing.core.model import parse_policy
from kata_sizing.core.render import FLUX_WATCH_LABEL, VALUES_KEY, render_policy
from tests.test_chart import CHART, find_tool

ROOT = Path(__file__).resolve().parent.parent
GITOPS = ROOT / "examples" / "gitops"
CLI = [sys.executable, "-m", "kata_sizing.cli"]


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def find(path: Path, kind: str, name: str | None = None) -> dict:
    (found,) = [d for d in documents(path) if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return found


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)


@pytest.fixture(scope="module")
def policy():
    return parse_policy(documents(GITOPS / "policy.yaml")[0])


def test_every_example_is_a_kubernetes_object() -> None:
    paths = sorted(GITOPS.rglob("*.yaml"))
    assert len(paths) >= 5
    for path in paths:
        if path.parent.name == "values":
            continue  # Helm values, not objects
        for doc in documents(path):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), path
            assert doc["metadata"].get("name"), path


def test_the_policy_is_valid_and_lets_the_chart_own_the_runtime_classes(policy) -> None:
    result = run_cli("validate", str(GITOPS / "policy.yaml"))
    assert result.returncode == 0, result.stderr
    # With the chart installing the overlay, the chart must create the RuntimeClasses.
    assert policy.spec.runtime_class.managed_by == "KataDeploy"


def test_flux_values_from_names_the_configmap_the_operator_writes(policy) -> None:
    release = find(GITOPS / "flux" / "kata-deploy.yaml", "HelmRelease")
    assert release["apiVersion"] == "helm.toolkit.fluxcd.io/v2"
    [ref] = release["spec"]["valuesFrom"]
    values_cm = render_policy(policy).configmaps[0]
    assert ref["kind"] == "ConfigMap"
    assert ref["name"] == values_cm["metadata"]["name"]
    assert ref["valuesKey"] == VALUES_KEY and VALUES_KEY in values_cm["data"]
    # Flux reads valuesFrom only in the HelmRelease's namespace: the policy must write there.
    assert values_cm["metadata"]["namespace"] == release["metadata"]["namespace"] == policy.spec.output.namespace
    # ...and upgrades at once when the ConfigMap changes only if it carries Flux's watch label.
    assert values_cm["metadata"]["labels"][FLUX_WATCH_LABEL] == "Enabled"


def test_flux_kata_deploy_comes_from_the_oci_chart_repository() -> None:
    path = GITOPS / "flux" / "kata-deploy.yaml"
    release, repository = find(path, "HelmRelease"), find(path, "HelmRepository")
    chart = release["spec"]["chart"]["spec"]
    assert chart["chart"] == "kata-deploy"
    assert chart["sourceRef"] == {"kind": "HelmRepository", "name": repository["metadata"]["name"]}
    assert repository["metadata"]["namespace"] == release["metadata"]["namespace"]
    assert repository["spec"]["type"] == "oci"
    assert repository["spec"]["url"] == "oci://ghcr.io/kata-containers/kata-deploy-charts"
    assert release["spec"]["interval"]


def test_argo_cd_commits_exactly_what_values_only_renders() -> None:
    committed = GITOPS / "argocd" / "values" / "kata-sizing-values.yaml"
    result = run_cli("render", str(GITOPS / "policy.yaml"), "--values-only")
    assert result.returncode == 0, result.stderr
    assert committed.read_text() == result.stdout, (
        "stale: kata-sizing render examples/gitops/policy.yaml --values-only > " + str(committed.relative_to(ROOT)))
    app = find(GITOPS / "argocd" / "kata-deploy.yaml", "Application", "kata-deploy")
    chart_source, values_source = app["spec"]["sources"]
    [value_file] = chart_source["helm"]["valueFiles"]
    assert value_file == f"${values_source['ref']}/{committed.relative_to(ROOT)}"
    assert chart_source["chart"] == "kata-deploy"
    # Argo CD's OCI Helm sources name the registry without the oci:// scheme.
    assert chart_source["repoURL"] == "ghcr.io/kata-containers/kata-deploy-charts"
    # The policy Application syncs before kata-deploy's.
    policies = find(GITOPS / "argocd" / "kata-deploy.yaml", "Application", "kata-sizing-policies")
    wave = lambda a: int(a["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"])  # noqa: E731
    operator = find(GITOPS / "argocd" / "kata-sizing.yaml", "Application")
    assert wave(operator) < wave(policies) < wave(app)
    assert (ROOT / policies["spec"]["source"]["path"] / policies["spec"]["source"]["directory"]["include"]).exists()


@pytest.mark.parametrize("path, kind", [
    (GITOPS / "flux" / "kata-sizing.yaml", "HelmRelease"),
    (GITOPS / "argocd" / "kata-sizing.yaml", "Application"),
])
def test_the_operator_chart_renders_with_the_examples_values(tmp_path: Path, path: Path, kind: str) -> None:
    helm = find_tool("helm")
    if helm is None:
        pytest.skip("helm not at .tools/helm nor on PATH (run `make tools`)")
    obj = find(path, kind)
    if kind == "HelmRelease":
        assert obj["spec"]["chart"]["spec"]["chart"] == "./charts/kata-sizing"
        values, namespace = obj["spec"]["values"], obj["metadata"]["namespace"]
    else:
        assert obj["spec"]["source"]["path"] == "charts/kata-sizing"
        values, namespace = obj["spec"]["source"]["helm"]["valuesObject"], obj["spec"]["destination"]["namespace"]
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = subprocess.run([helm, "template", "kata-sizing", str(CHART), "-n", namespace, "-f", str(values_file)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(result.stdout) if d}
    assert {"ServiceMonitor", "PrometheusRule", "Deployment"} <= kinds


# --- kata-sizing render --values-only ----------------------------------------------------------


def test_values_only_prints_the_overlay_the_configmap_holds(policy) -> None:
    result = run_cli("render", str(GITOPS / "policy.yaml"), "--values-only")
    assert result.returncode == 0, result.stderr
    assert result.stdout == render_policy(policy).values_yaml
    assert result.stderr == ""  # no note about RuntimeClasses: none are printed anyway


def test_values_only_merges_several_policies_into_one_overlay(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text((ROOT / "examples" / "qemu-runtime-rs.yaml").read_text() + "---\n"
                    + (ROOT / "examples" / "clh-snp-go.yaml").read_text())
    result = run_cli("render", str(both), "--values-only", "-o", "json")
    assert result.returncode == 0, result.stderr
    overlay = json.loads(result.stdout)
    runtimes = overlay["customRuntimes"]["runtimes"]
    assert overlay["customRuntimes"]["enabled"] is True
    assert {"kata-qemu-rs-s", "kata-qemu-rs-xl"} <= set(runtimes)
    assert any(name.startswith("kata-clh-snp") for name in runtimes)
    as_yaml = run_cli("render", str(both), "--values-only")
    assert yaml.safe_load(as_yaml.stdout) == overlay


def test_values_only_refuses_two_policies_rendering_the_same_runtime(tmp_path: Path) -> None:
    first = (ROOT / "examples" / "qemu-runtime-rs.yaml").read_text()
    doc = yaml.safe_load(first)
    doc["metadata"]["name"] = "other"
    doc["spec"]["runtimeClass"]["namePrefix"] = "kata-qemu-rs"  # the same names as qemu-rs's
    clash = tmp_path / "clash.yaml"
    clash.write_text(first + "---\n" + yaml.safe_dump(doc))
    result = run_cli("render", str(clash), "--values-only")
    assert result.returncode == 1
    assert "custom runtime 'kata-qemu-rs-s' is also rendered by policy 'qemu-rs'" in result.stderr
    assert "Traceback" not in result.stderr
