"""Teardown on the real kube-apiserver, in every order docs/install.md and docs/gitops.md allow:
the policies first while the operator runs, the install first (the operator, its RBAC, the shared
admission policies and the CRD go while the policies stay: a GitOps prune does not order deletions
by dependsOn), and both at once. Each ends with nothing stuck (no delete waits on a finalizer) and
nothing enforcing (a pod the policies refused is admitted) and nothing of kata-sizing left.

And installed by Helm with the chart's default values (order `helm-crd-first`): first as Flux's
helm-controller writes (Helm's client-side three-way merge), then upgraded server-side as Helm 4
does by default. Every policy is Ready; a shared admission policy deleted under each is put back in
the installer's name and the next upgrade succeeds without --force-conflicts. Then the CRD goes
first (no documented order, but it happens): the operator says so in one line and stops cleanly,
and the documented last commands (the sweep, and the namespace Helm's --create-namespace made,
with the operator's Lease in it) leave nothing.

A control plane of its own: the session's install stays for the other tests.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kata_sizing.controller.handlers import CRD_GONE
from kata_sizing.core.podfit import SHARED_NAMES
from tests.support.admission import ADMISSION, put_back_in_the_installers_name
from tests.support.realcluster import (
    CRD_NAME,
    POLICIES,
    ROOT,
    ControlPlane,
    RealOperator,
    installed_control_plane,
    poll,
    qemu_rs,
    wait_observed,
)

pytestmark = pytest.mark.realserver

SHARED = "katasizing.dev/shared=admission"
OURS = "app.kubernetes.io/managed-by=kata-sizing"
ADMISSION_KINDS = ("validatingadmissionpolicies,mutatingadmissionpolicies,"
                   "validatingadmissionpolicybindings,mutatingadmissionpolicybindings")
# Every step of a teardown must finish in this long: a step waiting on a finalizer does not.
STEP_TIMEOUT = "60s"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with installed_control_plane(tmp_path_factory.mktemp("teardown")) as cp:
        yield cp


def install(cp: ControlPlane, with_helm: bool = False) -> None:
    """`kubectl apply -k manifests/` (again), or the chart with its default values as Flux's
    helm-controller installs it (below), once the namespace of an earlier teardown is gone."""
    if not with_helm:
        poll(lambda: not ((cp.get("/api/v1/namespaces/kata-sizing") or {}).get("metadata") or {}).get(
            "deletionTimestamp"), 60, "the last teardown's namespace is gone")
        cp.install()
        return
    # Helm adopts nothing it did not create: any install there (the module's first, when this order
    # runs alone) goes first, and the last teardown's namespace and CRD are gone.
    delete_install(cp)
    poll(lambda: cp.get("/api/v1/namespaces/kata-sizing") is None
         and cp.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}") is None,
         60, "the last install's namespace and CRD are gone")
    helm(cp, "install", "kata-sizing", str(ROOT / "charts" / "kata-sizing"), "-n", "kata-sizing",
         "--create-namespace", "--server-side=false")
    cp.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    poll(lambda: cp.kubectl("get", "ksp", check=False).returncode == 0, 30, "kubectl get ksp works")


def helm(cp: ControlPlane, *args: str) -> None:
    """The real helm (4). Flux's helm-controller (not available here) embeds Helm's library: what it
    writes is what `--server-side=false` writes (Helm 3's three-way merge, each object's fields
    recorded as an Update), in its own field manager's name where the CLI's is `helm`, and with its
    own labels added. The operator takes both from the objects (compare.Installer)."""
    proc = subprocess.run([str(ROOT / ".tools" / "helm"), *args, f"--kubeconfig={cp.admin_kubeconfig}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}{proc.stderr}"


def upgraded_after_put_backs(cp: ControlPlane) -> None:
    """Every policy Ready with the chart's shared admission policies (Helm's labels on them); one
    put back under each kind of Helm write, and the next upgrade of that kind succeeds."""
    for name in cp.items(POLICIES):
        wait_observed(cp, name, Ready="True")
    chart = str(ROOT / "charts" / "kata-sizing")
    put_back_in_the_installers_name(
        cp, f"{ADMISSION}/validatingadmissionpolicies/{SHARED_NAMES['memory']}", ("helm", "Update"))
    helm(cp, "upgrade", "kata-sizing", chart, "-n", "kata-sizing", "--server-side=false")  # Flux's next upgrade
    helm(cp, "upgrade", "kata-sizing", chart, "-n", "kata-sizing", "--server-side=true")  # Helm 4's own way
    put_back_in_the_installers_name(
        cp, f"{ADMISSION}/mutatingadmissionpolicies/{SHARED_NAMES['route']}", ("helm", "Apply"))
    helm(cp, "upgrade", "kata-sizing", chart, "-n", "kata-sizing")  # server-side again, no --force-conflicts
    for name in cp.items(POLICIES):
        wait_observed(cp, name, Ready="True")


def policies() -> list[dict]:
    """Two policies: one with the operator's RuntimeClasses, one routing opted-in pods."""
    first = qemu_rs("torn")
    second = qemu_rs("down")
    second["spec"]["runtimeClass"] = {**second["spec"].get("runtimeClass", {}), "namePrefix": "kata-down"}
    return [first, second]


def refused_pod() -> dict:
    """A pod that opted in to policy `down` and fits none of its classes: refused while the
    policy's admission objects hold (pod-not-routed), admitted once nothing of it is left."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "too-big", "namespace": "default", "labels": {"katasizing.dev/policy": "down"}},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"limits": {"cpu": "512", "memory": "4Ti"}}}]}}


def admitted(cp: ControlPlane) -> bool:
    return cp.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(refused_pod()),
                      check=False).returncode == 0


def step(cp: ControlPlane, *args: str) -> None:
    """One teardown command, which must not hang."""
    proc = cp.kubectl(*args, f"--timeout={STEP_TIMEOUT}", check=False, timeout=120)
    assert proc.returncode == 0, f"kubectl {' '.join(args)} did not finish:\n{proc.stderr}"


def delete_install(cp: ControlPlane) -> None:
    """`kubectl delete -k manifests/`, not waiting for the namespace's contents to go (a CRD that
    hangs on a finalizer shows at the end, in what is left)."""
    step(cp, "delete", "-k", str(ROOT / "manifests"), "--ignore-not-found", "--wait=false")


def delete_policies(cp: ControlPlane) -> None:
    if cp.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + CRD_NAME) is not None:
        step(cp, "delete", "ksp", "--all", "--ignore-not-found", "--cascade=foreground")


def sweep(cp: ControlPlane) -> None:
    """The documented last steps: the shared admission policies (which a GitOps prune leaves, and
    an operator still stopping may have put back), and whatever of the policies' objects the
    garbage collector had not removed when the CRD went (it cannot look up an owner whose kind is
    no longer served, so it never will)."""
    step(cp, "delete", ADMISSION_KINDS, "-l", SHARED, "--ignore-not-found")  # Helm's labels on the chart's
    step(cp, "delete", ADMISSION_KINDS + ",runtimeclasses", "-l", OURS, "--ignore-not-found")
    step(cp, "delete", "configmaps", "-A", "-l", OURS, "--ignore-not-found")


def left_over(cp: ControlPlane) -> dict[str, list[str]]:
    def names(*args: str) -> list[str]:
        return cp.kubectl("get", *args, "-o", "name", check=False).stdout.split()
    return {
        "crd": names("crd", CRD_NAME, "--ignore-not-found"),
        "namespace": names("namespace", "kata-sizing", "--ignore-not-found"),
        "lease": names("lease", "-n", "kata-sizing", "--ignore-not-found"),
        "shared admission": names(ADMISSION_KINDS, "-l", SHARED),
        "rbac": names("clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/name=kata-sizing"),
        "runtime classes": names("runtimeclasses", "-l", OURS),
        "configmaps": names("configmaps", "-A", "-l", OURS),
        "admission": names(ADMISSION_KINDS, "-l", OURS),
    }


# policies-first after the other manifests/ orders: its foreground deletion waits for the garbage
# collector to know the CRD, which it learns at its next discovery (every 30 s) after the control
# plane's start. helm-crd-first after it: it deletes nothing in the foreground, and an order before
# policies-first would shift that wait (15 to 37 s).
@pytest.mark.parametrize("order", ["install-first", "at-once", "policies-first", "helm-crd-first"])
def test_a_teardown_in_any_order_leaves_nothing_stuck_nothing_enforcing_nothing_behind(
        cluster: ControlPlane, tmp_path: Path, order: str) -> None:
    cp = cluster
    with_helm = order.startswith("helm")
    install(cp, with_helm)
    operator = RealOperator(cp, tmp_path)
    # With a Lease, as the Deployment runs it: the Lease is what a Helm install leaves behind.
    operator.start(*(["--leader-elect"] if with_helm else []))
    try:
        cp.apply(*copy.deepcopy(policies()))
        def reconciled() -> bool:
            found = cp.items("/apis/katasizing.dev/v1alpha1/katasizingpolicies").values()
            return len(found) == 2 and all((p.get("status") or {}).get("observedGeneration") for p in found)
        poll(reconciled, 30, "both policies reconciled")
        poll(lambda: not admitted(cp), 30, "the opted-in pod that fits no class is refused")
        # Nothing for a teardown to wait on: the operator puts no finalizer on a policy.
        assert [p["metadata"].get("finalizers") for p in cp.items(
            "/apis/katasizing.dev/v1alpha1/katasizingpolicies").values()] == [None, None]
        shared = cp.kubectl("get", "validatingadmissionpolicies,mutatingadmissionpolicies", "-l", SHARED,
                            "-o", "name").stdout.split()
        assert len(shared) == 3, "the install holds the shared admission policies"

        if with_helm:
            upgraded_after_put_backs(cp)
            # The CRD first: every policy goes with it; the operator says so once and stops cleanly.
            step(cp, "delete", "crd", CRD_NAME)
            poll(lambda: not operator.running, 20, "the operator stopped once its CRD was deleted")
            log = operator.log()
            assert operator.stop() == 0, log[-3000:]
            assert log.count(CRD_GONE % CRD_NAME) == 1 and "Traceback" not in log, log[-3000:]
            helm(cp, "uninstall", "kata-sizing", "-n", "kata-sizing", "--wait")
        elif order == "policies-first":
            # docs/install.md: the policies, while the operator runs; then the install.
            delete_policies(cp)
            operator.stop()
            delete_install(cp)
        elif order == "install-first":
            # A prune that removes the operator before the policies: the operator stops with its
            # install, the policies stay until they are deleted (the CRD with the install here).
            operator.stop()
            delete_install(cp)
            delete_policies(cp)
        else:
            # Flux or Argo CD pruning both applications together.
            both = subprocess.Popen([str(ROOT / ".tools" / "kubectl"), f"--kubeconfig={cp.admin_kubeconfig}",
                                     "delete", "ksp", "--all", f"--timeout={STEP_TIMEOUT}"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            delete_install(cp)
            operator.stop()
            out, _ = both.communicate(timeout=120)
            assert both.returncode == 0 or "the server doesn't have a resource type" in out, out
        # Nothing enforces once the install and the policies are gone, before any sweep.
        poll(lambda: admitted(cp), 30, "the pod the policies refused is admitted")
        sweep(cp)
        if with_helm:
            # --create-namespace made it outside the release; the operator's Lease is in it.
            assert cp.kubectl("get", "lease", "kata-sizing", "-n", "kata-sizing", check=False).returncode == 0
            step(cp, "delete", "namespace", "kata-sizing")
    finally:
        operator.stop()
    poll(lambda: not any(left_over(cp).values()), 60, lambda: f"left behind: {left_over(cp)}")
    assert admitted(cp)
