"""The admission objects as the real API server and kubectl show them: kubectl's lines for a
verdict, a server dry run of pods, `kata-sizing render` of a policy, and who wrote a shared
admission policy (its managedFields) and how the operator puts one back in its installer's name."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from tests.support.realcluster import ControlPlane, poll

ADMISSION = "/apis/admissionregistration.k8s.io/v1"

# kubectl's lines for an admission policy's verdicts.
DENIED = re.compile(r"ValidatingAdmissionPolicy '([^']+)' with binding '[^']+' denied request: (.*)$")
WARNED = re.compile(r"^Warning: Validation failed for ValidatingAdmissionPolicy '([^']+)' with binding '[^']+': (.*)$")


def cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kata_sizing.cli", *args], capture_output=True, text=True,
                          input=input, timeout=60)


def rendered_objects(tmp_path: Path, body: dict) -> list[dict]:
    """What `kata-sizing render` prints for the policy (the GitOps path)."""
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(body))
    proc = cli("render", str(path))
    assert proc.returncode == 0, proc.stderr
    return [o for o in yaml.safe_load_all(proc.stdout) if o]


def verdicts(proc: subprocess.CompletedProcess) -> dict[str, set[tuple[str, str, str]]]:
    """{pod name: {(policy, kind of verdict, message)}} from kubectl's output."""
    found: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for line in proc.stderr.splitlines():
        for pattern, kind in ((DENIED, "Deny"), (WARNED, "Warn")):
            match = pattern.search(line)
            if match:
                who = re.match(r"pod [^/]+/(\S+)", match[2])
                assert who, line
                found[who[1]].add((match[1], kind, match[2]))
    return found


def dry_run(cp: ControlPlane, pods: list[dict], *extra: str) -> subprocess.CompletedProcess:
    return cp.kubectl("create", "--dry-run=server", *extra, "-f", "-", input=yaml.safe_dump_all(pods), check=False)


def writers(obj: dict) -> set[tuple[str, str]]:
    """(manager, operation) of every write the API server records on the object, its status aside."""
    return {(m["manager"], m["operation"]) for m in obj["metadata"].get("managedFields") or []
            if not m.get("subresource")}


def put_back_in_the_installers_name(cp: ControlPlane, path: str, installer: tuple[str, str]) -> None:
    """Delete the shared admission policy at `path`, installed by Helm (the chart); the operator
    puts it back as `installer` (manager, operation) wrote it: its labels (Helm's among them),
    annotations and spec, in its name alone."""
    before = cp.read(path)
    assert installer in writers(before), before["metadata"]["managedFields"]
    cp.delete(path)
    back = poll(lambda: cp.get(path), 10, f"{path} put back")
    assert writers(back) == {installer}, back["metadata"]["managedFields"]
    assert (back["metadata"]["labels"], back["metadata"]["annotations"], back["spec"]) == (
        before["metadata"]["labels"], before["metadata"]["annotations"], before["spec"])
    assert back["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
