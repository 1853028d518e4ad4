"""Audit of an existing kata-deploy install: its Helm values and, optionally, the live
RuntimeClasses, checked against the rules of docs/rules.md (rules.py).

Pure: dicts in, an `AuditReport` out; the CLI reads the files. How the values become
RuntimeClasses follows the kata-deploy chart ([kd-values] in defaults.py): its
`runtimeclasses.yaml` template (enabled shims, per-key `overhead` merged over the
built-in podFixed table, per-shim `overheadEnabled` over the global one, name and handler
`kata-<shim>[-<multiInstallSuffix>]`) and its `custom-runtimes.yaml` template (handler
read textually from the `handler:` line of the runtimeClass string).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, TypeVar

from . import bounded, defaults
from .defaults import Runtime, ShimInfo
from .kubegrammar import is_dns_label
from .quantity import QuantityError, cpu_cores, format_vcpus, memory_bytes, shown
from .rules import (  # noqa: F401  (Rule and Severity are part of this module's API)
    HostOverhead,
    KataConfig,
    PodFixed,
    Problem,
    Rule,
    Severity,
    Where,
    check_class,
    drop_in_setter,
    overhead_disabled,
    read_drop_in,
    show_cpu,
    show_memory,
)

if TYPE_CHECKING:
    from .model import KataSizingPolicy

T = TypeVar("T")


class AuditError(ValueError):
    """Input the audit cannot work on at all (not a mapping of values)."""


# kata-deploy's extra RuntimeClasses per shim (`debug`, `devkit`) reuse the shim's config.
_HANDLER_VARIANTS = ("-debug", "-devkit")
# [kd-values] defaultShim is read in this order by the chart's runtimeclasses.yaml.
_DEFAULT_SHIM_ARCHES = ("amd64", "arm64", "s390x", "ppc64le")


@dataclass(frozen=True)
class CheckedClass:
    name: str
    handler: str
    shim: str
    runtime: Runtime
    # "shim" (shims.<shim>), "custom-runtime" (customRuntimes.runtimes.<name>) or
    # "runtime-class" (a live RuntimeClass, whose podFixed is what Kubernetes uses).
    source: str
    values_path: str | None
    overhead_enabled: bool
    pod_fixed_memory_bytes: int | None
    pod_fixed_cpu: Decimal | None
    kata: KataConfig | None  # None when the drop-in cannot be read

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "handler": self.handler,
            "shim": self.shim,
            "runtime": self.runtime.value,
            "source": self.source,
            "valuesPath": self.values_path,
            "overheadEnabled": self.overhead_enabled,
            "podFixed": {
                "memory": show_memory(self.pod_fixed_memory_bytes),
                "cpu": show_cpu(self.pod_fixed_cpu),
            } if self.overhead_enabled else None,
            "kata": self.kata.as_dict() if self.kata else None,
        }


@dataclass(frozen=True)
class Finding:
    runtime_class: str
    handler: str
    severity: str
    rule: str
    value: str  # what the install has
    bound: str  # what the rule compares it with
    message: str
    fix: str

    @classmethod
    def of(cls, runtime_class: str, handler: str, problem: Problem) -> Finding:
        return cls(runtime_class, handler, problem.severity, problem.rule, problem.value, problem.bound,
                   problem.message, problem.fix)

    def __str__(self) -> str:
        return f"{self.runtime_class} (handler {self.handler}) [{self.rule}]: {self.message}; fix: {self.fix}"

    def as_dict(self) -> dict:
        return {
            "runtimeClass": self.runtime_class,
            "handler": self.handler,
            "severity": self.severity,
            "rule": self.rule,
            "value": self.value,
            "bound": self.bound,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass
class AuditReport:
    findings: list[Finding] = field(default_factory=list)
    checked: list[CheckedClass] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.WARNING]

    def as_dict(self) -> dict:
        return {
            "summary": {
                "checked": len(self.checked),
                "errors": len(self.errors),
                "warnings": len(self.warnings),
            },
            "findings": [f.as_dict() for f in self.findings],
            "checked": [c.as_dict() for c in self.checked],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class _Candidate:
    """A RuntimeClass before checking: where it comes from and its raw settings."""

    name: str
    handler: str
    shim: str
    source: str
    values_path: str | None
    pod_fixed_path: str  # where a podFixed fix goes, with "{key}" for memory or cpu
    drop_in: object
    drop_in_path: str
    overhead_enabled: bool
    pod_fixed: dict


def _describe(pod_fixed: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(pod_fixed.items())) or "none"


def _mapping(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _set(mapping: dict, key: str, default: object) -> object:
    # Helm drops a key set to null from the merged values, so null means "not set".
    value = mapping.get(key)
    return default if value is None else value


def _shim_handler(shim: str, suffix: str) -> str:
    return f"kata-{shim}-{suffix}" if suffix else f"kata-{shim}"


def _chart_pod_fixed(info: ShimInfo) -> dict:
    return {"memory": info.kata_deploy_pod_fixed_memory, "cpu": info.kata_deploy_pod_fixed_cpu}


def _overhead_keys(overhead: dict) -> dict:
    return {k: v for k, v in overhead.items() if k in ("memory", "cpu") and v is not None}


# --- values -> candidates -------------------------------------------------------------


def _shim_candidates(values: dict, notes: list[str]) -> tuple[list[_Candidate], bool]:
    shims = values.get("shims")
    if shims is None:
        notes.append("the values file has no `shims` section: only custom runtimes and the given "
                     "RuntimeClasses are audited (pass the full values, e.g. `helm get values --all`)")
        return [], True
    if not isinstance(shims, dict):
        notes.append("`shims` is not a mapping; no shim is audited")
        return [], True
    runtime_classes = _mapping(values.get("runtimeClasses"))
    creates = bool(_set(runtime_classes, "enabled", True))
    global_overhead = bool(_set(runtime_classes, "overheadEnabled", True))
    env = _mapping(values.get("env"))
    suffix = str(_set(env, "multiInstallSuffix", "") or "")
    disable_all = bool(_set(shims, "disableAll", False))
    default_shim = None
    if _set(runtime_classes, "createDefault", False) and not suffix:
        arches = _mapping(values.get("defaultShim"))
        default_shim = next((arches[a] for a in _DEFAULT_SHIM_ARCHES if arches.get(a)), None)

    missing = sorted(set(defaults.SHIMS) - set(shims))
    # With disableAll, a shim the file leaves out follows it and is not installed.
    if missing and not disable_all:
        notes.append(f"shims the values file does not list are not audited ({', '.join(missing)}); "
                     "if it is an overlay, pass the full values (`helm get values --all`)")
    candidates = []
    for shim, config in shims.items():
        if shim == "disableAll":
            continue
        config = _mapping(config)
        enabled = config.get("enabled")
        if enabled is not True and (enabled is False or disable_all):
            continue
        if shim in defaults.OUT_OF_SCOPE_SHIMS:
            notes.append(f"shims.{shim}: {defaults.OUT_OF_SCOPE_SHIMS[shim]}; not audited")
            continue
        if shim not in defaults.SHIMS:
            notes.append(f"shims.{shim}: not a shim kata-sizing knows (the chart creates no "
                         "RuntimeClass for it); not audited")
            continue
        rc_config = _mapping(config.get("runtimeClass"))
        overhead = rc_config.get("overhead")
        pod_fixed = _chart_pod_fixed(defaults.SHIMS[shim])
        if isinstance(overhead, dict):
            pod_fixed.update(_overhead_keys(overhead))
        elif overhead is not None:
            pod_fixed = {"invalid": overhead}
        handler = _shim_handler(shim, suffix)
        candidate = _Candidate(
            name=handler,
            handler=handler,
            shim=shim,
            source="shim",
            values_path=f"shims.{shim}",
            pod_fixed_path=f"shims.{shim}.runtimeClass.overhead.{{key}}",
            drop_in=config.get("dropIn"),
            drop_in_path=f"shims.{shim}.dropIn",
            overhead_enabled=bool(_set(rc_config, "overheadEnabled", global_overhead)),
            pod_fixed=pod_fixed,
        )
        candidates.append(candidate)
        if shim == default_shim:
            name = str(_set(runtime_classes, "defaultName", "kata"))
            candidates.append(replace(candidate, name=name))
    if not creates and candidates:
        notes.append("runtimeClasses.enabled is false: the chart creates no RuntimeClass for its "
                     "shims; they are audited only through the RuntimeClasses given")
    return candidates, creates


def _handler_line(text: str) -> str | None:
    # The chart takes the handler textually: the last line starting with `handler:`, trimmed.
    handler = None
    for line in text.split("\n"):
        line = line.strip()
        if line.startswith("handler:"):
            handler = line[len("handler:"):].strip()
    return handler


def _custom_candidates(values: dict, notes: list[str], findings: list[Finding]) -> list[_Candidate]:
    custom = _mapping(values.get("customRuntimes"))
    runtimes = custom.get("runtimes")
    if not runtimes:
        return []
    if not isinstance(runtimes, dict):
        notes.append("customRuntimes.runtimes is not a mapping; no custom runtime is audited")
        return []
    if not custom.get("enabled"):
        notes.append(f"customRuntimes.enabled is not true: {len(runtimes)} custom runtime(s) are "
                     "not installed and not audited")
        return []
    candidates = []
    for name, runtime in runtimes.items():
        path = f"customRuntimes.runtimes.{name}"
        runtime = _mapping(runtime)
        base = runtime.get("baseConfig")
        text = runtime.get("runtimeClass")
        if not text:
            notes.append(f"{path}: no runtimeClass, so the chart registers no handler; not audited")
            continue
        if not isinstance(base, str) or not base:
            notes.append(f"{path}: no baseConfig (the chart requires one); not audited")
            continue
        if base in defaults.OUT_OF_SCOPE_SHIMS:
            notes.append(f"{path}: baseConfig {base}: {defaults.OUT_OF_SCOPE_SHIMS[base]}; not audited")
            continue
        if base not in defaults.SHIMS:
            notes.append(f"{path}: baseConfig {base!r} is not a shim kata-sizing knows; not audited")
            continue
        textual = _handler_line(text) if isinstance(text, str) else None
        try:
            # The same bounds as the file it came in: an alias bomb fits in a few hundred bytes.
            documents = bounded.load_yaml_documents(text, f"{path}.runtimeClass") if isinstance(text, str) else []
            rc = documents[0] if len(documents) == 1 else None
        except bounded.InputError as exc:
            problem = str(exc).split(": ", 1)[-1]
            findings.append(Finding(str(name), textual or "?", Severity.ERROR, Rule.RUNTIME_CLASS_INVALID,
                                    "not YAML", "a RuntimeClass", f"{path}.runtimeClass cannot be read as YAML: {problem}",
                                    f"write a full RuntimeClass YAML in {path}.runtimeClass"))
            continue
        if not isinstance(rc, dict) or not isinstance(rc.get("handler"), str) or not textual:
            findings.append(Finding(str(name), textual or "?", Severity.ERROR, Rule.RUNTIME_CLASS_INVALID,
                                    "no handler", "a RuntimeClass with a handler",
                                    f"{path}.runtimeClass is not a RuntimeClass with a handler",
                                    f"write a full RuntimeClass YAML with `handler:` in {path}.runtimeClass"))
            continue
        rc_name = str(_mapping(rc.get("metadata")).get("name") or name)
        if textual != rc["handler"]:
            # The chart registers the text after `handler:`, quotes included; Kubernetes
            # uses the parsed value: the two disagree and no pod of this class starts.
            findings.append(Finding(rc_name, rc["handler"], Severity.ERROR, Rule.RUNTIME_CLASS_INVALID,
                                    f"handler: {textual}", f"handler: {rc['handler']}",
                                    (f"kata-deploy registers the containerd handler {textual!r} (it reads the "
                                     f"`handler:` line as text) but the RuntimeClass names {rc['handler']!r}"),
                                    f"write `handler: {rc['handler']}` unquoted in {path}.runtimeClass"))
        given = _mapping(_mapping(rc.get("overhead")).get("podFixed"))
        inherit = bool(_set(runtime, "inheritBaseOverhead", True))
        pod_fixed = {**_chart_pod_fixed(defaults.SHIMS[base]), **_overhead_keys(given)} if inherit \
            else _overhead_keys(given)
        candidates.append(_Candidate(
            name=rc_name,
            handler=rc["handler"],
            shim=base,
            source="custom-runtime",
            values_path=path,
            pod_fixed_path=f"overhead.podFixed.{{key}} in {path}.runtimeClass",
            drop_in=runtime.get("dropIn"),
            drop_in_path=f"{path}.dropIn",
            overhead_enabled=bool(pod_fixed),
            pod_fixed=pod_fixed,
        ))
    return candidates


# --- live RuntimeClasses ---------------------------------------------------------------


def runtime_classes_from_documents(documents: list[object]) -> list[dict]:
    """RuntimeClass objects from YAML documents: single objects or `kind: List` (as
    `kubectl get runtimeclass -o yaml` prints); other kinds are left to the audit to note."""
    found: list[dict] = []
    for index, document in enumerate(documents):
        if not isinstance(document, dict):
            raise AuditError(f"document {index + 1} is not a mapping (a RuntimeClass or a List)")
        if str(document.get("kind", "")).endswith("List"):
            items = document.get("items") or []
            if not isinstance(items, list):
                raise AuditError(f"document {index + 1}: items is not a list")
            found.extend(items)
        else:
            found.append(document)
    return found


def _shim_of_handler(handler: str, suffix: str = "") -> str | None:
    """The shim a `kata-<shim>[-<suffix>][-debug|-devkit]` handler runs, or None."""
    if not handler.startswith("kata-"):
        return None
    rest = handler[len("kata-"):]
    options = [rest]
    for variant in _HANDLER_VARIANTS:
        if rest.endswith(variant):
            options.append(rest[: -len(variant)])
    if suffix:
        options += [o[: -len(suffix) - 1] for o in list(options) if o.endswith(f"-{suffix}")]
    for option in options:
        if option in defaults.SHIMS or option in defaults.OUT_OF_SCOPE_SHIMS:
            return option
    return None


def _live_fields(rc: object) -> tuple[str, str, dict, bool] | None:
    if not isinstance(rc, dict) or rc.get("kind", "RuntimeClass") != "RuntimeClass":
        return None
    handler = rc.get("handler")
    if not isinstance(handler, str):
        return None
    name = str(_mapping(rc.get("metadata")).get("name") or handler)
    overhead = rc.get("overhead")
    pod_fixed = _mapping(overhead).get("podFixed") if overhead is not None else None
    if pod_fixed is None:
        return name, handler, {}, False
    if not isinstance(pod_fixed, dict):
        return name, handler, {"invalid": pod_fixed}, True
    given = _overhead_keys(pod_fixed)
    return name, handler, given, bool(given)


def _live_only_candidate(name: str, handler: str, shim: str, pod_fixed: dict, enabled: bool) -> _Candidate:
    return _Candidate(
        name=name,
        handler=handler,
        shim=shim,
        source="runtime-class",
        values_path=None,
        pod_fixed_path=f"overhead.podFixed.{{key}} of RuntimeClass {name} (only pods created afterwards get it)",
        drop_in=None,
        drop_in_path=f"the drop-in of shims.{shim}",
        overhead_enabled=enabled,
        pod_fixed=pod_fixed,
    )


# --- the checks ------------------------------------------------------------------------


def _field(c: _Candidate, key: str) -> str:
    return c.pod_fixed_path.replace("{key}", key)


def _parse_pod_fixed(c: _Candidate, finding) -> tuple[int | None, Decimal | None]:
    if "invalid" in c.pod_fixed:
        finding(Severity.ERROR, Rule.OVERHEAD_INVALID, shown(c.pod_fixed["invalid"]), "memory and cpu quantities",
                "the overhead is not a mapping of memory and cpu",
                f"set {_field(c, 'memory')} and {_field(c, 'cpu')}")
        return None, None
    def parsed(key: str, parse: Callable[[object], T], example: str) -> T | None:
        if key not in c.pod_fixed:
            return None
        try:
            return parse(c.pod_fixed[key])
        except QuantityError as exc:
            finding(Severity.ERROR, Rule.OVERHEAD_INVALID, f"podFixed.{key} {shown(c.pod_fixed[key])}",
                    f"a {key} quantity", str(exc), f"set {_field(c, key)} to a quantity such as {example}")
            return None
    return parsed("memory", memory_bytes, "320Mi"), parsed("cpu", cpu_cores, "250m")


def _overhead_disabled_fix(c: _Candidate) -> str:
    if c.values_path and c.source == "runtime-class":
        return f"enable the overhead in {c.values_path} and upgrade the release"
    return {
        "shim": f"set {c.values_path}.runtimeClass.overheadEnabled (or runtimeClasses.overheadEnabled) to true",
        "custom-runtime": f"add overhead.podFixed to {c.values_path}.runtimeClass",
    }.get(c.source, f"add overhead.podFixed to RuntimeClass {c.name} (only pods created afterwards get it)")


def _check(c: _Candidate, notes: list[str], hosts: dict[str, HostOverhead]) -> tuple[CheckedClass, list[Finding]]:
    """One class through rules.check_class: its drop-in read as Kata reads it, its podFixed as
    Kubernetes has it, and the host side of the policy that rendered it when known."""
    info = defaults.SHIMS[c.shim]
    host = hosts.get(c.handler) or HostOverhead.for_shim(c.shim)
    findings: list[Finding] = []

    def finding(severity, rule, value, bound, message, fix) -> None:
        findings.append(Finding(c.name, c.handler, severity, rule, value, bound, message, fix))

    if not is_dns_label(c.handler):
        # RuntimeClass.handler is a DNS label (k8s.io/api/node/v1): the API server refuses the
        # RuntimeClass, so no pod of this class can be created.
        source = {"custom-runtime": f"the handler: line of {c.values_path}.runtimeClass",
                  "shim": "env.multiInstallSuffix"}.get(c.source, f"RuntimeClass {c.name}")
        finding(Severity.ERROR, Rule.RUNTIME_CLASS_INVALID, f"handler {shown(c.handler)}", "a DNS label",
                f"handler {shown(c.handler)} is not a DNS label (at most 63 lower-case letters, digits and '-'): "
                "the API server refuses this RuntimeClass", f"correct {source}")
    pod_fixed_memory = pod_fixed_cpu = None
    if c.overhead_enabled:
        pod_fixed_memory, pod_fixed_cpu = _parse_pod_fixed(c, finding)
    reading = read_drop_in(c.drop_in, KataConfig.shipped(info), c.drop_in_path)
    notes.extend(reading.notes)
    findings.extend(Finding.of(c.name, c.handler, p) for p in reading.problems)
    kata = reading.config
    checked = CheckedClass(c.name, c.handler, c.shim, info.runtime, c.source, c.values_path,
                           c.overhead_enabled, pod_fixed_memory, pod_fixed_cpu, kata)
    where = Where(path=c.name, pod_fixed_field=lambda key: _field(c, key),
                  set_kata=drop_in_setter(c.drop_in_path), overhead_disabled_fix=_overhead_disabled_fix(c))
    if kata is None:
        if not c.overhead_enabled:
            findings.append(Finding.of(c.name, c.handler, overhead_disabled(where)))
        return checked, findings
    pod_fixed = PodFixed(pod_fixed_memory, pod_fixed_cpu) if c.overhead_enabled else None
    findings.extend(Finding.of(c.name, c.handler, p) for p in check_class(kata, pod_fixed, host, where))
    return checked, findings


def _run(candidates: list[_Candidate], notes: list[str], findings: list[Finding],
         hosts: dict[str, HostOverhead] | None = None) -> AuditReport:
    report = AuditReport(findings=findings)
    for candidate in candidates:
        checked, found = _check(candidate, notes, hosts or {})
        report.checked.append(checked)
        report.findings.extend(found)
    # A drop-in shared by a values class and its live RuntimeClasses notes the same thing twice.
    report.notes = list(dict.fromkeys(notes))
    return report


def _same_pod_fixed(a: dict, b: dict) -> bool:
    try:
        return (
            {k: memory_bytes(v) for k, v in a.items() if k == "memory"}
            == {k: memory_bytes(v) for k, v in b.items() if k == "memory"}
            and {k: cpu_cores(v) for k, v in a.items() if k == "cpu"}
            == {k: cpu_cores(v) for k, v in b.items() if k == "cpu"}
        )
    except (QuantityError, AttributeError, TypeError):
        return a == b


# --- public API ------------------------------------------------------------------------


def policy_host_overheads(policies: Sequence[KataSizingPolicy]) -> dict[str, HostOverhead]:
    """handler -> the host side of the policy that renders it: the audit of a rendered
    install judges podFixed with the policy's own hostMemory/hostCpu, not the shim family's."""
    from .sizing import size_policy

    hosts = {}
    for policy in policies:
        sizing = size_policy(policy)
        for sized in sizing.classes:
            hosts[sized.runtime_class] = HostOverhead(sizing.overhead.host_memory_mib, sizing.overhead.host_cpu)
    return hosts


def audit_values(values: dict, runtime_classes: list[dict],
                 policies: Sequence[KataSizingPolicy] = ()) -> AuditReport:
    """Audit a kata-deploy values file and the RuntimeClasses found in the cluster.

    A live RuntimeClass whose handler is one the values describe takes their drop-in but
    its own podFixed, since that is what Kubernetes uses. With `policies`, the classes they
    render are checked with their overhead function's host side."""
    if not isinstance(values, dict):
        raise AuditError("the values are not a mapping (a kata-deploy Helm values file)")
    notes: list[str] = []
    findings: list[Finding] = []
    shim_candidates, creates = _shim_candidates(values, notes)
    custom = _custom_candidates(values, notes, findings)
    suffix = str(_set(_mapping(values.get("env")), "multiInstallSuffix", "") or "")
    by_handler: dict[str, _Candidate] = {}
    for candidate in [*shim_candidates, *custom]:
        by_handler.setdefault(candidate.handler, candidate)

    live: list[_Candidate] = []
    replaced: set[str] = set()
    ignored: list[str] = []
    for rc in runtime_classes:
        fields = _live_fields(rc)
        if fields is None:
            kind = rc.get("kind") if isinstance(rc, dict) else type(rc).__name__
            notes.append(f"ignored an object that is not a RuntimeClass with a handler (kind {kind})")
            continue
        name, handler, pod_fixed, enabled = fields
        described = by_handler.get(handler)
        if described is not None:
            replaced.add(handler)
            if enabled and described.overhead_enabled and not _same_pod_fixed(pod_fixed, described.pod_fixed):
                notes.append(f"RuntimeClass {name}: the cluster has podFixed {_describe(pod_fixed)}, the values "
                             f"give {_describe(described.pod_fixed)}; the live object is what Kubernetes uses")
            live.append(replace(described, name=name, source="runtime-class",
                                pod_fixed=pod_fixed, overhead_enabled=enabled))
            continue
        shim = _shim_of_handler(handler, suffix)
        if shim is None:
            ignored.append(name)
            continue
        if shim in defaults.OUT_OF_SCOPE_SHIMS:
            notes.append(f"RuntimeClass {name}: {defaults.OUT_OF_SCOPE_SHIMS[shim]}; not audited")
            continue
        notes.append(f"RuntimeClass {name} (handler {handler}) is not described by the values; "
                     f"checked against shim {shim}'s shipped defaults (its drop-in, if any, is unknown)")
        live.append(_live_only_candidate(name, handler, shim, pod_fixed, enabled))
    if ignored:
        notes.append(f"RuntimeClasses without a Kata handler, not audited: {', '.join(ignored)}")

    from_values = [
        c for c in [*(shim_candidates if creates else []), *custom] if c.handler not in replaced
    ]
    return _run([*from_values, *live], notes, findings, policy_host_overheads(policies))


def audit_runtime_classes(runtime_classes: list[dict], managed_names: set[str]) -> list[Finding]:
    """Findings for live RuntimeClasses with a `kata-<shim>` handler that no policy manages,
    checked against that shim's shipped defaults (no values file is known)."""
    candidates = []
    for rc in runtime_classes:
        fields = _live_fields(rc)
        if fields is None:
            continue
        name, handler, pod_fixed, enabled = fields
        shim = _shim_of_handler(handler)
        if name in managed_names or shim is None or shim not in defaults.SHIMS:
            continue
        candidates.append(_live_only_candidate(name, handler, shim, pod_fixed, enabled))
    return _run(candidates, [], []).findings


def format_text(report: AuditReport) -> str:
    """One line per finding, then a table of the checked runtime classes."""
    lines = [f"{f.severity}: {f}" for f in report.findings]
    if lines:
        lines.append("")
    header = ("RUNTIMECLASS", "HANDLER", "SHIM", "RUNTIME", "PODFIXED", "DEFAULT_MEMORY", "OVERHEAD", "CGROUP_ONLY",
              "FINDINGS")
    rows = [header]
    for c in report.checked:
        count = sum(1 for f in report.findings if f.runtime_class == c.name and f.handler == c.handler)
        kata = c.kata
        overhead = "-"
        if kata and kata.overhead_memory_mib is not None and c.runtime is Runtime.RUST:
            vcpus = "-" if kata.overhead_vcpus is None else format_vcpus(kata.overhead_vcpus)
            overhead = f"{vcpus}/{kata.overhead_memory_mib}MiB"
        rows.append((
            c.name,
            c.handler,
            c.shim,
            c.runtime.value,
            f"{show_cpu(c.pod_fixed_cpu)}/{show_memory(c.pod_fixed_memory_bytes)}" if c.overhead_enabled else "none",
            f"{kata.default_memory_mib}MiB" if kata else "?",
            overhead,
            str(kata.sandbox_cgroup_only).lower() if kata else "?",
            str(count),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"{len(report.checked)} runtime classes checked: {len(report.errors)} errors, "
                 f"{len(report.warnings)} warnings")
    return "\n".join(bounded.printable(line) for line in lines) + "\n"
