"""The filter's criteria, declared once: name, what each reads, its annotations, and its check.

A ``Criterion`` says what it is called (the ``criterion`` label of the rejection metric, explain's
reasons), the ``Unit`` fields it reads and whether they change often (a temperature) or rarely (a
model), the pod annotations it reads with their parsing, and, for a per-unit criterion, its
check: a function of (unit, job) returning a reason or None. From these declarations come:

- ``ANNOTATIONS``: every pod annotation ``parse_pod`` knows (unknown-key detection, the
  reference's table); a declared annotation's parsed value is ``job.req.value(key)``;
- ``UNIT_CRITERIA``: the per-unit checks ``core.filter`` runs on each device, in this order;
- ``CRITERION_NAMES``: the names the metrics pre-create and explain reports;
- ``OFTEN_CHANGING_UNIT_FIELDS``: unit fields the equivalence layer leaves out of its keys
  (``served.equivalence``), so that a changing temperature never splits the node classes; a job a
  criterion over them applies to (``per_node_fields``) is decided node by node on those fields.

Adding a criterion is one ``Criterion`` in ``CRITERIA`` (and the ``Unit`` field it reads, when
new: ``core.devices`` copies a field named as the inventory's GPU field): docs/design.md,
"Adding a criterion".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Hashable, Literal

from scheduler_extender.core.annotations import BUILTIN_ANNOTATIONS, PREFIX, Annotation
from scheduler_extender.core.devices import Unit
from scheduler_extender.core.job import Job
from scheduler_extender.core.quantity import fmt_gib_below
from scheduler_extender.core.requirements import A_EXCLUDE, A_MIN_CC, A_MODELS, A_REQUIRE

UnitCheck = Callable[[Unit, Job], "str | None"]


@dataclass(frozen=True)
class Reads:
    """A field a criterion reads: a ``Unit`` field (``unit.<name>``) or the node's (``node.<name>``,
    a ``NodeState`` or allocation field), and how often its value changes on a node: ``rarely``
    (a model, a topology: part of the equivalence keys) or ``often`` (a temperature: never a key;
    the criterion is evaluated on each node's own value)."""

    field: str
    changes: Literal["rarely", "often"] = "rarely"


@dataclass(frozen=True)
class Criterion:
    """One filter criterion (module docstring).

    Attributes:
        name: stable identifier: metric label, explain's ``criterion``.
        summary: what it rejects, one line (the reference's table).
        reads: the fields it reads (``Reads``).
        annotations: the pod annotations it declares (with ``parse``), read as ``job.req.value(key)``.
        check: per-unit criteria: (unit, job) -> reason or None; None for node criteria, which
            ``core.filter`` composes itself (inventory, counts, free devices, NVLink, sharing).
    """

    name: str
    summary: str
    reads: tuple[Reads, ...] = ()
    annotations: tuple[Annotation, ...] = ()
    check: UnitCheck | None = None

    def applies(self, job: Job) -> bool:
        """Whether the criterion can reject anything for ``job``: always, unless it reads
        annotations of its own, which the pod must then give."""
        declared = [a.key for a in self.annotations if a.parse is not None]
        return not declared or any(job.req.value(k) is not None for k in declared)


def _unit(*names: str, often: bool = False) -> tuple[Reads, ...]:
    return tuple(Reads("unit." + n, "often" if often else "rarely") for n in names)


# Criterion names: stable identifiers used in metrics labels and `gpuplace explain`.
C_ANNOTATION = "annotation"
C_INVENTORY = "inventory"
C_RESOURCE = "resource"
C_HEALTHY = "healthy"
C_RUNTIME = "runtime"
C_MODEL = "model-allowed"
C_CLASS = "class-allowed"
C_CC = "compute-capability"
C_VRAM = "vram"
C_ECC = "ecc"
C_DEVICE_KIND = "device-kind"
C_COUNT = "gpu-count"
C_FREE = "free-gpus"
C_NVLINK = "nvlink"
C_TENANT = "tenant-allowed"
C_SHARED = "shared-gpu"
C_TEMPERATURE = "gpu-temperature"


def check_healthy(unit: Unit, job: Job) -> str | None:
    """An unhealthy GPU (retired pages, double-bit ECC errors, XID, agent error) never counts."""
    return None if unit.healthy else f"unhealthy ({unit.health_reason or 'reported by the agent'})"


def check_runtime(unit: Unit, job: Job) -> str | None:
    """CUDA jobs need NVIDIA GPUs, ROCm jobs AMD GPUs; ``any`` runs on both."""
    runtime = job.req.runtime
    if runtime == "cuda" and unit.vendor != "nvidia":
        return f"{unit.model} is {unit.vendor.upper()}; a CUDA job needs NVIDIA GPUs (gpuplace.io/runtime)"
    if runtime == "rocm" and unit.vendor != "amd":
        return f"{unit.model} is NVIDIA; a ROCm job needs AMD GPUs (gpuplace.io/runtime)"
    return None


def check_model_allowed(unit: Unit, job: Job) -> str | None:
    """The pod's ``gpu-models`` allowlist and ``exclude-gpu-models``, by catalog id (exact tokens)."""
    req = job.req
    model_id = unit.entry.id if unit.entry else None
    if req.allowed_models is not None and model_id not in req.allowed_models:
        return f"{unit.model} not in {A_MODELS} ({req.allowed_models_text})"
    if model_id is not None and model_id in req.excluded_models:
        return f"{unit.model} excluded by {A_EXCLUDE} ({req.excluded_models_text})"
    return None


def check_class_allowed(unit: Unit, job: Job) -> str | None:
    """The size class's models (full GPUs) and MIG profiles, from the policy."""
    cls = job.size_class
    if unit.kind == "mig":
        if not cls.mig_allowed:
            return f"MIG devices are not used by class {cls.name} (policy)"
        if cls.allowed_mig_profiles and unit.mig_profile not in cls.allowed_mig_profiles:
            return f"MIG profile {unit.mig_profile} not allowed for class {cls.name} (policy)"
        return None
    model_id = unit.entry.id if unit.entry else None
    if job.class_allowed_models is not None and model_id not in job.class_allowed_models:
        return f"{unit.model} not allowed for class {cls.name} (policy allowedModels)"
    if model_id is not None and model_id in job.class_denied_models:
        return f"{unit.model} is kept for larger jobs; this pod is class {cls.name} (policy deniedModels)"
    return None


def check_tenant_allowed(unit: Unit, job: Job) -> str | None:
    """The namespace's entitlement (policy ``tenants``): models, for full GPUs and MIG devices alike.

    A MIG device is its parent GPU's model: keeping H100s for one team keeps their slices too.
    """
    grant = job.tenancy
    why = grant.model_denial(unit.entry.id if unit.entry else None)
    if why is None:
        return None
    return f"{unit.model} not entitled to namespace {grant.namespace}: {grant.rule} {why}"


def check_compute_capability(unit: Unit, job: Job) -> str | None:
    """``min-compute-capability`` and what an *annotated* precision needs (bf16 8.0, fp8 8.9,
    fp6 and fp4 10.0: ``PRECISION_MIN_CC``).

    The default precision, used only for the estimate, imposes nothing. On AMD GPUs a precision
    is checked against the catalog's native precisions; a CUDA compute capability is unmet.
    """
    req = job.req
    if unit.vendor == "amd":
        if req.min_compute_capability is not None:
            return f"{unit.model} has no CUDA compute capability ({A_MIN_CC})"
        if req.precision and unit.entry is not None and req.precision not in unit.entry.precisions:
            return f"{unit.model} has no native {req.precision}"
        if req.precision and unit.entry is None:
            return f"{unit.model}: {req.precision} support unknown (not in the catalog)"
        return None
    need = req.required_cc()
    if need is None:
        return None
    (major, minor), why = need
    why_text = f"for {why}" if why != A_MIN_CC else f"by {A_MIN_CC}"
    if unit.compute_capability is None:
        return f"compute capability unknown, {major}.{minor} needed {why_text}"
    if unit.compute_capability < (major, minor):
        have = ".".join(map(str, unit.compute_capability))
        return f"compute capability {have} < {major}.{minor} needed {why_text}"
    return None


def check_vram(unit: Unit, job: Job) -> str | None:
    """The unit's VRAM (a full GPU's or a MIG device's) covers the need per GPU."""
    if job.vram is None or unit.memory_bytes >= job.vram.bytes_per_gpu:
        return None
    (have,), need = fmt_gib_below([unit.memory_bytes], job.vram.bytes_per_gpu)
    return f"{have} VRAM < {job.vram.describe(need)}"


def check_ecc(unit: Unit, job: Job) -> str | None:
    """``require: ecc``: ECC must be on; unknown ECC state does not satisfy a requirement."""
    if "ecc" not in job.req.require:
        return None
    if unit.ecc_enabled is None:
        return f"ECC state unknown ({A_REQUIRE}: ecc)"
    return None if unit.ecc_enabled else f"ECC off ({A_REQUIRE}: ecc)"


def check_device_kind(unit: Unit, job: Job) -> str | None:
    """``require: full-gpu`` / ``require: mig``."""
    if "full-gpu" in job.req.require and unit.kind == "mig":
        return f"MIG device {unit.mig_profile}, not a full GPU ({A_REQUIRE}: full-gpu)"
    if "mig" in job.req.require and unit.kind == "gpu":
        return f"full GPU, not a MIG device ({A_REQUIRE}: mig)"
    return None


A_MAX_TEMPERATURE = PREFIX + "max-gpu-temperature-c"
MAX_TEMPERATURE_C = 150
"""Highest limit accepted, degrees Celsius: above any GPU's shutdown temperature (NVML's
``NVML_TEMPERATURE_THRESHOLD_SHUTDOWN`` is about 90-105 C on data-center GPUs)."""
_CELSIUS = re.compile(r"^[0-9]{1,3}$", re.ASCII)


def parse_celsius(text: str) -> int:
    """'80' -> 80: whole degrees Celsius, 1 to ``MAX_TEMPERATURE_C``. Raises ValueError."""
    if not _CELSIUS.match(text) or not 1 <= int(text) <= MAX_TEMPERATURE_C:
        raise ValueError(text)
    return int(text)


def check_gpu_temperature(unit: Unit, job: Job) -> str | None:
    """``gpuplace.io/max-gpu-temperature-c``: the GPU (a MIG device: its parent) is no hotter than
    the limit when the agent last observed it (``Unit.temperature_c``, NVML's
    ``nvmlDeviceGetTemperature``, ``NVML_TEMPERATURE_GPU``); an unknown temperature does not
    satisfy a limit."""
    limit = job.req.value(A_MAX_TEMPERATURE)
    if limit is None:
        return None
    if unit.temperature_c is None:
        return f"GPU temperature unknown ({A_MAX_TEMPERATURE}: {limit})"
    if unit.temperature_c > limit:  # type: ignore[operator]  # parse_celsius: an int
        return f"{unit.temperature_c} °C > {limit} °C ({A_MAX_TEMPERATURE})"
    return None


CRITERIA: tuple[Criterion, ...] = (
    Criterion(C_ANNOTATION, "a gpuplace.io annotation or a resource request cannot be used (every node fails)"),
    Criterion(C_INVENTORY, "no GPU inventory, an invalid one, or one older than the policy allows",
              (Reads("node.view"),)),
    Criterion(C_RESOURCE, "the node offers none of the requested GPU resource", (Reads("node.view"),)),
    # Per-unit criteria, in check order (a rejection's reasons follow it).
    Criterion(C_HEALTHY, "an unhealthy GPU (retired pages, ECC errors, XID) never counts",
              _unit("healthy", "health_reason"), check=check_healthy),
    Criterion(C_RUNTIME, "CUDA jobs need NVIDIA GPUs, ROCm jobs AMD GPUs", _unit("vendor"), check=check_runtime),
    Criterion(C_MODEL, "the pod's gpu-models and exclude-gpu-models", _unit("entry"), check=check_model_allowed),
    Criterion(C_CLASS, "the size class's models and MIG profiles (policy)", _unit("kind", "mig_profile", "entry"),
              check=check_class_allowed),
    Criterion(C_TENANT, "the namespace's entitlement (policy tenants)", _unit("entry"), check=check_tenant_allowed),
    Criterion(C_CC, "min-compute-capability and what an annotated precision needs",
              _unit("vendor", "compute_capability", "entry"), check=check_compute_capability),
    Criterion(C_VRAM, "the device's VRAM covers the need per GPU", _unit("memory_bytes"), check=check_vram),
    Criterion(C_ECC, "require: ecc", _unit("ecc_enabled"), check=check_ecc),
    Criterion(C_DEVICE_KIND, "require: full-gpu / require: mig", _unit("kind", "mig_profile"), check=check_device_kind),
    # Node criteria after the per-unit ones (core.filter composes them).
    Criterion(C_COUNT, "fewer devices (or eligible devices) than requested", (Reads("node.view"),)),
    Criterion(C_FREE, "too few eligible devices free now (resolvable: preemption may free them)",
              (Reads("node.allocation"),)),
    Criterion(C_NVLINK, "require: nvlink: no group of the requested size all joined by NVLink",
              _unit("nvlink_peers") + (Reads("node.allocation"),)),
    Criterion(C_SHARED, "a GPU the device plugin shares: class may share, one replica, VRAM left on the GPUs "
                        "the plugin may hand out", _unit("memory_bytes") + (Reads("node.allocation"),)),
    Criterion(C_TEMPERATURE, "GPUs hotter than the pod's limit (unknown temperature fails a limit)",
              _unit("temperature_c", often=True),
              (Annotation(A_MAX_TEMPERATURE, f"whole degrees Celsius from 1 to {MAX_TEMPERATURE_C}, e.g. 80",
                          "the hottest GPU the pod may get, as the node agent last observed it",
                          (C_TEMPERATURE,), parse_celsius),),
              check=check_gpu_temperature),
)
"""Every criterion, in the order reasons are reported."""

CRITERION_NAMES: tuple[str, ...] = tuple(c.name for c in CRITERIA)

UNIT_CRITERIA: tuple[tuple[str, UnitCheck], ...] = tuple((c.name, c.check) for c in CRITERIA if c.check is not None)
"""Every per-unit criterion, in check order: (name, check)."""

ANNOTATIONS: tuple[Annotation, ...] = BUILTIN_ANNOTATIONS + tuple(a for c in CRITERIA for a in c.annotations)
"""Every pod annotation: the built-in ones (``core.annotations``), then those criteria declare."""

OFTEN_CHANGING_UNIT_FIELDS: frozenset[str] = frozenset(
    r.field.removeprefix("unit.") for c in CRITERIA for r in c.reads if r.changes == "often" and r.field.startswith("unit."))
"""``Unit`` fields some criterion declares as changing often: never part of an equivalence key."""

_PER_NODE = tuple(c for c in CRITERIA if any(r.changes == "often" for r in c.reads))
for _c in _PER_NODE:  # per_node_fields sees a job through its declared annotations only
    if not any(a.parse is not None for a in _c.annotations) or not all(
            r.field.startswith("unit.") for r in _c.reads if r.changes == "often"):
        raise ImportError(f"criterion {_c.name}: a criterion over often-changing fields reads unit. fields and "
                          "declares an annotation with parse (docs/design.md, 'Adding a criterion')")


def per_node_fields(job: Job) -> tuple[str, ...]:
    """The often-changing ``Unit`` fields read by criteria that apply to ``job``: what a verdict
    kept for a class of nodes (or of units) cannot stand for, so those are decided on each
    node's own values. Empty for almost every job (no such annotation)."""
    if not job.req.declared:  # every criterion over often-changing fields reads an annotation
        return ()
    return tuple(sorted({r.field.removeprefix("unit.") for c in _PER_NODE if c.applies(job)
                         for r in c.reads if r.changes == "often"}))
