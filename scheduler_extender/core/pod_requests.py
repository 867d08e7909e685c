"""A pod's resource requests as Kubernetes computes them: the one definition gpuplace uses.

kube-scheduler counts what a pod takes from a node with ``PodRequests``
(``k8s.io/component-helpers/resource/helpers.go``, v0.34.4: the module kube-scheduler v1.34.4 is
built with; NodeResourcesFit and the device count both read it). For each resource:

1. the app containers' requests are summed;
2. each restartable init container (``restartPolicy: Always``, a sidecar; GA in 1.33) runs beside
   them, so its requests add to that sum;
3. each regular init container runs alone, beside only the sidecars started before it, so it needs
   its own requests plus theirs; the pod needs the largest of (1 + 2) and each of these;
4. pod-level ``spec.resources`` (``PodLevelResources``, beta and on in 1.34) replaces the result
   for CPU and memory where set (``IsSupportedPodLevelResource``); its request defaults as the API
   server defaults it (``defaultPodRequests``): to the containers' requests where they set one, else
   to the pod-level limit;
5. ``spec.overhead`` (the RuntimeClass's) is added.

A container's missing request is its limit (``ResourceRequirements.merged``: the API server
defaults it so, and extended resources such as ``nvidia.com/gpu`` must have request = limit).
Every use of a pod's requests reads this module: the filter and score (through ``Job``), explain,
the simulator's pods, the learned workload, the cluster cache's bound pods and the pending pods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Mapping

from scheduler_extender.core.pod import FieldError, Pod, PodShapeError, ResourceRequirements, as_pod, shown
from scheduler_extender.core.quantity import QuantityError, parse_quantity

NVIDIA_GPU = "nvidia.com/gpu"
AMD_GPU = "amd.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
HOST_RESOURCES = ("cpu", "memory")
"""The resources pod-level ``spec.resources`` may set in Kubernetes 1.34 (``supportedPodLevelResources``)."""

_SCALE = {"cpu": 1000, "memory": 1}  # CPU in millicores, memory in bytes


def is_gpu_resource(name: str) -> bool:
    """Whether ``name`` is a GPU device resource gpuplace places: ``nvidia.com/gpu``,
    ``amd.com/gpu`` or a MIG resource ``nvidia.com/mig-<profile>``."""
    return name in (NVIDIA_GPU, AMD_GPU) or name.startswith(MIG_PREFIX)


@dataclass(frozen=True)
class PodRequests:
    """What a pod takes from a node, by ``PodRequests``' arithmetic.

    Attributes:
        gpu: GPU resource -> devices (whole, > 0; resources that sum to 0 are left out).
        cpu_milli: CPU in millicores (rounded up, as ``Quantity.MilliValue``); None when nothing
            in the pod names CPU or a CPU value is unusable (unknown, never 0).
        memory_bytes: memory in bytes (rounded up, as ``Quantity.Value``); None likewise.
        errors: every unusable value of those resources (not a quantity, negative, a fraction
            of a device): ``field`` is ``resources <name>``, the message says where it was
            (``spec.containers[0].resources.requests``), what it was and what is accepted.
    """

    gpu: Mapping[str, int] = field(default_factory=dict)
    cpu_milli: int | None = None
    memory_bytes: int | None = None
    errors: tuple[FieldError, ...] = ()


def pod_requests(pod: Pod | Mapping[str, Any]) -> PodRequests:
    """The pod's effective requests of GPU devices, CPU and memory (module docstring).

    Args:
        pod: a ``core.pod.Pod`` or a decoded ``v1.Pod`` (validated by ``as_pod``).

    Returns:
        The requests; a decoded pod whose fields have the wrong type requests nothing, with that
        error. Never raises for bad input.
    """
    try:
        pod = as_pod(pod)
    except PodShapeError as e:
        return PodRequests(errors=(FieldError(e.field, e.message),))
    errors: list[FieldError] = []
    bad: set[str] = set()
    spec = pod.spec
    total: dict[str, Decimal] = {}
    for i, c in enumerate(spec.containers or ()):
        _add(total, _read(c.resources, f"spec.containers[{i}].resources", errors, bad))
    total = _with_init_containers(total, spec.init_containers or (), errors, bad)
    if spec.resources is not None:
        total = _with_pod_level(total, spec.resources, errors, bad)
    if spec.overhead:
        _add(total, _read(ResourceRequirements(requests=spec.overhead), "spec.overhead", errors, bad,
                          where_fixed="spec.overhead"))
    gpu = {k: int(v) for k, v in total.items() if is_gpu_resource(k) and v > 0 and k not in bad}
    # Summed exactly, rounded up once, as Quantity.MilliValue() / Value() round the sum.
    cpu, memory = (None if r in bad or r not in total else math.ceil(total[r]) for r in HOST_RESOURCES)
    return PodRequests(gpu=gpu, cpu_milli=cpu, memory_bytes=memory, errors=tuple(errors))


def _with_init_containers(total: dict[str, Decimal], init: Any, errors: list[FieldError], bad: set[str]) -> dict[str, Decimal]:
    """Steps 2 and 3 of the module docstring (``AggregateContainerRequests``' init loop)."""
    sidecars: dict[str, Decimal] = {}
    init_max: dict[str, Decimal] = {}
    for i, c in enumerate(init):
        own = _read(c.resources, f"spec.initContainers[{i}].resources", errors, bad)
        if c.is_sidecar:
            _add(total, own)
            _add(sidecars, own)
            use = dict(sidecars)
        else:
            use = dict(own)
            _add(use, sidecars)
        for k, v in use.items():
            init_max[k] = max(init_max.get(k, v), v)
    for k, v in init_max.items():
        total[k] = max(total.get(k, v), v)
    return total


def _with_pod_level(total: dict[str, Decimal], resources: ResourceRequirements, errors: list[FieldError],
                    bad: set[str]) -> dict[str, Decimal]:
    """Step 4: pod-level CPU and memory replace the containers' (``PodRequests``), the request
    defaulted as ``defaultPodRequests`` does (the containers' where they set one, else the limit)."""
    requests = {k: v for k, v in (resources.requests or {}).items() if k in HOST_RESOURCES}
    limits = {k: v for k, v in (resources.limits or {}).items() if k in HOST_RESOURCES}
    stated = _read(ResourceRequirements(requests=requests), "spec.resources", errors, bad)
    if limits:
        by_limit = _read(ResourceRequirements(limits=limits), "spec.resources", errors, bad)
        for k, v in by_limit.items():
            if k not in stated and k not in total:
                stated[k] = v
    return {**total, **stated}


def _read(resources: ResourceRequirements | None, where: str, errors: list[FieldError], bad: set[str],
          where_fixed: str | None = None) -> dict[str, Decimal]:
    """The GPU, CPU and memory values of one ``resources`` (requests over limits), exact (devices,
    millicores, bytes); an unusable value is an error and marks its resource ``bad``."""
    if resources is None:
        return {}
    out: dict[str, Decimal] = {}
    for name, value in resources.merged().items():
        gpu = is_gpu_resource(name)
        if not gpu and name not in _SCALE:
            continue  # not read: ephemeral-storage, hugepages, other devices
        origin = where_fixed or f"{where}.{'requests' if name in (resources.requests or {}) else 'limits'}"
        problem, n = _value(name, value, gpu)
        if problem is not None:
            errors.append(FieldError(f"resources {name}", f"{origin} has {shown(value)}, {problem}"))
            bad.add(name)
            continue
        out[name] = n
    return out


def _value(name: str, value: Any, gpu: bool) -> tuple[str | None, Decimal]:
    """(None, value in devices, millicores or bytes, exact) or (what is wrong, 0)."""
    try:
        q = parse_quantity(value)
    except QuantityError:
        if gpu:
            return "not a whole number of devices", Decimal(0)
        return f"not a quantity; use e.g. {'500m or 2' if name == 'cpu' else '512Mi or 4Gi'}", Decimal(0)
    if q < 0:
        return "a negative request; a request is at least 0", Decimal(0)
    if gpu:
        if q != q.to_integral_value():
            return "not a whole number of devices", Decimal(0)
        return None, q
    return None, q * _SCALE[name]


def _add(into: dict[str, Decimal], values: Mapping[str, Decimal]) -> None:
    for k, v in values.items():
        into[k] = into.get(k, 0) + v

