"""Every YAML the project writes reads back as meant in the readers downstream: the real kubectl
and helm (go-yaml, YAML 1.1: `y`, `n`, `on`, `1e3`, `0o17` are not strings there), and PyYAML.

The policy here is the one of issue 18: named `n`, a namespace label `y`, a nodeSelector value
`y`, a toleration value `n`, a class named `n` and a RuntimeClass prefix `1e-3`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kata_sizing import cli
from kata_sizing.core import yamlout
from kata_sizing.core.guidance import NodeFacts
from kata_sizing.core.model import PolicyError, parse_policy
from kata_sizing.core.render import guidance_document, render_policy, runtime_class
from tests.support.paths import ROOT
from tests.support.policies import tricky_policy_body

# Plain scalars go-yaml (kubectl, Helm, the API server: core/yamlgo.py resolves as it does) or
# PyYAML read as a boolean, a null, a number or a timestamp.
NOT_STRINGS_IN_GO = [
    "y", "Y", "n", "N", "yes", "No", "on", "OFF", "true", "False", "~", "null", "",
    "1e3", "1e-3", "1E+3", "1.5e3", "0o17", "0x1f", "0b101", "-0b11", "017", "09", "+1", "-2", ".5", "1.", "<<", "=",
    ".inf", "-.Inf", ".nan", "1_000", "0_1", "1:20", "2024-01-02", "2001-12-14t21:59:43.10-05:00",
]
STRINGS_IN_GO = ["kata-y", "1e", "e3", "1e-3-s", "yes-no", "0x", "x1", "1-2", "n.", "._5", "2024-1-2", "- x", "a: b"]


def test_the_rule_of_what_go_reads_as_a_string():
    for text in NOT_STRINGS_IN_GO:
        assert not yamlout.reads_as_string_in_go(text), text
    for text in STRINGS_IN_GO:
        assert yamlout.reads_as_string_in_go(text), text


def test_every_string_go_reads_otherwise_is_quoted_and_the_rest_is_not():
    for text in NOT_STRINGS_IN_GO:
        assert yamlout.dump({"k": text}) in (f"k: '{text}'\n", f'k: "{text}"\n'), text
    assert yamlout.dump({"k": "kata-y"}) == "k: kata-y\n"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(), key=st.text(min_size=1))
def test_any_text_reads_back_the_same_in_pyyaml_at_any_depth(text, key):
    value = {"a": {"b": [{key: text, "next": "x"}]}, text or "e": [text]}
    assert yaml.safe_load(yamlout.dump(value, comments=["a comment"])) == value


# Documents shaped as the operator's (names, numbers, multi-line text in nested mappings and
# lists), with the characters and shapes where PyYAML quotes, folds or indents otherwise.
_WORDS = st.one_of(
    st.sampled_from(NOT_STRINGS_IN_GO + STRINGS_IN_GO + ["...x", "a #b", "a:", "x y", "a  b", "@a", "-a", "a=b", "é"]),
    st.text(alphabet="ab.-_/= :#@+\"'1e0x", min_size=0, max_size=12),
    st.text(alphabet="abc de", min_size=60, max_size=100),  # long enough to fold at a space
)
_TEXTS = st.one_of(_WORDS, st.text(alphabet="ab #=[]\n \t", max_size=30),
                   st.lists(st.sampled_from(["[x]", "k = 1", "# c", "", "  i", "t "]), max_size=5).map("\n".join),
                   st.lists(st.sampled_from(["[x]", "k = 1", "# c", ""]), max_size=5).map(lambda ls: "\n".join(ls) + "\n"))
_SCALARS = st.one_of(_TEXTS, st.integers(-10**12, 10**12), st.booleans(), st.none(), st.just(1.5))
_DOCUMENTS = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_WORDS, inner, max_size=4)),
    max_leaves=25,
)


# Documents the direct writer takes nearly whole: what a pass writes looks like these.
_NAMES = st.one_of(st.sampled_from(NOT_STRINGS_IN_GO + STRINGS_IN_GO[:-2] + ["...x", "a=b", "x@y", "kata-qemu-rs-s"]),
                   st.from_regex(r"[a-z0-9][a-z0-9./_-]{0,20}( [a-z0-9]{1,9}){0,12}", fullmatch=True))
_LINES = st.lists(st.one_of(st.just(""), st.from_regex(r"[!-~][ -~]{0,40}[!-~]", fullmatch=True),
                            st.from_regex(r" {1,4}[!-~]{1,10}", fullmatch=True)), min_size=1, max_size=6)
_BLOCKS = st.builds(lambda lines, end: "\n".join(lines) + end, _LINES, st.sampled_from(["", "\n"])).filter(
    lambda text: "\n" in text)
_KEYS = st.one_of(st.sampled_from(NOT_STRINGS_IN_GO + ["...k", "a=b", "katasizing.dev/policy"]),
                  st.from_regex(r"[a-z0-9][a-z0-9./_-]{0,20}", fullmatch=True))
_OURS = st.recursive(
    st.one_of(_NAMES, _BLOCKS, st.integers(0, 10**10), st.booleans(), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=4)),
    max_leaves=20,
).filter(lambda document: isinstance(document, dict))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=st.one_of(_DOCUMENTS, _OURS))
def test_the_direct_writer_writes_what_pyyaml_writes_or_leaves_it_to_pyyaml(document):
    """`yamlout` writes most documents itself (a pass renders several); whatever it writes is
    PyYAML's text exactly, and what it cannot write PyYAML writes."""
    pyyaml = yaml.dump(document, Dumper=yamlout._GoSafeDumper, sort_keys=False)
    direct = yamlout._simple_document(document)
    assert direct is None or direct == pyyaml
    assert yamlout.dump(document) == pyyaml
    assert yamlout.dump_documents([document, document]) == yaml.dump_all(
        [document, document], Dumper=yamlout._GoSafeDumper, sort_keys=False, explicit_start=True)


def test_the_direct_writer_writes_what_a_pass_writes_as_yaml():
    """The YAML a pass writes (the values overlay, with a RuntimeClass text per class) is written
    directly, not left to PyYAML (the point of the direct writer), and as PyYAML writes it."""
    policy = parse_policy(yaml.safe_load((ROOT / "examples" / "qemu-runtime-rs.yaml").read_text()))
    rendered = render_policy(policy)
    documents = [rendered.values, *(runtime_class(policy, c, owned=False) for c in rendered.sizing.classes)]
    for document in documents:
        assert yamlout._simple_document(document) == yaml.dump(document, Dumper=yamlout._GoSafeDumper,
                                                              sort_keys=False)


@pytest.mark.parametrize("text", ["a\n", "[x]\nk = 1\n", "# c\n\n[x]\n", "a\n\nb", "\nlead\n", " indented\nnext\n"])
def test_multi_line_text_is_a_literal_block(text):
    written = yamlout.dump({"k": text})
    assert written.startswith("k: |")
    assert yaml.safe_load(written) == {"k": text}


@pytest.mark.parametrize("text", ["\U0001f600 ", " \U0001f600", "x\U00018d09\n y"])
def test_characters_beyond_the_bmp_read_back(text):
    assert yaml.safe_load(yamlout.dump({"k": text})) == {"k": text}


def test_a_handler_go_would_read_as_a_number_is_refused_with_the_field_and_the_rule():
    body = tricky_policy_body()
    body["spec"]["runtimeClass"]["namePrefix"] = "1e"
    body["spec"]["classes"] = [{"name": "3", "cpu": "1", "memory": "1Gi"}]
    with pytest.raises(PolicyError) as raised:
        parse_policy(body)
    assert "spec.runtimeClass.namePrefix" in str(raised.value) and "'1e-3'" in str(raised.value)
    assert "would read as a number or date" in str(raised.value)


# --- the real readers ---------------------------------------------------------------------------


def _tool(name: str) -> str:
    local = ROOT / ".tools" / name
    found = str(local) if os.access(local, os.X_OK) else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not at .tools/{name} nor on PATH (run `make tools`)")
    return found


READBACK_ANNOTATION = "katasizing.dev/readback"


def kubectl_reads(text: str) -> list[dict]:
    """What kubectl decodes from `text` (offline: `annotate --local` decodes every document into its
    Go type and prints it as JSON), without the annotation it adds."""
    result = subprocess.run(
        [_tool("kubectl"), "annotate", "--local", "-o", "json", "-f", "-", f"{READBACK_ANNOTATION}=1"],
        input=text, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    objects, text, at = [], result.stdout, 0
    decoder = json.JSONDecoder()
    while text[at:].strip():  # one JSON object per document, one after the other
        obj, end = decoder.raw_decode(text[at:].lstrip())
        at = len(text) - len(text[at:].lstrip()) + end
        objects.append(obj)
    for obj in objects:
        annotations = obj["metadata"].pop("annotations")
        annotations.pop(READBACK_ANNOTATION)
        if annotations:
            obj["metadata"]["annotations"] = annotations
    return objects


def test_kubectl_reads_every_string_back_as_the_same_string():
    strings = NOT_STRINGS_IN_GO + STRINGS_IN_GO + ["multi\nline\n", "\U0001f600"]
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "n", "labels": {"y": "n", "on": "1e3"}},
                 "data": {f"k{i}": text for i, text in enumerate(strings)}}
    [read] = kubectl_reads(yamlout.dump_documents([configmap]))
    assert read["data"] == configmap["data"] and read["metadata"]["labels"] == configmap["metadata"]["labels"]


def test_plain_pyyaml_output_is_what_kubectl_refuses():
    # The defect this writer fixes: PyYAML leaves `n` and `1e3` plain.
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "labels": {"a": "n"}}}
    result = subprocess.run([_tool("kubectl"), "annotate", "--local", "-o", "json", "-f", "-", "x=1"],
                            input=yaml.safe_dump(configmap), capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "cannot unmarshal bool" in result.stderr


def _render_cli(capsys, path: Path, *flags: str) -> str:
    assert cli.main(["render", str(path), *flags]) == 0
    return capsys.readouterr().out


def test_kubectl_reads_render_output_as_render_means_it(capsys, tmp_path):
    path = tmp_path / "n.yaml"
    path.write_text(json.dumps(tricky_policy_body()))
    meant = json.loads(_render_cli(capsys, path, "-o", "json", "--node-capacity", "64Gi"))["items"]
    written = _render_cli(capsys, path, "--node-capacity", "64Gi")
    read = kubectl_reads(written)
    assert [(o["kind"], o["metadata"]["name"]) for o in read] == [(o["kind"], o["metadata"]["name"]) for o in meant]
    for got, want in zip(read, meant):
        assert got == want, want["metadata"]["name"]
    runtime_classes = [o for o in read if o["kind"] == "RuntimeClass"]
    assert {o["handler"] for o in runtime_classes} == {"1e-3-n", "1e-3-on"}
    assert {o["metadata"]["labels"]["katasizing.dev/class"] for o in runtime_classes} == {"n", "on"}
    assert all(o["metadata"]["labels"]["katasizing.dev/policy"] == "n" for o in read)
    # The admission policies every policy binds (`render --shared`), read as meant too.
    shared = json.loads(_render_cli(capsys, path, "--shared", "-o", "json"))["items"]
    assert len(shared) == 6 and kubectl_reads(_render_cli(capsys, path, "--shared")) == shared
    assert all(o["scheduling"]["nodeSelector"]["zone"] == "y" for o in runtime_classes)


HELM_READER = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: readback
data:
{{- range $key, $text := .Values.documents }}
  {{ $key }}: {{ $text | fromYaml | toJson | quote }}
{{- end }}
{{- range $name, $runtime := (.Values.customRuntimes | default dict).runtimes }}
  {{ $name }}.json: {{ $runtime.runtimeClass | fromYaml | toJson | quote }}
{{- /* the chart's own reading of the handler: the text after "handler:" on its line */ -}}
{{- $handler := "" }}
{{- range (splitList "\\n" $runtime.runtimeClass) }}
{{- if hasPrefix "handler:" (trim .) }}{{ $handler = trim (trimPrefix "handler:" (trim .)) }}{{ end }}
{{- end }}
  {{ $name }}.handler: {{ $handler | quote }}
{{- end }}
"""


def helm_reads(tmp_path: Path, values_yaml: str) -> dict[str, str]:
    """`helm template` of a reader chart given `values_yaml` (a Go reader: sigs.k8s.io/yaml)."""
    chart = tmp_path / "reader"
    (chart / "templates").mkdir(parents=True, exist_ok=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: reader\nversion: 0.1.0\n")
    (chart / "templates" / "readback.yaml").write_text(HELM_READER)
    values = tmp_path / "values.yaml"
    values.write_text(values_yaml)
    result = subprocess.run([_tool("helm"), "template", "r", str(chart), "-f", str(values)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["data"] or {}


def test_helm_reads_the_values_overlay_and_its_runtime_class_strings_as_meant(tmp_path):
    policy = parse_policy(tricky_policy_body())
    rendered = render_policy(policy)
    data = helm_reads(tmp_path, rendered.values_yaml)
    for sized in rendered.sizing.classes:
        name = sized.runtime_class
        assert json.loads(data[f"{name}.json"]) == runtime_class(policy, sized, owned=False)
        assert data[f"{name}.handler"] == name
    # The overlay as a whole, read by Go from inside its ConfigMap.
    documents = yamlout.dump({"documents": {"values": rendered.values_yaml}})
    assert json.loads(helm_reads(tmp_path, documents)["values"]) == rendered.values


def test_the_node_guidance_documents_read_back_in_go_as_meant(tmp_path):
    rendered = render_policy(parse_policy(tricky_policy_body()),
                             nodes=[NodeFacts(name="y", capacity_memory_bytes=64 * 2**30)])
    [guidance] = [cm for cm in rendered.configmaps if cm["metadata"]["name"] == "n-node-guidance"]
    texts = {key.removesuffix(".yaml"): text for key, text in guidance["data"].items() if key.endswith(".yaml")}
    assert texts
    read = helm_reads(tmp_path, yamlout.dump({"documents": texts}))
    for group in rendered.guidance:
        assert json.loads(read[group.key]) == guidance_document(group)
        assert json.loads(read[group.key])["nodes"] == ["y"]
