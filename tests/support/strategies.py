"""Hypothesis strategies the property and fuzz tests share: valid policies, and YAML scalars of
every shape the API server reads, each with the CRD field it is written to."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import strategies as st

from kata_sizing.core import defaults
from tests.support import apiserver_grammar as grammar

dns_labels = st.from_regex(r"\A[a-z]([a-z0-9-]{0,6}[a-z0-9])?\Z")


def _decimal_text(low: int, high: int, places: int) -> st.SearchStrategy[str]:
    """A decimal string in [low, high] / 10**places, written as a user would ("0.14")."""
    return st.integers(low, high).map(lambda n: format(Decimal(n).scaleb(-places).normalize(), "f"))


overhead_functions = st.fixed_dictionaries({}, optional={
    "guestMemoryBase": st.integers(0, 1024).map(lambda n: f"{n}Mi"),
    "guestMemoryRatio": _decimal_text(0, 600, 3),
    "guestCpu": st.integers(0, 2000).map(lambda n: f"{n}m"),
    "hostMemory": st.integers(1, 256).map(lambda n: f"{n}Mi"),
    "hostCpu": st.integers(1, 1000).map(lambda n: f"{n}m"),
    "margin": _decimal_text(0, 100, 2),
})


@st.composite
def class_lists(draw):
    count = draw(st.integers(1, 5))
    names = draw(st.lists(dns_labels, min_size=count, max_size=count, unique=True))
    memories_mib = sorted(draw(st.lists(st.integers(1, 256 * 1024), min_size=count, max_size=count, unique=True)))
    classes = []
    for name, memory_mib in zip(names, memories_mib):
        memory = f"{memory_mib // 1024}Gi" if memory_mib % 1024 == 0 else f"{memory_mib}Mi"
        cpu = draw(st.integers(100, 64000).map(lambda m: f"{m}m" if m % 1000 else str(m // 1000)))
        classes.append({"name": name, "cpu": cpu, "memory": memory})
    return classes


@st.composite
def valid_policies(draw) -> dict:
    spec: dict = {"shim": draw(st.sampled_from(sorted(set(defaults.SHIMS) - defaults.NOT_CHART_SHIMS)))}
    # The shim decides the runtime; naming another one is an error (rules.check_shim).
    if draw(st.booleans()):
        spec["runtime"] = defaults.SHIMS[spec["shim"]].runtime.value
    spec["overhead"] = draw(overhead_functions)
    if draw(st.booleans()):
        spec["classes"] = draw(class_lists())
    if draw(st.booleans()):
        spec["fallback"] = {"cpu": str(draw(st.integers(1, 8))), "memory": f"{draw(st.integers(1, 4096))}Mi"}
    spec["hugepages"] = draw(st.booleans())
    spec["sandboxCgroupOnly"] = draw(st.booleans())
    return {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
            "metadata": {"name": draw(dns_labels)}, "spec": spec}


SCALAR_FIELDS = {
    # field: (the CRD's kind, how it is written, what the CLI refuses on top: Kata's rules)
    "hugepages": ("boolean", "hugepages: {}", lambda s: False),
    "sandboxCgroupOnly": ("boolean", "sandboxCgroupOnly: {}", lambda s: False),
    "admission.enabled": ("boolean", "admission: {{enabled: {}}}", lambda s: False),
    # Kata reads at most 1024 vCPUs from a drop-in (rules.MAX_VCPUS).
    "defaultVcpus": ("positive", 'classes: [{{name: s, cpu: "1", memory: 1Gi, defaultVcpus: {}}}]',
                     lambda s: s.value > 1024),
    "tolerationSeconds": ("integer", "runtimeClass: {{tolerations: [{{key: k, operator: Exists, effect: NoExecute, "
                          "tolerationSeconds: {}}}]}}", lambda s: False),
    "nodeSelector value": ("label-value", "runtimeClass: {{nodeSelector: {{kata: {}}}}}", lambda s: False),
    # Memory is not negative and at most 2^63-1 bytes; a quantity is at most 64 characters.
    "kubeReserved": ("quantity", "nodes: {{kubeReserved: {}}}", lambda s: (
        (isinstance(s.value, int) and not 0 <= s.value < 2**63)
        or (isinstance(s.value, str) and s.value.startswith("-") and s.value.strip("-0.") != ""))),
}

yaml_scalars = st.one_of(
    grammar.booleans, grammar.integers(-5, 5000), grammar.floats(), grammar.plain_strings(max_size=8),
    grammar.quantity_texts.map(grammar.quoted), grammar.plain_strings().map(lambda s: grammar.quoted(s.text)),
    st.sampled_from(["y", "n", "1e3", "0o17", "0x1F", "1_000", "on"]).map(grammar.quoted),
)
