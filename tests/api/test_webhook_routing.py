"""The routing webhook (the fallback of the MutatingAdmissionPolicy, issue 10 item 2), served by the
real operator with the emulator as its API server: AdmissionReviews posted the way the API server
posts them, including when the API fails under it. The same webhook behind a real
MutatingWebhookConfiguration is tests/api/test_real_admission_operator.py's."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
import uuid

import pytest

from kata_sizing.controller.handlers import routes_through_webhook
from kata_sizing.controller.policy_webhook import ROUTE_POD_PATH_ID, pod_to_route, review_response
from kata_sizing.core.model import parse_policy
from kata_sizing.core.podfit import SHARED_NAMES, route_patch
from kata_sizing.core.sizing import size_policy
from tests.support.operator_helpers import POLICIES, wait_observed
from tests.support.policies import explicit_classes_policy
from tests.support.routing import (
    BOTH_ROUTE,
    SCOPE_NAMESPACES,
    SCOPES,
    pod,
    routed_by_the_bindings,
    scope_pods,
    scope_policy,
)
from tests.support.webhook import Webhook

pytestmark = pytest.mark.emulator


def review(obj: dict, operation: str = "CREATE", namespace: str = "team") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace, "operation": operation,
        "userInfo": {"username": "someone"}, "object": obj, "oldObject": None}}


def post(hook: Webhook, body: dict) -> dict:
    request = urllib.request.Request(f"https://127.0.0.1:{hook.port}/{ROUTE_POD_PATH_ID}",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=hook.context, timeout=5) as reply:
        answer = json.load(reply)
    assert answer["response"]["uid"] == body["request"]["uid"]
    return answer["response"]


def patch_of(response: dict) -> list[dict]:
    assert response["allowed"] is True
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


def routed_policy(name: str = "routed", routing: str = "Webhook") -> dict:
    return explicit_classes_policy(name, admission={"routing": routing})


# --- pure parts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("routing, served, expected", [
    ("Webhook", {"MutatingAdmissionPolicy": "v1"}, True),
    ("Auto", {}, True),
    ("Auto", {"MutatingAdmissionPolicy": "v1"}, False),
    ("MutatingAdmissionPolicy", {}, False),
])
def test_who_routes(routing, served, expected):
    assert routes_through_webhook(routing, served) is expected


def test_only_pod_creations_without_a_class_are_routed():
    assert pod_to_route(review(pod(labels={"katasizing.dev/policy": "p"})))[1] == "team"
    assert pod_to_route(review(pod(runtime_class="kata-p-s"))) is None
    assert pod_to_route(review(pod(), operation="UPDATE")) is None
    other = review(pod())
    other["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert pod_to_route(other) is None
    # A pod created from a template has no namespace in its metadata yet: the request's is used.
    bare = pod()
    del bare["metadata"]["namespace"]
    assert pod_to_route(review(bare, namespace="elsewhere"))[0]["metadata"]["namespace"] == "elsewhere"


def test_a_mutation_answer_carries_a_base64_json_patch():
    ops = [{"op": "add", "path": "/spec/runtimeClassName", "value": "kata-p-m"}]
    answer = review_response(review(pod()), allowed=True, patch=ops)["response"]
    assert answer["patchType"] == "JSONPatch" and json.loads(base64.b64decode(answer["patch"])) == ops
    assert "patch" not in review_response(review(pod()), allowed=True, patch=[])["response"]


# --- the operator serving it ----------------------------------------------------------------------


def test_the_webhook_routes_like_the_mutating_admission_policy_would(webhook):  # noqa: F811
    emu = webhook.emu
    body = routed_policy()
    emu.objects(POLICIES).create(body)
    wait_observed(emu, "routed", Ready="True")
    emu.objects("v1/namespaces").create({"metadata": {"name": "opted", "labels": {"katasizing.dev/policy": "routed"}}})
    sizing = size_policy(parse_policy(body))
    cases = [
        pod(labels={"katasizing.dev/policy": "routed"}, cpu="1500m", memory="2Gi"),  # m
        pod(labels={"katasizing.dev/policy": "routed"}, cpu="1", memory="1Gi"),  # s, exactly at its envelope
        pod(labels={"katasizing.dev/policy": "routed"}, cpu="1001m", memory="1Gi"),  # m: one millicore above s
        pod(namespace="opted", cpu="500m", memory="512Mi"),  # the namespace's label
        pod(labels={"katasizing.dev/policy": "routed"}, cpu="64", memory="1Ti"),  # fits none: left alone
        pod(labels={"katasizing.dev/policy": "routed"}, runtime_class="kata-routed-l", cpu="1", memory="1Gi"),
        pod(labels={"katasizing.dev/policy": "no-such-policy"}, cpu="1", memory="1Gi"),
    ]
    classes = []
    for case in cases:
        namespace = case["metadata"]["namespace"]
        labels = {"katasizing.dev/policy": "routed"} if namespace == "opted" else None
        got = patch_of(post(webhook, review(case, namespace=namespace)))
        assert got == route_patch(case, sizing, labels), case  # the one rule, podfit's
        classes.append(got[0]["value"] if got else None)
    assert classes == ["kata-routed-m", "kata-routed-s", "kata-routed-m", "kata-routed-s", None, None, None]


def test_with_a_mutating_admission_policy_served_the_webhook_leaves_auto_routing_to_it(webhook):  # noqa: F811
    emu = webhook.emu
    emu.objects(POLICIES).create(routed_policy("auto", routing="Auto"))
    wait_observed(emu, "auto", Ready="True")
    assert emu.objects("admissionregistration.k8s.io/v1/mutatingadmissionpolicies").get(SHARED_NAMES["route"])
    assert emu.objects("admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings").get("kata-sizing-auto-route")
    assert patch_of(post(webhook, review(pod(labels={"katasizing.dev/policy": "auto"}, cpu="1", memory="1Gi")))) == []


def test_an_api_failure_lets_the_pod_through_unrouted_with_a_warning(webhook):  # noqa: F811
    """failurePolicy Ignore in the configuration, and the same inside: never a refusal, never a 500;
    the pod then meets the envelope policy's pod-not-routed rule, which names the reason. The only
    request a review can make: the labels of a namespace the cache has not seen yet."""
    emu = webhook.emu
    emu.objects(POLICIES).create(routed_policy())
    wait_observed(emu, "routed", Ready="True")
    emu.fail_next(1, status=500, method="GET", path="/namespaces/unseen$")
    response = post(webhook, review(pod(namespace="unseen", labels={"katasizing.dev/policy": "routed"},
                                        cpu="1", memory="1Gi"), namespace="unseen"))
    assert response["allowed"] is True and "patch" not in response
    assert any("could not route" in w for w in response.get("warnings") or []), response
    # The next one, with the API back, is routed.
    assert patch_of(post(webhook, review(pod(namespace="unseen", labels={"katasizing.dev/policy": "routed"},
                                             cpu="1", memory="1Gi"), namespace="unseen")))


def test_the_webhook_routes_the_pods_the_policies_bindings_would_for_every_scope(webhook):  # noqa: F811
    emu = webhook.emu
    for namespace, labels in SCOPE_NAMESPACES.items():
        emu.objects("v1/namespaces").create({"metadata": {"name": namespace, "labels": labels}})
    for scope in SCOPES:
        emu.objects(POLICIES).create(scope_policy(scope))
    for scope in SCOPES:
        wait_observed(emu, f"scope-{scope}", Ready="True")
    pods = scope_pods()
    expected = routed_by_the_bindings(pods)
    # Each scope routes some pods and leaves others, so the table tells the scopes apart.
    assert {scope: {n for n, c in expected.items() if c == f"kata-scope-{scope}-s"} for scope in SCOPES} == {
        "everywhere": {f"everywhere-in-{n}" for n in SCOPE_NAMESPACES} - {BOTH_ROUTE},
        "names": {"names-in-listed", "names-in-listed-kata"},
        # ...and the pods of the namespace opted in to it whose own label's policy leaves them out.
        "selector": {"selector-in-listed-kata", "selector-in-kata", "selector-in-kata-opted",
                     "unlabelled-in-kata-opted", "names-in-kata-opted", "both-in-kata-opted"},
        "both": {"both-in-listed-kata"},
    }
    mark = len(emu.request_log)
    got = {}
    for case in pods:
        namespace = case["metadata"]["namespace"]
        patch = patch_of(post(webhook, review(case, namespace=namespace)))
        got[case["metadata"]["name"]] = patch[0]["value"] if patch else None
    assert got == expected
    # Answered from the operator's caches: no policy and no namespace read for any of them.
    assert [(r.method, r.path) for r in emu.request_log[mark:] if r.method == "GET" and "watch" not in r.query] == []


def test_a_pod_it_cannot_read_is_let_through_never_refused(webhook):  # noqa: F811
    """Issue 18: an init container or a CronJob-like shape that is not a mapping crashed the rule,
    and the server answered allowed: false with code 500 for a webhook documented never to refuse."""
    emu = webhook.emu
    emu.objects(POLICIES).create(routed_policy())
    wait_observed(emu, "routed", Ready="True")
    malformed = pod(labels={"katasizing.dev/policy": "routed"}, cpu="1", memory="1Gi")
    malformed["spec"]["initContainers"] = ["not a container"]
    response = post(webhook, review(malformed))
    assert response["allowed"] is True and "patch" not in response and "status" not in response
    assert response["warnings"] == [
        "kata-sizing could not route this pod: spec.initContainers[0]: not a container (a mapping)"]
    labels_not_a_mapping = pod(cpu="1", memory="1Gi")
    labels_not_a_mapping["metadata"]["labels"] = ["katasizing.dev/policy=routed"]
    response = post(webhook, review(labels_not_a_mapping))
    assert response["allowed"] is True and "patch" not in response


def test_a_legal_pod_larger_than_one_mebibyte_is_reviewed(webhook):  # noqa: F811
    """aiohttp reads 1 MiB by default and answered 413; reviews are bounded at 4 MiB (docs/inputs.md),
    and the API server stores objects up to 1.5 MiB (etcd's request limit), a pod with its review more."""
    emu = webhook.emu
    emu.objects(POLICIES).create(routed_policy())
    wait_observed(emu, "routed", Ready="True")
    big = pod(labels={"katasizing.dev/policy": "routed"}, cpu="1", memory="1Gi")
    big["metadata"]["annotations"] = {f"example.com/a{i}": "x" * 200_000 for i in range(6)}
    assert len(json.dumps(review(big))) > 1_200_000
    assert patch_of(post(webhook, review(big))) == [
        {"op": "add", "path": "/spec/runtimeClassName", "value": "kata-routed-s"}]


def test_a_review_past_the_input_bound_gets_413_with_the_reason(webhook):  # noqa: F811
    huge = pod(cpu="1", memory="1Gi")
    huge["metadata"]["annotations"] = {f"example.com/a{i}": "x" * 200_000 for i in range(22)}
    request = urllib.request.Request(f"https://127.0.0.1:{webhook.port}/{ROUTE_POD_PATH_ID}",
                                     data=json.dumps(review(huge)).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, context=webhook.context, timeout=10)
    assert error.value.code == 413
    assert error.value.read().decode() == "the request body is larger than the 4 MiB kata-sizing reads"
