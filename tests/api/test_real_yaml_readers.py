"""`kata-sizing render`'s YAML read by the real kubectl against the real API server (go-yaml,
YAML 1.1): a client-side dry run and a server-side dry run of every object give back exactly
the objects render means (its JSON output), for the policy of issue 18: named `n`, a namespace
label `y`, a nodeSelector value `y`, a toleration value `n`, classes `n` and `on`, RuntimeClass
prefix `1e-3`. tests/unit/test_yamlout.py reads the same output offline."""

from __future__ import annotations

import json

import pytest

from kata_sizing import cli
from tests.support.policies import tricky_policy_body

pytestmark = pytest.mark.realserver


def _render(capsys, tmp_path, *flags: str) -> str:
    path = tmp_path / "n.json"
    path.write_text(json.dumps(tricky_policy_body()))
    assert cli.main(["render", str(path), *flags]) == 0
    return capsys.readouterr().out


def _objects(stdout: str) -> list[dict]:
    found: list[dict] = []
    decoder, at = json.JSONDecoder(), 0
    while stdout[at:].strip():
        text = stdout[at:].lstrip()
        obj, end = decoder.raw_decode(text)
        at = len(stdout) - len(text) + end
        found.extend(obj["items"] if obj.get("kind") == "List" else [obj])
    return found


def _meant_fields(obj: dict) -> dict:
    """What render sets (on a server-side dry run the server adds its own metadata, and an empty
    status to an admission policy; it adds nothing to a spec: render writes out its defaults)."""
    meta = obj["metadata"]
    kept = {k: v for k, v in obj.items() if k != "status"}
    return {**kept, "metadata": {k: v for k, v in meta.items() if k in ("name", "namespace", "labels", "ownerReferences")}}


def test_kubectl_and_the_api_server_read_render_output_as_render_means_it(control_plane, capsys, tmp_path):
    cp = control_plane
    meant = json.loads(_render(capsys, tmp_path, "-o", "json", "--node-capacity", "64Gi"))["items"]
    written = _render(capsys, tmp_path, "--node-capacity", "64Gi")
    client = _objects(cp.kubectl("create", "--dry-run=client", "-o", "json", "-f", "-", input=written).stdout)
    assert client == meant
    server = _objects(cp.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", input=written).stdout)
    for got, want in zip(server, meant):
        assert _meant_fields(got) == want, want["metadata"]["name"]
    assert len(server) == len(meant)
    labels = {o["metadata"]["labels"]["katasizing.dev/policy"] for o in server}
    handlers = {o["handler"] for o in server if o["kind"] == "RuntimeClass"}
    assert labels == {"n"} and handlers == {"1e-3-n", "1e-3-on"}
