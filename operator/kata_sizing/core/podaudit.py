"""Audit of running pods against their class (`kata-sizing audit --pods`): each pod held to
the admission rule of every policy (podfit.py: the same rule the admission policies apply, in
Python), with findings and counts per class. Pure: documents in, a `PodAudit` out; the CLI reads
the files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import bounded
from .audit import AuditError

if TYPE_CHECKING:
    from .model import KataSizingPolicy

def pods_from_documents(documents: list[object], source: str) -> list[tuple[str, dict]]:
    """The Pods of `kubectl get pods -A -o yaml` (a List), of a multi-document file, or both."""
    pods = []
    for index, document in enumerate(documents):
        where = f"{source} (document {index + 1})" if len(documents) > 1 else source
        if document is None:
            continue
        if not isinstance(document, dict):
            raise AuditError(f"{where}: not a Pod or a List of Pods (a mapping)")
        if document.get("kind") in ("List", "PodList") or ("items" in document and "kind" not in document):
            items = document.get("items")
            if not isinstance(items, list):
                raise AuditError(f"{where}: items: not a list")
            for number, item in enumerate(items):
                if not isinstance(item, dict):
                    raise AuditError(f"{where}: items[{number}]: not a mapping")
                pods.append((f"{where}: items[{number}]", item))
        else:
            pods.append((where, document))
    return pods


@dataclass
class PodAudit:
    """Findings of running pods against their class, and how many pods each class holds."""

    findings: list = field(default_factory=list)  # podfit.PodFinding
    pods_per_class: dict[str, dict[str, int]] = field(default_factory=dict)
    checked: int = 0

    @property
    def errors(self) -> list:
        return [f for f in self.findings if f.is_error]

    @property
    def warnings(self) -> list:
        return [f for f in self.findings if not f.is_error]

    def as_dict(self) -> dict:
        return {
            "summary": {"pods": self.checked, "errors": len(self.errors), "warnings": len(self.warnings)},
            "classes": self.pods_per_class,
            "findings": [f.as_dict() for f in self.findings],
        }


def namespace_labels_from_documents(documents: list[object], source: str) -> dict[str, dict[str, str]]:
    """{namespace: labels} from `kubectl get namespaces -o yaml` (a List, or Namespace documents)."""
    labels: dict[str, dict[str, str]] = {}
    for where, item in pods_from_documents(documents, source):
        meta = item.get("metadata") if isinstance(item.get("metadata"), dict) else None
        if item.get("kind") not in (None, "Namespace") or meta is None or not isinstance(meta.get("name"), str):
            raise AuditError(f"{where}: not a Namespace with metadata.name")
        found = meta.get("labels") or {}
        if not isinstance(found, dict) or not all(isinstance(v, str) for v in found.values()):
            raise AuditError(f"{where}: metadata.labels: not a mapping of strings")
        labels[meta["name"]] = {str(k): v for k, v in found.items()}
    return labels


def audit_pods(pods: list[tuple[str, dict]], policies: Sequence[KataSizingPolicy],
               namespaces: dict[str, dict[str, str]] | None = None) -> PodAudit:
    """Each pod against the admission rule of every policy (podfit.check_pod); pods are as
    stored, so no routing is applied. `namespaces` gives the namespaces' labels (for a
    spec.admission.namespaces selector); without it only their names are known. Raises
    AuditError naming the pod and field it cannot read."""
    from . import podfit, podread
    from .sizing import size_policy

    report = PodAudit()
    sizings = [size_policy(policy) for policy in policies]
    for sizing in sizings:
        for sized in sizing.classes:
            report.pods_per_class[sized.runtime_class] = {
                "pods": 0, podfit.RULE_ENVELOPE_EXCEEDED: 0, podfit.RULE_MEMORY_LIMIT_MISSING: 0,
                podfit.RULE_SANDBOX_MEMORY_ZERO: 0}
    for where, pod in pods:
        report.checked += 1
        try:
            spec = podread.pod_spec_of(pod)
            runtime_class = spec.get("runtimeClassName")
            for sizing in sizings:
                namespace = str(podread.pod_metadata_of(pod).get("namespace") or "default")
                findings = podfit.check_pod(pod, sizing, (namespaces or {}).get(namespace))
                counts = report.pods_per_class.get(runtime_class) if isinstance(runtime_class, str) else None
                if counts is not None and any(c.runtime_class == runtime_class for c in sizing.classes):
                    counts["pods"] += 1
                    for finding in findings:
                        counts[finding.rule] = counts.get(finding.rule, 0) + 1
                report.findings.extend(findings)
        except podread.PodInputError as exc:
            raise AuditError(f"{where}: {exc}") from None
    return report


def format_pods_text(report: PodAudit) -> str:
    from . import podfit

    lines = [f"{'error' if f.is_error else 'warning'}: [{f.rule}] {f.message}" for f in report.findings]
    if lines:
        lines.append("")
    header = ("RUNTIMECLASS", "PODS", "OVER_ENVELOPE", "NO_MEMORY_LIMIT", "KATA_REFUSES")
    rows = [header] + [
        (name, str(c["pods"]), str(c[podfit.RULE_ENVELOPE_EXCEEDED]), str(c[podfit.RULE_MEMORY_LIMIT_MISSING]),
         str(c[podfit.RULE_SANDBOX_MEMORY_ZERO]))
        for name, c in report.pods_per_class.items()
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"{report.checked} pods checked: {len(report.errors)} errors, {len(report.warnings)} warnings")
    return "\n".join(bounded.printable(line) for line in lines) + "\n"
