"""What each Kata pod really uses on its node, read from the kubelet's Summary API
(docs/measurement.md). Pure: Summary documents and pod specs in, figures out; no I/O.

With `sandbox_cgroup_only = true` the shim, the VMM and virtiofsd run in the pod's cgroup,
whose memory limit the kubelet sets to the pod's limits plus `spec.overhead` (podFixed, copied
in at admission; pkg/kubelet/cm ResourceConfigForPod). The kubelet's Summary (`/stats/summary`,
k8s.io/kubelet/pkg/apis/stats/v1alpha1) gives per pod the pod cgroup's memory and per container
what the runtime reports (for Kata: from inside the guest). For each Kata pod:

- overhead used  = pod working set - sum of its containers' working sets (the part that is not
  the workload: the VM beyond it and the host-side processes);
- cgroup limit   = the pod's memory limits + spec.overhead.memory (none when some container
  has no memory limit: the kubelet then sets no limit and headroom is undefined);
- headroom       = cgroup limit - pod working set: the VMM's margin before an OOM kill.

Per class, over a sliding window, only aggregates are kept (`ClassWindow`): a fixed-size
quantile sketch of the overhead (p50/p99 with a relative error bound, see `QuantileSketch`),
its maximum and the minimum headroom with the pod and time of each, and counts. Memory grows
with the number of classes and nodes, never with pods or time (`MeasurementState`).
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from .defaults import KUBELET_MAX_REFRESH_S
from .headroom import HeadroomThreshold, mib_text
from .kubegrammar import UINT64_MAX
from .podread import PodInputError, PodLimits, pod_limits, pod_spec_of
from .quantity import QuantityError, memory_bytes

__all__ = [
    "ClassWindow",
    "HeadroomThreshold",
    "KataPod",
    "LowHeadroom",
    "MeasurementState",
    "NodeReading",
    "PodMeasurement",
    "QuantileSketch",
    "SummaryError",
    "kata_pod",
    "read_summary",
]

# Pods of a Summary that the pod cache does not know, named in a reading (the rest are counted).
MAX_NAMED = 20


class SummaryError(ValueError):
    """A Summary document that is not one (not a mapping, `pods` not a list...)."""


# --- pods as the measurement needs them ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KataPod:
    """A pod of a Kata RuntimeClass, as its spec says the kubelet sized its cgroup."""

    uid: str
    pod: str  # namespace/name
    runtime_class: str
    node: str | None
    # The memory limits Kubernetes sums (podread.pod_limits); None when some container has none.
    memory_limit_bytes: int | None
    # spec.overhead.memory: the RuntimeClass's podFixed when the pod was admitted (0 without).
    pod_fixed_memory_bytes: int
    # The containers the Summary should list: regular ones and sidecars (restartable init
    # containers); run-to-completion init containers have exited and are not listed.
    containers: tuple[str, ...] = ()
    # The limits that are set, summed as Kubernetes does: what Kata sizes the VM from
    # (sizing.explain_pod); None where no container sets one.
    set_cpu_millis: int | None = None
    set_memory_bytes: int | None = None

    @property
    def cgroup_limit_bytes(self) -> int | None:
        if self.memory_limit_bytes is None:
            return None
        return self.memory_limit_bytes + self.pod_fixed_memory_bytes


def kata_pod(pod: Mapping, runtime_classes: Container[str] | None, limits: PodLimits | None = None) -> KataPod | None:
    """The pod as the measurement needs it, or None when it is not of one of `runtime_classes`
    (None: of any runtime class), has finished, or its spec cannot be read (the API server
    validated it; nothing to measure). `limits`: podread.pod_limits of its spec, when the caller
    has them already."""
    return read_kata_pod(pod, runtime_classes, limits)[0]


def read_kata_pod(
    pod: Mapping, runtime_classes: Container[str] | None, limits: PodLimits | None = None,
) -> tuple[KataPod | None, str | None]:
    """kata_pod, and why a pod of one of `runtime_classes` that has not finished cannot be
    measured (its spec cannot be read), for a report that names it."""
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    runtime_class = spec.get("runtimeClassName") if isinstance(spec, Mapping) else None
    # A list or mapping here is no RuntimeClass name (and unhashable): not a pod of these classes.
    if not isinstance(runtime_class, str) or not runtime_class or (
            runtime_classes is not None and runtime_class not in runtime_classes):
        return None, None
    status = pod.get("status")
    if isinstance(status, Mapping) and status.get("phase") in ("Succeeded", "Failed"):
        return None, None
    if not isinstance(meta, Mapping):
        return None, "metadata is not a mapping"
    node = spec.get("nodeName")
    if node is not None and not isinstance(node, str):
        return None, "spec.nodeName is not a string"
    try:
        spec = pod_spec_of(pod)
        if limits is None:
            limits = pod_limits(spec)
        overhead = memory_bytes(((spec.get("overhead") or {}).get("memory")) or 0)
    except (PodInputError, QuantityError, AttributeError, TypeError) as exc:
        return None, f"its spec cannot be read: {exc}"
    containers = tuple(str(c.get("name")) for c in spec.get("containers") or [] if isinstance(c, Mapping))
    sidecars = tuple(
        str(c.get("name")) for c in spec.get("initContainers") or []
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always")
    return KataPod(
        uid=str(meta.get("uid") or ""),
        pod=f"{meta.get('namespace') or 'default'}/{meta.get('name')}",
        runtime_class=runtime_class,
        node=node or None,
        memory_limit_bytes=None if limits.memory_missing else (limits.memory_bytes or 0),
        pod_fixed_memory_bytes=overhead,
        containers=sidecars + containers,
        set_cpu_millis=limits.cpu_millis,
        set_memory_bytes=limits.memory_bytes,
    ), None


# --- one Summary -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodMeasurement:
    """One Kata pod in one Summary. A figure the Summary cannot give is None, and `problems`
    says why (in words a user can act on)."""

    pod: KataPod
    working_set_bytes: int | None
    usage_bytes: int | None
    containers_working_set_bytes: int | None
    problems: tuple[str, ...] = ()

    @property
    def overhead_bytes(self) -> int | None:
        if self.working_set_bytes is None or self.containers_working_set_bytes is None:
            return None
        return self.working_set_bytes - self.containers_working_set_bytes

    @property
    def headroom_bytes(self) -> int | None:
        limit = self.pod.cgroup_limit_bytes
        if limit is None or self.working_set_bytes is None:
            return None
        return limit - self.working_set_bytes


@dataclass(frozen=True)
class NodeReading:
    """What one Summary said about the Kata pods the pod cache places on its node."""

    node: str
    measurements: tuple[PodMeasurement, ...]
    # Kata pods the cache places on this node that the Summary does not list (just started,
    # or gone): not measured this time; with the runtime class of each, in the same order.
    not_reported: tuple[str, ...] = ()
    not_reported_runtime_classes: tuple[str, ...] = ()
    # Pods the Summary lists that the pod cache does not know (created or deleted a moment
    # ago); the first MAX_NAMED by name, and how many in all.
    unknown: tuple[str, ...] = ()
    unknown_count: int = 0
    other_pods: int = 0  # pods of other runtime classes (runc, another policy's)
    problems: tuple[str, ...] = ()


def _uint(stats: object, key: str) -> int | None:
    """A uint64 field of a stats block; None when the block or the field is missing or not an
    integer a kubelet can send, 0 to 2^64 - 1 (the kubelet omits fields the runtime does not report)."""
    # dict, not Mapping: a parsed Summary holds dicts, and this runs for every pod and container.
    if not isinstance(stats, dict):
        return None
    value = stats.get(key)
    if type(value) is not int or not 0 <= value <= UINT64_MAX:  # bool is not int here, nor is a float
        return None
    return value


def _missing(stats: object, key: str, what: str, when_absent: str) -> str:
    """Why `_uint` found no figure: absent, or present but not a uint64."""
    if isinstance(stats, dict) and stats.get(key) is not None:
        return f"{what} {str(stats.get(key))[:40]} is not a figure a kubelet sends (an integer from 0 to 2^64 - 1)"
    return when_absent


def _time(text: object) -> datetime | None:
    """An RFC 3339 time of the Summary (metav1.Time: seconds, UTC), or None."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _containers_working_set(entry: Mapping, expected: tuple[str, ...]) -> tuple[int | None, list[str]]:
    """Sum of the containers' working sets, or None with the reason.

    A container listed twice (the kubelet caught a restart between the old container's stats and
    the new one's) counts once, its latest start; an expected container that is missing
    (restarting, not started) makes the sum unknown: the pod's own figure still holds it or not,
    so the difference would be wrong either way.

    The pod's figure comes from cAdvisor, refreshed every 10 to 15 s; the containers' from the
    runtime, fresh on every request. A pod figure taken less than KUBELET_MAX_REFRESH_S after a
    container started may predate what that container allocated on start (the test node showed
    the pod 66 MiB below its one container for the 15 s after its start), so the sum is not used
    until the pod's figure is that much younger than the latest start."""
    containers = entry.get("containers")
    if containers is None:
        containers = []
    if not isinstance(containers, list):
        return None, ["containers is not a list"]
    latest: dict[str, tuple[str, dict]] = {}
    for container in containers:
        if not isinstance(container, dict) or not isinstance(container.get("name"), str):
            return None, ["a container entry has no name"]
        name, started = container["name"], str(container.get("startTime") or "")
        # RFC 3339 times of one kubelet compare as text.
        if name not in latest or started >= latest[name][0]:
            latest[name] = (started, container)
    problems = []
    missing = [name for name in expected if name not in latest]
    if missing:
        problems.append(f"container {', '.join(missing)} not in the Summary (restarting or not started)")
    total = 0
    for name, (_, container) in sorted(latest.items()):
        working_set = _uint(container.get("memory"), "workingSetBytes")
        if working_set is None:
            problems.append(_missing(container.get("memory"), "workingSetBytes",
                                     f"container {name}'s memory.workingSetBytes",
                                     f"container {name} has no memory.workingSetBytes"))
        else:
            total += working_set
    if not problems and latest:
        memory = entry.get("memory")
        taken = _time(memory.get("time")) if isinstance(memory, dict) else None
        newest = _time(max(started for started, _ in latest.values()))
        if taken is not None and newest is not None and (taken - newest).total_seconds() < KUBELET_MAX_REFRESH_S:
            problems.append(f"the pod's figure ({taken:%H:%M:%S}) is less than {KUBELET_MAX_REFRESH_S} s younger than "
                            f"its latest container's start ({newest:%H:%M:%S}): waiting for the kubelet's next one")
    return (None, problems) if problems else (total, [])


def read_summary(
    summary: object,
    node: str,
    kata_pods: Mapping[str, KataPod],
    known_pods: Container[str] = (),
) -> NodeReading:
    """The Kata pods of one node's Summary.

    `kata_pods` maps pod uid to the Kata pods (of the runtime classes being measured) that the
    pod cache places on `node`; `known_pods` holds the uids of every other pod the cache knows,
    so a pod in neither is reported as unknown. Pods are matched by uid (a pod deleted and
    created again under its name is another pod); a podRef without uid is matched by name.
    Raises SummaryError when the document is not a Summary at all."""
    if not isinstance(summary, dict):
        raise SummaryError(f"the Summary of node {node} is not a JSON object")
    problems = []
    reported = summary["node"].get("nodeName") if isinstance(summary.get("node"), dict) else None
    if reported and reported != node:
        problems.append(f"the Summary is of node {reported}, not {node}")
    pods = summary.get("pods")
    if pods is None:
        pods = []
    if not isinstance(pods, list):
        raise SummaryError(f"the Summary of node {node}: pods is not a list")
    by_name = {p.pod: p for p in kata_pods.values()}
    seen: set[str] = set()
    measurements: list[PodMeasurement] = []
    unknown: list[str] = []
    unknown_count = other = 0
    for entry in pods:
        if not isinstance(entry, dict) or not isinstance(entry.get("podRef"), dict):
            problems.append("a pod entry has no podRef")
            continue
        ref = entry["podRef"]
        uid, name = str(ref.get("uid") or ""), f"{ref.get('namespace')}/{ref.get('name')}"
        pod = kata_pods.get(uid) if uid else by_name.get(name)
        if pod is None:
            if uid in known_pods:
                other += 1
            else:
                unknown_count += 1
                if len(unknown) < MAX_NAMED:
                    unknown.append(name)
            continue
        if pod.uid in seen:
            continue  # a pod listed twice: the first entry is the one measured
        seen.add(pod.uid)
        measurements.append(_measure(pod, entry))
    missing = sorted((p.pod, p.runtime_class) for uid, p in kata_pods.items() if uid not in seen)
    return NodeReading(
        node=node, measurements=tuple(sorted(measurements, key=lambda m: m.pod.pod)),
        not_reported=tuple(pod for pod, _ in missing),
        not_reported_runtime_classes=tuple(runtime_class for _, runtime_class in missing),
        unknown=tuple(sorted(unknown)), unknown_count=unknown_count,
        other_pods=other, problems=tuple(problems))


def _measure(pod: KataPod, entry: Mapping) -> PodMeasurement:
    memory = entry.get("memory")
    working_set = _uint(memory, "workingSetBytes")
    usage = _uint(memory, "usageBytes")
    problems = []
    if working_set is None:
        problems.append(_missing(memory, "workingSetBytes", "the pod's memory.workingSetBytes",
                                 "the pod has no memory.workingSetBytes (the kubelet has not measured its cgroup yet)"))
    containers, container_problems = _containers_working_set(entry, pod.containers)
    problems += container_problems
    if pod.memory_limit_bytes is None:
        problems.append("no memory limit on some container: the pod cgroup has no limit, headroom is undefined")
    return PodMeasurement(pod, working_set, usage, containers, tuple(problems))


# --- pods under their threshold ----------------------------------------------------------------


@dataclass(frozen=True)
class LowHeadroom:
    """A pod whose headroom is under its threshold: that VMM is close to an OOM kill."""

    pod: str
    node: str
    runtime_class: str
    headroom_bytes: int
    working_set_bytes: int
    cgroup_limit_bytes: int
    threshold_bytes: int
    measured_at: float
    uid: str = ""

    def message(self, class_name: str, threshold: HeadroomThreshold) -> str:
        return (f"pod {self.pod} (class {class_name}) on node {self.node}: working set "
                f"{mib_text(self.working_set_bytes)} of its cgroup limit {mib_text(self.cgroup_limit_bytes)} leaves "
                f"{mib_text(self.headroom_bytes)}, under {mib_text(self.threshold_bytes)} ({threshold.describe()}): "
                "its VMM is close to an OOM kill")


# --- the sketch --------------------------------------------------------------------------------


class QuantileSketch:
    """A mergeable quantile sketch with a relative error bound (DDSketch: Masson, Rim and Lee,
    "DDSketch: a fast and fully-mergeable quantile sketch with relative-error guarantees",
    VLDB 2019), over integers (bytes).

    A value x with |x| >= MIN_INDEXED is counted in the bucket k = ceil(log_gamma |x|) of its
    sign, gamma = (1 + ALPHA) / (1 - ALPHA); the bucket stands for 2 gamma^k / (gamma + 1), which
    is within ALPHA of every value in (gamma^(k-1), gamma^k]. So the q-quantile returned is within
    ALPHA (0.5%) of the true q-quantile of the values counted (the element of rank
    floor(q (n - 1)) in sorted order), or within MIN_INDEXED (1 KiB) of it for values closer to 0.
    Values are clamped to MAX_INDEXED (8 PiB), so a sign holds at most 2,980 buckets whatever
    is added; a class's overheads fall into a few dozen."""

    ALPHA = 0.005
    GAMMA = (1 + ALPHA) / (1 - ALPHA)
    _LOG_GAMMA = math.log(GAMMA)
    MIN_INDEXED = 1024
    MAX_INDEXED = 2**53
    MAX_BUCKETS = math.ceil(math.log(MAX_INDEXED / MIN_INDEXED) / _LOG_GAMMA) + 1

    __slots__ = ("positive", "negative", "zero", "count")

    def __init__(self) -> None:
        self.positive: dict[int, int] = {}
        self.negative: dict[int, int] = {}
        self.zero = 0
        self.count = 0

    @classmethod
    def key(cls, magnitude: int) -> int:
        return math.ceil(math.log(min(magnitude, cls.MAX_INDEXED)) / cls._LOG_GAMMA)

    @classmethod
    def value(cls, key: int) -> float:
        return 2 * cls.GAMMA**key / (cls.GAMMA + 1)

    def add(self, value: int) -> None:
        self.count += 1
        if abs(value) < self.MIN_INDEXED:
            self.zero += 1
            return
        store = self.positive if value > 0 else self.negative
        key = self.key(abs(value))
        store[key] = store.get(key, 0) + 1

    def merge(self, other: QuantileSketch) -> None:
        for mine, theirs in ((self.positive, other.positive), (self.negative, other.negative)):
            for key, count in theirs.items():
                mine[key] = mine.get(key, 0) + count
        self.zero += other.zero
        self.count += other.count

    def quantile(self, q: float) -> int | None:
        """The q-quantile (0 <= q <= 1) in whole bytes, or None when empty."""
        if self.count == 0:
            return None
        rank = q * (self.count - 1)
        seen = 0
        for key in sorted(self.negative, reverse=True):
            seen += self.negative[key]
            if seen > rank:
                return -round(self.value(key))
        seen += self.zero
        if seen > rank:
            return 0
        for key in sorted(self.positive):
            seen += self.positive[key]
            if seen > rank:
                return round(self.value(key))
        return round(self.value(max(self.positive))) if self.positive else 0

    def buckets(self) -> int:
        return len(self.positive) + len(self.negative) + (1 if self.zero else 0)


# --- per class, over a window ------------------------------------------------------------------


@dataclass(frozen=True)
class Extreme:
    """A maximum or minimum, and where and when it was seen."""

    value_bytes: int
    pod: str
    node: str
    at: float


def _lower(a: Extreme | None, b: Extreme | None) -> Extreme | None:
    if a is None or b is None:
        return a or b
    return b if b.value_bytes < a.value_bytes else a


def _higher(a: Extreme | None, b: Extreme | None) -> Extreme | None:
    if a is None or b is None:
        return a or b
    return b if b.value_bytes > a.value_bytes else a


@dataclass
class _Slot:
    overhead: QuantileSketch = field(default_factory=QuantileSketch)
    max_overhead: Extreme | None = None
    min_headroom: Extreme | None = None
    samples: int = 0
    last_at: float | None = None


@dataclass(frozen=True)
class ClassFigures:
    """A class's figures over the window; None where nothing was measured."""

    samples: int
    overhead_p50_bytes: int | None
    overhead_p99_bytes: int | None
    max_overhead: Extreme | None
    min_headroom: Extreme | None
    last_measured_at: float | None


class ClassWindow:
    """One class's measurements over the last `window_s` seconds, in SLOTS sub-windows: a slot
    is dropped whole once it is older than the window, so the figures cover between
    window_s * (1 - 1/SLOTS) and window_s. Memory: SLOTS sketches and extremes, whatever the
    number of pods or readings."""

    SLOTS = 6

    def __init__(self, window_s: float) -> None:
        self.window_s = float(window_s)
        self.slot_s = self.window_s / self.SLOTS
        self.slots: dict[int, _Slot] = {}

    def _expire(self, now: float) -> None:
        current = int(now // self.slot_s)
        for index in [i for i in self.slots if i <= current - self.SLOTS]:
            del self.slots[index]

    def add(self, measurement: PodMeasurement, node: str, at: float) -> None:
        overhead, headroom = measurement.overhead_bytes, measurement.headroom_bytes
        if overhead is None and headroom is None:
            return
        index = int(at // self.slot_s)
        slot = self.slots.get(index)
        if slot is None:
            self._expire(at)
            slot = self.slots[index] = _Slot()
        slot.samples += 1
        if slot.last_at is None or at > slot.last_at:
            slot.last_at = at
        if overhead is not None:
            slot.overhead.add(overhead)
            if slot.max_overhead is None or overhead > slot.max_overhead.value_bytes:
                slot.max_overhead = Extreme(overhead, measurement.pod.pod, node, at)
        if headroom is not None and (slot.min_headroom is None or headroom < slot.min_headroom.value_bytes):
            slot.min_headroom = Extreme(headroom, measurement.pod.pod, node, at)

    def figures(self, now: float) -> ClassFigures:
        self._expire(now)
        merged = QuantileSketch()
        max_overhead = min_headroom = None
        samples, last = 0, None
        for slot in self.slots.values():
            merged.merge(slot.overhead)
            max_overhead = _higher(max_overhead, slot.max_overhead)
            min_headroom = _lower(min_headroom, slot.min_headroom)
            samples += slot.samples
            if slot.last_at is not None:
                last = slot.last_at if last is None else max(last, slot.last_at)
        return ClassFigures(
            samples=samples, overhead_p50_bytes=merged.quantile(0.50), overhead_p99_bytes=merged.quantile(0.99),
            max_overhead=max_overhead, min_headroom=min_headroom, last_measured_at=last)

    def holds_any(self, now: float) -> bool:
        """Whether a sample is still inside the window at `now` (else its figures are all empty)."""
        self._expire(now)
        return bool(self.slots)

    def buckets(self) -> int:
        return sum(slot.overhead.buckets() for slot in self.slots.values())


# --- the state of a whole fleet ----------------------------------------------------------------


@dataclass(frozen=True)
class NodeRecord:
    """The last word from one node: what its last good reading counted per runtime class and
    which pods were under their threshold, and the last failure, if the last read failed."""

    measured_at: float | None = None
    pods_by_class: Mapping[str, int] = field(default_factory=dict)
    without_limit_by_class: Mapping[str, int] = field(default_factory=dict)
    # Pods of a class the last reading could not measure: not in the Summary, or without figures.
    not_measured_by_class: Mapping[str, int] = field(default_factory=dict)
    low: tuple[LowHeadroom, ...] = ()
    unknown_count: int = 0
    error: str | None = None
    error_at: float | None = None
    failures: int = 0


class MeasurementState:
    """Every class's window and every node's last word. Fed one reading (or failure) per node
    read; asked for a class's figures and for the pods now under their threshold.

    Keys are RuntimeClass names (a RuntimeClass is one class of one policy). What is kept grows
    with classes and nodes only: per class the window's sketches, per node a few counters and
    the pods under threshold (which an operator wants few of)."""

    def __init__(self) -> None:
        self.windows: dict[str, ClassWindow] = {}
        self.nodes: dict[str, NodeRecord] = {}

    def window(self, runtime_class: str, window_s: float) -> ClassWindow:
        found = self.windows.get(runtime_class)
        if found is None or found.window_s != float(window_s):
            found = self.windows[runtime_class] = ClassWindow(window_s)
        return found

    def add_reading(
        self, reading: NodeReading, at: float, window_s: Mapping[str, float],
        thresholds: Mapping[str, tuple[HeadroomThreshold, int, int]],
    ) -> None:
        """One node's Summary, read at `at` (seconds since the epoch). `window_s` and
        `thresholds` ({runtime class: (threshold, the class's podFixed.memory and guest budget, bytes)}) say which
        runtime classes are measured; a pod of any other is ignored."""
        pods: dict[str, int] = {}
        without_limit: dict[str, int] = {}
        not_measured: dict[str, int] = {}
        for runtime_class in reading.not_reported_runtime_classes:
            not_measured[runtime_class] = not_measured.get(runtime_class, 0) + 1
        low = []
        for measurement in reading.measurements:
            runtime_class = measurement.pod.runtime_class
            if runtime_class not in window_s:
                continue
            pods[runtime_class] = pods.get(runtime_class, 0) + 1
            if measurement.working_set_bytes is None:
                not_measured[runtime_class] = not_measured.get(runtime_class, 0) + 1
            if measurement.pod.cgroup_limit_bytes is None:
                without_limit[runtime_class] = without_limit.get(runtime_class, 0) + 1
            self.window(runtime_class, window_s[runtime_class]).add(measurement, reading.node, at)
            headroom = measurement.headroom_bytes
            threshold, class_pod_fixed, guest_budget = thresholds[runtime_class]
            if headroom is None:
                continue
            # The class's line: a pod admitted under an older podFixed has that in its cgroup limit, hence in
            # its headroom, and its VM the guest budget of then, which the pod does not say.
            limit = threshold.line_bytes(class_pod_fixed, guest_budget)
            if headroom < limit:
                low.append(LowHeadroom(
                    measurement.pod.pod, reading.node, runtime_class, headroom,
                    measurement.working_set_bytes or 0, measurement.pod.cgroup_limit_bytes or 0, limit, at,
                    uid=measurement.pod.uid))
        self.nodes[reading.node] = NodeRecord(
            measured_at=at, pods_by_class=pods, without_limit_by_class=without_limit,
            not_measured_by_class=not_measured, low=tuple(low), unknown_count=reading.unknown_count)

    def add_failure(self, node: str, error: str, at: float) -> None:
        """A read that failed: the node's last good reading stands (a pod under threshold stays
        reported until a reading shows otherwise; a silent node is no evidence of recovery)."""
        before = self.nodes.get(node, NodeRecord())
        self.nodes[node] = NodeRecord(
            measured_at=before.measured_at, pods_by_class=before.pods_by_class,
            without_limit_by_class=before.without_limit_by_class,
            not_measured_by_class=before.not_measured_by_class, low=before.low,
            unknown_count=before.unknown_count, error=error, error_at=at, failures=before.failures + 1)

    def forget_nodes(self, keep: Iterable[str]) -> None:
        """Drop the records of nodes no longer measured (deleted, or running no Kata pod)."""
        kept = set(keep)
        for node in [n for n in self.nodes if n not in kept]:
            del self.nodes[node]

    def forget_classes(self, keep: Iterable[str]) -> None:
        kept = set(keep)
        for runtime_class in [c for c in self.windows if c not in kept]:
            del self.windows[runtime_class]

    def figures(self, runtime_class: str, now: float) -> ClassFigures | None:
        window = self.windows.get(runtime_class)
        return window.figures(now) if window is not None else None

    def pods_measured(self, runtime_class: str) -> int:
        """Pods of the class in each node's last good reading."""
        return sum(record.pods_by_class.get(runtime_class, 0) for record in self.nodes.values())

    def pods_not_measured(self, runtime_class: str) -> int:
        """Pods of the class each node's last reading could not measure (docs/measurement.md)."""
        return sum(record.not_measured_by_class.get(runtime_class, 0) for record in self.nodes.values())

    def pods_without_limit(self, runtime_class: str) -> int:
        return sum(record.without_limit_by_class.get(runtime_class, 0) for record in self.nodes.values())

    def low_headroom(self, runtime_classes: Container[str]) -> list[LowHeadroom]:
        found = [low for record in self.nodes.values() for low in record.low if low.runtime_class in runtime_classes]
        return sorted(found, key=lambda low: (low.headroom_bytes, low.pod))

    def failing_nodes(self) -> list[tuple[str, NodeRecord]]:
        """Nodes whose last read failed, by name."""
        return sorted((name, record) for name, record in self.nodes.items() if record.error is not None)
