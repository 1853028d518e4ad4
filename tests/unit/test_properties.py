"""Properties over generated policies: computed values keep every invariant, the largest pod
of each class fits its VM, and malformed input only ever yields a clean PolicyError / exit code."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import tempfile
import tomllib
from fractions import Fraction
from pathlib import Path

import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from kata_sizing.cli import main
from kata_sizing.core import bounded
from kata_sizing.core.defaults import Runtime
from kata_sizing.core.model import PolicyError, parse_policy
from kata_sizing.core.quantity import MIB, memory_bytes
from kata_sizing.core.render import render_policy
from kata_sizing.core.rules import Rule
from kata_sizing.core.sizing import explain_pod, size_policy
from tests.support import apiserver_grammar as grammar
from tests.support.strategies import SCALAR_FIELDS, valid_policies, yaml_scalars

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _unusable_mib(sizing, vm_mib: int) -> Fraction:
    """The overhead function without its margin: what a VM of vm_mib keeps from the workload."""
    fn = sizing.overhead
    return fn.guest_memory_base_mib + Fraction(fn.guest_memory_ratio) * vm_mib


@SETTINGS
@given(document=valid_policies())
def test_computed_values_keep_every_invariant(document):
    sizing = size_policy(parse_policy(document))
    # Only explicit per-class values (never generated here) may break a rule, or warn; and
    # sandboxCgroupOnly false, which is the user's choice but warned about.
    expected = set() if document["spec"]["sandboxCgroupOnly"] else {Rule.SANDBOX_CGROUP_ONLY}
    assert {p.rule for p in sizing.problems} == expected
    for sized in sizing.classes:
        if sizing.runtime is Runtime.RUST:
            assert sized.pod_fixed_memory_mib > sized.overhead_memory_mib
            assert sized.pod_fixed_cpu > sized.overhead_vcpus
            assert sized.pod_fixed_memory_mib >= sized.default_memory_mib + sizing.overhead.host_memory_mib
            assert sized.default_maxmemory_mib >= sized.default_memory_mib
        else:
            assert sized.pod_fixed_memory_mib > sized.default_memory_mib
        assert sized.pod_fixed_memory_mib > sized.guest_budget_mib
        assert sized.guest_budget_mib % 2 == 0


@SETTINGS
@given(document=valid_policies())
def test_largest_pod_of_each_class_fits_its_vm(document):
    sizing = size_policy(parse_policy(document))
    for sized in sizing.classes:
        envelope = next(c for c in sizing.policy.spec.effective_classes if c.name == sized.name)
        limit_bytes = memory_bytes(envelope.memory)
        limit_mib = math.ceil(Fraction(limit_bytes, MIB))
        explanation = explain_pod(sizing, sized.name, sized.envelope_cpu, limit_bytes)
        vm_mib = explanation.vm.memory_mib
        budget = sized.overhead_memory_mib if sizing.runtime is Runtime.RUST else sized.default_memory_mib
        assert vm_mib - limit_mib >= budget
        assert _unusable_mib(sizing, vm_mib) <= budget
        # The whole limit stays usable inside the VM.
        assert vm_mib - _unusable_mib(sizing, vm_mib) >= limit_mib
        assert explanation.vm.vcpus >= math.ceil(sized.envelope_cpu)
        assert explanation.vm == sized.largest_vm
        # Kubernetes accounts at least the VM: the node is not overcommitted by such a pod.
        assert explanation.accounted_memory_bytes >= vm_mib * MIB
        assert not [w for w in explanation.warnings if "overcommitted" in w or "envelope" in w]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=valid_policies())
def test_valid_policies_render_documents_that_parse(document):
    rendered = render_policy(parse_policy(document))
    values = yaml.safe_load(rendered.values_yaml)
    assert len(values["customRuntimes"]["runtimes"]) == len(rendered.sizing.classes)
    for text in rendered.drop_ins.values():
        hypervisor = tomllib.loads(text)["hypervisor"][rendered.sizing.hypervisor]
        assert hypervisor["default_memory"] > 0


# --- malformed input -------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
           | st.text(max_size=12) | st.sampled_from(["1Gi", "-1Gi", "0", "5Zi", "1e1000000", "auto", "qemu",
                                                     "remote", "Rust", "0.9", "nan", "", "s"]))
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=16)

SPEC_KEYS = ["shim", "runtime", "hypervisor", "sandboxCgroupOnly", "hugepages", "overhead", "fallback",
             "classes", "runtimeClass", "nodes", "output", "driftPolicy"]
CLASS_KEYS = ["name", "cpu", "memory", "overheadVcpus", "overheadMemory", "defaultVcpus", "defaultMemory",
              "podFixed"]

junk_classes = st.lists(st.dictionaries(st.sampled_from(CLASS_KEYS), junk, max_size=8), max_size=3)
junk_specs = st.dictionaries(st.sampled_from(SPEC_KEYS), junk, max_size=6).flatmap(
    lambda spec: st.builds(lambda classes: {**spec, "classes": classes}, junk_classes) if "classes" in spec
    else st.just(spec))
junk_documents = (
    junk
    | st.fixed_dictionaries({"metadata": st.dictionaries(st.sampled_from(["name", "uid", "generation"]), junk),
                             "spec": junk_specs})
    | st.fixed_dictionaries({"metadata": st.just({"name": "p"}), "spec": junk_specs})
)


def _paths(node, prefix=()):
    """Every (path, value) in a nested document."""
    yield prefix, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


def _set(document, path, value):
    target = document
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value


@st.composite
def mutated_policies(draw) -> tuple[dict, bool]:
    """A valid policy with one change; the flag says whether the change must make it invalid."""
    document = copy.deepcopy(draw(valid_policies()))
    paths = [p for p, _ in _paths(document) if p]
    kind = draw(st.sampled_from(["replace", "unknown-key", "drop-required", "bad-name"]))
    if kind == "replace":
        _set(document, draw(st.sampled_from(paths)), draw(junk))
        return document, False
    if kind == "unknown-key":
        containers = [p for p, v in _paths(document) if isinstance(v, dict)]
        path = draw(st.sampled_from(containers))
        target = document
        for part in path:
            target = target[part]
        key = draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in target))
        if path == ():
            target[key] = 1
        else:
            target[key] = draw(junk)
        # An unknown key anywhere in metadata passes (live objects carry many); elsewhere it is refused.
        return document, path[:1] != ("metadata",)
    if kind == "drop-required":
        del document["spec"]["shim"]
        return document, True
    document["metadata"]["name"] = draw(st.sampled_from(["Bad_Name", "-x", "x" * 64, ""]))
    return document, True


def _parse_outcome(document) -> str:
    try:
        parse_policy(document)
    except PolicyError as error:
        assert error.problems and all(isinstance(p, str) and p for p in error.problems)
        assert all("\n" not in p for p in error.problems)
        return "invalid"
    return "valid"


@SETTINGS
@given(document=junk_documents)
def test_junk_is_a_policy_error_never_another_exception(document):
    _parse_outcome(document)


@SETTINGS
@given(case=mutated_policies())
def test_mutated_policies_are_a_policy_error_never_another_exception(case):
    document, must_fail = case
    outcome = _parse_outcome(document)
    if must_fail:
        assert outcome == "invalid"


def _cli(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    assert "Traceback" not in err.getvalue()
    return code, err.getvalue()


def _cli_outcomes(text: str) -> list[tuple[int, str]]:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "policy.yaml"
        path.write_text(text)
        return [_cli("validate", str(path)), _cli("render", str(path))]


@SETTINGS
@given(document=junk_documents | mutated_policies().map(lambda case: case[0]))
@example(document={"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
                   "metadata": {"name": "a", "0": math.inf}, "spec": {"shim": "clh"}})  # found by CI
def test_cli_on_malformed_policies_exits_cleanly(document):
    try:
        text = yaml.safe_dump(document)
    except yaml.YAMLError:
        assume(False)
    try:
        bounded.load_yaml_documents(text, "policy.yaml")
    except bounded.InputError:
        readable = False  # e.g. a float infinity anywhere, even in metadata: kubectl cannot send it
    else:
        readable = True
    valid = readable and _parse_outcome(document) == "valid"
    for code, err in _cli_outcomes(text):
        assert code in ((0, 1) if valid else (1, 2) if readable else (2,))
        if code:
            assert err and all(line.startswith(("error: ", "warning: ", "note: ")) for line in err.splitlines())


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_cli_on_arbitrary_text_exits_1_or_2(text):
    for code, err in _cli_outcomes(text):
        assert code in (1, 2)
        assert err.startswith("error: ")


# --- the API server's grammar (tests/support/apiserver_grammar.py, checked on the real server by
# tests/api/test_real_inputs.py): what the CLI accepts, the server accepts, and the other way ---------

_EXAMPLE_SPEC = "spec:\n  shim: qemu-runtime-rs\n"


def _accepted(spec_lines: list[str], name: str = "p") -> bool:
    """The CLI's verdict (what `validate` does, in-process) on a policy written as YAML text."""
    text = ("apiVersion: katasizing.dev/v1alpha1\nkind: KataSizingPolicy\n"
            f"metadata: {{name: {name}}}\n{_EXAMPLE_SPEC}" + "".join(f"  {line}\n" for line in spec_lines))
    try:
        [document] = bounded.load_yaml_documents(text, "policy.yaml")
        return not size_policy(parse_policy(document)).errors
    except PolicyError as error:
        assert all("\n" not in p for p in error.problems)
        return False


def _flow(value: object) -> str:
    return json.dumps(value)  # JSON is YAML: every string quoted, whatever it holds


LABEL_PLACES = {
    "nodeSelector": lambda k, v: f"runtimeClass: {{nodeSelector: {{{_flow(k)}: {_flow(v)}}}}}",
    "nodes.selector": lambda k, v: f"nodes: {{selector: {{{_flow(k)}: {_flow(v)}}}}}",
    "matchLabels": lambda k, v: f"admission: {{namespaces: {{selector: {{matchLabels: {{{_flow(k)}: {_flow(v)}}}}}}}}}",
    "matchExpressions": lambda k, v: ("admission: {namespaces: {selector: {matchExpressions: "
                                      f"[{{key: {_flow(k)}, operator: In, values: [{_flow(v)}]}}]}}}}}}"),
}


@SETTINGS
@given(key=grammar.label_keys(), value=grammar.label_values(), place=st.sampled_from(sorted(LABEL_PLACES)))
def test_label_keys_and_values_follow_the_api_servers_grammar(key, value, place):
    assert _accepted([LABEL_PLACES[place](key, value)]) == (grammar.label_key_ok(key) and grammar.label_value_ok(value))


@SETTINGS
@given(tolerations=st.lists(grammar.tolerations(), min_size=1, max_size=3))
def test_tolerations_follow_the_api_servers_rules(tolerations):
    expected = all(grammar.toleration_ok(t) for t in tolerations) and grammar.tolerations_unique(tolerations)
    assert _accepted([f"runtimeClass: {{tolerations: {_flow(tolerations)}}}"]) == expected


@SETTINGS
@given(name=st.from_regex(r"\A[a-z][a-z0-9-]{0,40}\Z") | st.text("aZ0-_.", min_size=1, max_size=12),
       class_name=st.from_regex(r"\A[a-z0-9][a-z0-9-]{0,30}\Z") | st.text("aZ0-_.", min_size=1, max_size=12))
def test_names_follow_the_api_servers_grammar(name, class_name):
    # The policy name is a DNS label (it names ConfigMaps and RuntimeClasses), and so is each
    # RuntimeClass's handler, kata-<policy>-<class>.
    expected = (grammar.dns_label_ok(name) and grammar.dns_label_ok(class_name)
                and grammar.dns_label_ok(f"kata-{name}-{class_name}"))
    assert _accepted([f'classes: [{{name: {_flow(class_name)}, cpu: "1", memory: 1Gi}}]'], name=_flow(name)) == expected


@SETTINGS
@given(field=st.sampled_from(sorted(SCALAR_FIELDS)), scalar=yaml_scalars)
def test_yaml_scalars_mean_what_they_mean_to_the_api_server(field, scalar):
    """Written unquoted, `y` is true and `0x10` is 16 to kubectl and the API server: the CLI
    reads them the same and takes exactly the types the CRD's schema takes."""
    kind, line, stricter = SCALAR_FIELDS[field]
    server = grammar.schema_accepts(kind, scalar)
    cli = _accepted([line.format(scalar.text)])
    if cli:
        assert server, f"the CLI accepts {scalar.text!r} in {field}, the API server refuses it"
    if server and not stricter(scalar):
        assert cli, f"the API server accepts {scalar.text!r} in {field}, the CLI refuses it"


@SETTINGS
@given(key=st.one_of(grammar.booleans, grammar.integers(0, 10**6), grammar.plain_strings(max_size=8)))
def test_an_unquoted_label_key_is_the_text_kubectl_makes_of_it(key):
    # sigs.k8s.io/yaml turns a boolean key into "true"/"false" and an integer into its decimal text.
    text = ("true" if key.value else "false") if isinstance(key.value, bool) else str(key.value)
    assert _accepted([f"runtimeClass: {{nodeSelector: {{{key.text}: kata}}}}"]) == grammar.label_key_ok(text)
    policy = parse_policy(bounded.load_yaml_documents(
        f"metadata: {{name: p}}\nspec: {{shim: qemu-runtime-rs, runtimeClass: {{nodeSelector: {{{key.text}: kata}}}}}}\n",
        "policy.yaml")[0]) if grammar.label_key_ok(text) else None
    if policy is not None:
        assert policy.spec.runtime_class.node_selector == {text: "kata"}


# --- survey inputs: figures and names as a kubelet and the API server send them (issue 26) ----------

import csv  # noqa: E402

from kata_sizing.core.calibrate import parse_samples_csv  # noqa: E402
from kata_sizing.core.measure import KataPod, read_summary  # noqa: E402
from kata_sizing.core.survey import SurveyInputError, index_pods, readings_from, survey_rows, to_csv  # noqa: E402
from tests.support.summaries import Figures  # noqa: E402
from tests.support.summaries import kata_pod as pod_document  # noqa: E402
from tests.support.summaries import summary as summary_document  # noqa: E402

_SURVEY_POLICY = parse_policy({"metadata": {"name": "p"}, "spec": {
    "shim": "qemu-runtime-rs", "classes": [{"name": "s", "cpu": "1", "memory": "1Gi"}]}})
_SURVEY_SIZING = size_policy(_SURVEY_POLICY)
_RC = _SURVEY_SIZING.classes[0].runtime_class


@SETTINGS
@given(pod_figure=grammar.summary_figures, container_figure=grammar.summary_figures)
def test_summary_figures_count_only_as_a_kubelet_sends_them(pod_figure, container_figure):
    """A figure counts when it is a uint64, whatever else JSON could hold; the headroom is then the
    cgroup limit less it, exactly, and nothing raises."""
    pod = KataPod("u", "ns/p", _RC, "n1", 256 * MIB, 300 * MIB, ("c0",), None, 256 * MIB)
    document = summary_document("n1", [pod_document("p", "n1", _RC, "256Mi", "300Mi", namespace="ns", uid="u")],
                                lambda _: Figures(10 * MIB, 50 * MIB))
    document["pods"][0]["memory"]["workingSetBytes"] = pod_figure
    document["pods"][0]["containers"][0]["memory"]["workingSetBytes"] = container_figure
    [measurement] = read_summary(document, "n1", {"u": pod}).measurements
    if grammar.uint64_ok(pod_figure):
        assert measurement.headroom_bytes == 556 * MIB - pod_figure
    else:
        assert measurement.working_set_bytes is None and measurement.headroom_bytes is None
        assert any("workingSetBytes" in p for p in measurement.problems)
    if grammar.uint64_ok(pod_figure) and grammar.uint64_ok(container_figure):
        assert measurement.overhead_bytes == pod_figure - container_figure
    else:
        assert measurement.overhead_bytes is None


@SETTINGS
@given(namespace=grammar.name_texts, name=grammar.name_texts, node=grammar.name_texts)
def test_survey_takes_exactly_the_names_the_api_server_stores(namespace, name, node):
    """Accepted iff the API server could have stored the names; then the CSV `survey` writes reads back
    unchanged through Python's csv module and through calibrate."""
    pod = pod_document(name, node, _RC, "256Mi", "300Mi", namespace=namespace, uid="u1")
    expected = grammar.dns_label_ok(namespace) and grammar.dns_subdomain_ok(name) and grammar.dns_subdomain_ok(node)
    try:
        index = index_pods([pod], {_RC})
        readings, _ = readings_from([(node, summary_document(node, [pod], lambda _: Figures(10 * MIB, 50 * MIB)))],
                                    index)
    except SurveyInputError as exc:
        assert not expected, exc
        return
    assert expected
    rows, notes = survey_rows(readings, _SURVEY_SIZING)
    assert notes == [] and len(rows) == 1
    text = to_csv(rows)
    data = text.splitlines()
    assert [",".join(cells) for cells in csv.reader(data)] == data
    [back] = parse_samples_csv(text)
    assert (back.node, back.pod) == (node, f"{namespace}/{name}")


# --- what a survey row measured (calibrate's kind columns, issue 32) ------------------------------

from kata_sizing.core.calibrate import PROBE_COLUMNS, CalibrationError  # noqa: E402
from kata_sizing.core.survey import COLUMNS as SURVEY_COLUMNS  # noqa: E402

_DEVICE_WORDS = ["serial", "virtio-console", "virtio-blk", "virtio-scsi", "nvdimm", "vsock", "rng", "virtio-fs",
                 "virtio-net"]
_words = st.one_of(st.sampled_from(["", "kvm", "tcg", "KVM", "kata-pod", "kata-image", "kata-initrd", "kernel-only",
                                    "vmm", "vmm+virtiofsd", "none", "kata", "xen", " tcg"]),
                   st.text("abcdefgkmnorstuvz+-", max_size=12))
_devices = st.one_of(_words, st.lists(st.sampled_from([*_DEVICE_WORDS, "gpu", ""]), min_size=1, max_size=4)
                     .map("+".join))


def _kind_oracle(accelerator: str, guest: str, host: str, devices: str, tb_size: int | None) -> bool:
    """The grammar of docs/sizing-model.md, "What each row saw", restated: empty cells are a Kata pod's."""
    guest = guest or "kata-pod"
    if guest == "kata-pod":
        return (accelerator in ("", "kvm") and host in ("", "kata-pod", "none") and devices in ("", "kata")
                and tb_size is None)
    words = devices.split("+")
    return (guest in ("kata-image", "kata-initrd", "kernel-only") and accelerator in ("kvm", "tcg")
            and host in ("vmm", "vmm+virtiofsd") and all(w in _DEVICE_WORDS for w in words)
            and len(set(words)) == len(words)
            and (tb_size is not None and 1 <= tb_size <= 4096 if accelerator == "tcg" else tb_size is None))


@SETTINGS
@given(accelerator=_words, guest=_words, host=_words, devices=_devices,
       tb_size=st.one_of(st.none(), st.integers(-1, 5000)))
@example(accelerator="tcg", guest="kernel-only", host="vmm", devices="serial+virtio-console", tb_size=64)
@example(accelerator="kvm", guest="kata-image", host="vmm+virtiofsd", devices="vsock+rng+virtio-fs+nvdimm",
         tb_size=None)
@example(accelerator="", guest="", host="none", devices="", tb_size=None)
def test_the_kind_columns_take_exactly_their_grammar_and_read_back_unchanged(accelerator, guest, host, devices, tb_size):
    """A row is taken iff the grammar says so (else one line per problem, naming the column); a taken row
    written back as `probe` writes its rows reads back the same, so every part keeps its source."""
    header = ",".join(("accelerator", "guest", "host_processes", "devices", "tcg_tb_size_mib", "container_limit_mib",
                       "vm_nominal_mib", "free_total_mib", "free_used_mib"))
    cells = [accelerator, guest, host, devices, "" if tb_size is None else str(tb_size), "448", "512", "470", "17"]
    assume(all("," not in c and '"' not in c for c in cells))
    try:
        [row] = parse_samples_csv(header + "\n" + ",".join(cells) + "\n")
    except CalibrationError as exc:
        assert not _kind_oracle(accelerator.strip(), guest.strip(), host.strip(), devices.strip(), tb_size), exc
        assert all(p.startswith("line 2: ") and "\n" not in p for p in exc.problems)
        return
    assert _kind_oracle(accelerator.strip(), guest.strip(), host.strip(), devices.strip(), tb_size)
    text = to_csv([row], columns=(*SURVEY_COLUMNS, *PROBE_COLUMNS))
    [back] = parse_samples_csv(text)
    assert back == row
    assert (back.accelerator, back.guest, back.host_processes, back.devices) == (
        row.accelerator, row.guest, row.host_processes, row.devices)
