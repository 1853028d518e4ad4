"""What keeps a cold `kata-sizing render` quick, guarded (the timings are `make bench`'s):
the console script skips pydantic's plugin lookup and the cyclic collector, a render without
nodes builds its objects as data and imports no template engine at all, and what the console
script turns off is back on for the long-lived operator."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import yaml

from kata_sizing import cli
from kata_sizing.core import render
from kata_sizing.core.guidance import NodeFacts
from kata_sizing.core.model import parse_policy
from tests.support.paths import ROOT

EXAMPLE = ROOT / "examples" / "qemu-runtime-rs.yaml"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "COV_"))}


def _console_script_probe(argv: list[str], env: dict[str, str] | None = None) -> dict:
    """Run the console script's main in a fresh interpreter and say what it did."""
    probe = textwrap.dedent(f"""
        import contextlib, gc, io, json, sys
        sys.argv = ["kata-sizing", *{argv!r}]
        from kata_sizing.__main__ import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main()
        print(json.dumps({{
            "code": code, "output": out.getvalue(), "gc": gc.isenabled(),
            "loaded": sorted(m for m in ("importlib.metadata", "email", "zipfile", "kata_sizing.core.guidance",
                                         "kopf", "kubernetes", "jinja2") if m in sys.modules),
        }}))
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            env=env or _clean_env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_console_script_render_looks_up_no_plugin_imports_no_template_engine_and_skips_the_gc():
    seen = _console_script_probe(["render", str(EXAMPLE)])
    assert seen["code"] == 0
    assert seen["output"].startswith("---\napiVersion: v1\nkind: ConfigMap\n")
    # importlib.metadata (and the email/zipfile it brings) was pydantic's plugin lookup; the
    # objects are data and the drop-ins and values overlay are written without jinja2.
    assert seen["loaded"] == []
    assert seen["gc"] is False


def test_console_script_prints_the_same_documents_as_cli_main(capsys):
    assert cli.main(["render", str(EXAMPLE)]) == 0
    assert _console_script_probe(["render", str(EXAMPLE)])["output"] == capsys.readouterr().out


def test_the_guidance_summary_comes_from_the_template_directory_given(tmp_path, monkeypatch):
    policy = parse_policy(yaml.safe_load(EXAMPLE.read_text()))
    node = NodeFacts(name="node-a", capacity_memory_bytes=64 * 2**30)
    templates = tmp_path / "templates"
    templates.mkdir()
    source = (render.REPOSITORY_TEMPLATES / render.SUMMARY_TEMPLATE).read_text()
    (templates / render.SUMMARY_TEMPLATE).write_text("# an image's own copy\n" + source)
    monkeypatch.setenv("KATA_SIZING_TEMPLATES", str(templates))
    summary = render.render_policy(policy, nodes=[node]).configmaps[2]["data"][render.SUMMARY_KEY]
    assert summary.startswith("# an image's own copy\nNode guidance for KataSizingPolicy qemu-rs")


def test_the_operator_turns_the_cyclic_collector_back_on(monkeypatch, tmp_path):
    import kata_sizing.controller.operator_main as operator_main
    from tests.support.webhook import write_kubeconfig

    monkeypatch.setattr(operator_main, "run_operator", lambda **kwargs: 0)
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path)))  # checked before the operator starts
    args = cli.build_parser().parse_args(["operator", "--standalone"])
    gc.disable()
    try:
        assert args.func(args) == 0  # cli.operator.run
        assert gc.isenabled()
    finally:
        gc.enable()


def test_the_cleanup_sets_the_stop_flag_so_a_sigterm_stops_the_operator_at_once():
    """kopf gives the operator's stop flag (the policies' CRD going) a waiter it does not cancel
    on a SIGTERM, and waits 5 s for it before the process exits: the cleanup sets the flag, so a
    pod's termination (and each real-server test's) does not wait those 5 s."""
    import asyncio

    import kopf

    from kata_sizing.controller import handlers

    stop = asyncio.Event()
    asyncio.run(handlers.on_cleanup(memo=kopf.Memo(crd_stop=stop)))
    assert stop.is_set()
