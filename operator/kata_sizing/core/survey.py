"""`kata-sizing survey`: one measurement of every Kata pod of a policy, as the rows `calibrate`
reads (docs/measurement.md). Pure: readings (core/measure) and a sizing in, rows and CSV text out.

A row is one pod: its class, its memory limits (container_limit_mib), the VM Kata boots for
them by the policy's rules (vm_nominal_mib, sizing.explain_pod), and the kubelet's figures: the
pod cgroup's working set and usage (pod_cgroup_memory_current_bytes: usageBytes is the cgroup's
memory.current, memory.usage_in_bytes on cgroup v1) and the sum of its containers' working sets.
There is no `free -m` from inside the guest: the host side cannot see the guest's split.

Each row says what it measured (calibrate.KIND_COLUMNS): a Kata pod's VM (under KVM, its guest and
devices Kata's), and its pod cgroup holding the shim, the VMM and virtiofsd when the policy sets
sandbox_cgroup_only (host_processes kata-pod), none of them otherwise (none: they run in /kata_overhead).
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from .bounded import printable
from .calibrate import HOST_COLUMNS, KATA_DEVICES, KATA_POD, KIND_COLUMNS, Sample
from .kubegrammar import dns_label_problem, dns_subdomain_problem
from .measure import KataPod, NodeReading, PodMeasurement, SummaryError, read_kata_pod, read_summary
from .quantity import MIB
from .sizing import PolicySizing, SandboxRefused, explain_pod

COLUMNS = (
    "node", "pod", "class", *KIND_COLUMNS, "container_limit_mib", "vm_nominal_mib", "free_total_mib",
    "free_used_mib", "pod_cgroup_memory_current_bytes", *HOST_COLUMNS,
)
# Pods named per reason in the notes; the rest are counted (a survey of 2,000 pods with one node's
# Summary would otherwise print 2,000 lines).
MAX_NAMED = 20


class SurveyInputError(ValueError):
    """Input no API server or kubelet sends (a name outside Kubernetes' grammar, a node given twice):
    the message names the field; the caller names the file and refuses it."""


def _mib(size_bytes: int) -> Decimal:
    # Exact: a limit of 1G is 953.67431640625 MiB, and calibrate reads decimals.
    return (Decimal(size_bytes) / MIB).normalize() if size_bytes % MIB else Decimal(size_bytes // MIB)


# The fields of a pod a survey reads, and the grammar the API server holds each to.
_POD_NAMES = (
    ("metadata", "name", dns_subdomain_problem, True),
    ("metadata", "namespace", dns_label_problem, False),
    ("spec", "nodeName", dns_subdomain_problem, False),
    ("spec", "runtimeClassName", dns_subdomain_problem, False),
)


def check_pod_names(pod: object, where: str) -> dict:
    """The pod, or SurveyInputError unless the pod's names are ones the API server stores (a name
    with a comma, a quote or a line break would otherwise reach the CSV)."""
    if not isinstance(pod, dict):
        raise SurveyInputError(f"{where}: not a Pod (a mapping)")
    for part, key, problem_of, required in _POD_NAMES:
        block = pod.get(part)
        if block is None and not required:
            continue
        if not isinstance(block, dict):
            raise SurveyInputError(f"{where}: {part}: not a mapping")
        value = block.get(key)
        if value is None:
            if required:
                raise SurveyInputError(f"{where}: {part}.{key}: missing (every pod the API server lists has one)")
            continue
        problem = problem_of(value)
        if problem:
            raise SurveyInputError(f"{where}: {part}.{key}: {problem}")
    return pod


@dataclass
class PodIndex:
    """The Kata pods of the measured runtime classes by node, built one pod at a time (a 20,000-pod
    list is streamed, never held), and why each such pod that will not be measured is left out."""

    runtime_classes: set[str]
    by_node: dict[str, dict[str, KataPod]] = field(default_factory=dict)
    left_out: dict[str, list[str]] = field(default_factory=dict)  # reason -> pods
    pods: int = 0

    def add(self, pod: object, where: str) -> None:
        checked = check_pod_names(pod, where)
        self.pods += 1
        found, why = read_kata_pod(checked, self.runtime_classes)
        meta = checked.get("metadata") or {}
        name = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        if why is not None:
            self.left_out.setdefault(why, []).append(name)
        elif found is not None:
            if found.node is None:
                self.left_out.setdefault("not scheduled on a node yet", []).append(name)
            else:
                self.by_node.setdefault(found.node, {})[found.uid or name] = found

    def note(self, reason: str, pods: list[str]) -> None:
        self.left_out.setdefault(reason, []).extend(pods)

    def notes(self) -> list[str]:
        lines = []
        for reason, pods in sorted(self.left_out.items()):
            lines += [f"pod {pod} not measured: {reason}" for pod in sorted(pods)[:MAX_NAMED]]
            if len(pods) > MAX_NAMED:
                lines.append(f"{len(pods) - MAX_NAMED} more pod(s) not measured: {reason}")
        return lines


def index_pods(pods: Iterable[dict], runtime_classes: set[str]) -> PodIndex:
    index = PodIndex(set(runtime_classes))
    for number, pod in enumerate(pods):
        index.add(pod, f"items[{number}]")
    return index


def _listed_uids(summary: object, node: str) -> dict[str, str]:
    """{uid: namespace/name} of the pods a Summary lists, its names held to the API server's grammar."""
    pods = summary.get("pods") if isinstance(summary, dict) else None
    found = {}
    for number, entry in enumerate(pods if isinstance(pods, list) else []):
        ref = entry.get("podRef") if isinstance(entry, dict) else None
        if not isinstance(ref, dict):
            continue
        for key, problem_of in (("name", dns_subdomain_problem), ("namespace", dns_label_problem)):
            problem = problem_of(ref.get(key))
            if problem:
                raise SurveyInputError(f"the Summary of node {node}: pods[{number}].podRef.{key}: {problem}")
        if isinstance(ref.get("uid"), str) and ref["uid"]:
            found[ref["uid"]] = f"{ref['namespace']}/{ref['name']}"
    return found


def readings_from(summaries: Iterable[tuple[str, object]], index: PodIndex) -> tuple[list[NodeReading], list[str]]:
    """Readings of saved Summaries ((node, document) pairs) against the pods' specs (`kubectl get
    pods -A -o yaml`), and a note per Summary that could not be read and per pod left out."""
    summaries = list(summaries)
    twice = sorted(node for node, count in Counter(node for node, _ in summaries).items() if count > 1)
    if twice:
        raise SurveyInputError(f"two Summaries of node {twice[0]}: give one per node")
    listed = {node: _listed_uids(summary, node) for node, summary in summaries}
    readings, notes = [], []
    for node, summary in summaries:
        try:
            reading = read_summary(summary, node, index.by_node.get(node, {}))
        except SummaryError as exc:
            notes.append(str(exc))
            index.note(f"the Summary of node {node} cannot be read", [p.pod for p in index.by_node.get(node, {}).values()])
            continue
        readings.append(reading)
        notes.extend(f"node {node}: {problem}" for problem in reading.problems)
        missing = {p.pod: p for p in index.by_node.get(node, {}).values() if p.pod in reading.not_reported}
        for pod in missing.values():
            elsewhere = [other for other, uids in listed.items() if other != node and pod.uid in uids]
            index.note(f"its spec places it on node {node}, but the Summary of node {elsewhere[0]} lists it"
                       if elsewhere else f"not in the Summary of node {node} (just started, or gone)", [pod.pod])
    for node in sorted(set(index.by_node) - {node for node, _ in summaries}):
        index.note(f"no Summary of its node {node} was read", [p.pod for p in index.by_node[node].values()])
    return readings, notes


def survey_rows(readings: Iterable[NodeReading], sizing: PolicySizing) -> tuple[list[Sample], list[str]]:
    """A row per pod of the policy's classes whose two working sets the Summary gave, and a note
    per pod left out (with the reason)."""
    class_of = {c.runtime_class: c.name for c in sizing.classes}
    rows, notes = [], []
    for reading in readings:
        for measurement in reading.measurements:
            name = class_of.get(measurement.pod.runtime_class)
            if name is None:
                continue
            row, why = _row(measurement, reading.node, name, sizing)
            if row is None:
                notes.append(f"{measurement.pod.pod} on {reading.node}: {why}")
            else:
                rows.append(row)
    return rows, notes


def _row(measurement: PodMeasurement, node: str, class_name: str, sizing: PolicySizing) -> tuple[Sample | None, str]:
    pod = measurement.pod
    if measurement.overhead_bytes is None:
        return None, "; ".join(measurement.problems) or "not measured"
    cpu = None if pod.set_cpu_millis is None else Decimal(pod.set_cpu_millis) / 1000
    try:
        vm = explain_pod(sizing, class_name, cpu, pod.set_memory_bytes).vm
    except SandboxRefused as exc:
        return None, f"Kata refuses its sandbox ({exc})"
    return Sample(
        container_limit_mib=_mib(pod.set_memory_bytes or 0),
        vm_nominal_mib=Decimal(vm.memory_mib),
        pod_cgroup_memory_current_bytes=measurement.usage_bytes,
        pod_working_set_bytes=measurement.working_set_bytes,
        containers_working_set_bytes=measurement.containers_working_set_bytes,
        pod_cgroup_limit_bytes=pod.cgroup_limit_bytes,
        node=node, pod=pod.pod, class_name=class_name,
        accelerator="kvm", guest=KATA_POD, devices=KATA_DEVICES,
        host_processes=KATA_POD if sizing.policy.spec.sandbox_cgroup_only else "none",
    ), ""


def to_csv(rows: Iterable[Sample], comments: Iterable[str] = (), columns: tuple[str, ...] = COLUMNS) -> str:
    """The rows as the CSV calibrate reads, `#` comment lines first (`kata-sizing probe` adds its
    columns, calibrate.PROBE_COLUMNS)."""
    return "".join([*map(comment_line, comments), csv_line(columns), *(row_line(row, columns) for row in rows)])


def comment_line(text: str) -> str:
    """A `#` line of the CSV: whatever does not print (a line break, a control character) as its
    escape, so no text a comment quotes can start a line of its own."""
    return f"# {printable(text)}\n"


def csv_line(cells: Iterable[str]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(list(cells))
    return out.getvalue()


def row_line(row: Sample, columns: tuple[str, ...] = COLUMNS) -> str:
    return csv_line(_cell(row, column) for column in columns)


def _cell(row: Sample, column: str) -> str:
    value = getattr(row, "class_name" if column == "class" else column)
    if value is None:
        return ""
    return format(value, "f") if isinstance(value, Decimal) else str(value)
