"""What keeps a cold `kata-sizing render` quick, guarded (the timings are `make bench`'s):
the console script skips pydantic's plugin lookup and the cyclic collector, templates run
from the code shipped in compiled_templates/ while it matches them, and what the console
script turns off is back on for the long-lived operator."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from kata_sizing import cli
from kata_sizing.core import render, templategen
from kata_sizing.core.model import parse_policy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "qemu-runtime-rs.yaml"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "COV_"))}


def _console_script_probe(argv: list[str], env: dict[str, str] | None = None) -> dict:
    """Run the console script's main in a fresh interpreter and say what it did."""
    probe = textwrap.dedent(f"""
        import contextlib, gc, io, json, sys
        import jinja2
        compiled = []
        compile_template = jinja2.Environment.compile
        def counting(self, source, name=None, *args, **kwargs):
            compiled.append(name)
            return compile_template(self, source, name, *args, **kwargs)
        jinja2.Environment.compile = counting
        sys.argv = ["kata-sizing", *{argv!r}]
        from kata_sizing.__main__ import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main()
        print(json.dumps({{
            "code": code, "output": out.getvalue(), "compiled": compiled, "gc": gc.isenabled(),
            "loaded": sorted(m for m in ("importlib.metadata", "email", "zipfile", "kata_sizing.core.guidance",
                                         "kopf", "kubernetes") if m in sys.modules),
        }}))
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            env=env or _clean_env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_console_script_render_looks_up_no_plugin_compiles_no_template_and_skips_the_gc():
    seen = _console_script_probe(["render", str(EXAMPLE)])
    assert seen["code"] == 0
    assert seen["output"].startswith("---\napiVersion: v1\nkind: ConfigMap\n")
    # importlib.metadata (and the email/zipfile it brings) was pydantic's plugin lookup.
    assert seen["loaded"] == []
    assert seen["compiled"] == []
    assert seen["gc"] is False


def test_console_script_prints_the_same_documents_as_cli_main(capsys):
    assert cli.main(["render", str(EXAMPLE)]) == 0
    assert _console_script_probe(["render", str(EXAMPLE)])["output"] == capsys.readouterr().out


def test_an_edited_template_is_compiled_from_its_file_and_the_others_run_from_shipped_code(tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(render.REPOSITORY_TEMPLATES, templates)
    drop_in = templates / "dropin.toml.j2"
    drop_in.write_text("# edited after `make templates`\n" + drop_in.read_text())
    env = {**_clean_env(), "KATA_SIZING_TEMPLATES": str(templates)}
    seen = _console_script_probe(["render", str(EXAMPLE)], env=env)
    assert seen["code"] == 0
    assert seen["compiled"] == ["dropin.toml.j2"]
    assert "# edited after `make templates`" in seen["output"]


def test_shipped_code_renders_what_jinja2_renders_from_the_files(tmp_path, monkeypatch):
    policy = parse_policy(yaml.safe_load(EXAMPLE.read_text()))
    shipped = render.render_policy(policy)
    # A copy whose every file differs (a trailing comment line) is compiled from source.
    templates = tmp_path / "templates"
    templates.mkdir()
    for path in render.REPOSITORY_TEMPLATES.glob("*.j2"):
        (templates / path.name).write_text(path.read_text() + "{# compiled from this file #}")
    monkeypatch.setenv("KATA_SIZING_TEMPLATES", str(templates))
    compiled = render.render_policy(policy)
    assert (compiled.values_yaml, compiled.drop_ins, compiled.objects()) == \
        (shipped.values_yaml, shipped.drop_ins, shipped.objects())


def test_compiled_templates_are_current():
    result = subprocess.run([sys.executable, "-m", "kata_sizing.core.templategen", "--check"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, f"compiled_templates/ is stale: run `make templates`\n{result.stderr}"


def test_templategen_check_names_a_stale_module(tmp_path, monkeypatch):
    monkeypatch.setattr(templategen, "PACKAGE_DIR", tmp_path)
    files = templategen.generate(render.REPOSITORY_TEMPLATES)
    templategen.write(files)
    assert templategen.check(files) == 0
    (tmp_path / "dropin_toml.py").write_text("# hand-edited\n")
    assert templategen.check(files) == 1


def test_the_operator_turns_the_cyclic_collector_back_on(monkeypatch, tmp_path):
    import kata_sizing.controller.operator_main as operator_main
    from tests.test_webhook import write_kubeconfig

    monkeypatch.setattr(operator_main, "run_operator", lambda **kwargs: 0)
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path)))  # checked before the operator starts
    args = cli.build_parser().parse_args(["operator", "--standalone"])
    gc.disable()
    try:
        assert cli.cmd_operator(args) == 0
        assert gc.isenabled()
    finally:
        gc.enable()
