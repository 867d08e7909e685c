"""Shared GPUs: the NVIDIA device plugin's time-slicing and MPS replicas, budgeted by VRAM.

With ``sharing.timeSlicing`` or ``sharing.mps`` in its configuration, the NVIDIA device plugin
advertises each GPU as ``replicas`` devices of ``nvidia.com/gpu`` (ids ``<GPU-UUID>::<i>``;
``internal/rm/device_map.go``, ``updateDeviceMapWithReplicas``), on every GPU of the node, and
GPU feature discovery labels the Node ``nvidia.com/gpu.sharing-strategy`` (``time-slicing`` or
``mps``) and ``nvidia.com/gpu.replicas`` (``internal/lm/resource.go``; device plugin v0.15+). A
pod asking for one ``nvidia.com/gpu`` there gets one replica, and the extender cannot choose which:
the kubelet takes the plugin's preferred allocation, which counts replicas, never memory
(``internal/rm/allocate.go``, ``greedyAlloc``: the GPU with the fewest replicas in use by default,
ties broken at random). So a placement is correct whatever replica the pod gets only if:

- **MPS**: the pod's VRAM need fits one replica's limit, the GPU's memory / replicas (the MPS
  control daemon's ``set_default_device_pinned_mem_limit``, enforced; ``cmd/mps-control-daemon/
  mps/daemon.go``); any free replica then works.
- **time-slicing** (no memory isolation): every GPU the plugin may give has the pod's need left
  after the needs of the pods already on it: the GPUs with a free replica and the fewest in use
  (the plugin's default ``distributed`` policy; ties in Go's map order, so any of them), or, while
  a pod bound there is on a GPU the agent has not reported yet (the counts are then unknown),
  every GPU with a free replica. A pod whose need is unknown counts as the whole GPU; a pod the
  agent has not placed on a GPU yet counts on every GPU.

Asking for several replicas gives no more memory (MPS rejects it; time-slicing may put them on
one GPU), so a shared node passes only one-GPU pods. Which classes may share is the policy's
(``SizeClass.share_gpus``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Protocol, Sequence

from scheduler_extender.core.node import Node, as_node

SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
STRATEGIES = ("time-slicing", "mps")


@dataclass(frozen=True)
class GpuSharing:
    """How a node's GPUs are shared: ``strategy`` and ``replicas`` per GPU; ``source`` says where
    that was read (GPU feature discovery's labels, or the allocatable count)."""

    strategy: Literal["time-slicing", "mps"]
    replicas: int
    source: str

    def describe(self) -> str:
        return f"{self.strategy}, {self.replicas} replicas per GPU"


SharingLabels = tuple[Any, Any]
"""GPU feature discovery's (``nvidia.com/gpu.sharing-strategy``, ``nvidia.com/gpu.replicas``)
label values of a Node, each None when absent: what ``node_gpu_sharing`` reads of the Node."""


def sharing_labels(node: Node | Mapping[str, Any] | None) -> SharingLabels:
    """The Node's ``SharingLabels`` (a ``core.node.Node`` or a decoded ``v1.Node``; anything else
    has none)."""
    labels = as_node(node).labels
    return labels.get(SHARING_STRATEGY_LABEL), labels.get(REPLICAS_LABEL)


def node_gpu_sharing(labels: SharingLabels, allocatable: Mapping[str, int] | None,
                     nvidia_gpus: int, all_healthy: bool = True) -> GpuSharing | None:
    """How the Node's ``nvidia.com/gpu`` is shared, or None (whole GPUs, or unknown).

    ``labels``: the Node's ``sharing_labels``, the one reading of a Node for this, whether the
    Node came from the cluster cache's watch or in a request (``nodeCacheCapable: false``).
    GPU feature discovery's ``nvidia.com/gpu.sharing-strategy`` (``time-slicing`` or ``mps``) with
    ``nvidia.com/gpu.replicas`` >= 2 (the replicas label alone: time-slicing, as older GFD wrote
    it only for that). Without those labels, ``status.allocatable`` ``nvidia.com/gpu`` equal to a
    whole multiple >= 2 of ``nvidia_gpus`` (the inventory's full NVIDIA GPUs) is read as
    time-slicing, the mode without memory isolation, so the budget errs safe; only when
    ``all_healthy``: the device plugin advertises replicas of the GPUs it finds healthy, which
    may not be the ones the agent does, and a wrong divisor would be a wrong replica count.
    """
    if nvidia_gpus <= 0:
        return None  # no full NVIDIA GPU to share (MIG replicas are not budgeted)
    strategy, replicas_text = labels
    replicas = _whole(replicas_text)
    if strategy in (*STRATEGIES, None) and replicas is not None and replicas >= 2:
        return GpuSharing(strategy or "time-slicing", replicas,
                          f"labels {SHARING_STRATEGY_LABEL}, {REPLICAS_LABEL}" if strategy else f"label {REPLICAS_LABEL}")
    if strategy == "none" or (replicas is not None and replicas <= 1):
        return None  # GFD says so: whole GPUs
    advertised = (allocatable or {}).get("nvidia.com/gpu")
    if all_healthy and advertised and advertised > nvidia_gpus and advertised % nvidia_gpus == 0:
        return GpuSharing("time-slicing", advertised // nvidia_gpus,
                          f"allocatable nvidia.com/gpu {advertised} = {advertised // nvidia_gpus} x {nvidia_gpus} GPUs")
    return None


def shareable_gpus(view: Any) -> tuple[int, bool]:
    """(full NVIDIA GPUs, whether all are healthy) of a ``NodeView``, for ``node_gpu_sharing``;
    (0, ...) when ``nvidia.com/gpu`` holds MIG devices (MIG replicas are not budgeted here)."""
    units = view.units("nvidia.com/gpu")
    if any(u.kind != "gpu" for u in units):
        return 0, False
    return len(units), all(u.healthy for u in units)


def _whole(value: Any) -> int | None:
    if not isinstance(value, str) or not (value.isascii() and value.isdigit()) or len(value) > 6:
        return None
    return int(value)


def used_vram_bytes(memory_bytes: int, needs: Sequence[int | None]) -> int:
    """VRAM the pods holding a GPU's replicas use, by their needs (bytes; None: unknown, counted
    as the whole GPU), at most the GPU's memory."""
    return min(memory_bytes, sum(memory_bytes if n is None else n for n in needs))


MILLI = 1000
"""Thousandths of a unit in one unit: the measure of a GPU-sharing pod's share (FGD's ``MILLI``)."""


def fraction_bytes(memory_bytes: int, fraction_milli: int) -> int:
    """``fraction_milli`` thousandths of a GPU's ``memory_bytes``, in bytes, rounded up: the VRAM
    need of a ``gpuplace.io/gpu-fraction`` pod on that GPU."""
    return -(-memory_bytes * fraction_milli // MILLI)


def share_milli(need_bytes: int | None, memory_bytes: int) -> int:
    """The share of a GPU a pod holding one of its replicas takes, in thousandths: its VRAM need
    over the GPU's memory, rounded up, at most all of it; an unknown need (None) takes all, as the
    time-slicing budget counts it. What fragmentation, scarcity and packing read of a shared GPU,
    in the cluster as in ``gpuplace simulate`` (openb's ``gpu_milli``)."""
    if need_bytes is None or memory_bytes <= 0:
        return MILLI
    return max(1, min(MILLI, math.ceil(MILLI * need_bytes / memory_bytes)))


class _SharedGpu(Protocol):
    uuid: str
    memory_bytes: int
    healthy: bool


def shared_free_milli(gpus: Sequence[_SharedGpu], shared: Mapping[str, Sequence[int | None]],
                      unplaced: Sequence[int | None]) -> dict[str, int]:
    """Per shared GPU that its holders use part or all of, the thousandths they leave
    (``NodeAllocation.partly_free_milli``): ``MILLI`` minus each holder's ``share_milli``. The
    holders the agent has not placed on a GPU yet (``unplaced``) are counted, largest first, on
    the GPU with the most left: the device plugin's default replica choice gives the GPU with the
    fewest replicas in use (``core.sharing`` docstring), which the one with the most left mostly is."""
    left = {g.uuid: MILLI - sum(share_milli(n, g.memory_bytes) for n in shared.get(g.uuid, ()))
            for g in gpus if g.healthy}
    memory = {g.uuid: g.memory_bytes for g in gpus}
    for need in sorted(unplaced, key=lambda n: math.inf if n is None else n, reverse=True):
        if not left:
            break
        uuid = max(left, key=lambda u: (left[u], u))
        left[uuid] -= share_milli(need, memory[uuid])
    return {u: max(0, v) for u, v in left.items() if v < MILLI}
