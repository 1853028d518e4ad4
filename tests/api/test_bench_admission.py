"""`make bench`'s admission section (bench/admission_bench.py) at a tiny size, so that it cannot
rot: every case measured on its own control plane (two webhook replicas behind a Service
included), every pod admitted and routed, and the CEL's cost computed by the API server's own
library where `.tools/celcost` is built. The figures themselves are the bench's business: none is
held to a target here."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from bench import admission_bench as bench
from tests.support.realcluster import require_binary

pytestmark = pytest.mark.realserver


def test_the_admission_section_measures_every_case_at_a_tiny_size() -> None:
    require_binary()
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("the webhook replicas listen on the node's test address: needs root and `ip`")
    lines: list[tuple[str, str, str, str]] = []
    settings = bench.Settings(rate=8, seconds=0.5, block_seconds=0.5, inits=40, shapes=(bench.SIDECAR,),
                              search_largest=False)
    bench.bench_admission(lambda *line: lines.append(line), settings=settings)

    assert not [line for line in lines if line[3] in ("ERROR", "SKIP") and "celcost" not in line[0]], lines
    for case in bench.CASES:
        what = f"admission, {bench.SIDECAR}, {case.name}"
        (latency,) = [f for w, f, _, _ in lines if w.startswith(f"{what}: create p50 / p95 / p99 (4 pods")]
        assert re.fullmatch(r"[\d.]+ / [\d.]+ / [\d.]+ ms", latency), latency
        (refused,) = [(f, v) for w, f, _, v in lines if w == f"{what}: refused / admitted without a class"]
        assert refused == ("0 / 0", "PASS"), (case.name, refused, lines)
        (cpu,) = [f for w, f, _, _ in lines if w == f"{what}: kube-apiserver CPU per 1000 creates (net of idle)"]
        assert re.fullmatch(r"[\d.]+ s", cpu), cpu
        if case.webhook:
            # The API server spent time in the webhook plugin, none in the MutatingAdmissionPolicy's.
            (plugins,) = [f for w, f, _, _ in lines if w.startswith(f"{what}: time in its admission plugins")]
            mutating_policy, webhook, _ = (float(v) for v in plugins.removesuffix(" ms").split(" / "))
            assert webhook > mutating_policy, plugins
    # The pod the CEL before could not judge is admitted by the CEL now.
    beyond = {w: f for w, f, _, _ in lines if w.startswith(f"admission, a pod of {bench.BEYOND_BEFORE_INITS} init")}
    assert beyond[f"admission, a pod of {bench.BEYOND_BEFORE_INITS} init containers (half sidecars), CEL"].startswith(
        "admitted, class kata-adm-cel-"), beyond
    assert "cost" in beyond[f"admission, a pod of {bench.BEYOND_BEFORE_INITS} init containers (half sidecars), "
                            "CEL before"], beyond
    if bench.CELCOST.exists():
        costs = {w: (f, v) for w, f, _, v in lines if w.startswith("CEL cost (")}
        assert costs and all(v == "PASS" for f, v in costs.values() if v), costs
