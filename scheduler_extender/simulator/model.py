"""What the simulator places: ``SimNode`` (an inventory plus CPU/memory capacity) and ``SimPod``
(a pod manifest for the engine plus what the baselines and the report need), and the simulation
catalog (the shipped catalog plus documented stand-ins for GPU models a trace does not disclose).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

from node_agent.inventory import NodeGPUInventory
from scheduler_extender.core.catalog import Catalog, CatalogEntry, default_catalog
from scheduler_extender.core.requirements import A_MODELS, NVIDIA_GPU
from scheduler_extender.core.sharing import GpuSharing

OBSERVED_AT = "2026-01-01T00:00:00Z"

# Undisclosed models, by the trace's code -> (stand-in id, alias, catalog row whose figures it copies).
# The traces name no figures for these; a stand-in keeps them distinct GPU types (so gpu_spec and
# nodeSelector constraints stay exact) with the figures of a real GPU of a plausible class.
STAND_INS: dict[str, tuple[str, str, str]] = {
    "G2": ("openb-g2", "G2", "a10"),
    "G3": ("openb-g3", "G3", "v100-sxm2-32gb"),
    "GPU-series-1": ("spot-series-1", "GPU-series-1", "a10"),
    "GPU-series-2": ("spot-series-2", "GPU-series-2", "h20-96gb"),
}


def _stand_in(model_id: str, alias: str, base: CatalogEntry) -> CatalogEntry:
    data = base.model_dump(by_alias=True)
    data.update(
        id=model_id,
        displayName=f"{alias} (undisclosed; stand-in with the figures of {base.display_name})",
        driverNames=[f"{alias} (stand-in)"],
        aliases=[alias],
        migProfiles=[],
        sources=[f"Alibaba clusterdata traces name this GPU type only {alias!r}; every figure is copied "
                 f"from the catalog row {base.id} as a stand-in (gpuplace simulator, documented choice)"],
    )
    return CatalogEntry.model_validate(data)


@lru_cache(maxsize=1)
def simulation_catalog() -> Catalog:
    """The shipped catalog plus the ``STAND_INS`` rows."""
    base = default_catalog()
    extra = [_stand_in(mid, alias, base.entries[src]) for mid, alias, src in STAND_INS.values()]
    return Catalog(list(base.entries.values()) + extra)


def resolve_model(token: str, catalog: Catalog) -> CatalogEntry:
    """The catalog row for a trace's GPU model code (``V100M32``, ``A100-SXM4-80GB``, ``G2``).

    Raises:
        ValueError: the code is neither a stand-in nor a catalog token.
    """
    if token in STAND_INS:
        return catalog.entries[STAND_INS[token][0]]
    try:
        ids = catalog.resolve_token(token)
    except ValueError:
        raise ValueError(f"GPU model {token!r} is not in the catalog (see `gpuplace catalog`)") from None
    return catalog.entries[sorted(ids)[0]]


def make_inventory(node_name: str, entry: CatalogEntry, count: int, *, nvlink: bool = False) -> NodeGPUInventory:
    """A NodeGPUInventory of ``count`` identical GPUs with the catalog row's figures.

    ``nvlink``: every GPU is an NVLink peer of every other (an NVSwitch system).
    """
    uuids = [f"GPU-{node_name}-{i}" for i in range(count)]
    gpus = []
    for i, uuid in enumerate(uuids):
        gpus.append({
            "index": i, "uuid": uuid, "vendor": entry.vendor, "name": entry.driver_names[0],
            "memoryMiB": entry.memory_mib, "computeCapability": entry.compute_capability,
            "memoryBandwidthGBps": entry.memory_bandwidth_gbps, "eccEnabled": entry.ecc,
            "nvlinks": [{"peerUuid": p, "links": entry.nvlink_links} for p in uuids if p != uuid] if nvlink else [],
        })
    return NodeGPUInventory.model_validate({
        "apiVersion": "gpuplace.io/v1alpha1", "kind": "NodeGPUInventory", "nodeName": node_name,
        "observedAt": OBSERVED_AT, "migStrategy": "none", "gpus": gpus,
    })


@dataclass(frozen=True)
class SimNode:
    """One node: its inventory, CPU (millicores) and memory (MiB); ``None`` capacity = not modelled."""

    name: str
    inventory: NodeGPUInventory
    cpu_milli: int | None = None
    memory_mib: int | None = None
    template: str = ""  # nodes with the same template share one inventory shape (same NodeView)
    sharing: GpuSharing | None = None  # time-sliced by the device plugin (``simulator.device_plugin``)


@dataclass(frozen=True)
class SimPod:
    """One pod of a workload.

    Attributes:
        name: the trace's pod name.
        gpus: GPUs requested (``nvidia.com/gpu``; openb ``num_gpu``); 0 for a CPU-only pod.
        gpu_milli: thousandths of each GPU the pod takes (openb ``gpu_milli``): 1000 for whole
            GPUs; below 1000 (with ``gpus`` = 1) a GPU-sharing pod takes that share of one GPU and
            other sharing pods may take the rest (``cluster.Cluster``'s share model).
        annotations: the ``gpuplace.io/*`` annotations the engine reads.
        allowed_models: catalog ids a nodeSelector/affinity would allow (``gpu_spec``); None: any.
        cpu_milli, memory_mib: requests; None when the workload does not give them.
        creation_s, duration_s: arrival time and run time, seconds.
        params: model parameters, for the static nodeSelector map; None when unknown.
        workload: ``training`` / ``finetune-lora`` / ``inference`` / None.
    """

    name: str
    gpus: int
    annotations: Mapping[str, str] = field(default_factory=dict)
    allowed_models: frozenset[str] | None = None
    cpu_milli: int | None = None
    memory_mib: int | None = None
    creation_s: float = 0.0
    duration_s: float = 3600.0
    params: float | None = None
    workload: str | None = None
    gpu_milli: int = 1000

    @property
    def sharing(self) -> bool:
        """A GPU-sharing pod: a share of one GPU (openb ``gpu_milli`` < 1000, ``num_gpu`` = 1)."""
        return self.gpus == 1 and self.gpu_milli < 1000

    @property
    def total_milli(self) -> int:
        """Thousandths of a GPU the pod requests in all (FGD's ``PodResource.TotalMilliGpu``)."""
        return self.gpus * self.gpu_milli

    @property
    def signature(self) -> tuple[Any, ...]:
        """What the engine's decision depends on: pods with equal signatures get equal verdicts
        (the share size too: a share pod is filtered against the GPUs with that share free)."""
        return (self.gpus, self.gpu_milli, tuple(sorted(self.annotations.items())))

    @property
    def shape(self) -> tuple[Any, ...]:
        """Signature plus CPU/memory and the nodeSelector: equal shapes fit the same nodes."""
        return (*self.signature, self.cpu_milli, self.memory_mib, self.allowed_models, self.params, self.workload)

    def manifest(self, namespace: str = "sim") -> dict[str, Any]:
        """The v1.Pod kube-scheduler would send the extender for this pod."""
        requests: dict[str, str] = {NVIDIA_GPU: str(self.gpus)}
        if self.cpu_milli is not None:
            requests["cpu"] = f"{self.cpu_milli}m"
        if self.memory_mib is not None:
            requests["memory"] = f"{self.memory_mib}Mi"
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "namespace": namespace, "uid": f"uid-{self.name}",
                         "annotations": dict(self.annotations)},
            "spec": {"containers": [{"name": "main", "resources": {"requests": requests,
                                                                   "limits": {NVIDIA_GPU: str(self.gpus)}}}]},
        }


def models_annotation(ids: frozenset[str] | None) -> dict[str, str]:
    """``gpuplace.io/gpu-models`` for a set of catalog ids (empty when any model is allowed)."""
    return {A_MODELS: ",".join(sorted(ids))} if ids else {}
