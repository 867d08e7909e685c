"""FGD, Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23), as a baseline: written
from the paper's definitions and the authors' simulator, hkust-adsl/kubernetes-scheduler-simulator
at commit 8f3d6417 (the paths below are in that repository); no code of theirs is copied.

*Target workload* (``typical_pods``): the pods of the workload, by resource spec (CPU, milli-GPU
per GPU, GPU count, allowed GPU models), the most frequent specs first until they make up 95 % of
the pods, CPU-only pods included, shares renormalised to 1 (``GetTypicalPods``,
``pkg/utils/frag.go:381-476``, with the paper's configuration ``isInvolvedCpuPods: true``,
``podPopularityThreshold: 95``, ``podIncreaseStep: 1``, ``gpuResWeight: 0`` from
``scripts/generate_config_and_run.py:56-59,117-121``). The authors take it from the whole pod list
before tuning (``SetWorkloadPods``/``SetTypicalPods``, ``pkg/simulator/core.go:96-97``): FGD knows
the workload in advance; ``FgdPolicy`` is given it the same way.

*Node fragmentation* (``FgdPolicy.fragmentation``), in milli-GPUs, the expected share of a node's
free GPU that the next pod of the target workload could not use (``NodeGpuShareFragAmount``,
``frag.go:147-167``, classified by ``GetNodePodFrag``, ``frag.go:556-582``): for each typical pod
``m`` with share ``p``, ``p`` x

- the free milli of the GPUs with less than ``m``'s per-GPU share free, when the node can host
  ``m`` (``m``'s GPU model allowed, ``m``'s GPU count of GPUs with its share free, ``m``'s CPU
  free) — the case the paper calls Q-III, only those GPUs are fragment;
- all the node's free milli otherwise (lacking GPU, CPU or both, a model ``m`` may not use, or
  ``m`` a CPU-only pod: then no free GPU serves it).

Memory is not part of it (FGD's ``PodResource`` has no memory; kube-scheduler's NodeResourcesFit
still filters on it, here as for every policy).

*Score* (``FGDScore``, ``pkg/simulator/plugin/fgd_score.go:38-90``): for a node that passes the
filters, ``int(sigmoid((F_before - F_after) / 1000) x 100)`` where ``F_after`` is the node's
fragmentation with the pod placed: a whole-GPU pod on wholly free GPUs (which ones does not change
``F``; it gets the first by index, ``AllocateExclusiveGpuId``, ``pkg/type/resource.go:348-368``); a
sharing pod on each GPU with its share free, the node scoring its best GPU, the lowest index among
equal scores, which is also the GPU it gets (``allocateGpuIdBasedOnFGDScore``); a CPU-only pod
changes only the free CPU. The pod goes to the highest score (FGD is the only score plugin in
the paper's runs, weight 1000, ``percentageOfNodesToScore: 100``). The integer truncation is kept:
it makes many ties (a change under ~40 milli-GPUs moves no score).

*Ties* go the authors' way, not kube-scheduler's: their simulator vendors a patched
kube-scheduler (``go.mod:54``, ``k8s.io/kubernetes => github.com/mental2008/kubernetes
v1.20.5-minor``) whose ``selectHost`` takes the smallest node name among equal scores "for
reproducibility" (``vendor/k8s.io/kubernetes/pkg/scheduler/core/generic_scheduler.go:187-212``),
and it prefixes each node's name with its place in a permutation drawn from the seed
(``pkg/simulator/simulator.go:478-485``). So ties go to the first node of a seeded random order,
the same node every time: a packing effect. It matters: on openb ``default`` at 130 % this FGD
allocates 95.3 % with it and 89.6 % with random ties (seed 0), against the authors' 95.39 % (their
``experiments/analysis/expected_results/analysis_allo_discrete.csv``, mean of 10 seeds).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from scheduler_extender.simulator.cluster import MILLI, Cluster
from scheduler_extender.simulator.model import SimPod

POPULARITY = 0.95
"""Typical pods: the most frequent specs until they make up this share of the pods."""

FRAG_SCALE_MILLI = 1000.0
"""The score's sigmoid takes the fragmentation decrease in GPUs (``/ 1000``, ``fgd_score.go:72,83``)."""

_CHUNK = 512  # nodes per vectorised fragmentation pass (bounds the node x typical x GPU arrays)


@dataclass(frozen=True)
class TypicalPod:
    """One spec of the target workload and its share of the pods (``TargetPod``)."""

    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for a CPU-only pod
    gpus: int
    allowed_models: frozenset[str] | None
    share: float


def pod_spec(pod: SimPod) -> tuple[int, int, int, frozenset[str] | None]:
    """(CPU, milli per GPU, GPUs, allowed models) of a pod: FGD's ``PodResource`` (memory left out)."""
    return (pod.cpu_milli or 0, pod.gpu_milli if pod.gpus else 0, pod.gpus, pod.allowed_models)


def typical_pods(pods: Sequence[SimPod], popularity: float = POPULARITY) -> list[TypicalPod]:
    """The target workload of ``pods`` (module docstring): specs by count, most frequent first (ties:
    the larger spec first, as ``sort.Reverse`` over ``TargetPodList.Less`` orders them), until
    their pods reach ``popularity`` of all, shares renormalised over the specs kept."""
    counts = Counter(pod_spec(p) for p in pods)
    if not counts:
        return []

    def order(item: tuple[tuple, int]) -> tuple:
        (cpu, milli, gpus, allowed), n = item
        return (n, cpu, milli, gpus, "|".join(sorted(allowed or ())))

    ranked = sorted(counts.items(), key=order, reverse=True)
    expected = popularity * len(pods)
    kept: list[tuple[tuple, int]] = []
    cum = 0
    for spec, n in ranked:
        if cum >= expected:
            break
        kept.append((spec, n))
        cum += n
    return [TypicalPod(*spec, share=n / cum) for spec, n in kept]


class FgdPolicy:
    """FGD as a placement policy (module docstring), over ``target``'s typical pods."""

    name = "fgd"

    def __init__(self, target: Sequence[SimPod], popularity: float = POPULARITY,
                 typical: Sequence[TypicalPod] | None = None) -> None:
        """``typical``: the target workload's typical pods as given (``target`` is then unused)."""
        self.typical = list(typical) if typical is not None else typical_pods(target, popularity)
        if not self.typical:
            raise ValueError("fgd needs a target workload with at least one pod")
        self._cluster: Cluster | None = None

    def reset(self) -> None:
        self._cluster = None

    def bind(self, cluster: Cluster, rng: random.Random | None = None) -> None:
        """Per-cluster arrays: the typical pods' columns (``fragmentation`` reads them), the score
        caches and the tie-break order (a permutation of the nodes drawn from ``rng``; None: node
        order); a no-op for the cluster already bound."""
        if cluster is self._cluster:
            return
        self._cluster = cluster
        n = len(cluster.nodes)
        order = list(range(n))
        if rng is not None:
            rng.shuffle(order)
        self._rank = np.array(order, dtype=np.int64)
        t = self.typical
        self._t_milli = np.array([x.gpu_milli for x in t], dtype=np.int64)
        self._t_gpus = np.array([x.gpus for x in t], dtype=np.int64)
        self._t_cpu = np.array([x.cpu_milli for x in t], dtype=float)
        self._t_share = np.array([x.share for x in t], dtype=float)
        self._t_gpu_pod = self._t_milli > 0
        # typical pod x node model: may the pod use that model
        self._access = np.array([[x.allowed_models is None or mid in x.allowed_models for mid in cluster.models]
                                 for x in t], dtype=bool).reshape(len(t), len(cluster.models))
        self._before = np.zeros(n)
        self._before_version = np.full(n, -1, dtype=np.int64)
        self._scores: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def fragmentation(self, free_milli: np.ndarray, cpu_free: np.ndarray, model: np.ndarray) -> np.ndarray:
        """Fragmentation (milli-GPUs) of node states given row by row: free milli per GPU (0 for a
        GPU the node does not have), free CPU (millicores; inf: not modelled), model index."""
        out = np.empty(len(free_milli))
        for s in range(0, len(free_milli), _CHUNK):
            left = free_milli[s:s + _CHUNK]
            total = left.sum(axis=1)
            fits = left[:, None, :] >= self._t_milli[None, :, None]  # row x typical x GPU
            host = fits.sum(axis=2) >= self._t_gpus[None, :]
            short = np.where(fits, 0, left[:, None, :]).sum(axis=2)  # free milli of the GPUs too small
            q3 = (host & (cpu_free[s:s + _CHUNK, None] >= self._t_cpu[None, :])
                  & self._access[:, model[s:s + _CHUNK]].T & self._t_gpu_pod[None, :])
            out[s:s + _CHUNK] = np.where(q3, short, total[:, None]) @ self._t_share
        return out

    def _node_fragmentation(self, cluster: Cluster, idx: np.ndarray) -> np.ndarray:
        stale = idx[self._before_version[idx] != cluster.version[idx]]
        if len(stale):
            self._before[stale] = self.fragmentation(cluster.milli_free[stale], cluster.cpu_free[stale],
                                                     cluster.model_of[stale])
            self._before_version[stale] = cluster.version[stale]
        return self._before[idx]

    def _score(self, pod: SimPod, cluster: Cluster, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(score, GPU index for a sharing pod) on nodes ``idx``, each able to take the pod."""
        before = self._node_fragmentation(cluster, idx)
        left = cluster.milli_free[idx]
        cpu = cluster.cpu_free[idx] - (pod.cpu_milli or 0)
        model = cluster.model_of[idx]
        width = left.shape[1]
        if pod.sharing:
            rows = np.repeat(left[:, None, :], width, axis=1)  # node x option (GPU g) x GPU
            rows[:, np.arange(width), np.arange(width)] -= pod.gpu_milli
            after = self.fragmentation(rows.reshape(-1, width), np.repeat(cpu, width),
                                       np.repeat(model, width)).reshape(len(idx), width)
            scores = _sigmoid_score(before[:, None] - after)
            scores[left < pod.gpu_milli] = -1  # GPUs without the share free
            return scores.max(axis=1), scores.argmax(axis=1)  # argmax: the lowest index among equals
        if pod.gpus:
            free = left == MILLI
            left = np.where(free & (np.cumsum(free, axis=1) <= pod.gpus), 0, left)
        return _sigmoid_score(before - self.fragmentation(left, cpu, model)), np.zeros(len(idx), dtype=np.int64)

    def feasible(self, pod: SimPod, cluster: Cluster) -> np.ndarray:
        ok = cluster.fits_gpus(pod) & cluster.model_mask(pod.allowed_models) & cluster.fits_resources(pod)
        if pod.sharing and cluster.any_shared:  # FGD's own filter: a GPU with the share free (besides a replica)
            ok &= cluster.milli_free.max(axis=1) >= pod.gpu_milli
        return ok

    def choose(self, pod: SimPod, cluster: Cluster, rng: random.Random):  # noqa: ANN201 (baselines.Choice)
        self.bind(cluster, rng)
        ok = self.feasible(pod, cluster)
        if not ok.any():
            return None
        # A node's score depends on its state and the pod's (CPU, milli, GPUs) only: kept per pod
        # spec and recomputed for the nodes that changed since.
        key = (pod.cpu_milli or 0, pod.gpu_milli if pod.gpus else 0, pod.gpus)
        cached = self._scores.get(key)
        if cached is None:
            n = len(cluster.nodes)
            cached = self._scores[key] = (np.zeros(n), np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64))
        score, gpu, version = cached
        stale = np.flatnonzero(ok & (version != cluster.version))
        if len(stale):
            score[stale], gpu[stale] = self._score(pod, cluster, stale)
            version[stale] = cluster.version[stale]
        keys = np.where(ok, score, -np.inf)
        best = np.flatnonzero(keys == keys.max())
        i = int(best[np.argmin(self._rank[best])])  # the authors' tie-break (module docstring)
        if pod.sharing:
            return i, (cluster.units[i][int(gpu[i])],)
        return i, cluster.units_for(i, pod)


def _sigmoid_score(decrease: np.ndarray) -> np.ndarray:
    """``int64(sigmoid(decrease / 1000) * 100)`` (``fgd_score.go:72,83``; Go truncates toward 0)."""
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-decrease / FRAG_SCALE_MILLI)) * 100.0).astype(np.int64).astype(float)
