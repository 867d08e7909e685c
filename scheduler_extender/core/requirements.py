"""What a pod asks for: its GPU request and its ``gpuplace.io/*`` annotations
(docs/user-guide.md#asking-for-gpus-pod-annotations).

``parse_pod`` reads a pod (the JSON of a ``v1.Pod``, as kube-scheduler sends it) into
``JobRequirements``. Nothing is guessed: an annotation that cannot be parsed becomes an
``AnnotationError`` naming the annotation and the accepted form, and the filter fails every node
with it, so ``kubectl describe pod`` tells the user what to fix.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Sequence

from scheduler_extender.core.annotations import BUILTIN_ANNOTATIONS, PREFIX, Annotation
from scheduler_extender.core.catalog import Catalog, UnknownModelError
from scheduler_extender.core.pod import SHOWN_CHARS, FieldError, Pod, PodShapeError, as_pod, cut, shown  # noqa: F401 - SHOWN_CHARS, cut: re-exported
from scheduler_extender.core.pod_requests import AMD_GPU, MIG_PREFIX, NVIDIA_GPU, pod_requests
from scheduler_extender.core.quantity import QuantityError, parse_quantity

A_PARAMS = PREFIX + "model-params"
A_WORKLOAD = PREFIX + "workload"
A_PRECISION = PREFIX + "precision"
A_SHARDING = PREFIX + "sharding"
A_VRAM = PREFIX + "vram"
A_MODELS = PREFIX + "gpu-models"
A_EXCLUDE = PREFIX + "exclude-gpu-models"
A_MIN_CC = PREFIX + "min-compute-capability"
A_REQUIRE = PREFIX + "require"
A_PREFER = PREFIX + "prefer"
A_RUNTIME = PREFIX + "runtime"
A_CLASS = PREFIX + "class"
A_FRACTION = PREFIX + "gpu-fraction"
KNOWN_ANNOTATIONS = frozenset(a.key for a in BUILTIN_ANNOTATIONS)
"""The keys ``parse_pod`` reads itself (``core.annotations``); criteria may declare more
(``core.criteria.ANNOTATIONS`` is every known key)."""

_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-((?:\d{1,2}c\.)?\d{1,2}g\.\d{1,4}gb)((?:[.-][a-z]{1,8}){0,3})$", re.ASCII)


def mig_resource_name(profile: str) -> str:
    """The extended resource the NVIDIA device plugin (``mixed`` strategy) advertises for MIG
    devices of an NVML profile name: ``nvidia.com/mig-`` + the profile with ``+`` turned into
    ``.`` (k8s-device-plugin ``internal/rm``): ``3g.40gb`` -> ``nvidia.com/mig-3g.40gb``,
    ``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me``, ``1g.24gb+gfx`` -> ``...mig-1g.24gb.gfx``,
    Blackwell's ``1g.23gb-me`` unchanged, a compute instance ``1c.3g.40gb`` -> ``...mig-1c.3g.40gb``."""
    return MIG_PREFIX + profile.replace("+", ".")


def mig_profile_of(resource: str) -> str | None:
    """The NVML profile name behind a MIG resource name (``mig_resource_name`` reversed: the first
    ``.`` after ``gb`` was a ``+``); None when ``resource`` is not a MIG resource name."""
    m = _MIG_RESOURCE.match(resource)
    if m is None:
        return None
    suffix = m.group(2)
    if suffix.startswith("."):
        suffix = "+" + suffix[1:]
    return m.group(1) + suffix

WORKLOADS = ("training", "finetune-lora", "inference")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp6", "fp4", "int8", "int4")
SHARDINGS = ("none", "zero1", "zero2", "zero3", "fsdp")
CONSTRAINTS = ("nvlink", "ecc", "full-gpu", "mig")
RUNTIMES = ("cuda", "rocm", "any")

PRECISION_MIN_CC: dict[str, tuple[int, int]] = {
    "bf16": (8, 0), "tf32": (8, 0), "fp8": (8, 9), "fp6": (10, 0), "fp4": (10, 0),
}
"""Compute capability an explicitly annotated precision needs on NVIDIA GPUs: BF16 and TF32
tensor cores arrived with Ampere (8.0), FP8 with Ada/Hopper (8.9) (NVIDIA CUDA C++ Programming
Guide, "Compute Capabilities"; Ampere and Ada architecture whitepapers), FP6 and FP4 with Blackwell
(10.0 for B200/GB200, 10.3 for B300/GB300, 12.0 for the RTX 50 series and RTX PRO Blackwell): the
PTX ISA's e2m3/e3m2 (FP6) and e2m1 (FP4) MMA types need sm_100a or sm_120a and later, and no GPU
of compute capability 9.x or below has them."""

_FRACTION = re.compile(r"^(?:0?\.[0-9]{1,6}|1(?:\.0{1,6})?|0)$", re.ASCII)
# A share of one GPU: a decimal in (0, 1], at most six decimals (a millionth of a GPU is below any
# VRAM need that matters; the share is counted in thousandths, rounded up).

_PARAMS = re.compile(r"^([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT])?$", re.ASCII)
# Major and minor of a compute capability: a few ASCII digits each (int() of thousands of digits
# is slow, and past Python's 4,300-digit limit it raises).
_CC = re.compile(r"\s*([0-9]{1,3})\.([0-9]{1,3})\s*", re.ASCII)
_PARAM_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


MAX_VALUE_CHARS = 4096
"""Longest ``gpuplace.io/`` annotation value parsed. The longest a user needs is a list of GPU models
(every id and alias the catalog knows, comma-separated, is under 1,000 characters); a longer value is
refused unread, so its size cannot make a request's parsing cost more (Kubernetes allows 256 KiB of
annotations in all)."""

UNKNOWN_KEYS_NAMED = 3
"""How many unknown ``gpuplace.io/`` keys of one pod a reason names (the rest are counted), so that
a pod with thousands of them costs a few nearest-key look-ups, not thousands."""


def _unknown_keys(keys: list[str], known: frozenset[str]) -> list[AnnotationError]:
    """An error per key not in ``known`` (the first :data:`UNKNOWN_KEYS_NAMED`, sorted), naming
    the nearest known key (``difflib``'s ratio >= 0.6) or, without one, all of them."""
    unknown = sorted(k for k in keys if k not in known)
    errors = []
    for key in unknown[:UNKNOWN_KEYS_NAMED]:
        near = difflib.get_close_matches(key, sorted(known), n=1)
        hint = (f"did you mean {near[0]}?" if near
                else f"the pod annotations are {', '.join(sorted(known))}")
        errors.append(AnnotationError(cut(key), f"not a gpuplace.io pod annotation; {hint}"))
    if len(unknown) > UNKNOWN_KEYS_NAMED:
        errors.append(AnnotationError(PREFIX + "*", f"{len(unknown) - UNKNOWN_KEYS_NAMED} more unknown gpuplace.io/ keys"))
    return errors


AnnotationError = FieldError
"""One unusable pod field (``core.pod.FieldError``): an annotation, or a resource request."""


@dataclass(frozen=True)
class JobRequirements:
    """A pod's GPU needs, as parsed. ``None`` means the pod did not say."""

    namespace: str
    name: str
    resource: str | None  # nvidia.com/gpu, amd.com/gpu, nvidia.com/mig-<profile>; None: no GPU
    gpu_count: int
    mig_profile: str | None = None
    params: float | None = None
    workload: str | None = None
    precision: str | None = None
    sharding: str | None = None
    vram_bytes: int | None = None
    allowed_models: frozenset[str] | None = None  # catalog ids
    allowed_models_text: str = ""
    excluded_models: frozenset[str] = frozenset()
    excluded_models_text: str = ""
    min_compute_capability: tuple[int, int] | None = None
    require: frozenset[str] = frozenset()
    prefer: frozenset[str] = frozenset()
    runtime: str = "cuda"
    runtime_explicit: bool = False
    class_name: str | None = None
    has_annotations: bool = False
    gpu_fraction_milli: int | None = None  # gpuplace.io/gpu-fraction, thousandths of one GPU
    cpu_milli: int | None = None  # the pod's CPU request, millicores (core.pod_requests); None: unknown
    memory_bytes: int | None = None  # ... and memory request, bytes
    declared: tuple[tuple[str, Hashable], ...] = ()
    """(key, parsed value) of the annotations criteria declare (``core.criteria``), in declaration
    order; only those the pod gives and that parsed. Read with ``value``."""
    errors: tuple[AnnotationError, ...] = field(default=())

    def value(self, key: str) -> Hashable | None:
        """The parsed value of the declared annotation ``key``; None when the pod does not give it."""
        for k, v in self.declared:
            if k == key:
                return v
        return None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def wants_gpu(self) -> bool:
        return self.resource is not None and self.gpu_count > 0

    def required_cc(self) -> tuple[tuple[int, int], str] | None:
        """The highest compute capability this job needs and why, or None."""
        needs: list[tuple[tuple[int, int], str]] = []
        if self.min_compute_capability:
            needs.append((self.min_compute_capability, A_MIN_CC))
        if self.precision in PRECISION_MIN_CC:
            needs.append((PRECISION_MIN_CC[self.precision], f"{self.precision}"))
        return max(needs) if needs else None


def pod_gpu_requests(pod: Pod | Mapping[str, Any]) -> tuple[dict[str, int], list[AnnotationError]]:
    """GPU resources a pod requests, ``{resource: count}``, and the unusable request values, by
    Kubernetes' arithmetic (``core.pod_requests``: containers and sidecars summed, the max with
    each regular init container, plus overhead)."""
    r = pod_requests(pod)
    return dict(r.gpu), list(r.errors)


def pod_host_requests(pod: Pod | Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(CPU millicores, memory bytes) a pod requests, as kube-scheduler's NodeResourcesFit counts
    them (``core.pod_requests``); None where nothing in the pod names it or a value is unusable
    (unknown, never 0)."""
    r = pod_requests(pod)
    return r.cpu_milli, r.memory_bytes


MAX_PARAMS = 1e15
"""Largest parameter count accepted (1000T; the largest published models have ~2T). Beyond it,
e.g. '1E310' (infinite as a float), there is no VRAM estimate to make."""


def parse_params(text: str) -> float:
    """'7B' -> 7e9, '350M' -> 3.5e8, '1.3e9' -> 1.3e9. Raises ValueError (also beyond ``MAX_PARAMS``)."""
    m = _PARAMS.match(text.strip())
    if not m:
        raise ValueError(text)
    value = float(m.group(1)) * _PARAM_SUFFIX.get((m.group(2) or "").lower(), 1.0)
    if not 1 <= value <= MAX_PARAMS:  # also false for inf and nan
        raise ValueError(text)
    return value


def _split_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _choice(annotations: Mapping[str, str], key: str, allowed: tuple[str, ...], errors: list[AnnotationError]) -> str | None:
    if key not in annotations:
        return None
    value = str(annotations[key]).strip().lower()
    if value not in allowed:
        errors.append(AnnotationError(key, f"{shown(annotations[key])} is not one of {', '.join(allowed)}"))
        return None
    return value


def _models(annotations: Mapping[str, str], key: str, catalog: Catalog, errors: list[AnnotationError]) -> frozenset[str] | None:
    if key not in annotations:
        return None
    tokens = _split_list(str(annotations[key]))
    if not tokens:
        errors.append(AnnotationError(key, "empty; give a comma list of catalog ids or families, e.g. A100-80GB,H100"))
        return None
    ids: set[str] = set()
    unknown = []
    for t in tokens:
        try:
            ids |= catalog.resolve_token(t)
        except UnknownModelError:
            unknown.append(t)
    if unknown:
        errors.append(AnnotationError(
            key, f"unknown GPU model {cut(', '.join(repr(u) for u in unknown))}; use catalog ids or families "
                 f"(exact, case-insensitive), e.g. A100, A100-80GB, H100, H200, L40S, RTX-4090, A6000 "
                 f"(`gpuplace catalog` lists all)"))
        return None
    return frozenset(ids)


def _constraints(annotations: Mapping[str, str], key: str, errors: list[AnnotationError]) -> frozenset[str]:
    if key not in annotations:
        return frozenset()
    tokens = [t.lower() for t in _split_list(str(annotations[key]))]
    bad = [t for t in tokens if t not in CONSTRAINTS]
    if bad or not tokens:
        errors.append(AnnotationError(
            key, f"{shown(annotations[key])} is not a comma list of {', '.join(CONSTRAINTS)}"))
        return frozenset()
    return frozenset(tokens)


def parse_pod(pod: Pod | Mapping[str, Any], catalog: Catalog, class_names: tuple[str, ...] = (),
              annotations: Sequence[Annotation] = BUILTIN_ANNOTATIONS) -> JobRequirements:
    """Read a pod's GPU request and annotations.

    Args:
        pod: a ``core.pod.Pod``, or a ``v1.Pod`` as decoded JSON (validated by ``as_pod``; a field
            of the wrong type is the requirements' one error, naming the field).
        catalog: resolves ``gpu-models`` tokens to catalog ids.
        class_names: the policy's class names, for ``gpuplace.io/class``.
        annotations: every known annotation (``core.criteria.ANNOTATIONS``: the built-in ones and
            those criteria declare); a ``gpuplace.io/`` key not among them is an error, and those
            with a ``parse`` function are parsed into ``declared``.

    Returns:
        The requirements; ``errors`` lists every unusable field, in the order the fields are read
        (never raises for bad input).
    """
    try:
        pod = as_pod(pod)
    except PodShapeError as e:
        return JobRequirements(namespace="default", name="", resource=None, gpu_count=0,
                               errors=(AnnotationError(e.field, e.message),))
    ours = {k: v for k, v in pod.annotations.items() if k.startswith(PREFIX)}
    # A misspelt key (gpuplace.io/vrma) would silently drop the user's constraint: refuse it.
    errors: list[AnnotationError] = _unknown_keys(list(ours), frozenset(a.key for a in annotations))
    for key in [k for k, v in ours.items() if len(str(v)) > MAX_VALUE_CHARS]:
        errors.append(AnnotationError(key, f"{shown(ours.pop(key))} is longer than {MAX_VALUE_CHARS} characters; "
                                           "no gpuplace.io annotation needs that many"))
    declared = _declared(ours, annotations, errors)
    asked = pod_requests(pod)
    errors.extend(asked.errors)
    resource, count, mig_profile = _gpu_request(asked.gpu, errors)
    params = _params(ours, errors)
    workload = _choice(ours, A_WORKLOAD, WORKLOADS, errors)
    precision = _choice(ours, A_PRECISION, PRECISIONS, errors)
    sharding = _choice(ours, A_SHARDING, SHARDINGS, errors)
    vram = _vram(ours, errors)
    allowed = _models(ours, A_MODELS, catalog, errors)
    excluded = _models(ours, A_EXCLUDE, catalog, errors) or frozenset()
    min_cc = _min_cc(ours, errors)
    require = _constraints(ours, A_REQUIRE, errors)
    prefer = _constraints(ours, A_PREFER, errors)
    if {"full-gpu", "mig"} <= require:
        errors.append(AnnotationError(A_REQUIRE, "full-gpu and mig exclude each other; require one"))
    gpu_fraction_milli = _gpu_fraction(ours, resource, count, errors)
    runtime, runtime_explicit = _runtime(ours, resource, errors)
    class_name = _class_name(ours, class_names, errors)
    return JobRequirements(
        namespace=pod.namespace, name=pod.name, resource=resource, gpu_count=count, mig_profile=mig_profile,
        params=params, workload=workload, precision=precision, sharding=sharding, vram_bytes=vram,
        allowed_models=allowed, allowed_models_text=cut(str(ours.get(A_MODELS, ""))),
        excluded_models=excluded, excluded_models_text=cut(str(ours.get(A_EXCLUDE, ""))),
        min_compute_capability=min_cc, require=require, prefer=prefer, runtime=runtime,
        runtime_explicit=runtime_explicit, class_name=class_name, has_annotations=bool(ours),
        cpu_milli=asked.cpu_milli, memory_bytes=asked.memory_bytes, gpu_fraction_milli=gpu_fraction_milli,
        declared=declared, errors=tuple(errors),
    )


def _gpu_request(requests: Mapping[str, int], errors: list[AnnotationError]) -> tuple[str | None, int, str | None]:
    """(resource, count, MIG profile) of the pod's GPU requests (``pod_requests``): one kind only."""
    if len(requests) > 1:
        errors.append(AnnotationError(
            "resources", f"requests several GPU kinds ({', '.join(sorted(requests))}); request one of "
                         f"{NVIDIA_GPU}, {AMD_GPU} or {MIG_PREFIX}<profile>"))
        return None, 0, None
    if not requests:
        return None, 0, None
    resource, count = next(iter(requests.items()))
    mig_profile = mig_profile_of(resource)
    if mig_profile is None and resource.startswith(MIG_PREFIX):
        errors.append(AnnotationError(f"resources {resource}", f"not a MIG resource of the form {MIG_PREFIX}<profile>, e.g. "
                                                               "nvidia.com/mig-3g.40gb or nvidia.com/mig-1g.10gb.me"))
    return resource, count, mig_profile


def _params(annotations: Mapping[str, str], errors: list[AnnotationError]) -> float | None:
    """``gpuplace.io/model-params`` (``parse_params``), or None."""
    if A_PARAMS not in annotations:
        return None
    try:
        return parse_params(str(annotations[A_PARAMS]))
    except ValueError:
        errors.append(AnnotationError(A_PARAMS, f"{shown(annotations[A_PARAMS])} is not a parameter count; use a number with an optional K, M, B or T suffix, e.g. 350M, 7B, 70B, 1.3e9 (at most 1000T)"))
        return None


def _vram(annotations: Mapping[str, str], errors: list[AnnotationError]) -> int | None:
    """``gpuplace.io/vram`` in bytes (a Kubernetes quantity, rounded up as ``Quantity.Value()``), or None."""
    if A_VRAM not in annotations:
        return None
    try:
        quantity = parse_quantity(str(annotations[A_VRAM]))
    except QuantityError:
        errors.append(AnnotationError(A_VRAM, f"{shown(annotations[A_VRAM])} is not a memory quantity; use e.g. 40Gi (GiB, 2^30 bytes), 40G (10^9 bytes) or 40960Mi"))
        return None
    if quantity < 1:  # 0, negative, or "1m": a thousandth of a byte is no VRAM need
        errors.append(AnnotationError(A_VRAM, f"{shown(annotations[A_VRAM])} is less than one byte; a VRAM need is at "
                                              "least one byte, e.g. 40Gi (GiB, 2^30 bytes) or 40G (10^9 bytes)"))
        return None
    return math.ceil(quantity)


def _min_cc(annotations: Mapping[str, str], errors: list[AnnotationError]) -> tuple[int, int] | None:
    """``gpuplace.io/min-compute-capability`` as (major, minor), or None."""
    if A_MIN_CC not in annotations:
        return None
    m = _CC.fullmatch(str(annotations[A_MIN_CC]))
    if m is None:
        errors.append(AnnotationError(A_MIN_CC, f"{shown(annotations[A_MIN_CC])} is not a compute capability like 8.0 or 8.9"))
        return None
    return int(m.group(1)), int(m.group(2))


def _runtime(annotations: Mapping[str, str], resource: str | None, errors: list[AnnotationError]) -> tuple[str, bool]:
    """(runtime, whether the pod named it): ``gpuplace.io/runtime``, else ``rocm`` for
    ``amd.com/gpu`` and ``cuda`` otherwise; a runtime the requested GPUs cannot run is an error."""
    runtime = _choice(annotations, A_RUNTIME, RUNTIMES, errors)
    explicit = runtime is not None
    if runtime is None:
        runtime = "rocm" if resource == AMD_GPU else "cuda"
    if resource == AMD_GPU and runtime == "cuda":
        errors.append(AnnotationError(A_RUNTIME, f"cuda cannot run on {AMD_GPU}; use rocm or any, or request {NVIDIA_GPU}"))
    if resource and resource != AMD_GPU and runtime == "rocm":
        errors.append(AnnotationError(A_RUNTIME, f"rocm cannot run on {resource}; request {AMD_GPU} or use cuda"))
    return runtime, explicit


def _class_name(annotations: Mapping[str, str], class_names: tuple[str, ...], errors: list[AnnotationError]) -> str | None:
    """``gpuplace.io/class``: one of the policy's classes, or None."""
    if A_CLASS not in annotations:
        return None
    value = str(annotations[A_CLASS]).strip()
    if value in class_names:
        return value
    errors.append(AnnotationError(A_CLASS, f"{shown(value)} is not a class of the policy; use one of {', '.join(class_names)}"))
    return None


def _declared(ours: Mapping[str, Any], annotations: Sequence[Annotation],
              errors: list[AnnotationError]) -> tuple[tuple[str, Hashable], ...]:
    """(key, value) of the declared annotations (those with ``parse``) the pod gives; a value
    ``parse`` refuses is an error naming the annotation and its accepted form."""
    out = []
    for a in annotations:
        if a.parse is None or a.key not in ours:
            continue
        text = str(ours[a.key]).strip()
        try:
            out.append((a.key, a.parse(text)))
        except ValueError:
            errors.append(AnnotationError(a.key, f"{shown(ours[a.key])} is not {a.form}"))
    return tuple(out)


def _gpu_fraction(annotations: Mapping[str, str], resource: str | None, count: int,
                  errors: list[AnnotationError]) -> int | None:
    """``gpuplace.io/gpu-fraction`` in thousandths of a GPU (rounded up), or None; only for a pod
    asking one ``nvidia.com/gpu`` (a replica of a shared GPU, or a whole GPU elsewhere)."""
    if A_FRACTION not in annotations:
        return None
    text = str(annotations[A_FRACTION]).strip()
    if not _FRACTION.match(text) or float(text) <= 0:
        errors.append(AnnotationError(A_FRACTION, f"{shown(annotations[A_FRACTION])} is not a share of one GPU; "
                                                  "use a decimal above 0 and at most 1, e.g. 0.5 or 0.25"))
        return None
    if resource != NVIDIA_GPU or count != 1:
        errors.append(AnnotationError(A_FRACTION, f"a share of one GPU needs a request of 1 {NVIDIA_GPU}, "
                                                  f"not {count} {resource or 'GPU'}"))
        return None
    return max(1, math.ceil(float(text) * 1000 - 1e-9))

