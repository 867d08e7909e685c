"""Placement policies of one simulation: gpuplace (the extender's Engine) and the baselines.

Every policy sees the same cluster and the same kube-scheduler filters: free GPU count
(``nvidia.com/gpu``, the device plugin's extended resource), CPU and memory requests where the
workload gives them (NodeResourcesFit), and the pod's GPU-model constraint (openb ``gpu_spec`` as
a nodeSelector/affinity on the model label). Ties between equally scored nodes are broken at
random, as kube-scheduler's ``selectHost`` does.

- ``gpuplace``: the pod's manifest through ``Engine.filter`` and ``Engine.score`` (the code the
  extender runs), on top of the CPU/memory filter. The node is picked as kube-scheduler picks it
  with the extender as the chart installs it: ``/filter`` passes one of the nodes of gpuplace's
  best score (``filter_returns_best``, ``NodeScore.best_rank``), the one the default profile's
  scores prefer (``kube_scores``, as ``spread``; the extender breaks its ties by the same formula,
  ``core.kube_scores``), then the first in kube-scheduler's rotating order, modelled as a random
  pick among ties; with two verbs, extender score x ``EXTENDER_WEIGHT`` x 10 plus those scores.
  The units are the filter's ``chosen``. A GPU-sharing pod's job carries its share
  (``Job.gpu_milli``, as a GPU-sharing device plugin would grant it); it is filtered as a one-GPU
  pod against the node with the units that have less than its share free held, and scored with
  what sharing pods left of each unit (``NodeAllocation.partly_free_milli``; both from
  ``Cluster.class_state``), so fragmentation counts shares as FGD does; it gets the filter's
  chosen unit, the one with the least share left that holds it (the best fit). A CPU-only pod
  reaches the extender as the chart installs it (``scheduler.extender.cpuOnlyPods``, no
  ``managedResources``; ``cpu_only_pods``) and is scored on every class of nodes that fits it
  (``_choose_without_gpus``); with ``cpu_only_pods`` False the default profile places it, as
  ``spread``. The free GPUs per model of the nodes that fit a GPU pod are the ``supply`` of the
  score's scarcity term, as the extender counts them over its request.
- ``random``: any feasible node.
- ``spread``: kube-scheduler's default profile: NodeResourcesFit ``LeastAllocated`` plus
  NodeResourcesBalancedAllocation over cpu and memory (``kube_scores``; resources the workload
  does not give are left out). The default profile does not score nvidia.com/gpu.
- ``bestfit``: NodeResourcesFit ``MostAllocated`` over cpu, memory and nvidia.com/gpu (the
  "Resource Bin Packing" configuration of the Kubernetes docs), plus BalancedAllocation.
- ``static``: the hand-written nodeSelector a platform team maintains, model size -> GPU types
  (``STATIC_MAP``), on top of ``spread`` scoring; pods of unknown size get no selector.
- ``fgd``: FGD's fragmentation gradient descent over the target workload (``scheduler_extender.simulator.fgd``),
  FGD's own choice of GPU for a sharing pod.

Every policy places under the share model of ``cluster.Cluster``: whole-GPU pods need wholly free
GPUs, a GPU-sharing pod needs its ``gpu_milli`` free on one GPU (kube-scheduler with a GPU-sharing
device plugin and its filter, as FGD's simulator models it). No baseline checks VRAM: a device
plugin counts devices, not memory; that is where OOM risk comes from. Baselines take the node's
first free GPUs by index, as the device plugin does, and for a sharing pod the best-fitting GPU
(``Cluster.units_for``). ``bestfit``'s nvidia.com/gpu fraction counts milli-GPUs.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Protocol, Sequence

import numpy as np

from scheduler_extender.core.catalog import Catalog
from scheduler_extender.core.devices import NodeState, Unit
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.pod import as_pod
from scheduler_extender.served.decider import Decider
from scheduler_extender.served.grouped import GroupedEngine, GroupedResults
from scheduler_extender.served.selection import best_ranked
from scheduler_extender.core.filter import NodeResult, filter_node
from scheduler_extender.core.job import Job
from scheduler_extender.simulator import batch_fragmentation
from scheduler_extender.simulator.cluster import MILLI, Cluster
from scheduler_extender.simulator.model import SimPod

Choice = tuple[int, tuple[Unit, ...]]

# (largest model in billions of parameters, GPU types a platform team would pin it to).
STATIC_MAP: list[tuple[float, list[str]]] = [
    (3, ["T4", "L4", "A10", "GPU-series-1", "P100", "V100"]),
    (13, ["A10", "L4", "L40S", "RTX-4090", "A6000", "GPU-series-1", "V100-32GB"]),
    (34, ["A100-80GB", "A800", "L40S", "GPU-series-2"]),
    (float("inf"), ["H100", "H800", "H200", "A100-80GB", "A800", "GPU-series-2"]),
]
KUBE_BASELINES = ("random", "spread", "bestfit", "static")
BASELINES = (*KUBE_BASELINES, "fgd")


class PlacementPolicy(Protocol):
    name: str

    def choose(self, pod: SimPod, cluster: Cluster, rng: random.Random) -> Choice | None: ...

    def feasible(self, pod: SimPod, cluster: Cluster) -> np.ndarray: ...


EXTENDER_WEIGHT = 10
"""The extender's ``weight`` in the kube-scheduler configuration (``extenders[].weight``), as the
e2e harness installs it. The extender's 0-10 score is multiplied by weight x 10 (kube-scheduler
scales extender scores to its 0-100 range): at 10 one extender point outweighs the default
plugins together, which then only break ties. ``gpuplace simulate --extender-weight`` changes it."""


def _fractions_after(pod: SimPod, c: Cluster, gpu: bool) -> list[np.ndarray]:
    """Requested / allocatable per resource after placing ``pod`` (resources the workload gives)."""
    parts = []
    if gpu:
        used = c.milli_total - c.milli_free.sum(axis=1)
        parts.append((used + pod.total_milli) / np.maximum(c.milli_total, 1))
    if pod.cpu_milli is not None and np.isfinite(c.cpu_cap).all():
        parts.append((c.cpu_cap - c.cpu_free + pod.cpu_milli) / c.cpu_cap)
    if pod.memory_mib is not None and np.isfinite(c.mem_cap).all():
        parts.append((c.mem_cap - c.mem_free + pod.memory_mib) / c.mem_cap)
    return parts


def kube_scores(pod: SimPod, c: Cluster, strategy: str = "LeastAllocated", gpu: bool = False) -> np.ndarray:
    """kube-scheduler's resource scoring for every node, 0-200: NodeResourcesFit with
    ``strategy`` (``LeastAllocated``: 100 x mean free fraction; ``MostAllocated``: 100 x mean
    used fraction) plus NodeResourcesBalancedAllocation (100 x (1 - std of the used fractions)),
    both over cpu and memory (the default profile) and, with ``gpu``, nvidia.com/gpu (listed in
    the plugins' ``resources`` args, as bin-packing configurations do), after placing the pod,
    each plugin at weight 1 (kubernetes pkg/scheduler/framework/plugins/noderesources). The GPU
    fraction is in milli-GPUs (a sharing pod requests its share of one GPU)."""
    parts = _fractions_after(pod, c, gpu=gpu)
    if not parts:
        return np.zeros(len(c.nodes))
    f = np.clip(np.array(parts), 0, 1)
    fit = f.mean(axis=0) if strategy == "MostAllocated" else 1 - f.mean(axis=0)
    return np.round(100 * fit) + np.round(100 * (1 - f.std(axis=0)))


def _pick(keys: np.ndarray, rng: random.Random) -> int | None:
    best = keys.max()
    if best == -np.inf:
        return None
    ties = np.flatnonzero(keys == best)
    return int(ties[rng.randrange(len(ties))]) if len(ties) > 1 else int(ties[0])


class GpuplacePolicy:
    """The extender's decision, on the path the extender serves: ``Engine.filter_grouped`` (the
    equivalence classes and the job memo of ``/filter``) and ``Engine.score_grouped`` (those of
    ``/prioritize``) over one engine state per class of simulated nodes."""

    def __init__(self, engine: Engine, name: str = "gpuplace", extender_weight: float = EXTENDER_WEIGHT,
                 filter_returns_best: bool = True, cpu_only_pods: bool = True, defrag: bool = False) -> None:
        self.name = name
        # Replay mode: plan room for waiting whole-GPU pods by moving running ones (``simulator.defrag``).
        self.defrag = defrag
        # As the chart installs the extender (scheduler.extender.cpuOnlyPods): kube-scheduler asks it
        # about pods without GPUs too; False: the default profile places them alone.
        self.cpu_only_pods = cpu_only_pods
        self.extender_weight = extender_weight
        # As the chart installs the extender (extender.filterReturnsBest): /filter passes only the
        # nodes of the best score (``NodeScore.best_rank``), and kube-scheduler's own scores choose
        # among those; False: filter + prioritize.
        self.filter_returns_best = filter_returns_best
        # The engine, the job memo and the learned workload, as the extender's service holds them;
        # the candidates' fragmentation increases in one numpy batch (equal to the extender's plain
        # loop, float for float: ``simulator.batch_fragmentation``).
        self.decider = Decider(engine)
        self.decider.engine.fragmentation_deltas = batch_fragmentation.fragmentation_deltas
        self._jobs: dict[tuple, Job] = {}
        self.filter_calls = 0  # requests to the grouped filter (one per pod the extender is asked about)

    @property
    def engine(self) -> GroupedEngine:
        """The decider's engine."""
        return self.decider.engine

    def job(self, pod: SimPod) -> Job:
        """The decider's ``Job`` for the pod's manifest (``Decider.job``, the extender's job memo),
        kept per kind of pod so that the manifest is built once: keyed on the signature
        plus the CPU/memory requests, which the filter does not read but the score's
        ``fragmentation`` and the learned workload do (keyed on the signature alone, every pod of a
        signature was scored and learned with the first one's requests)."""
        key = (pod.signature, pod.cpu_milli, pod.memory_mib)
        j = self._jobs.get(key)
        if j is None:
            j = self.decider.job(as_pod(pod.manifest()), None)
            if pod.sharing:  # the share the GPU-sharing device plugin would give it
                j = dataclasses.replace(j, gpu_milli=pod.gpu_milli)
            j = self._jobs[key] = j
        return j

    def _grouped(self, pod: SimPod, cluster: Cluster, fits: np.ndarray
                 ) -> tuple[Job, list[int], list[int], GroupedResults]:
        """The grouped filter over the engine states of the classes with a node that fits the
        pod's CPU/memory (kube-scheduler runs NodeResourcesFit before it calls the extender):
        (job, live classes, per live class the index of its state in the request, results)."""
        job = self.job(pod)
        live = cluster.live_classes(fits)
        per_class = cluster.class_states(live, pod.gpu_milli)
        ids = list(map(id, per_class))
        distinct = dict(zip(ids, per_class))  # each state once, in order of first appearance
        states: list[NodeState] = list(distinct.values())
        position = {i: k for k, i in enumerate(distinct)}
        state_of = list(map(position.__getitem__, ids))
        self.filter_calls += 1
        return job, live, state_of, self.engine.filter_grouped(job, states, None)

    def _verdicts_for(self, pod: SimPod, cluster: Cluster, fits: np.ndarray) -> tuple[Job, dict[int, NodeResult]]:
        job, live, state_of, grouped = self._grouped(pod, cluster, fits)
        return job, _by_class(live, state_of, grouped)

    def feasible(self, pod: SimPod, cluster: Cluster) -> np.ndarray:
        fits = cluster.fits_resources(pod)
        if pod.gpus == 0:  # no GPU request: kube-scheduler does not call the extender
            return fits
        _, verdicts = self._verdicts_for(pod, cluster, fits)
        ok = np.zeros(cluster.class_total, dtype=bool)
        ok[[c for c, r in verdicts.items() if r.passed and r.chosen]] = True
        return ok[cluster.class_of] & fits

    def choose(self, pod: SimPod, cluster: Cluster, rng: random.Random) -> Choice | None:
        fits = cluster.fits_resources(pod)
        if pod.gpus == 0:
            if self.cpu_only_pods:
                return self._choose_without_gpus(pod, cluster, fits, rng)
            i = _pick(np.where(fits, kube_scores(pod, cluster), -np.inf), rng)  # the default profile alone
            return None if i is None else (i, ())
        job, live, state_of, grouped = self._grouped(pod, cluster, fits)
        self.decider.learn(job)  # the extender learns from every pod it is asked about, placed or not
        verdicts = _by_class(live, state_of, grouped)
        if not any(r.passed and r.chosen for r in verdicts.values()):
            return None
        # Free GPUs per model over the nodes kube-scheduler sends the extender (those that fit
        # the pod's CPU/memory), as the extender counts them over its request (``supply_of``).
        free = np.bincount(cluster.model_of[fits], weights=cluster.milli_free[fits].sum(axis=1),
                           minlength=len(cluster.models)) / MILLI
        supply = {mid: float(v) for mid, v in zip(cluster.models, free) if v > 0}
        scored = self.decider.score(job, grouped, supply)
        by_class = np.full(cluster.class_total, -np.inf)
        rank: dict[int, tuple[int, float]] = {}
        for cid, k in zip(live, state_of):
            sc = scored.scores[scored.score_of[k]]
            if sc is not None and verdicts[cid].passed and verdicts[cid].chosen:
                by_class[cid] = sc.score
                rank[cid] = sc.best_rank
        i = self._pick_node(pod, cluster, fits, by_class, rank, rng)
        if i is None:
            return None
        cid = int(cluster.class_of[i])
        chosen = verdicts[cid].chosen
        state = cluster.class_state(cid, pod.gpu_milli)
        if any(u.uuid in state.allocation.held for u in chosen):
            # The grouped filter decided this class through another state of its equivalence class:
            # as many free devices, alike up to UUIDs, not the same ones. This node's own are the
            # plain filter's on its state (the devices, not the decision, differ).
            chosen = filter_node(job, state, self.engine.policy, None).chosen
        return i, chosen

    def _choose_without_gpus(self, pod: SimPod, cluster: Cluster, fits: np.ndarray,
                             rng: random.Random) -> Choice | None:
        """A CPU-only pod sent to the extender (``cpu_only_pods``): scored on every node that fits
        its CPU/memory (``Engine.score``: ``score._score_without_devices``), one state per class,
        then picked as a GPU pod's node is."""
        job = self.job(pod)
        live = cluster.live_classes(fits)
        if not live:
            return None
        state_of = [cluster.class_state(cid) for cid in live]
        states = list({id(st): st for st in state_of}.values())
        results = [NodeResult(st.name, True, untouched=True) for st in states]
        scores = self.engine.score(job, states, results, self.decider.workload_profile())
        by_class = np.full(cluster.class_total, -np.inf)
        rank = {}
        for cid, st in zip(live, state_of):
            sc = scores[st.name]
            by_class[cid] = sc.score
            rank[cid] = sc.best_rank
        i = self._pick_node(pod, cluster, fits, by_class, rank, rng)
        return None if i is None else (i, ())

    def _pick_node(self, pod: SimPod, cluster: Cluster, fits: np.ndarray, by_class: np.ndarray,
                   rank: dict[int, tuple[int, float]], rng: random.Random) -> int | None:
        """kube-scheduler's pick (class docstring) from the extender's score per class
        (``by_class``) and ``NodeScore.best_rank`` per passing class (``rank``)."""
        if self.filter_returns_best and rank:
            # As the server's /filter (served.selection): the others fail; kube-scheduler never scores them.
            _, best = best_ranked(rank.items())
            kept = set(best)
            for cid in rank:
                if cid not in kept:
                    by_class[cid] = -np.inf
        # kube-scheduler adds the extender's 0-10 score x weight x 10 to its plugins' scores.
        keys = by_class[cluster.class_of] * (self.extender_weight * 10) + kube_scores(pod, cluster)
        keys[~fits] = -np.inf
        return _pick(keys, rng)

    def reset(self) -> None:
        self.decider.reset_workload()


def _by_class(live: list[int], state_of: list[int], grouped: GroupedResults) -> dict[int, NodeResult]:
    """Per live class, the grouped filter's verdict for its state."""
    return {cid: grouped.results[grouped.group_of[k]] for cid, k in zip(live, state_of)}


class KubeBaseline:
    """kube-scheduler with the NVIDIA device plugin and no extender (see module docstring)."""

    def __init__(self, name: str, catalog: Catalog) -> None:
        if name not in KUBE_BASELINES:
            raise ValueError(f"unknown kube-scheduler baseline {name!r}; use one of {', '.join(KUBE_BASELINES)} "
                             "(fgd is simulator.fgd.FgdPolicy)")
        self.name = name
        self._static = [(limit, frozenset().union(*(_resolve(t, catalog) for t in tokens)))
                        for limit, tokens in STATIC_MAP]

    def selector(self, pod: SimPod) -> frozenset[str] | None:
        """The models the pod's nodeSelector allows: its own constraint, and for ``static`` the map."""
        allowed = pod.allowed_models
        if self.name == "static" and pod.params is not None:
            mapped = next(models for limit, models in self._static if pod.params <= limit * 1e9)
            allowed = mapped if allowed is None else (allowed & mapped)
        return allowed

    def feasible(self, pod: SimPod, cluster: Cluster) -> np.ndarray:
        return cluster.fits_gpus(pod) & cluster.model_mask(self.selector(pod)) & cluster.fits_resources(pod)

    def choose(self, pod: SimPod, cluster: Cluster, rng: random.Random) -> Choice | None:
        ok = self.feasible(pod, cluster)
        if not ok.any():
            return None
        keys = np.zeros(len(ok)) if self.name == "random" else (
            kube_scores(pod, cluster, "MostAllocated", gpu=True) if self.name == "bestfit"
            else kube_scores(pod, cluster))
        keys = np.where(ok, keys, -np.inf)
        i = _pick(keys, rng)
        if i is None:
            return None
        return i, cluster.units_for(i, pod)


def _resolve(token: str, catalog: Catalog) -> frozenset[str]:
    from scheduler_extender.simulator.model import resolve_model
    try:
        return catalog.resolve_token(token)
    except ValueError:
        return frozenset({resolve_model(token, catalog).id})


def make_policies(engine: Engine, baselines: list[str], target: Sequence[SimPod] | None = None
                  ) -> list[PlacementPolicy]:
    """gpuplace first, then the named baselines; ``fgd`` needs ``target``, the workload whose
    typical pods it measures fragmentation against (``scheduler_extender.simulator.fgd``)."""
    from scheduler_extender.simulator.fgd import FgdPolicy
    out: list[PlacementPolicy] = [GpuplacePolicy(engine)]
    for b in baselines:
        if b == "fgd":
            if target is None:
                raise ValueError("baseline fgd needs the target workload (target=...)")
            out.append(FgdPolicy(target))
        else:
            out.append(KubeBaseline(b, engine.catalog))
    return out
