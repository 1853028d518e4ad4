"""The measurement's arithmetic on kubelet Summary documents as they are (kata_sizing.core.measure).

tests/fixtures/summary/kata-node-1.json has the shape k8s.io/kubelet's stats/v1alpha1 Summary
serializes to (node block with system containers, pods with podRef, containers, cpu, memory,
network, volume, ephemeral-storage, process_stats): a Kata pod measured whole, a pod whose
container restarted (listed twice) beside a sidecar, a pod starting (no figures yet), a pod
without a memory limit, a runc pod, and a pod the pod cache does not know.
"""

from __future__ import annotations

import copy
import json
import math
import random
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kata_sizing.core.headroom import HeadroomThreshold
from kata_sizing.core.measure import (
    ClassWindow,
    KataPod,
    MeasurementState,
    NodeReading,
    PodMeasurement,
    QuantileSketch,
    SummaryError,
    kata_pod,
    read_summary,
)
from tests.support.paths import FIXTURES

MIB = 1024 * 1024
SUMMARY = json.loads((FIXTURES / "summary" / "kata-node-1.json").read_text())
KATA = {"kata-qemu-rs-s", "kata-qemu-rs-m", "kata-qemu-rs-l"}


def pod(name: str, namespace: str, uid: str, runtime_class: str | None, containers: list[dict],
        init: list[dict] | None = None, overhead: str | None = None, node: str = "kata-node-1",
        phase: str = "Running") -> dict:
    spec: dict = {"nodeName": node, "containers": containers}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if init:
        spec["initContainers"] = init
    if overhead:
        spec["overhead"] = {"cpu": "250m", "memory": overhead}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": spec, "status": {"phase": phase}}


def container(name: str, memory: str | None) -> dict:
    return {"name": name, "image": "busybox", "resources": {"limits": {"memory": memory}} if memory else {}}


UID = "6f0b1c2e-1111-4a3b-9c77-0000000000{:02d}".format
PODS = [
    pod("web-7d9c4b8f6d-x2lqk", "shop", UID(1), "kata-qemu-rs-m", [container("web", "600Mi")], overhead="358Mi"),
    pod("batch-8h2kd", "jobs", UID(2), "kata-qemu-rs-l", [container("worker", "2Gi")],
        init=[{**container("log-shipper", "64Mi"), "restartPolicy": "Always"},
              container("migrate", "1Gi")], overhead="200Mi"),
    pod("starting-0", "shop", UID(3), "kata-qemu-rs-s", [container("app", "256Mi")], overhead="160Mi"),
    pod("notebook-0", "lab", UID(4), "kata-qemu-rs-s", [container("jupyter", None)], overhead="160Mi"),
    pod("gone-1", "shop", UID(5), "kata-qemu-rs-s", [container("app", "256Mi")], overhead="160Mi"),
    pod("kube-proxy-9fx2d", "kube-system", "0c1d2e3f-2222-4a3b-9c77-000000000010", None, [container("kube-proxy", None)]),
]


def kata_index(pods=PODS) -> tuple[dict[str, KataPod], set[str]]:
    kata, others = {}, set()
    for obj in pods:
        found = kata_pod(obj, KATA)
        if found is None:
            others.add(obj["metadata"]["uid"])
        else:
            kata[found.uid] = found
    return kata, others


def reading(summary=None, pods=PODS) -> NodeReading:
    kata, others = kata_index(pods)
    return read_summary(SUMMARY if summary is None else summary, "kata-node-1", kata, others)


def measured(result: NodeReading) -> dict[str, PodMeasurement]:
    return {m.pod.pod: m for m in result.measurements}


# --- pods as the kubelet sized them ------------------------------------------------------------


def test_the_cgroup_limit_is_the_limits_as_kubernetes_sums_them_plus_the_pods_overhead():
    kata, _ = kata_index()
    web = kata[UID(1)]
    # The figure seen on a real kubelet (600Mi + 358Mi -> memory.limit_in_bytes 1004535808).
    assert web.cgroup_limit_bytes == 1004535808
    batch = kata[UID(2)]
    # max(worker 2Gi + sidecar 64Mi, init 1Gi + the sidecar started before it) + 200Mi.
    assert batch.memory_limit_bytes == 2048 * MIB + 64 * MIB
    assert batch.cgroup_limit_bytes == (2048 + 64 + 200) * MIB
    assert batch.containers == ("log-shipper", "worker")  # the sidecar is listed; the init container is not


def test_a_pod_with_a_container_without_memory_limit_has_no_cgroup_limit():
    kata, _ = kata_index()
    assert kata[UID(4)].memory_limit_bytes is None
    assert kata[UID(4)].cgroup_limit_bytes is None


@pytest.mark.parametrize("obj, why", [
    (pod("a", "x", "u1", "runc", [container("c", "1Gi")]), "another runtime class"),
    (pod("a", "x", "u2", None, [container("c", "1Gi")]), "no runtime class"),
    (pod("a", "x", "u3", "kata-qemu-rs-s", [container("c", "1Gi")], phase="Succeeded"), "finished"),
    (pod("a", "x", "u4", "kata-qemu-rs-s", [container("c", "1Gi")], phase="Failed"), "finished"),
    ({"metadata": {"name": "a", "uid": "u5"}, "spec": {"runtimeClassName": "kata-qemu-rs-s",
                                                       "containers": "not a list"}}, "unreadable"),
    ({"metadata": {"name": "a", "uid": "u6"}, "spec": {"runtimeClassName": "kata-qemu-rs-s", "containers": [
        {"name": "c", "resources": {"limits": {"memory": "lots"}}}]}}, "bad quantity"),
])
def test_pods_that_are_not_measured(obj, why):
    assert kata_pod(obj, KATA) is None, why


def test_a_pod_admitted_without_overhead_has_podfixed_zero():
    found = kata_pod(pod("a", "x", "u", "kata-qemu-rs-s", [container("c", "1Gi")]), KATA)
    assert found.pod_fixed_memory_bytes == 0
    assert found.cgroup_limit_bytes == 1024 * MIB


# --- one Summary -------------------------------------------------------------------------------


def test_a_kata_pod_measured_whole():
    web = measured(reading())["shop/web-7d9c4b8f6d-x2lqk"]
    assert web.working_set_bytes == 714571776
    assert web.usage_bytes == 749731840
    assert web.containers_working_set_bytes == 297795584
    assert web.overhead_bytes == 714571776 - 297795584
    assert web.headroom_bytes == 1004535808 - 714571776
    assert web.problems == ()


def test_a_restarted_container_listed_twice_counts_once_with_its_latest_start():
    batch = measured(reading())["jobs/batch-8h2kd"]
    # worker's new instance (started 09:58:51) and the sidecar; the dead instance is not added.
    assert batch.containers_working_set_bytes == 1931476992 + 20971520
    assert batch.overhead_bytes == 2419064832 - (1931476992 + 20971520)
    assert batch.headroom_bytes == (2048 + 64 + 200) * MIB - 2419064832
    assert batch.problems == ()


def test_a_pod_the_kubelet_has_not_measured_yet_has_no_figures_and_says_why():
    starting = measured(reading())["shop/starting-0"]
    assert starting.working_set_bytes is None
    assert starting.overhead_bytes is None and starting.headroom_bytes is None
    assert any("no memory.workingSetBytes" in p for p in starting.problems)
    assert any("container app not in the Summary" in p for p in starting.problems)


def test_a_pod_without_memory_limit_has_an_overhead_but_no_headroom():
    notebook = measured(reading())["lab/notebook-0"]
    assert notebook.overhead_bytes == 1159725056 - 811597824
    assert notebook.headroom_bytes is None
    assert any("headroom is undefined" in p for p in notebook.problems)


def test_pods_of_the_cache_not_in_the_summary_and_pods_the_cache_does_not_know():
    result = reading()
    assert result.not_reported == ("shop/gone-1",)
    assert result.unknown == ("shop/just-created-abc12",)
    assert result.unknown_count == 1
    assert result.other_pods == 1  # kube-proxy: known, not Kata
    assert sorted(measured(result)) == ["jobs/batch-8h2kd", "lab/notebook-0", "shop/starting-0",
                                        "shop/web-7d9c4b8f6d-x2lqk"]


def _with(summary_edit) -> dict:
    summary = copy.deepcopy(SUMMARY)
    summary_edit(summary)
    return summary


def _pod_entry(summary: dict, name: str) -> dict:
    return next(p for p in summary["pods"] if p["podRef"]["name"] == name)


@pytest.mark.parametrize("edit, overhead, headroom, problem", [
    # The pod's memory block missing entirely.
    (lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk").pop("memory"), None, None, "no memory.workingSetBytes"),
    # A container without workingSetBytes (the runtime did not report it).
    (lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk")["containers"][0]["memory"].pop("workingSetBytes"),
     None, 1004535808 - 714571776, "container web has no memory.workingSetBytes"),
    # The container missing (restarting): headroom still holds, the overhead would be wrong.
    (lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk").update(containers=[]),
     None, 1004535808 - 714571776, "container web not in the Summary"),
    # containers: null, as a Go nil slice serializes.
    (lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk").update(containers=None),
     None, 1004535808 - 714571776, "container web not in the Summary"),
    # A figure that is not a uint64 (a float, a string, negative, past 2^64 - 1) is no figure.
    (lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk")["memory"].update(workingSetBytes=1.5e8),
     None, None, "workingSetBytes 150000000.0 is not a figure a kubelet sends"),
    (lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk")["memory"].update(workingSetBytes="714571776"),
     None, None, "workingSetBytes 714571776 is not a figure a kubelet sends"),
    (lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk")["memory"].update(workingSetBytes=-1),
     None, None, "workingSetBytes -1 is not a figure a kubelet sends"),
    (lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk")["memory"].update(workingSetBytes=2**64),
     None, None, "workingSetBytes 18446744073709551616 is not a figure a kubelet sends (an integer from 0 to 2^64 - 1)"),
    (lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk")["memory"].update(workingSetBytes=10**30),
     None, None, "is not a figure a kubelet sends"),
    # 2^64 - 1 itself is a figure (the headroom is then hugely negative, as the kubelet says).
    (lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk")["memory"].update(workingSetBytes=2**64 - 1),
     2**64 - 1 - 297795584, 1004535808 - (2**64 - 1), None),
    # A container the spec does not name (an ephemeral debug container) is part of the workload.
    (lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk")["containers"].append(
        {"name": "debugger", "startTime": "2026-12-03T09:00:00Z", "memory": {"workingSetBytes": 1048576}}),
     714571776 - 297795584 - 1048576, 1004535808 - 714571776, None),
])
def test_summary_fields_missing_or_odd(edit, overhead, headroom, problem):
    web = measured(reading(_with(edit)))["shop/web-7d9c4b8f6d-x2lqk"]
    assert web.overhead_bytes == overhead
    assert web.headroom_bytes == headroom
    if problem is None:
        assert web.problems == ()
    else:
        assert any(problem in p for p in web.problems), web.problems


@pytest.mark.parametrize("container_started, counted", [
    ("2026-12-03T09:59:54Z", False),  # 5 s before the pod's figure: it may predate the start-up allocations
    ("2026-12-03T09:59:45Z", False),  # 14 s
    ("2026-12-03T09:59:44Z", True),   # 15 s: the kubelet has refreshed the pod's figure since
])
def test_a_pod_figure_taken_right_after_a_container_started_is_not_subtracted(container_started, counted):
    """The pod's figure (cAdvisor, every 10-15 s) lags the containers' (the runtime, on each
    request): on the test node the pod read 66 MiB below its one container for the 15 s after
    the container started."""
    summary = _with(lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk")["containers"][0].update(startTime=container_started))
    web = measured(reading(summary))["shop/web-7d9c4b8f6d-x2lqk"]
    assert (web.overhead_bytes is not None) == counted
    assert web.headroom_bytes == 1004535808 - 714571776  # the pod's own figure is good either way
    if not counted:
        assert web.problems == ("the pod's figure (09:59:59) is less than 15 s younger than its latest container's "
                                "start (" + container_started[11:19] + "): waiting for the kubelet's next one",)


def test_a_pod_matched_by_name_when_the_podref_has_no_uid():
    summary = _with(lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk")["podRef"].pop("uid"))
    assert measured(reading(summary))["shop/web-7d9c4b8f6d-x2lqk"].overhead_bytes == 714571776 - 297795584


def test_a_pod_created_again_under_the_same_name_is_another_pod():
    summary = _with(lambda s: _pod_entry(s, "web-7d9c4b8f6d-x2lqk")["podRef"].update(uid="new-uid"))
    result = reading(summary)
    assert "shop/web-7d9c4b8f6d-x2lqk" not in measured(result)
    assert result.not_reported == ("shop/gone-1", "shop/web-7d9c4b8f6d-x2lqk")
    assert "shop/web-7d9c4b8f6d-x2lqk" in result.unknown


def test_a_summary_of_another_node_is_said():
    summary = _with(lambda s: s["node"].update(nodeName="kata-node-9"))
    assert reading(summary).problems == ("the Summary is of node kata-node-9, not kata-node-1",)


@pytest.mark.parametrize("document, message", [
    ([], "is not a JSON object"),
    ("text", "is not a JSON object"),
    ({"node": {}, "pods": {"a": 1}}, "pods is not a list"),
])
def test_a_document_that_is_no_summary(document, message):
    with pytest.raises(SummaryError, match=message):
        read_summary(document, "kata-node-1", {}, ())


def test_an_empty_summary_measures_nothing_and_reports_every_kata_pod_missing():
    result = reading({"node": {"nodeName": "kata-node-1"}, "pods": None})
    assert result.measurements == ()
    assert len(result.not_reported) == 5


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**64, max_value=2**64) | st.floats(allow_nan=False)
    | st.text(max_size=30) | st.sampled_from(["2026-12-03T10:00:00Z", "not a time", "", "web", UID(1), UID(2)]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["node", "pods", "podRef", "uid", "name", "namespace", "memory", "containers",
                         "workingSetBytes", "usageBytes", "time", "startTime", "nodeName", "x"]), children, max_size=5),
    max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_json_is_read_or_refused_with_a_summary_error(document):
    """A kubelet (or a file given to survey) may send anything: it is a reading or a SummaryError."""
    kata, others = kata_index()
    try:
        result = read_summary(document, "kata-node-1", kata, others)
    except SummaryError:
        return
    for measured_pod in result.measurements:
        assert measured_pod.overhead_bytes is None or isinstance(measured_pod.overhead_bytes, int)


@settings(max_examples=200, deadline=None)
@given(st.lists(JSON, max_size=6))
def test_any_pod_entries_in_a_real_summary_are_read_or_skipped(entries):
    summary = _with(lambda s: s["pods"].extend(entries))
    reading(summary)


def test_malformed_pod_entries_are_skipped_and_said():
    summary = _with(lambda s: s["pods"].extend([None, {"podRef": "x"}, {"memory": {}}]))
    result = reading(summary)
    assert result.problems.count("a pod entry has no podRef") == 3
    assert len(result.measurements) == 4


# --- the threshold -----------------------------------------------------------------------------


@pytest.mark.parametrize("text, pod_fixed, guest_budget, expected", [
    # A share of what podFixed holds beyond the guest budget: 358 - 308 = 50 MiB, 10% of it.
    ("10%", 358 * MIB, 308 * MIB, 5 * MIB),
    ("10%", 377 * MIB, 0, math.ceil(377 * MIB / 10)),
    ("0%", 358 * MIB, 308 * MIB, 0),
    ("12.5%", 200 * MIB, 0, 25 * MIB),
    # podFixed under the guest budget (validate refuses it): no share, no line.
    ("50%", 100 * MIB, 200 * MIB, 0),
    ("64Mi", 358 * MIB, 308 * MIB, 64 * MIB),
    ("100000000", 1, 0, 100000000),
])
def test_thresholds(text, pod_fixed, guest_budget, expected):
    assert HeadroomThreshold.parse(text).line_bytes(pod_fixed, guest_budget) == expected


@pytest.mark.parametrize("text, message", [
    ("101%", "between 0% and 100%"),
    ("-1%", "is not a percentage such as 10%"),
    ("１０%", "ASCII digits"),
    ("1_0%", "ASCII digits"),
    ("ten%", "not a percentage"),
    ("lots", "neither a percentage"),
    ("NaN%", "is not a percentage such as 10%"),
])
def test_bad_thresholds(text, message):
    with pytest.raises(ValueError, match=message):
        HeadroomThreshold.parse(text)


# --- the sketch --------------------------------------------------------------------------------


def exact_quantile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[math.floor(q * (len(ordered) - 1))]


def within_bound(estimate: int, exact: int) -> bool:
    # The documented bound: ALPHA relative, or MIN_INDEXED absolute next to 0 (plus rounding to a byte).
    return abs(estimate - exact) <= max(QuantileSketch.ALPHA * abs(exact), QuantileSketch.MIN_INDEXED) + 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-2**40, max_value=2**50), min_size=1, max_size=400),
       st.sampled_from([0.0, 0.01, 0.5, 0.9, 0.99, 1.0]))
def test_the_sketch_keeps_its_error_bound(values, q):
    sketch = QuantileSketch()
    for value in values:
        sketch.add(value)
    assert within_bound(sketch.quantile(q), exact_quantile(values, q))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=200),
       st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=200))
def test_merged_sketches_answer_as_one(left, right):
    one, a, b = QuantileSketch(), QuantileSketch(), QuantileSketch()
    for value in left + right:
        one.add(value)
    for value in left:
        a.add(value)
    for value in right:
        b.add(value)
    a.merge(b)
    for q in (0.5, 0.99):
        assert a.quantile(q) == one.quantile(q)


def test_the_sketch_stays_small_whatever_it_is_fed():
    sketch = QuantileSketch()
    rng = random.Random(7)
    for _ in range(200_000):
        sketch.add(rng.randrange(-2**62, 2**62))
    assert sketch.count == 200_000
    assert sketch.buckets() <= 2 * QuantileSketch.MAX_BUCKETS + 1
    assert QuantileSketch.MAX_BUCKETS < 3000


def test_p99_of_a_realistic_overhead_distribution():
    rng = random.Random(11)
    values = [int(rng.gauss(300 * MIB, 20 * MIB)) for _ in range(20_000)]
    sketch = QuantileSketch()
    for value in values:
        sketch.add(value)
    for q in (0.5, 0.99):
        exact = exact_quantile(values, q)
        assert abs(sketch.quantile(q) - exact) <= 0.005 * exact
    assert sketch.buckets() < 60


# --- a class over a window ---------------------------------------------------------------------


def fake_measurement(name: str, overhead: int, headroom: int | None, runtime_class: str = "kata-qemu-rs-m",
                     pod_fixed: int = 358 * MIB) -> PodMeasurement:
    limit = None if headroom is None else 600 * MIB
    kata = KataPod(uid=name, pod=f"ns/{name}", runtime_class=runtime_class, node="n1",
                   memory_limit_bytes=limit, pod_fixed_memory_bytes=pod_fixed, containers=("c",))
    # A pod without a memory limit has no cgroup limit and no headroom to measure.
    working_set = 500 * MIB if limit is None or headroom is None else limit + pod_fixed - headroom
    return PodMeasurement(kata, working_set, working_set, working_set - overhead)


def test_a_window_keeps_the_maximum_overhead_and_the_minimum_headroom_with_pod_and_time():
    window = ClassWindow(3600)
    window.add(fake_measurement("a", 300 * MIB, 100 * MIB), "n1", 1000.0)
    window.add(fake_measurement("b", 320 * MIB, 40 * MIB), "n2", 1010.0)
    window.add(fake_measurement("c", 310 * MIB, None), "n1", 1020.0)
    figures = window.figures(1030.0)
    assert figures.samples == 3
    assert (figures.max_overhead.pod, figures.max_overhead.node, figures.max_overhead.value_bytes) == \
        ("ns/b", "n2", 320 * MIB)
    assert (figures.min_headroom.pod, figures.min_headroom.at, figures.min_headroom.value_bytes) == \
        ("ns/b", 1010.0, 40 * MIB)
    assert abs(figures.overhead_p50_bytes - 310 * MIB) <= 0.005 * 310 * MIB
    assert figures.last_measured_at == 1020.0


def test_a_window_forgets_what_is_older_than_the_window():
    window = ClassWindow(600)  # slots of 100 s
    window.add(fake_measurement("old", 900 * MIB, 1 * MIB), "n1", 0.0)
    window.add(fake_measurement("new", 300 * MIB, 200 * MIB), "n1", 550.0)
    assert window.figures(590.0).max_overhead.pod == "ns/old"
    later = window.figures(600.0)  # slot [0, 100) is now older than 600 s
    assert later.max_overhead.pod == "ns/new"
    assert later.min_headroom.pod == "ns/new"
    assert later.samples == 1
    assert window.figures(1200.0).samples == 0
    assert window.figures(1200.0).overhead_p99_bytes is None


def test_a_pod_with_neither_figure_adds_nothing():
    window = ClassWindow(600)
    kata = KataPod("u", "ns/p", "kata-qemu-rs-m", "n1", 600 * MIB, 358 * MIB, ("c",))
    window.add(PodMeasurement(kata, None, None, None, ("the pod has no memory.workingSetBytes",)), "n1", 10.0)
    assert window.figures(20.0).samples == 0


# --- the fleet's state -------------------------------------------------------------------------

# Classes whose podFixed (358 MiB) holds 200 MiB beyond their guest budget: a line of 20 MiB.
THRESHOLDS = {c: (HeadroomThreshold(), 358 * MIB, 158 * MIB) for c in KATA}
WINDOWS = {c: 3600.0 for c in KATA}


def test_the_state_counts_pods_per_class_and_lists_the_ones_under_threshold():
    state = MeasurementState()
    state.add_reading(reading(), 1000.0, WINDOWS, THRESHOLDS)
    assert state.pods_measured("kata-qemu-rs-m") == 1
    assert state.pods_measured("kata-qemu-rs-s") == 2  # starting-0 (no figures yet) and notebook-0
    assert state.pods_without_limit("kata-qemu-rs-s") == 1
    low = state.low_headroom(KATA)
    # batch: 5 MiB left against its class's line, 10% of the 200 MiB podFixed holds beyond the guest budget.
    assert [(p.pod, p.headroom_bytes, p.threshold_bytes) for p in low] == [
        ("jobs/batch-8h2kd", (2048 + 64 + 200) * MIB - 2419064832, 20 * MIB)]
    message = low[0].message("l", HeadroomThreshold())
    assert message == ("pod jobs/batch-8h2kd (class l) on node kata-node-1: working set 2307.0Mi of its cgroup "
                       "limit 2312.0Mi leaves 5.0Mi, under 20.0Mi (10% of podFixed.memory beyond the guest budget): its "
                       "VMM is close to an OOM kill")


def test_the_warning_clears_when_the_next_reading_shows_headroom_and_stays_while_the_node_is_silent():
    state = MeasurementState()
    state.add_reading(reading(), 1000.0, WINDOWS, THRESHOLDS)
    assert state.low_headroom(KATA)
    state.add_failure("kata-node-1", "HTTP 500: the kubelet failed", 1060.0)
    assert state.low_headroom(KATA), "a node that does not answer is no evidence of recovery"
    assert state.failing_nodes()[0][0] == "kata-node-1"
    recovered = _with(lambda s: _pod_entry(s, "batch-8h2kd")["memory"].update(workingSetBytes=2000000000))
    state.add_reading(reading(recovered), 1120.0, WINDOWS, THRESHOLDS)
    assert state.low_headroom(KATA) == []
    assert state.failing_nodes() == []


def test_a_class_not_measured_is_ignored_and_a_fixed_threshold_applies_to_every_pod():
    state = MeasurementState()
    thresholds = {"kata-qemu-rs-m": (HeadroomThreshold.parse("300Mi"), 358 * MIB, 308 * MIB)}
    state.add_reading(reading(), 1000.0, {"kata-qemu-rs-m": 60.0}, thresholds)
    assert set(state.windows) == {"kata-qemu-rs-m"}
    assert [p.pod for p in state.low_headroom(KATA)] == ["shop/web-7d9c4b8f6d-x2lqk"]  # 276.5Mi < 300Mi


def test_the_state_does_not_grow_with_pods_or_readings():
    """4,000 pods on 100 nodes read 40 times: the state holds sketches and per-node counters only."""
    state = MeasurementState()
    rng = random.Random(3)
    classes = sorted(KATA)

    def fleet_reading(node: int) -> NodeReading:
        measurements = []
        for index in range(40):
            overhead = int(rng.gauss(300 * MIB, 30 * MIB))
            measurements.append(fake_measurement(f"p{node}-{index}", overhead, int(rng.uniform(50, 400) * MIB),
                                                 runtime_class=classes[index % 3]))
        return NodeReading(node=f"node-{node}", measurements=tuple(measurements))

    # Ten different readings of each node, read in turn: 40 rounds of 4,000 pods.
    readings = [[fleet_reading(node) for node in range(100)] for _ in range(10)]
    windows = {c: 600.0 for c in KATA}  # full after 10 rounds of 60 s
    sizes = []
    for round_ in range(40):
        for node, found in enumerate(readings[round_ % 10]):
            state.add_reading(found, 60.0 * round_ + node * 0.5, windows, THRESHOLDS)
        sizes.append((len(state.nodes), sum(w.buckets() for w in state.windows.values())))
    assert sizes[-1][0] == 100
    # Once the window is full, buckets are bounded by the values' range, not by the readings:
    # they hardly change (a rare extreme value may open one more, an expired slot closes some).
    assert abs(sizes[-1][1] - sizes[14][1]) <= 30, sizes
    assert sizes[-1][1] < 3 * ClassWindow.SLOTS * 200
    assert sum(state.pods_measured(c) for c in classes) == 4_000
    assert sum(len(w.slots) for w in state.windows.values()) <= 3 * ClassWindow.SLOTS


def test_forgetting_nodes_and_classes():
    state = MeasurementState()
    state.add_reading(reading(), 1000.0, WINDOWS, THRESHOLDS)
    state.forget_nodes([])
    assert state.pods_measured("kata-qemu-rs-m") == 0
    assert state.low_headroom(KATA) == []
    state.forget_classes(["kata-qemu-rs-s"])
    assert set(state.windows) == {"kata-qemu-rs-s"}


def test_figures_in_bytes_are_exact_for_the_extremes():
    state = MeasurementState()
    state.add_reading(reading(), 1000.0, WINDOWS, THRESHOLDS)
    figures = state.figures("kata-qemu-rs-l", 1000.0)
    assert figures.max_overhead.value_bytes == 2419064832 - (1931476992 + 20971520)
    assert figures.min_headroom.value_bytes == (2048 + 64 + 200) * MIB - 2419064832
    assert state.figures("kata-qemu-rs-xl", 1000.0) is None
    assert Decimal(figures.overhead_p99_bytes) == pytest.approx(Decimal(466616320), rel=Decimal("0.005"))


def test_pods_not_measured_are_counted_per_class():
    """A pod the Summary does not list, and one it lists without a figure a kubelet sends, are counted
    per class (status.measurement.classes[].podsNotMeasured)."""
    pods = {uid: KataPod(uid, f"ns/{uid}", "kata-x-s", "n1", 256 * MIB, 300 * MIB, ("c0",), None, 256 * MIB)
            for uid in ("a", "b", "c")}
    document = {"node": {"nodeName": "n1"}, "pods": [
        {"podRef": {"name": "a", "namespace": "ns", "uid": "a"}, "memory": {"workingSetBytes": 400 * MIB},
         "containers": [{"name": "c0", "memory": {"workingSetBytes": 100 * MIB}}]},
        {"podRef": {"name": "b", "namespace": "ns", "uid": "b"}, "memory": {"workingSetBytes": 2**64},
         "containers": [{"name": "c0", "memory": {"workingSetBytes": 100 * MIB}}]}]}
    reading = read_summary(document, "n1", pods)
    assert reading.not_reported == ("ns/c",) and reading.not_reported_runtime_classes == ("kata-x-s",)
    state = MeasurementState()
    state.add_reading(reading, 0.0, {"kata-x-s": 600.0}, {"kata-x-s": (HeadroomThreshold(), 300 * MIB, 250 * MIB)})
    assert state.pods_measured("kata-x-s") == 2 and state.pods_not_measured("kata-x-s") == 2
