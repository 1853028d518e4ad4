"""The parameters the API server judges pods by are the ConfigMap's current ones, whatever order the
admission objects went and came back in (docs/admission.md#the-parameters-stay-followed).

kube-apiserver 1.37.2 stops its informer of a paramKind once no binding of a policy with that
paramKind is left for one refresh (about a second) and never starts it again; the install's
keep-alive binding of each shared policy (podfit.KEEP_ALIVE_NAMES) keeps it running. What this shows
depends on the API server's whole life (a stopped informer stays stopped), so on a control plane of
its own, with no operator (a GitOps tool applying `kata-sizing render`): every binding of the policy
deleted for a few seconds and applied again, then an envelope widened in the ConfigMap, and the next
pod is judged and routed by the new envelope; the render deleted (its ConfigMap first) and applied
again, and no pod makes the API server read the ConfigMap; and, last, the same moment without the
keep-alive bindings, which leaves the API server judging by the old envelope.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kata_sizing.core import podfit
from tests.support.admission import dry_run, rendered_objects
from tests.support.pods import IN, POLICY, ROUTED, Case, limits
from tests.support.realcluster import ControlPlane, installed_control_plane, poll

pytestmark = pytest.mark.realserver

# Two of the API server's policy refreshes (one a second, policy_source.go). Long enough: the last
# test shows that without the keep-alive bindings a moment this long stops the informer.
GAP_S = 2
KEEP_ALIVE = "katasizing.dev/shared=admission"
PARAMS = "/api/v1/namespaces/kata-sizing/configmaps/fit-dropins"  # the policy's, in the default output namespace
WIDE_BYTES = 4 * 1024**3

# 1 CPU and 3Gi: over class s (1Gi), within m (4Gi); within s once s is widened to 4Gi.
BIG_ON_S = Case("big-on-s", (limits("1", "3Gi"),), None, None).pod()
OPTED_IN = Case("opted-in", (limits("1", "3Gi"),), None, None, runtime_class=None, namespace=ROUTED,
                labels={podfit.POLICY_LABEL: "fit"}).pod()


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, list[dict]]]:
    """A control plane of its own with kata-sizing installed and the policy's render applied (its
    RuntimeClasses, the drop-ins ConfigMap with the parameters, its three bindings)."""
    tmp = tmp_path_factory.mktemp("params")
    with installed_control_plane(tmp) as cp:
        objects = [o for o in rendered_objects(tmp, POLICY)
                   if o["kind"] != "ConfigMap" or o["metadata"]["name"] == "fit-dropins"]
        cp.apply(*({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}} for name in (IN, ROUTED)),
                 *objects)
        poll(lambda: judged(cp) == (False, "kata-fit-m"), 30, lambda: f"the render judges: {judged(cp)}")
        yield cp, objects


def judged(cp: ControlPlane) -> tuple[bool, str | None]:
    """(the 3Gi pod on class s admitted, the class the routing gives the opted-in 3Gi pod)."""
    admitted = dry_run(cp, [BIG_ON_S]).returncode == 0
    routed = dry_run(cp, [OPTED_IN], "-o", "json")
    return admitted, json.loads(routed.stdout)["spec"].get("runtimeClassName") if routed.returncode == 0 else None


def set_envelope_of_s(cp: ControlPlane, memory_bytes: int, text: str) -> None:
    """A spec change as the operator writes it: class s's envelope in the parameters."""
    def change(params: dict) -> None:
        data = params["data"]
        data["classMemory"] = ",".join([str(memory_bytes), *data["classMemory"].split(",")[1:]])
        data["classEnvelopes"] = ";".join([f"cpu 1, memory {text}", *data["classEnvelopes"].split(";")[1:]])
    cp.edit(PARAMS, change)


def without_for_a_moment(cp: ControlPlane, objects: list[dict]) -> None:
    """The objects deleted (in this order), gone for GAP_S, and applied again."""
    for obj in objects:
        cp.kubectl("delete", "-f", "-", input=yaml.safe_dump(obj))
    time.sleep(GAP_S)
    cp.apply(*objects)


def configmap_gets(cp: ControlPlane) -> float:
    """GETs of a ConfigMap the API server has answered since it started, whoever asked (its own
    admission plugins' included: the audit log records no loopback request)."""
    request = urllib.request.Request(cp.url + "/metrics", headers={"Authorization": f"Bearer {cp._admin_token}"})
    with urllib.request.urlopen(request, context=cp._ssl, timeout=30) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "apiserver_request_total" and sample.labels.get("resource") == "configmaps"
               and sample.labels.get("verb") == "GET")


def bindings_of(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"].endswith("PolicyBinding")]


def test_after_a_moment_without_bindings_pods_are_judged_by_the_parameters_the_configmap_holds(fresh) -> None:
    cp, objects = fresh
    without_for_a_moment(cp, bindings_of(objects))
    poll(lambda: judged(cp) == (False, "kata-fit-m"), 30, "the bindings judge again")
    set_envelope_of_s(cp, WIDE_BYTES, "4Gi")
    # The validating policies and the routing both follow the edit: the pod fits s now.
    poll(lambda: judged(cp) == (True, "kata-fit-s"), 10, lambda: f"after the edit: {judged(cp)}")
    set_envelope_of_s(cp, 1024**3, "1Gi")
    poll(lambda: judged(cp) == (False, "kata-fit-m"), 10, lambda: f"after the edit back: {judged(cp)}")


def test_after_the_render_was_deleted_and_applied_again_no_pod_makes_the_api_server_read_the_configmap(
        fresh) -> None:
    cp, objects = fresh
    params = next(o for o in objects if o["kind"] == "ConfigMap")
    # A GitOps prune in the worst order: the parameters first (docs/admission.md).
    without_for_a_moment(cp, [params, *bindings_of(objects)])
    poll(lambda: judged(cp) == (False, "kata-fit-m"), 30, "the render judges again")
    pods = [Case(f"pod-{i}", (limits("500m", "512Mi"),), None, None).pod() for i in range(30)]
    before = configmap_gets(cp)
    assert dry_run(cp, pods).returncode == 0
    # Before the keep-alive bindings: 90 GETs, one per binding per pod (docs/admission.md).
    assert configmap_gets(cp) - before < len(pods), "the API server read the parameters per pod"


def test_without_the_keep_alive_bindings_kube_apiserver_1_37_judges_by_stale_parameters(fresh) -> None:
    """Why the install carries the keep-alive bindings (and the test above is no empty claim): the
    same moment without them leaves the API server judging by the envelope before the edit, for
    the rest of its life. Last in this module. A Kubernetes release that fixes its param informers
    (kubernetes/kubernetes#130887) fails this test: docs/admission.md then says from which release
    the keep-alive bindings are no longer needed."""
    cp, objects = fresh
    keep_alive = cp.kubectl("get", "validatingadmissionpolicybindings,mutatingadmissionpolicybindings",
                            "-l", KEEP_ALIVE, "-o", "name").stdout.split()
    assert len(keep_alive) == 3, keep_alive
    cp.kubectl("delete", *keep_alive)
    without_for_a_moment(cp, bindings_of(objects))
    poll(lambda: judged(cp) == (False, "kata-fit-m"), 30, "the bindings judge again")
    set_envelope_of_s(cp, WIDE_BYTES, "4Gi")
    time.sleep(GAP_S)  # with a running informer the edit shows in milliseconds (the first test)
    refused = dry_run(cp, [BIG_ON_S])
    assert "exceed class s (cpu 1, memory 1Gi)" in refused.stderr, refused.stderr
    assert judged(cp) == (False, "kata-fit-m")
    assert cp.read(PARAMS)["data"]["classMemory"].startswith(f"{WIDE_BYTES},")
