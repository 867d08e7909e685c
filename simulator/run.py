"""The two simulation modes and what they measure.

*fill* (the FGD evaluation, Weng et al., ATC'23): pods arrive one after another and never
leave; a pod that fits nowhere is counted unplaced and dropped. When the GPUs requested so far
(in thousandths of a GPU: a sharing pod requests its share) reach each ``load`` share of the
fleet's GPUs, a snapshot is taken; the run stops at the highest
load. A trace that runs out first is continued with pods drawn from it at random (seeded).

*replay*: pods arrive in trace order at their trace times, scaled so that the offered load (GPUs
x run time requested per unit of time, over the span of arrivals) is ``load`` x the fleet's GPUs,
run for their trace duration, and leave. A pod that fits nowhere waits in a FIFO queue and is
retried whenever GPUs are freed. Measured over the span from the first to the last arrival.

Metrics per run and load (``Snapshot``):
- ``allocation_ratio``: allocated GPUs / fleet GPUs (replay: time average);
- ``stranded_gpus``: wholly free GPUs on nodes where no pending GPU pod fits under the policy's
  own filter (0 when nothing is pending), also by model and by cause (``stranded_by_cause``,
  ``STRANDED_CAUSES``: what keeps the pending pods off those GPUs);
- ``placed`` / ``unplaced`` GPU pods, and ``sharing_placed`` / ``sharing_unplaced`` for openb's
  GPU-sharing pods (a share of one GPU, ``cluster.Cluster``'s share model);
- ``oom_risk``: placed pods whose GPUs have less VRAM than gpuplace's estimate of their need
  (None when no placed pod's need is known, e.g. the openb trace);
- ``premium_gpu_hours_wasted``: GPU-hours of premium-tier GPUs (policy ``tier``) given to pods
  that fit a non-premium GPU of the fleet allowed by their own constraint (VRAM need met, or
  unknown, and a node of that model with enough GPUs), at the pods' trace durations (a share of
  a GPU counts its share);
- ``cost_per_hour``: USD per hour of the allocated GPUs (policy prices; replay: time average);
- ``queue_delay_hours_mean`` / ``_max`` (replay) of the pods that started.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from scheduler_extender.core.devices import Unit
from scheduler_extender.core.engine import Engine
from simulator.baselines import GpuplacePolicy, PlacementPolicy
from simulator.cluster import Cluster
from simulator.model import SimNode, SimPod

Progress = Callable[[int], None]


@dataclass
class Placement:
    pod: SimPod
    node: int
    units: tuple[Unit, ...]
    start_s: float


@dataclass
class Snapshot:
    allocation_ratio: float
    stranded_gpus: int
    placed: int
    unplaced: int
    oom_risk: int | None
    premium_gpu_hours_wasted: float
    cost_per_hour: float
    sharing_placed: int = 0
    sharing_unplaced: int = 0
    allocated_gpus: float = 0.0
    stranded_by_model: dict[str, int] = field(default_factory=dict)
    stranded_by_cause: dict[str, int] = field(default_factory=dict)
    queue_delay_hours_mean: float | None = None
    queue_delay_hours_max: float | None = None


class Judge:
    """What the report needs to know about a pod, independent of the policy that placed it:
    the VRAM need (gpuplace's estimate) and whether it fits a non-premium GPU of the fleet."""

    def __init__(self, engine: Engine, nodes: Sequence[SimNode], cluster: Cluster) -> None:
        self.engine = engine
        self.policy = engine.policy
        self._need: dict[tuple, int | None] = {}
        self._cheaper: dict[tuple, bool] = {}
        # (model id, VRAM bytes, largest node GPU count) of every non-premium model in the fleet
        best: dict[str, tuple[int, int]] = {}
        for units in cluster.units:
            if not units:
                continue
            u = units[0]
            if self.policy.tier(u.entry) == "premium":
                continue
            mid = u.entry.id if u.entry else "unknown"
            mem, count = best.get(mid, (u.memory_bytes, 0))
            best[mid] = (min(mem, u.memory_bytes), max(count, len(units)))
        self._non_premium = best

    def need_bytes(self, pod: SimPod) -> int | None:
        if pod.signature not in self._need:
            job = self.engine.job(pod.manifest())
            self._need[pod.signature] = job.vram.bytes_per_gpu if job.vram else None
        return self._need[pod.signature]

    def fits_cheaper(self, pod: SimPod) -> bool:
        key = (pod.signature, pod.allowed_models)
        if key not in self._cheaper:
            need = self.need_bytes(pod)
            self._cheaper[key] = any(
                (pod.allowed_models is None or mid in pod.allowed_models) and count >= pod.gpus
                and (need is None or mem >= need)
                for mid, (mem, count) in self._non_premium.items())
        return self._cheaper[key]

    def is_premium(self, u: Unit) -> bool:
        return self.policy.tier(u.entry) == "premium"


STRANDED_CAUSES = ("cpu", "memory", "cpu_and_memory", "model", "gpus", "other")
"""Why a stranded node's free GPUs serve no pending pod, the first that applies: some pending pod
would fit but for the node's free ``cpu`` / ``memory`` / both (its GPU count and model fit); some
would fit but may not use the node's GPU ``model``; every pending pod that fits the node's host
resources and model needs more ``gpus`` than are free (or a larger share of one GPU than any has
free); ``other``: the policy's own filter (e.g. gpuplace's VRAM check) or several of these at once."""


def stranded_causes(cluster: Cluster, stranded: np.ndarray, pending: Sequence[SimPod]) -> dict[str, int]:
    """Stranded GPUs (``stranded``: per node, 0 where not stranded) by ``STRANDED_CAUSES``, judged
    on the cluster's own bookkeeping (free GPUs, GPU model, free CPU and memory) against the pending
    pods, one per shape. Causes with no GPU are left out."""
    nodes = stranded > 0
    hits = {c: np.zeros(len(cluster.nodes), dtype=bool) for c in STRANDED_CAUSES[:-1]}
    for pod in pending:
        gpus = cluster.fits_gpus(pod)
        model = cluster.model_mask(pod.allowed_models)
        cpu = cluster.cpu_free >= (pod.cpu_milli or 0)
        mem = cluster.mem_free >= (pod.memory_mib or 0)
        hits["cpu"] |= gpus & model & ~cpu & mem
        hits["memory"] |= gpus & model & cpu & ~mem
        hits["cpu_and_memory"] |= gpus & model & ~cpu & ~mem
        hits["model"] |= gpus & ~model & cpu & mem
        hits["gpus"] |= ~gpus & model & cpu & mem
    out: dict[str, int] = {}
    for cause in STRANDED_CAUSES:
        mask = nodes & hits[cause] if cause in hits else nodes
        n = int(stranded[mask].sum())
        if n:
            out[cause] = n
        nodes = nodes & ~mask
    return out


def _stranded(cluster: Cluster, policy: PlacementPolicy, pending: Iterable[SimPod]
              ) -> tuple[int, dict[str, int], dict[str, int]]:
    usable = np.zeros(len(cluster.nodes), dtype=bool)
    shapes: dict[tuple, SimPod] = {}
    for pod in pending:
        if pod.shape in shapes or pod.gpus == 0:  # a CPU-only pod needs no free GPU
            continue
        shapes[pod.shape] = pod
        if not usable.all():
            usable |= policy.feasible(pod, cluster)
    if not shapes:
        return 0, {}, {}
    stranded = np.where(usable, 0, cluster.gpu_free)
    by_model: dict[str, int] = {}
    for ix, mid in enumerate(cluster.models):
        n = int(stranded[cluster.model_of == ix].sum())
        if n:
            by_model[mid] = n
    return int(stranded.sum()), by_model, stranded_causes(cluster, stranded, list(shapes.values()))


def _placement_totals(placements: Iterable[Placement], judge: Judge) -> tuple[int | None, float]:
    oom = 0
    known = 0
    wasted = 0.0
    for p in placements:
        if not p.units:
            continue
        need = judge.need_bytes(p.pod)
        if need is not None:
            known += 1
            if any(u.memory_bytes < need for u in p.units):
                oom += 1
        premium = sum(1 for u in p.units if judge.is_premium(u))
        if premium and judge.fits_cheaper(p.pod):
            wasted += premium * p.pod.gpu_milli / 1000 * p.pod.duration_s / 3600
    return (oom if known else None), wasted


def fill_stream(pods: Sequence[SimPod], seed: int) -> Iterator[SimPod]:
    """The trace in order, then pods drawn from it at random with replacement (seeded)."""
    yield from pods
    rng = random.Random(seed)
    for k in itertools.count():
        p = pods[rng.randrange(len(pods))]
        yield SimPod(**{**p.__dict__, "name": f"{p.name}-r{k}"})


def run_fill(nodes: Sequence[SimNode], stream: Iterator[SimPod], policy: PlacementPolicy, engine: Engine,
             loads: Sequence[float], seed: int, progress: Progress | None = None) -> dict[float, Snapshot]:
    """Fill mode (module docstring): one pass, a snapshot at each load."""
    cluster = Cluster(nodes, engine.catalog, engine.policy)
    judge = Judge(engine, nodes, cluster)
    rng = random.Random(seed * 7919 + 1)
    if isinstance(policy, GpuplacePolicy):
        policy.reset()
    placed: list[Placement] = []
    pending: list[SimPod] = []
    requested = 0
    out: dict[float, Snapshot] = {}
    targets = sorted(loads)
    for n, pod in enumerate(stream):
        requested += pod.total_milli
        choice = policy.choose(pod, cluster, rng)
        if choice is None:
            pending.append(pod)
        else:
            i, units = choice
            cluster.place(i, pod, units)
            placed.append(Placement(pod, i, units, 0.0))
        if progress is not None and n % 200 == 0:
            progress(n)
        while targets and requested >= targets[0] * cluster.capacity_milli:
            load = targets.pop(0)
            stranded, by_model, by_cause = _stranded(cluster, policy, pending)
            oom, wasted = _placement_totals(placed, judge)
            out[load] = Snapshot(
                allocation_ratio=cluster.allocated / cluster.capacity, stranded_gpus=stranded,
                placed=len(placed), unplaced=len(pending), oom_risk=oom, premium_gpu_hours_wasted=wasted,
                cost_per_hour=cluster.cost_per_hour, allocated_gpus=cluster.allocated,
                sharing_placed=sum(p.pod.sharing for p in placed), sharing_unplaced=sum(p.sharing for p in pending),
                stranded_by_model=by_model, stranded_by_cause=by_cause,
            )
        if not targets:
            break
    return out


def replay_time_scale(pods: Sequence[SimPod], load: float, capacity: int) -> float:
    """By how much to compress arrival times so that the offered load (GPUs x run time requested
    per unit of time over the window of arrivals; a share of a GPU counts its share) is ``load`` x
    ``capacity``; 1 for one instant."""
    t0 = min(p.creation_s for p in pods)
    span = max(p.creation_s for p in pods) - t0
    offered = sum(p.total_milli / 1000 * p.duration_s for p in pods) / span if span > 0 else 0.0
    return load * capacity / offered if offered > 0 else 1.0


def run_replay(nodes: Sequence[SimNode], pods: Sequence[SimPod], policy: PlacementPolicy, engine: Engine,
               load: float, seed: int, progress: Progress | None = None) -> Snapshot:
    """Replay mode (module docstring) at one load."""
    cluster = Cluster(nodes, engine.catalog, engine.policy)
    judge = Judge(engine, nodes, cluster)
    rng = random.Random(seed * 7919 + 1)
    if isinstance(policy, GpuplacePolicy):
        policy.reset()
    if not pods:
        raise ValueError("replay needs at least one pod")
    t0 = min(p.creation_s for p in pods)
    compress = replay_time_scale(pods, load, cluster.capacity)
    arrivals = sorted(((p.creation_s - t0) / compress, k, p) for k, p in enumerate(pods))
    end = arrivals[-1][0]
    departures: list[tuple[float, int, Placement]] = []
    queue: list[tuple[SimPod, float]] = []
    started: list[Placement] = []
    delays: list[float] = []
    seq = itertools.count()
    now = 0.0
    alloc_integral = cost_integral = 0.0

    def advance(t: float) -> None:
        nonlocal now, alloc_integral, cost_integral
        t = min(t, end)
        if t > now:
            alloc_integral += cluster.allocated * (t - now)
            cost_integral += cluster.cost_per_hour * (t - now)
            now = t

    def try_place(pod: SimPod, arrived: float, t: float) -> bool:
        choice = policy.choose(pod, cluster, rng)
        if choice is None:
            return False
        i, units = choice
        cluster.place(i, pod, units)
        p = Placement(pod, i, units, t)
        started.append(p)
        delays.append(t - arrived)
        heapq.heappush(departures, (t + pod.duration_s, next(seq), p))
        return True

    for n, (t, _, pod) in enumerate(arrivals):
        while departures and departures[0][0] <= t:
            dt_, _, p = heapq.heappop(departures)
            advance(dt_)
            i = p.node
            cluster.release(i, p.pod, p.units)
            # Queued pods fitted nowhere before; only node i changed, so only it can take one now.
            blocked: set[tuple] = set()
            waiting: list[tuple[SimPod, float]] = []
            for q, arrived in queue:
                could = (cluster.fits_gpus_at(i, q) and cluster.cpu_free[i] >= (q.cpu_milli or 0)
                         and cluster.mem_free[i] >= (q.memory_mib or 0))
                if not could or q.shape in blocked or not try_place(q, arrived, dt_):
                    if could:
                        blocked.add(q.shape)  # placements only use capacity: the same shape fails again
                    waiting.append((q, arrived))
            queue = waiting
        advance(t)
        if not try_place(pod, t, t):
            queue.append((pod, t))
        if progress is not None and n % 200 == 0:
            progress(n)
    stranded, by_model, by_cause = _stranded(cluster, policy, (q for q, _ in queue))
    oom, wasted = _placement_totals(started, judge)
    span = max(end, 1e-9)
    return Snapshot(
        allocation_ratio=alloc_integral / span / cluster.capacity, stranded_gpus=stranded,
        placed=len(started), unplaced=len(queue), oom_risk=oom, premium_gpu_hours_wasted=wasted,
        cost_per_hour=cost_integral / span, allocated_gpus=alloc_integral / span,
        sharing_placed=sum(p.pod.sharing for p in started), sharing_unplaced=sum(q.sharing for q, _ in queue),
        stranded_by_model=by_model, stranded_by_cause=by_cause,
        queue_delay_hours_mean=(sum(delays) / len(delays) / 3600) if delays else None,
        queue_delay_hours_max=(max(delays) / 3600) if delays else None,
    )


@dataclass
class RunResult:
    """policy -> load -> one Snapshot per seed; and wall-clock seconds per policy."""

    snapshots: dict[str, dict[float, list[Snapshot]]]
    seconds: dict[str, float]
    seeds: list[int]
    meta: dict


def simulate(nodes: Sequence[SimNode], policies: Sequence[PlacementPolicy], engine: Engine, *, mode: str,
             loads: Sequence[float], seeds: Sequence[int], pods_for_seed: Callable[[int, float], Iterator[SimPod] | Sequence[SimPod]],
             progress: Callable[[str, int], None] | None = None) -> RunResult:
    """Every policy x seed (x load in replay mode). ``pods_for_seed(seed, load)`` gives the
    workload: a stream for fill mode (load ignored), a list for replay mode."""
    snaps: dict[str, dict[float, list[Snapshot]]] = {p.name: {l: [] for l in loads} for p in policies}
    seconds: dict[str, float] = {}
    for pol in policies:
        start = time.perf_counter()
        for seed in seeds:
            cb = (lambda n, _p=pol.name, _s=seed: progress(f"{_p} seed {_s}", n)) if progress else None
            if mode == "fill":
                res = run_fill(nodes, iter(pods_for_seed(seed, max(loads))), pol, engine, loads, seed, cb)
                for l in loads:
                    snaps[pol.name][l].append(res[l])
            else:
                for l in loads:
                    snaps[pol.name][l].append(run_replay(nodes, list(pods_for_seed(seed, l)), pol, engine, l, seed, cb))
        seconds[pol.name] = time.perf_counter() - start
    return RunResult(snaps, seconds, list(seeds), {})
