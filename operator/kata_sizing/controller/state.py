"""The operator's state, typed: what one process keeps between passes (kopf's memo holds only
this object, as `memo.state`), one `PolicyRecord` per policy."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from ..core.sizing import PolicySizing
from ..core.statusmodel import KataSizingPolicyStatus
from .compare import is_ours
from .events import EventSink
from .informer import ChildCache, Informer
from .kinds import ObjKey
from .leader import LeaderElector
from .plan import Desired, Intent, PassInputs
from .workqueue import WorkQueue


@dataclass
class DesiredCache:
    """What each policy's last pass wanted, which is also the index from a managed object back to
    its policy (for drift) and the set of Kata RuntimeClass names (for node guidance)."""

    by_policy: dict[str, Desired] = field(default_factory=dict)
    by_child: dict[ObjKey, str] = field(default_factory=dict)
    # Bumps when the set of RuntimeClass names some policy renders changes (not on every pass).
    version: int = 0
    _names: tuple[int, frozenset[str]] | None = field(default=None, repr=False)
    _name_counts: dict[str, int] = field(default_factory=dict, repr=False)  # name -> policies rendering it

    def put(self, desired: Desired) -> Desired | None:
        """Record a pass's desired state; returns the one it replaces."""
        old = self.by_policy.get(desired.policy_name)
        new_keys = set(desired.keys())
        if old is not None:
            self._release(desired.policy_name, set(old.keys()) - new_keys)
        self.by_policy[desired.policy_name] = desired
        for key in new_keys:
            self.by_child[key] = desired.policy_name
        before = old.runtime_class_names() if old is not None else set()
        after = desired.runtime_class_names()
        if old is None or before != after:
            self._count_names(before, after)
            self.version += 1
        return old

    def drop(self, policy_name: str) -> Desired | None:
        old = self.by_policy.pop(policy_name, None)
        if old:
            self._release(policy_name, set(old.keys()))
            self._count_names(old.runtime_class_names(), set())
            self.version += 1
        return old

    def _release(self, policy_name: str, keys: set[ObjKey]) -> None:
        for key in keys:
            if self.by_child.get(key) == policy_name:
                other = next((d.policy_name for d in self.by_policy.values()
                              if d.policy_name != policy_name and d.lookup(key)), None)
                if other:
                    self.by_child[key] = other
                else:
                    del self.by_child[key]

    def _count_names(self, before: set[str], after: set[str]) -> None:
        for name in before - after:
            if self._name_counts[name] == 1:
                del self._name_counts[name]
            else:
                self._name_counts[name] -= 1
        for name in after - before:
            self._name_counts[name] = self._name_counts.get(name, 0) + 1

    def runtime_class_names(self) -> frozenset[str]:
        """Every RuntimeClass some policy renders: the Kata classes the operator knows of (read
        once per `version`, from how many policies render each name: every pass after a policy's
        classes changed asks, and scanning the index of every object of 200 policies was most of
        a pass's audit there)."""
        if self._names is None or self._names[0] != self.version:
            self._names = (self.version, frozenset(self._name_counts))
        return self._names[1]

    def for_child(self, key: ObjKey, live: dict | None = None) -> Desired | None:
        """The policy that wants `key`; given the `live` object, the one it belongs to. Two
        policies may render the same name (one of them in Conflict), and the index holds only
        the last one put."""
        name = self.by_child.get(key)
        indexed = self.by_policy.get(name) if name else None
        if indexed is None or live is None or is_ours(live, indexed.policy_name, indexed.policy_uid):
            return indexed
        for desired in self.by_policy.values():
            if desired.lookup(key) is not None and is_ours(live, desired.policy_name, desired.policy_uid):
                return desired
        return indexed


@dataclass
class PolicyRecord:
    """What this replica keeps about one policy between its passes; forgetting a policy drops it."""

    name: str
    # The latest body seen (the policy watch, and the operator's own status writes); None once
    # the watch said the policy is deleted (its queued item then forgets it).
    body: dict | None
    # The status as this replica last wrote it (None: not yet; the first pass reads the body's).
    status: KataSizingPolicyStatus | None = None
    # ((uid, generation), its sizing, or None when that generation is invalid): sized once per
    # generation, not per pass (the guidance check's pod audit needs it on every change of pods).
    sizing: tuple[tuple, PolicySizing | None] | None = None
    # ((uid, generation, node facts, admission versions), what the policy wants with them).
    intent: tuple[tuple, Intent] | None = None
    inputs: PassInputs | None = None  # of its last successful pass
    # The objects its last pass reported, or could not write (a change of any other object that
    # leaves it as the policy wants it needs no pass).
    attention: frozenset[ObjKey] = frozenset()
    # The drift its passes reported (as (key, resourceVersion)) and still stands, and the events
    # last posted, by reason.
    reported: frozenset = frozenset()
    announced: dict[str, object] = field(default_factory=dict)
    # Increments of status.driftCorrections/driftDetected not yet written.
    pending_counts: dict[str, int] = field(default_factory=dict)

    @property
    def generation(self) -> int | None:
        return ((self.body or {}).get("metadata") or {}).get("generation")


@dataclass
class OperatorState:
    api: Any  # kube.KubeApi (or a test's fake of it)
    admission_versions: dict[str, str]
    children: ChildCache
    nodes: Informer
    pods: Informer
    events: EventSink = field(default=lambda ref, type_, reason, message: None)
    work: WorkQueue[str, str] | None = None
    leader: LeaderElector | None = None
    webhook_serving: bool = False
    # With the routing webhook served: each namespace's labels, by (None, name), so a review reads
    # its pod's scope from memory (handlers.route_pod).
    namespaces: Informer | None = None
    # The measurement of the policies' pods (measurement.MeasurementLoop) and, reading on the
    # kubelets' own port, their client (kubelet.DirectKubelets); docs/measurement.md.
    measurement: Any = None
    kubelets: Any = None
    desired: DesiredCache = field(default_factory=DesiredCache)
    records: dict[str, PolicyRecord] = field(default_factory=dict)
    # Node facts and audits computed once per change and shared by every policy: one slot each,
    # (the version it was computed from, the value) (gather.memoized).
    derived: dict[Hashable, tuple] = field(default_factory=dict)
    # Policy watch events whose handling raised, the newest per policy, to be taken again
    # (worker.policy_watched).
    unseen: dict[str | None, tuple[str | None, dict]] = field(default_factory=dict)
    background: list[asyncio.Task] = field(default_factory=list)

    def enqueue(self, policy_name: str, trigger: str) -> None:
        """A pass of the policy, for `trigger` (worker.TRIGGERS): the queue holds one item per
        policy, whatever asked for it."""
        if self.work is not None:
            self.work.add(policy_name, trigger)

    def informers(self) -> list[Informer]:
        return [self.nodes, self.pods, *self.children.informers(), *([self.namespaces] if self.namespaces else [])]

    def forget_policy(self, policy_name: str) -> None:
        self.records.pop(policy_name, None)
        self.desired.drop(policy_name)
        if self.work is not None:
            self.work.forget(policy_name)
        if self.measurement is not None:
            self.measurement.configure(None, policy_name)

    def forget_leadership(self) -> None:
        """This replica stopped leading: what it announced, reported and wrote is another
        replica's business now, and is said again if it leads again and finds it still so."""
        for record in self.records.values():
            record.status, record.reported, record.announced = None, frozenset(), {}
        if self.measurement is not None:
            self.measurement.forget()  # the leader reads the kubelets and exports the gauges
