"""A pod resolved against the policy: its requirements, VRAM estimate and size class."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from scheduler_extender.core.catalog import Catalog
from scheduler_extender.core.estimate import VramEstimate, estimate_vram
from scheduler_extender.core.policy import Policy, SizeClass
from scheduler_extender.core.quantity import fmt_gib
from scheduler_extender.core.pod import Pod, PodShapeError, as_pod
from scheduler_extender.core.annotations import BUILTIN_ANNOTATIONS, Annotation
from scheduler_extender.core.requirements import A_CLASS, A_MODELS, JobRequirements, parse_pod
from scheduler_extender.core.sharing import fraction_bytes
from scheduler_extender.core.tenancy import UNRESTRICTED, TenantGrant, resolve_tenancy


@dataclass(frozen=True)
class Job:
    """Everything the filter and the score need to know about one pod.

    ``vram`` is None when the pod gives neither ``gpuplace.io/vram`` nor
    ``gpuplace.io/model-params``: the need is unknown and no VRAM check applies.
    ``class_*_models`` are the size class's model lists as catalog ids, except where the pod names
    its models itself (``gpuplace.io/gpu-models``) and its class was inferred: an explicit request
    is honored within the namespace's entitlement, never overruled by a guessed size class, so the
    class's allowed, denied and last-resort models do not apply (a class pinned with
    ``gpuplace.io/class`` keeps them).
    ``tenancy`` is the entitlement of the pod's namespace (policy ``tenants``), resolved with the
    namespace's labels; ``tenant_denial`` says why the request as a whole is outside it (a class or
    ``gpu-models`` it may not use, or labels needed to decide that are unknown), None otherwise.
    """

    req: JobRequirements
    workload: str | None
    vram: VramEstimate | None
    size_class: SizeClass
    class_reason: str
    class_allowed_models: frozenset[str] | None = None  # catalog ids; None: any model
    class_denied_models: frozenset[str] = frozenset()
    class_last_resort_models: frozenset[str] = frozenset()  # catalog ids; full GPUs scored last (``score``)
    tenancy: TenantGrant = UNRESTRICTED
    tenant_denial: str | None = None
    cpu_milli: int | None = None  # the pod's CPU request (millicores); None: none given
    memory_bytes: int | None = None  # the pod's memory request; None: none given
    gpu_milli: int = 1000
    """Thousandths of each of its GPUs the pod takes: 1000, whole GPUs; below (one GPU) a share of
    a GPU that other such pods take the rest of (FGD's ``gpu_milli``, Alibaba's GPU-sharing
    scheduler). The score's fragmentation reads it with ``NodeAllocation.partly_free_milli``. Set
    by ``gpuplace.io/gpu-fraction`` (and by ``gpuplace simulate`` for openb's GPU-sharing pods);
    on a node whose GPUs are shared the score counts the pod's VRAM need over the GPU's memory
    instead (``score.share_taken``)."""

    def vram_need_on(self, unit: Any) -> int | None:
        """The pod's VRAM need on ``unit`` (a ``devices.Unit``): ``vram_need(unit.memory_bytes)``."""
        return self.vram_need(unit.memory_bytes)

    def vram_need(self, memory_bytes: int | None) -> int | None:
        """The pod's VRAM need on a GPU of ``memory_bytes``, bytes: ``gpuplace.io/gpu-fraction`` of
        that memory (rounded up; None when the memory is not given), else ``vram`` (the
        annotation or the estimate), else None."""
        if self.req.gpu_fraction_milli is not None:
            return None if memory_bytes is None else fraction_bytes(memory_bytes, self.req.gpu_fraction_milli)
        return self.vram.bytes_per_gpu if self.vram is not None else None

    @property
    def errors(self):  # noqa: ANN201 - tuple of AnnotationError
        return self.req.errors

    def describe(self) -> str:
        """One line for tables and logs: what the pod asked."""
        r = self.req
        parts = [f"{r.gpu_count}x {r.resource}" if r.resource else "no GPU"]
        if not r.resource and (self.cpu_milli is not None or self.memory_bytes is not None):
            # A pod without GPUs is placed by its CPU and memory: show them as kube-scheduler sums them.
            parts.append(", ".join(part for part in (
                None if self.cpu_milli is None else f"cpu {self.cpu_milli}m",
                None if self.memory_bytes is None else f"memory {fmt_gib(self.memory_bytes)}") if part))
        if self.vram:
            parts.append(self.vram.summary if self.vram.source == "estimate" else f"vram {fmt_gib(self.vram.bytes_per_gpu)}")
        if r.gpu_fraction_milli is not None:
            parts.append(f"gpu-fraction {r.gpu_fraction_milli / 1000:g}")
        if r.require:
            parts.append("require " + ",".join(sorted(r.require)))
        if r.runtime_explicit:
            parts.append(f"runtime {r.runtime}")
        return "; ".join(parts)


def tenant_denial(req: JobRequirements, size_class: SizeClass, class_reason: str, grant: TenantGrant) -> str | None:
    """Why the request as a whole is outside the namespace's entitlement, or None.

    Annotations narrow, never widen: a pinned ``gpuplace.io/class`` or an assigned class must be
    one the namespace may use, and a ``gpuplace.io/gpu-models`` list must keep at least one model
    it may use (models it may not use are then rejected per GPU by the filter).
    """
    ns = req.namespace
    if grant.undecided is not None:
        return grant.undecided
    if not grant.permits_class(size_class.name):
        what = f"{A_CLASS}: {size_class.name}" if class_reason == A_CLASS else \
            f"class {size_class.name} (assigned by policy {class_reason})"
        return f"{what} not entitled to namespace {ns}: {grant.rule} allows classes {grant.classes_text}"
    if req.allowed_models is not None and all(grant.model_denial(m) for m in req.allowed_models):
        return f"{A_MODELS}: {req.allowed_models_text} not entitled to namespace {ns}: {grant.rule} {grant.models_text()}"
    return None


def resolve_job(pod: Pod | Mapping[str, Any], policy: Policy, catalog: Catalog,
                namespace_labels: Mapping[str, str] | None = None,
                annotations: Sequence[Annotation] = BUILTIN_ANNOTATIONS) -> Job:
    """Parse a pod (a ``core.pod.Pod``, or a decoded ``v1.Pod``: ``as_pod``) and resolve it
    against the policy. Never raises for bad pod content: a field of the wrong type is the job's
    error, naming the field.

    ``namespace_labels`` are the labels of the pod's namespace, for tenants that select
    namespaces by label; None when unknown (see ``core.tenancy``).
    """
    class_names = tuple(c.name for c in policy.classes)
    try:
        pod = as_pod(pod)
    except PodShapeError:
        pass  # parse_pod reports it
    req = parse_pod(pod, catalog, class_names, annotations)
    workload = req.workload or (policy.defaults.workload if req.params is not None else None)
    vram: VramEstimate | None = None
    if req.vram_bytes is not None:
        vram = VramEstimate(bytes_per_gpu=req.vram_bytes, summary="gpuplace.io/vram", source="annotation",
                            terms=(("gpuplace.io/vram", req.vram_bytes),))
    elif req.params is not None and workload is not None and not req.errors:
        vram = estimate_vram(
            params=req.params,
            workload=workload,
            precision=req.precision or policy.defaults.precision,
            gpu_count=max(1, req.gpu_count),
            sharding=req.sharding,
            settings=policy.estimator_settings,
        )
    if req.class_name is not None:
        size_class, why = policy.class_named(req.class_name), "gpuplace.io/class"
    else:
        size_class, why = policy.assign_class(
            vram_bytes=vram.bytes_per_gpu if vram else None,
            params=req.params,
            gpu_count=req.gpu_count,
            workload=workload,
            namespace=req.namespace,
            requires=req.require,
        )
    assert size_class is not None  # validated: every class reference exists

    def ids(tokens: list[str]) -> frozenset[str]:
        # Tokens were checked against the catalog when the policy was loaded.
        return frozenset().union(*(catalog.resolve_token(t) for t in tokens))

    cpu, memory = req.cpu_milli, req.memory_bytes
    grant = resolve_tenancy(policy.tenants, policy.default_tenant, req.namespace, namespace_labels, catalog)
    explicit = req.allowed_models is not None and why != A_CLASS
    return Job(req=req, workload=workload, vram=vram, size_class=size_class, class_reason=why,
               class_allowed_models=ids(size_class.allowed_models) if size_class.allowed_models and not explicit
               else None,
               class_denied_models=frozenset() if explicit else ids(size_class.denied_models),
               class_last_resort_models=frozenset() if explicit else ids(size_class.last_resort_models),
               tenancy=grant, tenant_denial=tenant_denial(req, size_class, why, grant),
               cpu_milli=cpu, memory_bytes=memory,
               **({"gpu_milli": req.gpu_fraction_milli} if req.gpu_fraction_milli is not None else {}))
