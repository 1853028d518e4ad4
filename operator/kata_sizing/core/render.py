"""Rendering: sized classes -> the desired Kubernetes objects, through jinja2 templates.

Pure: no client, no I/O beyond reading the templates once. Every template is rendered
with StrictUndefined, values enter YAML through `tojson` or `yaml_block`, and each
document is parsed back here, so what leaves this module is plain dicts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from importlib.machinery import SourceFileLoader
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
import yaml

from .model import API_VERSION, KIND, KataSizingPolicy
from .quantity import format_cpu, format_mib
from .sizing import ClassSizing, PolicySizing, Problem, size_policy

if TYPE_CHECKING:  # guidance loads only when nodes are given (the CLI's default render has none)
    from .guidance import NodeFacts, NodeGroupGuidance

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kata-sizing"
POLICY_LABEL = "katasizing.dev/policy"
CLASS_LABEL = "katasizing.dev/class"
# Flux's helm-controller re-runs a HelmRelease as soon as a ConfigMap it reads with valuesFrom
# changes, if that ConfigMap carries this label (otherwise only at the release's interval).
FLUX_WATCH_LABEL = "reconcile.fluxcd.io/watch"

VALUES_KEY = "values.yaml"
SUMMARY_KEY = "summary.txt"

_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


REPOSITORY_TEMPLATES = Path(__file__).resolve().parents[3] / "templates"


def templates_dir() -> Path:
    """`templates/` at the repository root, or $KATA_SIZING_TEMPLATES in an image."""
    override = os.environ.get("KATA_SIZING_TEMPLATES")
    return Path(override) if override else REPOSITORY_TEMPLATES


# json.dumps writes a character beyond U+FFFF as a UTF-16 surrogate pair (\ud83d\ude00);
# YAML reads that as two lone surrogates, so such pairs become YAML's \UXXXXXXXX escape.
# The lookbehind skips a `\\u` that is an escaped backslash followed by "u".
_SURROGATE_PAIR = re.compile(r"(?<!\\)((?:\\\\)*)\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})")


def _json_for_yaml(value: object, **kwargs) -> str:
    """JSON that YAML parsers read back to the same value."""

    def astral(match: re.Match) -> str:
        code = 0x10000 + ((int(match[2], 16) - 0xD800) << 10) + (int(match[3], 16) - 0xDC00)
        return f"{match[1]}\\U{code:08x}"

    return _SURROGATE_PAIR.sub(astral, json.dumps(value, **kwargs))


def _yaml_block(text: str, indent: int) -> str:
    """A literal block scalar (`|`) for readable multi-line strings; JSON otherwise."""
    plain = all(ch in "\n\t" or ch.isprintable() for ch in text)
    lines = text.split("\n")
    if (
        not text.strip()
        or not plain
        or text.lstrip("\n")[0] in " \t"
        or text.endswith("\n\n")
        or any(line != line.rstrip() for line in lines)
    ):
        return _json_for_yaml(text)
    chomp = "" if text.endswith("\n") else "-"
    body = lines[:-1] if text.endswith("\n") else lines
    pad = " " * indent
    return f"|{chomp}\n" + "\n".join(pad + line if line else "" for line in body)


def compiled_module_stem(template: str) -> str:
    """runtimeclass.yaml.j2 -> runtimeclass_yaml: the template's module in compiled_templates/."""
    return "".join(ch if ch.isalnum() else "_" for ch in template.removesuffix(".j2"))


class _PrecompiledLoader(jinja2.FileSystemLoader):
    """The template files, run from the code shipped for them in compiled_templates/
    (`make templates`) when a file's text and the jinja2 version are the ones that code was
    generated from; any other template is compiled from its file, as FileSystemLoader does."""

    def load(self, environment: jinja2.Environment, name: str, globals=None) -> jinja2.Template:
        from . import compiled_templates

        source, filename, uptodate = self.get_source(environment, name)
        digest = compiled_templates.SOURCE_SHA256.get(name)
        if (digest is None or compiled_templates.JINJA2_VERSION != jinja2.__version__
                or hashlib.sha256(source.encode("utf-8")).hexdigest() != digest):
            return super().load(environment, name, globals)
        stem = compiled_module_stem(name)
        module = f"{compiled_templates.__name__}.{stem}"
        path = os.path.join(os.path.dirname(compiled_templates.__file__), f"{stem}.py")
        # The module's code object (from its .pyc), run by jinja2 the way it runs code it has
        # just compiled; the module is never imported (its code expects jinja2's namespace).
        code = SourceFileLoader(module, path).get_code(module)
        template = environment.template_class.from_code(
            environment, code, environment.make_globals(globals), uptodate)
        template.filename = filename
        return template


def jinja_environment(loader: jinja2.BaseLoader) -> jinja2.Environment:
    """The environment every template renders in (and templategen compiles with)."""
    env = jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["yaml_block"] = _yaml_block
    env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    env.policies["json.dumps_function"] = _json_for_yaml
    return env


@lru_cache(maxsize=4)
def _environment(directory: str) -> jinja2.Environment:
    return jinja_environment(_PrecompiledLoader(directory))


def _render(template: str, **context) -> str:
    return _environment(str(templates_dir())).get_template(template).render(**context)


def _load(text: str) -> dict:
    return yaml.load(text, Loader=_SafeLoader)


@dataclass
class Rendered:
    sizing: PolicySizing
    runtime_classes: list[dict]
    configmaps: list[dict]
    drop_ins: dict[str, str]
    values_yaml: str
    guidance: list[NodeGroupGuidance] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    # ValidatingAdmissionPolicies, the MutatingAdmissionPolicy and their bindings (podfit.py).
    admission: list[dict] = field(default_factory=list)

    @property
    def creates_runtime_classes(self) -> bool:
        return self.sizing.policy.spec.runtime_class.managed_by == "Operator"

    def objects(self) -> list[dict]:
        """What the operator applies (and `kata-sizing render` prints), in apply order."""
        runtime_classes = self.runtime_classes if self.creates_runtime_classes else []
        return [*self.configmaps, *runtime_classes, *self.admission]


def owner_reference(policy: KataSizingPolicy) -> list[dict]:
    if not policy.metadata.uid:
        return []
    return [{
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": policy.name,
        "uid": policy.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }]


def policy_labels(policy: KataSizingPolicy) -> dict[str, str]:
    return {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: policy.name}


def render_runtime_class(policy: KataSizingPolicy, sized: ClassSizing, owned: bool = True) -> str:
    spec = policy.spec.runtime_class
    return _render(
        "runtimeclass.yaml.j2",
        rc={"name": sized.runtime_class, "pod_fixed": sized.pod_fixed},
        labels={**policy_labels(policy), CLASS_LABEL: sized.name},
        annotations={},
        owner_references=owner_reference(policy) if owned else [],
        node_selector=dict(spec.node_selector),
        tolerations=[t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations],
    )


def render_drop_in(sizing: PolicySizing, sized: ClassSizing) -> str:
    return _render(
        "dropin.toml.j2",
        policy=sizing.policy.name,
        c=sized,
        envelope_cpu=format_cpu(sized.envelope_cpu),
        envelope_memory=format_mib(sized.envelope_memory_mib),
        runtime=sizing.runtime.value,
        settings=sized.kata.to_toml(),
    )


def configmap(
    policy: KataSizingPolicy, name: str, data: dict[str, str], extra_labels: dict[str, str] | None = None,
) -> dict:
    return _load(_render(
        "configmap.yaml.j2",
        name=name,
        namespace=policy.spec.output.namespace,
        labels={**policy_labels(policy), **(extra_labels or {})},
        owner_references=owner_reference(policy),
        data=data,
    ))


def configmap_names(policy_name: str) -> dict[str, str]:
    return {
        "values": f"{policy_name}-kata-deploy-values",
        "dropins": f"{policy_name}-dropins",
        "guidance": f"{policy_name}-node-guidance",
    }


def render_policy(
    policy: KataSizingPolicy,
    nodes: list[NodeFacts] | None = None,
    sizing: PolicySizing | None = None,
) -> Rendered:
    """All desired objects for a policy; `nodes` adds the node-guidance ConfigMap."""
    sizing = sizing or size_policy(policy)
    names = configmap_names(policy.name)
    runtime_class_texts = {c.name: render_runtime_class(policy, c) for c in sizing.classes}
    runtime_classes = [_load(text) for text in runtime_class_texts.values()]
    drop_ins = {f"{c.name}.toml": render_drop_in(sizing, c) for c in sizing.classes}
    values_yaml = _render(
        "kata-deploy-values.yaml.j2",
        policy=policy.name,
        shim=policy.spec.shim,
        runtimes=[
            {
                "name": c.runtime_class,
                "drop_in": drop_ins[f"{c.name}.toml"],
                # The chart creates this object itself, so no ownerReference in it.
                "runtime_class_yaml": render_runtime_class(policy, c, owned=False),
            }
            for c in sizing.classes
        ],
    )
    configmaps = [
        configmap(policy, names["values"], {VALUES_KEY: values_yaml}, {FLUX_WATCH_LABEL: "Enabled"}),
        configmap(policy, names["dropins"], drop_ins),
    ]
    guidance: list[NodeGroupGuidance] = []
    problems = list(sizing.problems)
    if nodes is not None:
        from .guidance import node_guidance

        guidance, guidance_problems = node_guidance(sizing, nodes)
        problems.extend(guidance_problems)
        data = {g.key + ".yaml": render_guidance_document(policy.name, g) for g in guidance}
        data[SUMMARY_KEY] = _render(
            "node-guidance-summary.txt.j2",
            policy=policy.name,
            groups=guidance,
            node_count=sum(len(g.nodes) for g in guidance),
        )
        configmaps.append(configmap(policy, names["guidance"], data))
    return Rendered(sizing, runtime_classes, configmaps, drop_ins, values_yaml, guidance, problems,
                    render_admission(sizing))


def render_admission(sizing: PolicySizing) -> list[dict]:
    """The admission objects of a policy (docs/admission.md), each policy before its binding:
    the two ValidatingAdmissionPolicies (one per rule, since a binding's action applies to
    every validation of its policy) and, unless spec.admission.routing is Webhook, the
    MutatingAdmissionPolicy that routes opted-in pods. Same labels and ownerReference as the
    RuntimeClasses."""
    from . import podfit

    policy = sizing.policy
    if not policy.spec.admission.enabled or not sizing.classes:
        return []
    labels = policy_labels(policy)
    owners = owner_reference(policy)

    specs = podfit.admission_specs(sizing)
    frames = [{"api_version": api_version, "kind": kind, "name": name} for api_version, kind, name, _ in specs]
    text = _render("admission.yaml.j2", objects=frames, labels=labels, owner_references=owners)
    documents = [d for d in yaml.load_all(text, Loader=_SafeLoader) if d is not None]
    for body, (_, _, _, spec) in zip(documents, specs, strict=True):
        # A copy (the objects share their CEL variables); 20 KB of CEL through YAML text would
        # triple the cost of rendering a policy.
        body["spec"] = json.loads(json.dumps(spec))
    return documents


def render_guidance_document(policy_name: str, group: NodeGroupGuidance) -> str:
    return _render("node-guidance.yaml.j2", policy=policy_name, g=group)


def parse_yaml(text: str) -> object:
    return _load(text)
