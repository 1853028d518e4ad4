"""The measurement loop (docs/measurement.md): what the pods of each policy's classes really use
on their nodes, read from the kubelets' Summaries at a bounded rate.

Every node that runs a pod of a measured class is read once per interval (the shortest interval
of the policies whose pods it runs), at a fixed phase within the interval taken from a hash of
its name, so the reads of a fleet spread evenly over the interval and one node is never read
twice in an interval. At most READ_SLOTS reads run at once, each bounded by the kubelet request
timeout; a node that fails or does not answer is recorded as skipped (its last reading stands)
and read again at its next turn, and never holds up another node.

Only aggregates are kept (core/measure.MeasurementState): per class the window's sketches and
extremes, per node its last counts and the pods under their headroom threshold. Entering that
list posts a Warning event (HeadroomLow) on the policy; leaving it posts a Normal one
(HeadroomRecovered). The figures go to status.measurement (`report`) and to metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ..core.headroom import HeadroomThreshold, mib_text
from ..core.measure import KataPod, LowHeadroom, MeasurementState, SummaryError, read_summary
from ..core.statusmodel import HeadroomLowPod, MeasuredClass, MeasurementStatus, SkippedNode
from . import conditions as cond
from . import metrics

log = logging.getLogger("kata_sizing.measurement")

READ_SLOTS = 8
# Nodes and pods named in status (the rest are counted).
MAX_LISTED = 20
Read = Callable[[str], Awaitable[object]]
EventSink = Callable[[dict, str, str, str], None]


@dataclass(frozen=True)
class Clock:
    """Seconds since the epoch, and how many of them pass per real second (tests run the loop's
    intervals faster than real time; the kubelet request timeout stays real)."""

    now: Callable[[], float] = time.time
    speed: float = 1.0

    @classmethod
    def faster(cls, speed: float) -> Clock:
        start = time.time()
        return cls(now=lambda: start + (time.time() - start) * speed, speed=speed)


@dataclass(frozen=True)
class MeasuredPolicy:
    """What a policy asks to be measured: its classes ({runtime class: (class, podFixed.memory
    bytes, guest budget bytes)}), how often, over which window, and under which headroom a pod is
    reported (core/headroom.py: a share of podFixed beyond the guest budget)."""

    name: str
    ref: dict
    classes: Mapping[str, tuple[str, int, int]]
    interval_s: float
    window_s: float
    threshold: HeadroomThreshold
    threshold_text: str


@dataclass
class PolicyMeasurement:
    """What the loop keeps about one measured policy, forgotten with it in one `pop`."""

    policy: MeasuredPolicy
    # Its pods under the threshold, as announced: pod -> the low it was announced with.
    announced: dict[str, LowHeadroom] = field(default_factory=dict)
    # Bumped when its report should be written (the pods under threshold changed, or an interval
    # passed since the last bump), so status is written about once per interval.
    version: int = 0
    published_at: float = float("-inf")
    nodes: set[str] = field(default_factory=set)  # the nodes running its pods (from `targets`)
    # The report of this version has nothing measured (as at the start, when every pass writes the
    # empty one): no bump is needed while it stays so.
    published_quiet: bool = True


def measured_policy(sizing, ref: dict) -> MeasuredPolicy | None:
    """What a valid policy's sizing asks to be measured; None when spec.measurement.enabled is false."""
    spec = sizing.policy.spec.measurement
    if not spec.enabled:
        return None
    return MeasuredPolicy(
        name=sizing.policy.name, ref=ref,
        classes={c.runtime_class: (c.name, c.pod_fixed_memory_mib * 2**20, c.guest_budget_mib * 2**20)
                 for c in sizing.classes},
        interval_s=float(spec.interval_seconds), window_s=float(spec.window_seconds),
        threshold=HeadroomThreshold.parse(spec.headroom_warning), threshold_text=spec.headroom_warning)


def rfc3339(at: float | None) -> str | None:
    if at is None:
        return None
    return datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def phase_s(node: str, interval_s: float) -> float:
    """Where in each interval `node` is read: spread by a hash of its name (stable across
    restarts and replicas), not by its position in a list that changes as nodes come and go."""
    return zlib.crc32(node.encode()) / 2**32 * interval_s


def next_turn(node: str, interval_s: float, after: float) -> float:
    """The first time >= `after` at the node's phase of the interval."""
    phase = phase_s(node, interval_s)
    return after + (phase - after) % interval_s


# ({class: window}, {class: (threshold, podFixed, guest budget)}, {class: policy}).
_ClassTable = tuple[dict[str, float], dict[str, tuple[HeadroomThreshold, int, int]], dict[str, str]]


class MeasurementLoop:
    """`read(node)` returns a node's Summary (either access, see controller/kubelet.py) or raises;
    `pods` is the operator's pod cache (an Informer of cluster.PodRequest keyed by uid)."""

    def __init__(self, read: Read, pods, events: EventSink | None = None,
                 clock: Clock = Clock(), read_slots: int = READ_SLOTS,
                 gate: Callable[[], Awaitable[None]] | None = None):
        self.read = read
        self.pods = pods
        self.events = events
        self.clock = clock.now
        self.speed = clock.speed
        self.gate = gate  # with two replicas: wait until this one leads
        self.state = MeasurementState()
        self.measured: dict[str, PolicyMeasurement] = {}  # by policy name
        self._config_version = 0
        self._targets_key: tuple | None = None
        self._targets: dict[str, tuple[float, dict[str, KataPod]]] = {}
        # ({class: window}, {class: (threshold, podFixed, guest budget)}, {class: policy}), kept by
        # configure (_retable): every node's reading asks for it.
        self._table: _ClassTable = ({}, {}, {})
        self._overlap = False  # two policies name one class: the table is built whole
        self._pruned_for: tuple | None = None
        self.next_due: dict[str, float] = {}
        self.in_flight: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self._slots = asyncio.Semaphore(read_slots)
        self._wake = asyncio.Event()
        self.reads_ok = 0
        self.reads_failed = 0

    # --- configuration, from each policy's pass -------------------------------------------------

    def configure(self, policy: MeasuredPolicy | None, name: str) -> None:
        """Measure `policy`'s classes from now on (None: stop measuring policy `name`)."""
        record = self.measured.get(name)
        before = record.policy if record is not None else None
        if policy is None:
            self.measured.pop(name, None)
        elif record is None:
            self.measured[name] = PolicyMeasurement(policy)
        else:
            record.policy = policy
        if before != policy:
            self._config_version += 1
            self._retable(name, before, policy)
            self.state.forget_classes(self._table[2])
            self._wake.set()

    def forget(self) -> None:
        """Everything read so far (this replica stopped leading): the leader measures, warns and
        exports the gauges now; what to measure is kept for when this one leads again."""
        self.state = MeasurementState()
        self.next_due.clear()
        for record in self.measured.values():
            record.announced, record.version, record.published_at = {}, 0, float("-inf")
            record.published_quiet = True
        self._pruned_for = None

    def policies(self) -> list[MeasuredPolicy]:
        return [record.policy for record in self.measured.values()]

    def _retable(self, name: str, before: MeasuredPolicy | None, after: MeasuredPolicy | None) -> None:
        """The class table after policy `name` went from `before` to `after`: its classes taken
        out and put in again, not every policy's walked (a policy created among 200 rebuilt a
        table of 800 classes; docs/performance.md). While two policies name one class (the
        operator refuses the second, but passes may run before it does) the table is built whole,
        by the policies' order, as it always was: the last policy naming a class owns it."""
        windows, thresholds, owner = self._table
        if not self._overlap and (after is None or all(owner.get(c, name) == name for c in after.classes)):
            for runtime_class in before.classes if before is not None else ():
                del windows[runtime_class], thresholds[runtime_class], owner[runtime_class]
            adding = [after] if after is not None else []
        else:
            for table in (windows, thresholds, owner):
                table.clear()
            adding = self.policies()
            self._overlap = len({c for p in adding for c in p.classes}) < sum(len(p.classes) for p in adding)
        for policy in adding:
            for runtime_class, (_, pod_fixed, guest_budget) in policy.classes.items():
                windows[runtime_class] = policy.window_s
                thresholds[runtime_class] = (policy.threshold, pod_fixed, guest_budget)
                owner[runtime_class] = policy.name

    def targets(self) -> dict[str, tuple[float, dict[str, KataPod]]]:
        """{node: (interval, {uid: Kata pod of a measured class on it})}, recomputed when the pod
        cache or the configuration changed."""
        key = (getattr(self.pods, "version", None), self._config_version)
        if key == self._targets_key:
            return self._targets
        _, _, owner = self._table
        targets: dict[str, tuple[float, dict[str, KataPod]]] = {}
        for record in self.measured.values():
            record.nodes = set()
        for request in list(self.pods.items.values()):
            kata = getattr(request, "kata", None)
            if kata is None or kata.node is None or kata.runtime_class not in owner:
                continue
            record = self.measured[owner[kata.runtime_class]]
            interval, pods = targets.get(kata.node, (record.policy.interval_s, {}))
            pods[kata.uid] = kata
            targets[kata.node] = (min(interval, record.policy.interval_s), pods)
            record.nodes.add(kata.node)
        self._targets, self._targets_key = targets, key
        return targets

    # --- the loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                if self.gate is not None:
                    await self.gate()
                now = self.clock()
                targets = self.targets()
                if self._targets_key != self._pruned_for:
                    # Nodes that run no measured pod any more: no turn, no record.
                    for node in [n for n in self.next_due if n not in targets]:
                        del self.next_due[node]
                    self.state.forget_nodes(targets)
                    self._pruned_for = self._targets_key
                for node, (interval, _) in targets.items():
                    due = self.next_due.get(node)
                    if due is None:
                        due = self.next_due[node] = next_turn(node, interval, now)
                    if due > now:
                        continue
                    # The next turn at the node's phase, at least half an interval after this read: a
                    # loop running late reads late once and skips a turn rather than read twice in a row.
                    self.next_due[node] = next_turn(node, interval, max(now, due) + interval * 0.5)
                    if node in self.in_flight:
                        continue  # still waiting for the last one (bounded by the read timeout)
                    self.in_flight.add(node)
                    task = asyncio.create_task(self._read(node), name=f"summary-{node}")
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                self._publish_due(now)
                wait = min((due - now for due in self.next_due.values()), default=1.0)
                self._wake.clear()
                try:
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that
                    # comes as the event is set (a policy forgotten at shutdown), and the loop ran on.
                    async with asyncio.timeout(max(0.01, min(wait, 1.0)) / self.speed):
                        await self._wake.wait()
                except TimeoutError:
                    pass
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _read(self, node: str) -> None:
        try:
            async with self._slots:
                try:
                    summary = await self.read(node)
                    _, pods = self.targets().get(node, (0.0, {}))
                    reading = read_summary(summary, node, pods, self.pods.items)
                except asyncio.CancelledError:
                    raise
                except SummaryError as exc:
                    self._failed(node, str(exc))
                except Exception as exc:  # noqa: BLE001 - a node's failure must never stop the loop
                    self._failed(node, str(exc) or type(exc).__name__)
                else:
                    windows, thresholds, _ = self._table
                    self.state.add_reading(reading, self.clock(), windows, thresholds)
                    self.reads_ok += 1
                    metrics.summary_read(True)
                    self._announce()
        finally:
            self.in_flight.discard(node)

    def _failed(self, node: str, message: str) -> None:
        self.reads_failed += 1
        metrics.summary_read(False)
        self.state.add_failure(node, message, self.clock())
        log.warning("Summary of node %s not read: %s", node, message)

    # --- warnings, status, metrics --------------------------------------------------------------

    def _announce(self) -> None:
        """Events for pods entering and leaving the under-threshold list of each policy."""
        for record in self.measured.values():
            policy = record.policy
            now = {low.pod: low for low in self.state.low_headroom(policy.classes)}
            before = record.announced
            if now.keys() == before.keys():
                record.announced = now
                continue
            for pod in sorted(now.keys() - before.keys()):
                low = now[pod]
                class_name = policy.classes[low.runtime_class][0]
                self._event(policy, "Warning", cond.EVENT_HEADROOM_LOW, low.message(class_name, policy.threshold))
            for pod in sorted(before.keys() - now.keys()):
                low = before[pod]
                class_name = policy.classes.get(low.runtime_class, (low.runtime_class,))[0]
                gone = low.uid not in self.pods.items
                self._event(policy, "Normal", cond.EVENT_HEADROOM_RECOVERED,
                            f"pod {pod} (class {class_name}) on node {low.node}: "
                            + ("the pod is gone" if gone else
                               f"headroom no longer under {mib_text(low.threshold_bytes)} ({policy.threshold_text})"))
            record.announced = now
            self._bump(record)

    def _event(self, policy: MeasuredPolicy, type_: str, reason: str, message: str) -> None:
        log.log(logging.WARNING if type_ == "Warning" else logging.INFO, "policy %s: %s: %s", policy.name, reason, message)
        if self.events is not None:
            self.events(policy.ref, type_, reason, message)

    def _bump(self, record: PolicyMeasurement) -> None:
        record.version += 1
        record.published_at = self.clock()

    def _publish_due(self, now: float) -> None:
        """Bump each policy's version once per interval, but not a policy whose report is the
        empty one of its version and still would be: no node runs its pods, no window holds its
        classes, no node's record has its pods under threshold. Its status would not change, and
        every bump makes the guidance check ask for its report (with 200 policies and no Kata pod,
        a tenth of the operator's CPU between passes; docs/performance.md)."""
        low: set[str] | None = None  # the classes with pods under threshold, once a policy is due
        windows = self.state.windows
        for record in self.measured.values():
            if now - record.published_at < record.policy.interval_s:
                continue
            if low is None:
                low = {found.runtime_class for node in self.state.nodes.values() for found in node.low}
            quiet = not (record.nodes or record.announced or any(
                c in low or (c in windows and windows[c].holds_any(now)) for c in record.policy.classes))
            if quiet and record.published_quiet:
                record.published_at = now  # looked at again an interval from now, not at every wake
                continue
            self._bump(record)
            record.published_quiet = quiet

    def version(self, policy: str) -> int:
        record = self.measured.get(policy)
        return record.version if record is not None else 0

    def measures(self, name: str) -> bool:
        return name in self.measured

    def report(self, name: str, previous: MeasurementStatus | None = None) -> MeasurementStatus | None:
        """status.measurement of policy `name`: None when it is not measured (the field is
        removed), `previous` while this replica has read none of its nodes yet (a new leader: the
        status keeps what the last one measured until this one has read)."""
        record = self.measured.get(name)
        if record is None:
            return None
        policy, now = record.policy, self.clock()
        self.targets()
        nodes = sorted(record.nodes)
        if nodes and not any(node in self.state.nodes for node in nodes):
            return previous
        read = [self.state.nodes[n] for n in nodes if n in self.state.nodes]
        failing = [(node, self.state.nodes[node]) for node in nodes
                   if node in self.state.nodes and self.state.nodes[node].error is not None]
        low = self.state.low_headroom(policy.classes)
        classes = []
        for runtime_class, (class_name, _, _) in policy.classes.items():
            figures = self.state.figures(runtime_class, now)
            measured = figures is not None and figures.samples > 0
            most = figures.max_overhead if measured and figures else None
            least = figures.min_headroom if measured and figures else None
            classes.append(MeasuredClass(
                name=class_name, runtime_class=runtime_class,
                pods_measured=sum(record.pods_by_class.get(runtime_class, 0) for record in read),
                pods_without_limit=sum(record.without_limit_by_class.get(runtime_class, 0) for record in read),
                pods_not_measured=sum(record.not_measured_by_class.get(runtime_class, 0) for record in read),
                pods_under_threshold=sum(1 for found in low if found.runtime_class == runtime_class),
                samples=figures.samples if figures else 0,
                overhead_p50_bytes=figures.overhead_p50_bytes if measured and figures else None,
                overhead_p99_bytes=figures.overhead_p99_bytes if measured and figures else None,
                overhead_max_bytes=most.value_bytes if most else None, overhead_max_pod=most.pod if most else None,
                min_headroom_bytes=least.value_bytes if least else None,
                min_headroom_pod=least.pod if least else None, min_headroom_node=least.node if least else None,
                min_headroom_at=rfc3339(least.at) if least else None,
                last_measured=rfc3339(figures.last_measured_at) if measured and figures else None))
        return MeasurementStatus(
            interval_seconds=int(policy.interval_s), window_seconds=int(policy.window_s), nodes=len(nodes),
            nodes_skipped=len(failing),
            skipped=[SkippedNode(node=node, reason=(record.error or "")[:300], failures=record.failures,
                                 since=rfc3339(record.error_at)) for node, record in failing[:MAX_LISTED]],
            classes=classes,
            under_threshold=[HeadroomLowPod(
                pod=found.pod, node=found.node, class_name=policy.classes[found.runtime_class][0],
                headroom_bytes=found.headroom_bytes, threshold_bytes=found.threshold_bytes,
                measured_at=rfc3339(found.measured_at) or "") for found in low[:MAX_LISTED]])

    def gauges(self) -> list[tuple[str, str, dict]]:
        """(policy, class, figures) for the metrics: pods under threshold, min headroom, overhead quantiles."""
        now = self.clock()
        found = []
        for policy in self.policies():
            low = self.state.low_headroom(policy.classes)
            for runtime_class, (class_name, _, _) in policy.classes.items():
                figures = self.state.figures(runtime_class, now)
                found.append((policy.name, class_name, {
                    "under_threshold": sum(1 for item in low if item.runtime_class == runtime_class),
                    "min_headroom": figures.min_headroom.value_bytes if figures and figures.min_headroom else None,
                    "p50": figures.overhead_p50_bytes if figures else None,
                    "p99": figures.overhead_p99_bytes if figures else None,
                    "max": figures.max_overhead.value_bytes if figures and figures.max_overhead else None,
                }))
        return found
