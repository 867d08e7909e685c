"""Generated GPU clusters and pods for the benchmarks: NodeGPUInventory documents and v1.Pod dicts.

Every node has 8 GPUs; the mix follows the shapes of ``examples/cluster`` (HGX A100/H100 with
every GPU NVLinked to the other seven, A100s partitioned as MIG with the ``single`` and ``mixed``
strategies, RTX 4090 without NVLink, RTX A6000 in NVLinked pairs, L4, T4, MI300X). GPU facts
(VRAM, compute capability, bandwidth, ECC) come from the shipped catalog, so every document
passes ``parse_inventory``. A share of the devices is already held (``allocatedTo``), chosen by
a seeded RNG: the same arguments always give the same cluster.

Pods use the ``gpuplace.io/*`` annotations of ``examples/pods`` in realistic proportions: most
are 1-GPU inference and LoRA jobs, a few are 4- and 8-GPU training jobs that require NVLink.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from scheduler_extender.core.catalog import default_catalog

GPUS_PER_NODE = 8

# (template, share of nodes). Shares sum to 1.
NODE_MIX: tuple[tuple[str, float], ...] = (
    ("a100-80gb-nvlink", 0.15),
    ("h100-nvlink", 0.10),
    ("a100-mig-single", 0.10),
    ("a100-mig-mixed", 0.05),
    ("rtx-4090", 0.20),
    ("rtx-a6000", 0.10),
    ("l4", 0.15),
    ("t4", 0.10),
    ("mi300x", 0.05),
)

_TEMPLATE_GPU = {
    "a100-80gb-nvlink": "NVIDIA A100-SXM4-80GB",
    "h100-nvlink": "NVIDIA H100 80GB HBM3",
    "a100-mig-single": "NVIDIA A100-SXM4-80GB",
    "a100-mig-mixed": "NVIDIA A100-SXM4-80GB",
    "rtx-4090": "NVIDIA GeForce RTX 4090",
    "rtx-a6000": "NVIDIA RTX A6000",
    "l4": "NVIDIA L4",
    "t4": "Tesla T4",
    "mi300x": "AMD Instinct MI300X",
}
# MIG layouts per GPU (valid A100-80GB geometries: slices sum to <= 7).
_MIG_SINGLE = ("3g.40gb", "3g.40gb")
_MIG_MIXED = (("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"), ("1g.10gb",) * 7)


def _uuid(prefix: str, node: int, gpu: int, sub: int = 0) -> str:
    return f"{prefix}-{node:08x}-{gpu:04x}-{sub:04x}-0000-000000000000"


def node_inventory(index: int, template: str, rng: random.Random, allocated_share: float = 0.3,
                   observed_at: str = "2026-11-21T08:00:00Z") -> dict[str, Any]:
    """One NodeGPUInventory document (dict) for node ``gpu-<index>`` built from ``template``."""
    catalog = default_catalog()
    driver_name = _TEMPLATE_GPU[template]
    entry = catalog.resolve_driver_name(driver_name)
    assert entry is not None, driver_name
    name = f"gpu-{index:05d}"
    mig = template.startswith("a100-mig")
    strategy = "single" if template == "a100-mig-single" else ("mixed" if mig else "none")
    gpus: list[dict[str, Any]] = []
    for g in range(GPUS_PER_NODE):
        uuid = _uuid("GPU", index, g)
        doc: dict[str, Any] = {
            "index": g, "uuid": uuid, "vendor": entry.vendor, "name": driver_name,
            "memoryMiB": entry.memory_mib, "pciBusId": f"00000000:{0x10 + g:02X}:00.0",
            "architecture": entry.architecture, "memoryBandwidthGBps": entry.memory_bandwidth_gbps,
            "eccEnabled": entry.ecc, "powerLimitW": entry.tdp_w, "numaNode": g // 4, "healthy": True,
        }
        if entry.compute_capability:
            doc["computeCapability"] = entry.compute_capability
        if mig:
            layout = _MIG_SINGLE if strategy == "single" else _MIG_MIXED[g % 2]
            doc["migEnabled"] = True
            doc["migDevices"] = []
            for k, profile in enumerate(layout):
                p = entry.mig_profile(profile)
                assert p is not None, profile
                doc["migDevices"].append({
                    "uuid": _uuid("MIG", index, g, k + 1), "profile": profile, "memoryMiB": p.memory_mib,
                    "allocatedTo": f"team-{rng.randrange(20)}/job-{rng.randrange(10**6)}"
                    if rng.random() < allocated_share else ""})
        else:
            doc["allocatedTo"] = (f"team-{rng.randrange(20)}/job-{rng.randrange(10**6)}"
                                  if rng.random() < allocated_share else "")
        gpus.append(doc)
    if template in ("a100-80gb-nvlink", "h100-nvlink", "mi300x"):  # NVSwitch / Infinity Fabric: all-to-all
        for doc in gpus:
            doc["nvlinks"] = [{"peerUuid": o["uuid"], "links": 12} for o in gpus if o is not doc]
    elif template == "rtx-a6000":  # NVLink bridges join pairs
        for doc in gpus:
            peer = gpus[doc["index"] ^ 1]
            doc["nvlinks"] = [{"peerUuid": peer["uuid"], "links": 4}]
    if template == "mi300x":
        for doc in gpus:  # AMD links are not NVLink; the agent reports none for AMD
            doc["nvlinks"] = []
    return {"apiVersion": "gpuplace.io/v1alpha1", "kind": "NodeGPUInventory", "nodeName": name,
            "observedAt": observed_at, "driverVersion": "580.95.05", "cudaDriverVersion": "13.0",
            "migStrategy": strategy, "gpus": gpus}


def templates_for(nodes: int) -> list[str]:
    """Node templates in NODE_MIX proportions, interleaved (deterministic)."""
    out: list[str] = []
    acc = {t: 0.0 for t, _ in NODE_MIX}
    for _ in range(nodes):
        for t, share in NODE_MIX:
            acc[t] += share
        best = max(acc, key=lambda t: acc[t])
        acc[best] -= 1.0
        out.append(best)
    return out


def generate_cluster(nodes: int, seed: int = 1, allocated_share: float = 0.3) -> list[dict[str, Any]]:
    """``nodes`` inventory documents, names ``gpu-00000`` ...; deterministic for a seed."""
    rng = random.Random(seed)
    return [node_inventory(i, t, rng, allocated_share) for i, t in enumerate(templates_for(nodes))]


def write_cluster(directory: Path, docs: list[dict[str, Any]]) -> Path:
    """One ``<nodeName>.json`` per document (static mode's ``--inventory-dir``)."""
    directory.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        (directory / f"{doc['nodeName']}.json").write_text(json.dumps(doc), encoding="utf-8")
    return directory


# (annotations, resource, GPU count, weight) in the spirit of examples/pods.
POD_MIX: tuple[tuple[dict[str, str], str, int, int], ...] = (
    ({"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "inference", "gpuplace.io/precision": "bf16"},
     "nvidia.com/gpu", 1, 20),
    ({"gpuplace.io/model-params": "13B", "gpuplace.io/workload": "inference", "gpuplace.io/precision": "bf16"},
     "nvidia.com/gpu", 1, 15),
    ({"gpuplace.io/model-params": "3B", "gpuplace.io/workload": "inference"}, "nvidia.com/gpu", 1, 10),
    ({"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "finetune-lora"}, "nvidia.com/gpu", 1, 15),
    ({"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "inference", "gpuplace.io/require": "ecc"},
     "nvidia.com/gpu", 1, 5),
    ({"gpuplace.io/vram": "16Gi", "gpuplace.io/gpu-models": "L4,T4,RTX-4090"}, "nvidia.com/gpu", 1, 10),
    ({"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "training", "gpuplace.io/sharding": "zero3",
      "gpuplace.io/precision": "bf16", "gpuplace.io/require": "nvlink"}, "nvidia.com/gpu", 4, 5),
    ({"gpuplace.io/model-params": "13B", "gpuplace.io/workload": "training", "gpuplace.io/sharding": "fsdp",
      "gpuplace.io/precision": "bf16"}, "nvidia.com/gpu", 8, 3),
    ({"gpuplace.io/model-params": "1.3B", "gpuplace.io/workload": "inference", "gpuplace.io/precision": "fp16",
      "gpuplace.io/runtime": "rocm"}, "amd.com/gpu", 1, 4),
    ({"gpuplace.io/model-params": "1B", "gpuplace.io/workload": "inference"}, "nvidia.com/mig-1g.10gb", 1, 5),
    ({}, "nvidia.com/gpu", 1, 8),  # GPU count only
)


def pod(index: int, annotations: dict[str, str], resource: str, gpus: int, namespace: str = "bench") -> dict[str, Any]:
    """A v1.Pod as kube-scheduler sends it, GPUs in limits (same shape as tests/factories.pod)."""
    name = f"bench-{index:06d}"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                     "annotations": dict(annotations)},
        "spec": {"schedulerName": "gpuplace-scheduler",
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"limits": {resource: str(gpus)}, "requests": {"cpu": "100m"}}}]},
    }


def generate_pods(count: int, seed: int = 2, namespace: str = "bench") -> list[dict[str, Any]]:
    """``count`` pods drawn from POD_MIX by weight; every pod has its own name (as in a real burst)."""
    rng = random.Random(seed)
    weights = [w for *_, w in POD_MIX]
    picks = rng.choices(POD_MIX, weights=weights, k=count)
    return [pod(i, a, r, n, namespace) for i, (a, r, n, _) in enumerate(picks)]
