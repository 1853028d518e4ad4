"""`kata-sizing survey`: one measurement of every Kata pod of a policy, as the rows `calibrate`
reads (docs/measurement.md). Pure: readings (core/measure) and a sizing in, rows and CSV text out.

A row is one pod: its class, its memory limits (container_limit_mib), the VM Kata boots for
them by the policy's rules (vm_nominal_mib, sizing.explain_pod), and the kubelet's figures: the
pod cgroup's working set and usage (pod_cgroup_memory_current_bytes: usageBytes is the cgroup's
memory.current, memory.usage_in_bytes on cgroup v1) and the sum of its containers' working sets.
There is no `free -m` from inside the guest: the host side cannot see the guest's split.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from decimal import Decimal

from .calibrate import HOST_COLUMNS, Sample
from .measure import KataPod, NodeReading, PodMeasurement, SummaryError, kata_pod, read_summary
from .quantity import MIB
from .sizing import PolicySizing, SandboxRefused, explain_pod

COLUMNS = (
    "node", "pod", "class", "container_limit_mib", "vm_nominal_mib", "free_total_mib", "free_used_mib",
    "pod_cgroup_memory_current_bytes", *HOST_COLUMNS,
)


def _mib(size_bytes: int) -> Decimal:
    # Exact: a limit of 1G is 953.67431640625 MiB, and calibrate reads decimals.
    return (Decimal(size_bytes) / MIB).normalize() if size_bytes % MIB else Decimal(size_bytes // MIB)


def kata_pods_by_node(pods: Iterable[dict], runtime_classes: set[str]) -> tuple[dict[str, dict[str, KataPod]], set[str]]:
    """The scheduled Kata pods of `runtime_classes` by node and uid, and the uids of every other pod."""
    by_node: dict[str, dict[str, KataPod]] = {}
    others: set[str] = set()
    for pod in pods:
        found = kata_pod(pod, runtime_classes)
        if found is None or found.node is None:
            others.add(str(((pod.get("metadata") or {}).get("uid")) or ""))
        else:
            by_node.setdefault(found.node, {})[found.uid] = found
    return by_node, others


def readings_from(
    summaries: Iterable[tuple[str, object]], pods: Iterable[dict], runtime_classes: set[str],
) -> tuple[list[NodeReading], list[str]]:
    """Readings of saved Summaries ((node, document) pairs) against the pods' specs (`kubectl get
    pods -A -o yaml`), and a note per Summary that could not be read."""
    by_node, others = kata_pods_by_node(pods, runtime_classes)
    readings, notes = [], []
    for node, summary in summaries:
        try:
            reading = read_summary(summary, node, by_node.get(node, {}), others)
        except SummaryError as exc:
            notes.append(str(exc))
            continue
        readings.append(reading)
        notes.extend(f"node {node}: {problem}" for problem in reading.problems)
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
    ), ""


def to_csv(rows: Iterable[Sample], comments: Iterable[str] = ()) -> str:
    """The rows as the CSV calibrate reads, `#` comment lines first."""
    out = io.StringIO()
    for comment in comments:
        out.write(f"# {comment}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([
            row.node or "", row.pod or "", row.class_name or "",
            format(row.container_limit_mib, "f"), format(row.vm_nominal_mib, "f"), "", "",
            *("" if value is None else value for value in (
                row.pod_cgroup_memory_current_bytes, row.pod_working_set_bytes, row.containers_working_set_bytes,
                row.pod_cgroup_limit_bytes)),
        ])
    return out.getvalue()
