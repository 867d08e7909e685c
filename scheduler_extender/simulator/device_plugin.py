"""The cluster's sharing model (``gpuplace simulate --sharing device-plugin``): GPU-sharing pods
on nodes the NVIDIA device plugin time-slices, where the plugin, not the scheduler, picks the GPU.

openb's own setting (``--sharing scheduler``, the default) lets the scheduler put a share on the
GPU it chooses (FGD's simulator, Alibaba's GPU-sharing plugin). A Kubernetes cluster with the
NVIDIA device plugin works otherwise, and this module models it, for the simulator and for the
cluster replay (``benchmarks.bench_replay``) alike:

- **Which nodes share.** Nodes are time-sliced by the plugin's configuration (``sharing.
  timeSlicing.resources[].replicas``) and labelled by GPU feature discovery
  (``nvidia.com/gpu.sharing-strategy: time-slicing``, ``nvidia.com/gpu.replicas``); their
  ``nvidia.com/gpu`` is ``replicas`` x GPUs. Which nodes: per GPU model, ``share`` of its nodes,
  spread evenly over the list (``time_sliced``); by default the list's share of milli-GPUs that
  sharing pods ask for (``sharing_share``), so each pool is offered what it is asked.
  ``DEFAULT_REPLICAS`` = 4, the replicas of the GPU Operator's documented time-slicing example
  (docs.nvidia.com, "Time-Slicing GPUs in Kubernetes").
- **Which pods may share: the cluster's rules.** A platform team keeps whole-GPU jobs off the
  shared nodes with a taint (``TAINT``) that only sharing pods (and CPU-only pods) tolerate, and
  sends sharing pods there with a nodeSelector on GPU feature discovery's strategy label. A
  sharing pod asks one ``nvidia.com/gpu`` (a replica) with ``gpuplace.io/gpu-fraction`` = its
  ``gpu_milli`` / 1000 and ``gpuplace.io/class`` = the policy's first class that may share
  (``shareGpus``), so gpuplace budgets it by that share of the GPU's memory; the baselines
  count replicas, as kube-scheduler does.
- **Which GPU.** The kubelet takes the plugin's preferred allocation: the GPU with the fewest
  replicas in use, ties at random (``plugin_choice``; the NVIDIA device plugin's
  ``internal/rm/allocate.go``, the default for replicated resources), whatever the scheduler
  would have chosen. A share can so land on a GPU without room for it: a VRAM over-commit,
  which the report counts (``Cluster.overcommit``).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict
from typing import Sequence

from scheduler_extender.core.policy import Policy
from scheduler_extender.core.requirements import A_CLASS, A_FRACTION
from scheduler_extender.core.sharing import REPLICAS_LABEL, SHARING_STRATEGY_LABEL, GpuSharing
from scheduler_extender.simulator.model import SimNode, SimPod

SHARING_MODES = ("scheduler", "device-plugin")
DEFAULT_REPLICAS = 4
TAINT = {"key": "gpuplace.io/shared-gpus", "value": "time-slicing", "effect": "NoSchedule"}
"""The taint on time-sliced nodes that sharing and CPU-only pods tolerate, whole-GPU pods do not."""
SOURCE = "gpuplace simulate --sharing device-plugin"


def sharing_share(pods: Sequence[SimPod]) -> float:
    """The share of the GPU pods' milli-GPUs that sharing pods ask for (0 without GPU pods)."""
    total = sum(p.total_milli for p in pods if p.gpus)
    return sum(p.total_milli for p in pods if p.sharing) / total if total else 0.0


def time_sliced(nodes: Sequence[SimNode], share: float) -> list[bool]:
    """Per node, whether it is time-sliced: per GPU model (its first GPU's name), ``share`` of
    its nodes rounded up, every ``1/share``-th in list order (deterministic)."""
    if not 0 <= share <= 1:
        raise ValueError(f"time-sliced share {share} is not between 0 and 1")
    by_model: dict[str, list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        by_model[n.inventory.gpus[0].name if n.inventory.gpus else ""].append(i)
    out = [False] * len(nodes)
    for members in by_model.values():
        want = math.ceil(share * len(members) - 1e-9)
        for k in range(want):
            out[members[(k * len(members)) // want]] = True
    return out


def cluster_fleet(nodes: Sequence[SimNode], share: float, replicas: int = DEFAULT_REPLICAS) -> list[SimNode]:
    """``nodes`` with ``share`` of each model's time-sliced into ``replicas`` per GPU."""
    if replicas < 2:
        raise ValueError(f"--replicas {replicas}: time-slicing needs at least 2 replicas per GPU")
    sharing = GpuSharing("time-slicing", replicas, SOURCE)
    return [dataclasses.replace(n, sharing=sharing, template=f"{n.template or 'node:' + n.name}+ts{replicas}")
            if ts else n for n, ts in zip(nodes, time_sliced(nodes, share))]


def sharing_class(policy: Policy) -> str:
    """The policy's first class that may share a GPU (``shareGpus``); ValueError when none may."""
    for c in policy.classes:
        if c.share_gpus:
            return c.name
    raise ValueError("--sharing device-plugin: no class of the policy may share a GPU (shareGpus: true)")


def cluster_pod(pod: SimPod, class_name: str) -> SimPod:
    """The pod as the cluster runs it: a sharing pod with its share as ``gpuplace.io/gpu-fraction``
    and the sharing class; any other pod unchanged."""
    if not pod.sharing:
        return pod
    return dataclasses.replace(pod, annotations={**pod.annotations, A_FRACTION: f"{pod.gpu_milli / 1000:g}",
                                                 A_CLASS: class_name})


def cluster_model(nodes: Sequence[SimNode], pods: Sequence[SimPod], policy: Policy, share: float | None,
                  replicas: int = DEFAULT_REPLICAS) -> tuple[list[SimNode], list[SimPod], float]:
    """The fleet and the pods as the cluster runs them (module docstring): (nodes with ``share``
    of each model's time-sliced, None: ``sharing_share(pods)``; the pods with ``cluster_pod``;
    the share used). ValueError names what is wrong: no sharing class, a share outside 0-1, too
    few replicas."""
    cls = sharing_class(policy)
    share = sharing_share(pods) if share is None else share
    return cluster_fleet(nodes, share, replicas), [cluster_pod(p, cls) for p in pods], share


def node_labels(sharing: GpuSharing | None) -> dict[str, str]:
    """GPU feature discovery's sharing labels of a node (none for whole GPUs)."""
    if sharing is None:
        return {}
    return {SHARING_STRATEGY_LABEL: sharing.strategy, REPLICAS_LABEL: str(sharing.replicas)}


def plugin_choice(in_use: Sequence[int], replicas: int, rng: random.Random) -> int | None:
    """The GPU (index into ``in_use``, replicas in use per GPU) whose replica the device plugin
    gives a one-replica request: the fewest in use, ties at random; None when every replica is."""
    free = [j for j, n in enumerate(in_use) if n < replicas]
    if not free:
        return None
    low = min(in_use[j] for j in free)
    return rng.choice([j for j in free if in_use[j] == low])
