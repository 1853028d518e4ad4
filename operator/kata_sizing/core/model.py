"""The KataSizingPolicy custom resource as pydantic v2 models: its spec, and reading a policy
(`parse_policy`, one line per problem with its path).

With `admissionspec` (spec.admission), `statusmodel` (what the operator writes) and `modelbase`
(the quantity types and the base model) these models are the single source of the CRD schema
(`python -m kata_sizing.core.crdgen`).
Quantities stay as the strings the user wrote (so a policy round-trips) and are checked
here; `sizing` parses them exactly with `quantity`.
"""

# No `from __future__ import annotations`: pydantic would compile and evaluate every field's
# annotation from its string when the models are built, on each CLI start.
from collections.abc import Sequence
from decimal import Decimal
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from . import bounded, defaults
from .admissionspec import (  # noqa: F401  (importable from the model as before)
    Admission,
    AdmissionAction,
    AdmissionNamespaces,
    LabelSelector,
    LabelSelectorRequirement,
)
from .defaults import Runtime
from .headroom import HeadroomThreshold
from .kubegrammar import (
    CONFIG_MAP_KEY,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    DNS_SUBDOMAIN_MAX_LENGTH,
    duplicate_tolerations,
    toleration_problems,
)
from .modelbase import (  # noqa: F401  (the API's names, importable from the model as before)
    API_VERSION,
    DECIMAL_PATTERN,
    GROUP,
    INT64_MAX,
    KIND,
    MAX_DECIMAL_CHARS,
    MAX_HANDLER_LENGTH,
    PLURAL,
    SHORT_NAME,
    VERSION,
    ApiModel,
    CpuQuantity,
    DecimalString,
    MemoryQuantity,
    Resources,
    as_quantity_text,
    check_labels,
    check_memory,
    described,
    format_decimal_error,
    yaml_boolean_hint,
)
from .quantity import cpu_cores, memory_bytes
from .rules import MAX_VCPUS
from .yamlout import reads_as_string_in_go


class Sample(ApiModel):
    """One survey row (docs/sizing-model.md): a VM of known size and what it could use."""

    container_limit_mib: int = Field(ge=0, description="The container's memory limit, MiB.")
    vm_nominal_mib: int = Field(gt=0, description="The VM's nominal memory, MiB.")
    free_total_mib: int = Field(ge=0, description="`total` of `free -m` inside the guest, MiB.")
    free_used_mib: int = Field(ge=0, description="`used` of `free -m` inside the guest (the guest daemons), MiB.")
    pod_cgroup_memory_current_bytes: int | None = Field(
        default=None, ge=0,
        description="The pod's host cgroup memory.current, bytes; gives the host side when set.",
    )


class SurveyRef(ApiModel):
    """A `kata-sizing survey` CSV kept in a ConfigMap (docs/measurement.md): the operator refits
    the overhead function from it and proposes the result in status; it never applies it."""

    config_map: str = Field(description="The ConfigMap's name.")
    namespace: str | None = Field(default=None, description="Its namespace. Default: spec.output.namespace.")
    key: str = Field(default="survey.csv", description="The key holding the CSV. Default: survey.csv.")

    @field_validator("config_map")
    @classmethod
    def _config_map_name(cls, value: str) -> str:
        if not DNS_SUBDOMAIN.fullmatch(value) or len(value) > DNS_SUBDOMAIN_MAX_LENGTH:
            raise ValueError(f"{value[:80]!r} is not a ConfigMap name (a DNS subdomain)")
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace_name(cls, value: str | None) -> str | None:
        if value is not None and (not DNS_LABEL.fullmatch(value) or len(value) > 63):
            raise ValueError(f"{value[:80]!r} is not a valid namespace name (a DNS label)")
        return value

    @field_validator("key")
    @classmethod
    def _key_name(cls, value: str) -> str:
        # k8s.io/apimachinery IsConfigMapKey: letters, digits, '-', '_', '.'; at most 253.
        if not CONFIG_MAP_KEY.fullmatch(value) or len(value) > 253 or value in (".", ".."):
            raise ValueError(f"{value[:80]!r} is not a ConfigMap key (letters, digits, '-', '_', '.')")
        return value


class Overhead(ApiModel):
    """The overhead function; unset fields take the shim family's defaults (defaults.py)."""

    guest_memory_base: MemoryQuantity | None = Field(
        default=None,
        description="Memory the guest keeps whatever its size (kernel, daemons). Default: per shim family.",
    )
    guest_memory_ratio: DecimalString | None = Field(
        default=None,
        description="Fraction of VM memory the workload cannot use, in [0, 0.9), as a string "
        "(\"0.14\"). Default: 0.14 (the survey's upper envelope).",
    )
    guest_cpu: CpuQuantity | None = Field(
        default=None, description="Guest CPU budget -> overhead_vcpus. Default: per shim family."
    )
    host_memory: MemoryQuantity | None = Field(
        default=None,
        description="Shim, VMM and virtiofsd outside the VM; above 0. Default: 50Mi.",
    )
    host_cpu: CpuQuantity | None = Field(
        default=None, description="Host-side CPU (shim, VMM threads) added to podFixed.cpu; above 0. Default: 50m."
    )
    margin: DecimalString | None = Field(
        default=None, description="Safety margin on the guest budget, at most 1.0. Default: \"0.10\"."
    )
    samples: list[Sample] | None = Field(
        default=None,
        description="Measured survey rows; when given, base and ratio are fitted from them.",
    )
    survey: SurveyRef | None = Field(
        default=None,
        description="A `kata-sizing survey` CSV in a ConfigMap: refitted and proposed in status.proposal, "
        "never applied (apply it by setting the proposed fields).",
    )

    @field_validator("guest_memory_ratio")
    @classmethod
    def _ratio_range(cls, value: str | None) -> str | None:
        if value is not None and not Decimal(value) < Decimal("0.9"):
            raise ValueError(f"{value} is not in [0, 0.9): the guest cannot lose 90% or more of the VM")
        return value

    @field_validator("host_memory")
    @classmethod
    def _host_memory_positive(cls, value: str | None) -> str | None:
        if value is not None and memory_bytes(value) == 0:
            raise ValueError("must be above 0: podFixed must stay above the guest budget")
        return value

    @field_validator("host_cpu")
    @classmethod
    def _host_cpu_positive(cls, value: str | None) -> str | None:
        if value is not None and cpu_cores(value) == 0:
            raise ValueError("must be above 0: podFixed.cpu must stay above overhead_vcpus")
        return value

    @field_validator("margin")
    @classmethod
    def _margin_range(cls, value: str | None) -> str | None:
        if value is not None and Decimal(value) > 1:
            raise ValueError(f"{value} is above 1.0 (a 100% margin); use a fraction such as 0.10")
        return value

    @field_validator("samples")
    @classmethod
    def _enough_samples(cls, value: list[Sample] | None) -> list[Sample] | None:
        if value is not None and len(value) < 2:
            raise ValueError("a fit needs at least two samples of different VM sizes")
        return value


class Fallback(ApiModel):
    """default_vcpus/default_memory: the VM of a pod without limits."""

    cpu: CpuQuantity = Field(
        default=defaults.FALLBACK_CPU, description="default_vcpus: whole vCPUs, at least 1."
    )
    memory: MemoryQuantity = Field(default=defaults.FALLBACK_MEMORY, description="default_memory.")

    @field_validator("cpu")
    @classmethod
    def _whole_vcpus(cls, value: str) -> str:
        cores = cpu_cores(value)
        if cores < 1 or cores != cores.to_integral_value():
            raise ValueError(f"{value} must be a whole number of vCPUs, at least 1 (default_vcpus)")
        return value


class SizeClass(ApiModel):
    """One size class: the largest pod it serves, and optional measured values."""

    name: str = Field(description="DNS label; RuntimeClass and handler <namePrefix>-<name>.")
    cpu: CpuQuantity = Field(description="Largest pod CPU limit this class serves.")
    memory: MemoryQuantity = Field(description="Largest pod memory limit this class serves.")
    overhead_vcpus: DecimalString | None = Field(
        default=None, description="Measured overhead_vcpus (Rust runtime), used as given and still validated."
    )
    overhead_memory: MemoryQuantity | None = Field(
        default=None, description="Measured overhead_memory (Rust runtime), used as given and still validated."
    )
    default_vcpus: int | None = Field(
        default=None, ge=1, description="Measured default_vcpus, used as given."
    )
    default_memory: MemoryQuantity | None = Field(
        default=None, description="Measured default_memory, used as given and still validated."
    )
    pod_fixed: Resources | None = Field(
        default=None,
        description="Measured RuntimeClass overhead.podFixed; must stay above overhead_* "
        "(Rust) or default_memory (Go).",
    )

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not DNS_LABEL.fullmatch(value) or len(value) > MAX_HANDLER_LENGTH:
            raise ValueError(
                f"{value!r} is not a DNS label (lower-case letters, digits and '-', "
                "starting and ending with a letter or digit)"
            )
        return value

    @field_validator("cpu")
    @classmethod
    def _cpu_fits_cel(cls, value: str) -> str:
        # The admission policies compare a pod's CPU with this envelope in CEL, whose integers
        # are int64: a larger literal makes the API server refuse them (docs/admission.md).
        millicores = cpu_cores(value) * 1000
        if millicores > INT64_MAX:
            raise ValueError(
                f"{value} is {int(millicores)} millicores; the admission policies compare CPU in int64 "
                f"millicores, at most {INT64_MAX}m")
        return value

    @field_validator("overhead_vcpus")
    @classmethod
    def _vcpus_kata_reads(cls, value: str | None) -> str | None:
        if value is not None and Decimal(value) > MAX_VCPUS:
            raise ValueError(f"{value} is above {MAX_VCPUS} vCPUs, the most a Kata drop-in is read with")
        return value

    @field_validator("memory")
    @classmethod
    def _memory_positive(cls, value: str) -> str:
        if memory_bytes(value) < 1024 * 1024:
            raise ValueError(f"{value} is below 1Mi: a class must serve pods with some memory")
        return value


class Toleration(ApiModel):
    """A toleration copied into each RuntimeClass's scheduling (core/v1 Toleration)."""

    key: str | None = Field(default=None, description="The taint key; empty with Exists matches all.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal (default).")
    value: str | None = Field(default=None, description="The taint value, for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="The taint effect to match; empty matches all."
    )
    toleration_seconds: int | None = Field(
        default=None, description="For NoExecute: how long the pod stays bound after the taint appears."
    )

    @model_validator(mode="after")
    def _kubernetes_accepts(self) -> "Toleration":
        # The RuntimeClass's scheduling.tolerations get ValidateTolerations on the API server.
        problems = toleration_problems(self.model_dump(by_alias=True))
        if problems:
            raise ValueError("; ".join(problems))
        return self


class RuntimeClassSpec(ApiModel):
    """The RuntimeClasses: names, scheduling and who creates them."""

    name_prefix: str | None = Field(
        default=None,
        description="RuntimeClass and handler names are <namePrefix>-<class>. Default: kata-<policy name>.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=lambda: dict(defaults.KATA_NODE_LABEL),
        description="scheduling.nodeSelector of each RuntimeClass. Default: katacontainers.io/kata-runtime=true.",
    )
    tolerations: list[Toleration] = Field(
        # A Python function, not `list`: pydantic reads the factory's signature, and for a
        # builtin that means compiling the tokenizer's patterns (~2 ms of every CLI start).
        default_factory=lambda: [], description="scheduling.tolerations of each RuntimeClass."
    )
    managed_by: Literal["Operator", "KataDeploy"] = Field(
        default="Operator",
        description="Operator: the operator creates RuntimeClasses. KataDeploy: the chart does, "
        "from the rendered values; the operator only guards their fields.",
    )

    _node_selector_labels = field_validator("node_selector")(check_labels)

    @field_validator("tolerations")
    @classmethod
    def _tolerations_unique(cls, value: list[Toleration]) -> list[Toleration]:
        for first, again in duplicate_tolerations([t.model_dump(by_alias=True) for t in value]):
            raise ValueError(f"tolerations[{again}] repeats tolerations[{first}] (the same key, operator, value and "
                             "effect); a RuntimeClass may not hold a toleration twice")
        return value

    @field_validator("name_prefix")
    @classmethod
    def _prefix_label(cls, value: str | None) -> str | None:
        if value is not None and not DNS_LABEL.fullmatch(value):
            raise ValueError(f"{value!r} is not a DNS label")
        return value


class Nodes(ApiModel):
    """The Kata nodes and their kubelet reservations, for the node guidance."""

    selector: dict[str, str] = Field(
        default_factory=lambda: dict(defaults.KATA_NODE_LABEL),
        description="Labels of the nodes the guidance covers. Default: katacontainers.io/kata-runtime=true.",
    )
    system_reserved: MemoryQuantity = Field(
        default=defaults.NODE_SYSTEM_RESERVED, description="KubeletConfiguration systemReserved.memory."
    )
    kube_reserved: MemoryQuantity = Field(
        default=defaults.NODE_KUBE_RESERVED, description="KubeletConfiguration kubeReserved.memory."
    )
    eviction_hard: MemoryQuantity = Field(
        default=defaults.NODE_EVICTION_HARD, description="evictionHard[memory.available]."
    )
    infra_pod_memory: str = Field(
        default="auto",
        description="auto: sum of non-Kata pod memory requests per node; or a quantity.",
        json_schema_extra={"x-kubernetes-int-or-string": True},
    )

    _selector_labels = field_validator("selector")(check_labels)

    @field_validator("infra_pod_memory", mode="before")
    @classmethod
    def _auto_or_quantity(cls, value: object) -> object:
        value = as_quantity_text(value)
        if isinstance(value, str) and value != "auto":
            check_memory(value)
        return value  # anything but a string fails the field's own str type check


class Output(ApiModel):
    """Where the ConfigMaps go."""

    namespace: str = Field(default="kata-sizing", description="Namespace of the ConfigMaps.")

    @field_validator("namespace")
    @classmethod
    def _namespace_label(cls, value: str) -> str:
        if not DNS_LABEL.fullmatch(value) or len(value) > 63:
            raise ValueError(f"{value!r} is not a valid namespace name (a DNS label)")
        return value


def _check_headroom_warning(text: str) -> str:
    HeadroomThreshold.parse(text)
    return text


class Measurement(ApiModel):
    """What the operator measures of this policy's pods on their nodes (docs/measurement.md)."""

    enabled: bool = Field(
        default=True, description="false: the operator reads no node's Summary for this policy's pods.")
    interval_seconds: int = Field(
        default=defaults.MEASUREMENT_INTERVAL_S, ge=defaults.MEASUREMENT_MIN_INTERVAL_S, le=3600,
        description="Each node running this policy's pods is read once per interval, nodes spread over "
        f"it. Default {defaults.MEASUREMENT_INTERVAL_S}; at least {defaults.MEASUREMENT_MIN_INTERVAL_S} "
        "(the kubelet refreshes its figures no faster).")
    window_seconds: int = Field(
        default=defaults.MEASUREMENT_WINDOW_S, ge=60, le=7 * 24 * 3600,
        description=f"The window of the overhead's p50/p99/max and the minimum headroom. Default "
        f"{defaults.MEASUREMENT_WINDOW_S}.")
    headroom_warning: str = Field(
        default=defaults.HEADROOM_WARNING, max_length=MAX_DECIMAL_CHARS,
        description="A pod whose headroom (cgroup limit - working set) falls under this is reported (Warning "
        "event, status, metric): a percentage of what its class's podFixed.memory holds beyond the guest budget "
        "(the host side's share, which no VM fills; 10%) or a memory quantity (64Mi). "
        f"Default {defaults.HEADROOM_WARNING}.")

    _headroom_warning = field_validator("headroom_warning")(_check_headroom_warning)

    @model_validator(mode="after")
    def _window_holds_an_interval(self) -> "Measurement":
        if self.window_seconds < self.interval_seconds:
            raise ValueError(f"windowSeconds {self.window_seconds} is shorter than intervalSeconds "
                             f"{self.interval_seconds}: a window must hold at least one reading")
        return self


class KataSizingPolicySpec(ApiModel):
    shim: str = Field(description="A kata-deploy shim name, used as baseConfig.")
    runtime: Literal["Rust", "Go"] | None = Field(
        default=None, description="Rust: VM = limits + overhead_*; Go: VM = default_memory + limits."
    )
    hypervisor: Literal[defaults.HYPERVISORS] | None = Field(  # type: ignore[valid-type]
        default=None, description="TOML section [hypervisor.<name>]; default from the shim."
    )
    sandbox_cgroup_only: bool = Field(
        default=defaults.SANDBOX_CGROUP_ONLY,
        description="sandbox_cgroup_only: put the shim and VMM in the pod's cgroup so podFixed is enforced.",
    )
    hugepages: bool = Field(
        default=False, description="enable_hugepages; with true, /dev/shm does not limit the VMs."
    )
    overhead: Overhead = Field(default_factory=Overhead)
    fallback: Fallback = Field(default_factory=Fallback)
    classes: list[SizeClass] | None = Field(
        default=None, description="Omitted: s, m, l, xl (see README for the envelopes)."
    )
    runtime_class: RuntimeClassSpec = Field(default_factory=RuntimeClassSpec)
    nodes: Nodes = Field(default_factory=Nodes)
    output: Output = Field(default_factory=Output)
    admission: Admission = Field(default_factory=Admission)
    measurement: Measurement = Field(default_factory=Measurement)
    drift_policy: Literal["Correct", "Report"] = Field(
        default="Correct",
        description="Correct: hand edits of managed objects are put back. Report: they are "
        "counted and announced as events only.",
    )

    @field_validator("shim")
    @classmethod
    def _known_shim(cls, value: str) -> str:
        if value in defaults.OUT_OF_SCOPE_SHIMS:
            raise ValueError(defaults.OUT_OF_SCOPE_SHIMS[value])
        if value in defaults.NOT_CHART_SHIMS:
            raise ValueError(
                f"{value!r} is not a shim of the kata-deploy chart, so a custom runtime "
                "cannot use it as baseConfig"
            )
        if value not in defaults.SHIMS:
            known = ", ".join(sorted(set(defaults.SHIMS) - defaults.NOT_CHART_SHIMS))
            raise ValueError(f"{value!r} is not a kata-deploy shim (one of: {known})")
        return value

    @field_validator("classes")
    @classmethod
    def _classes_consistent(cls, value: list[SizeClass] | None) -> list[SizeClass] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("must list at least one class, or be omitted for s/m/l/xl")
        seen: set[str] = set()
        for size_class in value:
            if size_class.name in seen:
                raise ValueError(f"class name {size_class.name!r} is used twice; names must be unique")
            seen.add(size_class.name)
        for smaller, larger in zip(value, value[1:]):
            if memory_bytes(larger.memory) <= memory_bytes(smaller.memory):
                raise ValueError(
                    f"class {larger.name!r} memory {larger.memory} is not above class "
                    f"{smaller.name!r} memory {smaller.memory}: envelopes must strictly increase"
                )
        return value

    @property
    def shim_info(self) -> defaults.ShimInfo:
        return defaults.SHIMS[self.shim]

    @property
    def effective_runtime(self) -> Runtime:
        return Runtime(self.runtime) if self.runtime else self.shim_info.runtime

    @property
    def effective_hypervisor(self) -> str:
        return self.hypervisor or self.shim_info.hypervisor

    @property
    def effective_classes(self) -> list[SizeClass]:
        if self.classes is not None:
            return list(self.classes)
        return [SizeClass(name=c.name, cpu=c.cpu, memory=c.memory) for c in defaults.DEFAULT_CLASSES]


class ObjectMeta(BaseModel):
    """The part of metadata kata-sizing reads; everything else passes through."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    uid: str | None = None
    generation: int | None = None

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not DNS_LABEL.fullmatch(value) or len(value) > 63:
            raise ValueError(
                f"{value!r} is not a DNS label; the policy name is used in ConfigMap and "
                "RuntimeClass names"
            )
        return value



class KataSizingPolicy(ApiModel):
    api_version: Literal["katasizing.dev/v1alpha1"] = API_VERSION
    kind: Literal["KataSizingPolicy"] = KIND
    metadata: ObjectMeta
    spec: KataSizingPolicySpec
    # Always None once parsed: status is the operator's output (KataSizingPolicyStatus).
    status: None = None

    @model_validator(mode="after")
    def _names_fit(self) -> "KataSizingPolicy":
        prefix = self.runtime_class_prefix
        source = (
            "spec.runtimeClass.namePrefix" if self.spec.runtime_class.name_prefix
            else f"metadata.name (the default prefix is kata-{self.metadata.name})"
        )
        for size_class in self.spec.effective_classes:
            name = f"{prefix}-{size_class.name}"
            if len(name) > MAX_HANDLER_LENGTH:
                raise ValueError(
                    f"{source}: RuntimeClass/handler {name!r} is {len(name)} characters; "
                    "a handler is a DNS label of at most 63"
                )
            if not reads_as_string_in_go(name):
                # kata-deploy reads the handler as plain YAML text: 2024-01-02 would be a date,
                # 1e-5 a number (go-yaml, Helm's reader).
                raise ValueError(
                    f"{source}: RuntimeClass/handler {name!r} would read as a number or date "
                    "in YAML; start the prefix with a letter"
                )
        return self

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def runtime_class_prefix(self) -> str:
        return self.spec.runtime_class.name_prefix or f"kata-{self.metadata.name}"


def _key_text(key: object) -> str:
    # A user's key may hold a newline or control character; each problem must stay one line.
    text = str(key)
    return text if text.isprintable() and text.strip() == text and text else repr(key)


# pydantic's error types -> what the CRD's structural schema says the field is.
_TYPE_ERRORS = {
    "bool_type": ("true or false", "boolean"),
    "int_type": ("a whole number", "integer"),
    "string_type": ("a string", "string"),
    "dict_type": ("a mapping", "object"),
    "model_type": ("a mapping", "object"),
    "model_attributes_type": ("a mapping", "object"),
    "list_type": ("a list", "array"),
}


def _type_message(error_type: str, value: object) -> str:
    """A type the API server refuses, said the way its structural schema says it, with the
    value as YAML gave it and how to write what was meant."""
    wanted, schema_type = _TYPE_ERRORS[error_type]
    message = f"must be {wanted} (the CRD's type {schema_type}), not {described(value)}"
    if schema_type == "string":
        if isinstance(value, bool):
            return message + yaml_boolean_hint(value)
        if isinstance(value, (int, float)):
            return message + "; YAML reads it as a number: quote it"
    if schema_type == "boolean" and isinstance(value, str) and value.lower() in ("true", "false"):
        return message + f"; write {value.lower()} without quotes"
    if schema_type == "integer" and isinstance(value, str) and value.strip().lstrip("+-").isascii() \
            and value.strip().lstrip("+-").isdigit():
        return message + f"; write {value.strip()} without quotes"
    return message


def validation_problems(exc: ValidationError, root: str = "") -> list[tuple[str, str]]:
    """(field path, message) per problem: `("spec.classes[1].memory", <rule>)`."""
    located = []
    for error in exc.errors(include_url=False):
        path = root
        for part in error["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
            elif part.startswith("function-") or part in ("str", "int", "bool"):
                continue
            else:
                path += f".{_key_text(part)}" if path else _key_text(part)
        message = error["msg"]
        for prefix in ("Value error, ", "Assertion failed, "):
            if message.startswith(prefix):
                message = message[len(prefix):]
        if error["type"] == "extra_forbidden":
            message = "unknown field (not part of KataSizingPolicy)"
        elif error["type"] == "missing":
            message = "required field is missing"
        elif error["type"] in _TYPE_ERRORS:
            message = _type_message(error["type"], error.get("input"))
        located.append((path or "(policy)", message))
    return located


def format_validation_error(exc: ValidationError, root: str = "") -> list[str]:
    """One line per problem: `spec.classes[1].memory: <rule>`."""
    return [f"{path}: {message}" for path, message in validation_problems(exc, root)]


class PolicyError(ValueError):
    """A policy that is not valid; `problems` holds one line per violated rule, `located` the
    same as (source, field path, message) where the field is known ("" where it is not)."""

    def __init__(self, problems: list[str], located: list[tuple[str, str, str]] | None = None):
        super().__init__("; ".join(problems))
        self.problems = problems
        self.located = located if located is not None else [("", "(policy)", p) for p in problems]

    @classmethod
    def at(cls, located: list[tuple[str, str, str]]) -> "PolicyError":
        return cls([": ".join(part for part in entry if part) for entry in located], located)


def policy_set_problems(policies: Sequence[tuple[str, "KataSizingPolicy"]]) -> list[tuple[str, str, str]]:
    """Policies applied together (one file, or the files of one command), as (source, path,
    message): two of one name would replace each other, and two that name the same RuntimeClass
    (an explicit namePrefix equal to another's default included) would fight over it."""
    problems = []
    names: dict[str, str] = {}
    owners: dict[str, tuple[str, str, str]] = {}
    for source, policy in policies:
        if policy.name in names:
            problems.append((source, "metadata.name", f"a policy named {policy.name!r} is already in "
                             f"{names[policy.name]}; names must be unique"))
            continue
        names[policy.name] = source
        field = "spec.runtimeClass.namePrefix" if policy.spec.runtime_class.name_prefix else "metadata.name"
        for size_class in policy.spec.effective_classes:
            runtime_class = f"{policy.runtime_class_prefix}-{size_class.name}"
            if runtime_class in owners:
                other_source, other, other_class = owners[runtime_class]
                problems.append((source, field, (
                    f"RuntimeClass {runtime_class} (class {size_class.name}) is also RuntimeClass {runtime_class} of "
                    f"policy {other!r} (class {other_class}, {other_source}): the two policies would overwrite "
                    "each other's RuntimeClass and kata-deploy runtime; change a namePrefix or a class name")))
            else:
                owners[runtime_class] = (source, policy.name, size_class.name)
    return problems


def parse_policy(document: object) -> KataSizingPolicy:
    """A KataSizingPolicy from a parsed YAML/JSON document or a live object's body."""
    if not isinstance(document, dict):
        raise PolicyError.at([("", "(policy)", f"expected a mapping (a KataSizingPolicy), got {type(document).__name__}")])
    body = {key: document[key] for key in ("apiVersion", "kind", "metadata", "spec", "status") if key in document}
    unknown = sorted(set(document) - set(body), key=str)
    if isinstance(body.get("metadata"), dict):
        # Live objects carry server fields (managedFields, resourceVersion...); keep what we read.
        meta = body["metadata"]
        body["metadata"] = {k: meta[k] for k in ("name", "uid", "generation") if k in meta}
    # Status is the operator's to write; a stale or hand-edited one must not invalidate the spec.
    body.pop("status", None)
    try:
        # Bodies from the API server or a review are parsed already: bound what is read of them
        # here too (not the status and managedFields a live body carries, which nothing reads).
        bounded.check_structure({**body, **{key: document[key] for key in unknown}}, "(policy)")
    except bounded.InputError as exc:
        raise PolicyError.at([("", "(policy)", str(exc).removeprefix("(policy): "))]) from None
    problems = [("", _key_text(key), "unknown top-level field") for key in unknown]
    try:
        policy = KataSizingPolicy.model_validate(body)
    except ValidationError as exc:
        raise PolicyError.at(problems + [("", path, message) for path, message in validation_problems(exc)]) from None
    if problems:
        raise PolicyError.at(problems)
    return policy
