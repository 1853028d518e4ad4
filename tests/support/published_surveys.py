"""The published SNP survey (tests/fixtures/survey-aks-clh-snp.csv, docs/sizing-model.md [survey]) rebuilt
as what its cluster would give `kata-sizing survey`: the pods as `kubectl get pods -A -o yaml` lists
them and each node's kubelet Summary, for a policy like the one the survey ran (Go runtime,
default_memory 256 MiB and podFixed 320Mi in every class: VM = 256 MiB + the container's limit).

Only the published figures are used: a pod's cgroup working set (and usage) is the table's
memory.current, its VM the table's nominal size. Not in the table: the minimal container's own
working set, taken as 1 MiB (it does not enter a fully resident VM's figures: such rows give the
host side only)."""

from __future__ import annotations

import csv

from tests.support.paths import FIXTURES
from tests.support.summaries import MIB, Figures, kata_pod, summary

FIXTURE = FIXTURES / "survey-aks-clh-snp.csv"
CONTAINER_WORKING_SET = MIB
# The survey ran every pod with default_memory 256 and podFixed 320Mi (the Contrast node installer).
CLASSES = [("s", "1", "256Mi"), ("m", "1", "1Gi"), ("l", "2", "2Gi"), ("xl", "2", "4Gi")]


def rows() -> list[dict[str, int]]:
    lines = [line for line in FIXTURE.read_text().splitlines() if line and not line.startswith("#")]
    return [{k: int(v) for k, v in row.items()} for row in csv.DictReader(lines)]


def policy(name: str = "snp", survey_time: bool = True, **spec) -> dict:
    """The policy the survey ran (explicit defaultMemory 256Mi, podFixed 320Mi), or with
    survey_time=False the same classes left to the fit."""
    explicit = {"defaultMemory": "256Mi", "podFixed": {"cpu": "250m", "memory": "320Mi"}} if survey_time else {}
    return {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "metadata": {"name": name},
            "spec": {"shim": "qemu-snp", **spec, "runtimeClass": {"namePrefix": "kata-snp"},
                     "classes": [{"name": n, "cpu": cpu, "memory": memory, **explicit} for n, cpu, memory in CLASSES]}}


def class_of(limit_mib: int) -> str:
    for name, _, memory in CLASSES:
        if limit_mib <= int(memory[:-2]) * (1024 if memory.endswith("Gi") else 1):
            return name
    raise ValueError(limit_mib)


def cluster() -> tuple[list[dict], dict[str, dict]]:
    """The survey's pods (two nodes, alternating) and each node's Summary."""
    pods, figures = [], {}
    for index, row in enumerate(rows()):
        limit = row["container_limit_mib"]
        pod = kata_pod(f"snp-{limit}", f"aks-snp-{index % 2}", f"kata-snp-{class_of(limit)}", f"{limit}Mi", "320Mi",
                       namespace="survey", uid=f"uid-snp-{limit}")
        pods.append(pod)
        held = row["pod_cgroup_memory_current_bytes"]
        figures[pod["metadata"]["uid"]] = Figures(CONTAINER_WORKING_SET, held - CONTAINER_WORKING_SET, 0)
    summaries = {node: summary(node, [p for p in pods if p["spec"]["nodeName"] == node],
                               lambda p: figures[p["metadata"]["uid"]]) for node in ("aks-snp-0", "aks-snp-1")}
    return pods, summaries


def with_guest_columns(survey_csv: str) -> str:
    """A `survey` CSV with the survey's `free -m` columns added (what a look inside each guest gives)."""
    published = {row["container_limit_mib"]: row for row in rows()}
    lines = survey_csv.splitlines()
    out = []
    reader = csv.reader([line for line in lines if not line.startswith("#")])
    header = next(reader)
    out.append(",".join(header))
    for cells in reader:
        row = dict(zip(header, cells, strict=True))
        found = published[int(row["container_limit_mib"])]
        row["free_total_mib"], row["free_used_mib"] = str(found["free_total_mib"]), str(found["free_used_mib"])
        out.append(",".join(row[column] for column in header))
    return "\n".join(out) + "\n"
