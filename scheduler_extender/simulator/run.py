"""The two simulation modes and what they measure.

FGD below is Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC'23, and its public simulator
hkust-adsl/kubernetes-scheduler-simulator at commit 8f3d6417 (paths below are in that repository).

*fill* (FGD's evaluation): pods arrive one after another and never leave (the authors' pod YAML
has no creation/deletion times: ``data/pod_csv_to_yaml.py:119-120``); a pod that fits nowhere is
counted unplaced and dropped, with no retry (``assumePod`` deletes it:
``pkg/simulator/simulator.go:301-310``). For a pod list (openb, YAML) the arrivals are FGD's
(``fgd_arrivals``): the list in name order, shuffled with the seed (``SortClusterPods``,
``simulator.go:843-852``; the paper's runs shuffle: ``experiments/run_scripts/
generate_run_scripts.py:103``), then tuned to the highest ``load`` x the fleet's milli-GPUs
(``TunePodsByNodeTotalResource``, ``simulator.go:1067-1137``): random pods removed while the
list asks for more, random copies of the list's pods appended while it asks for less. A pod's
arrived GPU demand is ``gpu_milli`` x ``gpus`` (``TotalMilliGpu``; CPU-only pods arrive with 0).
A generated stream (``--trace llm``) arrives as drawn. When the demand arrived so far reaches
each ``load`` share of the fleet's GPUs (in milli-GPUs), a snapshot of the cluster is taken (when
the list ends first, at its end: a tuned list ends within one GPU of the highest load).

*replay*: pods arrive in trace order at their trace times, scaled so that the offered load (GPUs
x run time requested per unit of time, over the span of arrivals) is ``load`` x the fleet's GPUs,
run for their trace duration, and leave. A pod that fits nowhere waits in a FIFO queue and is
retried whenever GPUs are freed. Measured over the span from the first to the last arrival.

Metrics per run and load (``Snapshot``):
- ``gpu_milli_allocation_ratio``: FGD's "GPU allocation rate", the milli-GPUs requested by the
  placed pods / (fleet GPUs x 1000) (``ClusterGpuFragReport``, ``pkg/simulator/analysis.go:48-54,
  74``), as FGD's analysis reads it at an arrived share: the mean over every pod event whose
  arrived share, in percent rounded to a whole number, equals the load's (or, where no event
  does, lies within one point of it) (``experiments/analysis/merge_alloc_discrete.py:96-120``;
  ``allocation_curve``). Replay: time average of the milli-GPUs taken;
- ``allocation_ratio``: whole-GPU occupancy, GPUs with any share taken / fleet GPUs, at the
  snapshot (replay: time average);
- ``stranded_gpus``: wholly free GPUs on nodes where no pending GPU pod fits under the policy's
  own filter (0 when nothing is pending), also by model and by cause (``stranded_by_cause``,
  ``STRANDED_CAUSES``: what keeps the pending pods off those GPUs);
- ``placed`` / ``unplaced`` GPU pods, ``sharing_placed`` / ``sharing_unplaced`` for openb's
  GPU-sharing pods (a share of one GPU, ``cluster.Cluster``'s share model), ``cpu_only_placed`` /
  ``cpu_only_unplaced`` for pods without GPUs;
- ``oom_risk``: placed pods whose GPUs have less VRAM than gpuplace's estimate of their need
  (None when no placed pod's need is known, e.g. the openb trace);
- ``premium_gpu_hours_wasted``: GPU-hours of premium-tier GPUs (policy ``tier``) given to pods
  while a non-premium GPU that the pod's filter passes was free (``Judge.cheaper_free``, asked at
  the moment of the placement), at the pods' trace durations (a share of a GPU counts its share):
  premium capacity spent where a cheaper GPU was there to take;
- ``premium_gpu_hours_fit_cheaper``: GPU-hours of premium-tier GPUs given to pods that fit a
  non-premium GPU *model* of the fleet allowed by their own constraint (VRAM need met, or
  unknown, and a node of that model with enough GPUs), free or not: includes the premium GPUs a
  pod takes as a last resort when every cheaper one that fits is busy;
- ``cost_per_hour``: USD per hour of the occupied GPUs (policy prices; replay: time average);
- ``queue_delay_hours_mean`` / ``_max`` (replay) of the pods that started;
- ``defrag_moves`` / ``defrag_started`` (replay, policy ``gpuplace+defrag``: ``simulator.defrag``):
  running pods moved to make room for waiting ones, and the waiting pods started on that room.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from scheduler_extender.core.devices import Unit
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.job import Job
from scheduler_extender.simulator.baselines import PlacementPolicy
from scheduler_extender.simulator.cluster import Cluster
from scheduler_extender.simulator.defrag import PLANS_PER_EVENT, Defrag
from scheduler_extender.simulator.model import SimNode, SimPod

Progress = Callable[[int], None]


@dataclass
class Placement:
    pod: SimPod
    node: int
    units: tuple[Unit, ...]
    start_s: float
    cheaper_was_free: bool = False  # premium units while a non-premium GPU the pod's filter passes was free


@dataclass
class Snapshot:
    allocation_ratio: float
    stranded_gpus: int
    placed: int
    unplaced: int
    oom_risk: int | None
    premium_gpu_hours_wasted: float
    cost_per_hour: float
    premium_gpu_hours_fit_cheaper: float = 0.0
    sharing_placed: int = 0
    sharing_unplaced: int = 0
    allocated_gpus: float = 0.0
    stranded_by_model: dict[str, int] = field(default_factory=dict)
    stranded_by_cause: dict[str, int] = field(default_factory=dict)
    queue_delay_hours_mean: float | None = None
    queue_delay_hours_max: float | None = None
    gpu_milli_allocation_ratio: float | None = None
    allocated_gpu_milli: float = 0.0
    arrived_ratio: float | None = None
    cpu_only_placed: int = 0
    cpu_only_unplaced: int = 0
    overcommitted_gpus: int = 0  # GPUs whose holders' shares exceed them (time-sliced: the device plugin's choice)
    overcommitted_pods: int = 0  # the pods holding shares of those GPUs
    overcommitted_milli: int = 0  # the milli-GPUs they asked for
    safe_allocation_ratio: float | None = None  # fill: (allocated_gpu_milli - overcommitted_milli) / fleet milli
    defrag_moves: int | None = None  # replay with defragmentation: pods moved (``simulator.defrag``)
    defrag_started: int | None = None  # ... and waiting pods started on the room a plan made


class Judge:
    """What the report needs to know about a pod, independent of the policy that placed it:
    the VRAM need (gpuplace's estimate) and whether it fits a non-premium GPU of the fleet."""

    def __init__(self, engine: Engine, nodes: Sequence[SimNode], cluster: Cluster) -> None:
        self.engine = engine
        self.policy = engine.policy
        self._jobs: dict[tuple, Job] = {}
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

    def _job(self, pod: SimPod) -> Job:
        """The engine's job for the pod's kind (signature: what the filter reads)."""
        job = self._jobs.get(pod.signature)
        if job is None:
            job = self._jobs[pod.signature] = self.engine.job(pod.manifest())
        return job

    def need_bytes(self, pod: SimPod) -> int | None:
        if pod.signature not in self._need:
            job = self._job(pod)
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

    def cheaper_free(self, pod: SimPod, units: Sequence[Unit], cluster: Cluster) -> bool:
        """Whether ``units`` (about to be given to ``pod``) hold a premium GPU while a non-premium
        GPU that gpuplace's filter passes for the pod is free now (asked before the placement)."""
        if not any(self.is_premium(u) for u in units) or not self.fits_cheaper(pod):
            return False
        job = self._job(pod)
        for cid in cluster.live_classes(cluster.fits_resources(pod)):
            r = self.engine.filter(job, [cluster.class_state(cid, pod.gpu_milli)], None)[0]
            if r.passed and r.chosen and not any(self.is_premium(u) for u in r.chosen):
                return True
        return False


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


def _placement_totals(placements: Iterable[Placement], judge: Judge) -> tuple[int | None, float, float]:
    """(OOM-risk placements, premium GPU-hours wasted, premium GPU-hours to pods a cheaper model fits)."""
    oom = 0
    known = 0
    wasted = 0.0
    fit_cheaper = 0.0
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
            hours = premium * p.pod.gpu_milli / 1000 * p.pod.duration_s / 3600
            fit_cheaper += hours
            if p.cheaper_was_free:
                wasted += hours
    return (oom if known else None), wasted, fit_cheaper


def _overcommit(cluster: Cluster, safe: bool = False) -> dict[str, int | float]:
    """``Snapshot``'s over-commit fields (``Cluster.overcommit``); with ``safe``, also the share of
    the fleet's milli-GPUs allocated to pods on GPUs that are not over-committed, at this moment."""
    gpus, pods, milli = cluster.overcommit()
    out: dict[str, int | float] = {"overcommitted_gpus": gpus, "overcommitted_pods": pods, "overcommitted_milli": milli}
    if safe:
        out["safe_allocation_ratio"] = (cluster.allocated_milli - milli) / cluster.capacity_milli
    return out


def fgd_arrivals(pods: Sequence[SimPod], seed: int, ratio: float, capacity_milli: int) -> list[SimPod]:
    """FGD's arrivals of a pod list (module docstring): ``pods`` in name order, shuffled with
    ``seed``, then tuned so that they ask for ``ratio`` x ``capacity_milli`` milli-GPUs.

    Tuning as ``TunePodsByNodeTotalResource`` (``pkg/simulator/simulator.go:1067-1137``): while the
    list asks for more, a pod at a random position is removed; while it asks for less, a copy of a
    random pod of the name-ordered list (``-tuned-K``) is appended, and appending stops at the first
    copy whose per-GPU ``gpu_milli`` would pass the target (the source compares the per-GPU share,
    not ``gpus`` x ``gpu_milli``, ``simulator.go:1130``; kept, so a multi-GPU copy may pass the target
    by less than a GPU per extra GPU). FGD's draws come from Go's ``math/rand`` seeded with the
    tuning seed; these come from Python's ``random.Random(seed)``: the same procedure, other draws.
    """
    ordered = sorted(pods, key=lambda p: p.name)
    if not ordered:
        return []
    rng = random.Random(seed)
    out = list(ordered)
    rng.shuffle(out)
    target = ratio * capacity_milli
    total = sum(p.total_milli for p in out)
    while total > target and out:
        total -= out.pop(rng.randrange(len(out))).total_milli
    k = 0
    while total < target:
        p = ordered[rng.randrange(len(ordered))]
        if total + p.gpu_milli > target:
            break
        out.append(dataclasses.replace(p, name=f"{p.name}-tuned-{k}"))
        total += p.total_milli
        k += 1
    return out


def arrived_percent(arrived_milli: float, gpus: int) -> float:
    """An event's arrived share of the fleet, in percent rounded to a whole number as FGD's
    analysis rounds it (``round(arrived_gpu_milli / total_gpus / 10, 0)``,
    ``experiments/analysis/merge_alloc_discrete.py:97-98``; Python's round, half to even)."""
    return round(arrived_milli / gpus / 10, 0)


def allocation_curve(arrived_milli: Sequence[float], used_milli: Sequence[float], gpus: int,
                     top_percent: int) -> dict[int, float]:
    """FGD's allocation rate (percent) at each whole arrived percent 0..``top_percent``, from the
    (arrived, used) milli-GPUs after each pod event, as ``experiments/analysis/
    merge_alloc_discrete.py:96-120`` computes it: each event's rate rounded to 0.01 %; at ``x`` the
    mean over the events whose ``arrived_percent`` is ``x``, or where none is, over those within
    ``x`` +- 1; rounded to 0.01 %. A percent with no event near it is left out."""
    bins: dict[float, list[float]] = {}
    for a, u in zip(arrived_milli, used_milli):
        bins.setdefault(arrived_percent(a, gpus), []).append(round(u / gpus / 10, 2))
    out: dict[int, float] = {}
    for x in range(top_percent + 1):
        vals = bins.get(float(x))
        if not vals:
            vals = [v for k in (x - 1, x, x + 1) for v in bins.get(float(k), [])]
        if vals:
            out[x] = round(sum(vals) / len(vals), 2)
    return out


class FillSnapshots(dict):
    """``run_fill``'s answer: load -> ``Snapshot``, and ``curve``: FGD's allocation rate (percent)
    at each whole arrived percent up to the highest load (``allocation_curve``)."""

    curve: dict[int, float]


def run_fill(nodes: Sequence[SimNode], stream: Iterable[SimPod], policy: PlacementPolicy, engine: Engine,
             loads: Sequence[float], seed: int, progress: Progress | None = None) -> FillSnapshots:
    """Fill mode (module docstring): one pass over ``stream``, a snapshot at each load, and the
    (arrived, used) milli-GPUs after every pod for FGD's metric. A list (FGD's tuned arrivals)
    arrives whole, as in FGD; an endless stream stops before the first pod whose arrived percent
    passes the highest load's by more than one point (the analysis reads up to there)."""
    cluster = Cluster(nodes, engine.catalog, engine.policy)
    judge = Judge(engine, nodes, cluster)
    rng = random.Random(seed * 7919 + 1)
    if hasattr(policy, "reset"):
        policy.reset()
    placed: list[Placement] = []
    pending: list[SimPod] = []
    arrived = 0
    top = int(round(100 * max(loads)))
    # FGD logs one allocation line before the first pod (pkg/simulator/core.go:99), then one after
    # each pod, placed or not (pkg/simulator/simulator.go:340).
    arrived_series: list[int] = [0]
    used_series: list[int] = [0]
    out = FillSnapshots()
    targets = sorted(loads)

    def snapshot(load: float) -> None:
        gpu_pending = [p for p in pending if p.gpus]
        stranded, by_model, by_cause = _stranded(cluster, policy, gpu_pending)
        oom, wasted, fit_cheaper = _placement_totals(placed, judge)
        out[load] = Snapshot(premium_gpu_hours_fit_cheaper=fit_cheaper,
            allocation_ratio=cluster.allocated / cluster.capacity, stranded_gpus=stranded,
            placed=sum(1 for p in placed if p.pod.gpus), unplaced=len(gpu_pending), oom_risk=oom,
            premium_gpu_hours_wasted=wasted, cost_per_hour=cluster.cost_per_hour, allocated_gpus=cluster.allocated,
            sharing_placed=sum(p.pod.sharing for p in placed), sharing_unplaced=sum(p.sharing for p in pending),
            stranded_by_model=by_model, stranded_by_cause=by_cause, allocated_gpu_milli=cluster.allocated_milli,
            arrived_ratio=arrived / cluster.capacity_milli,
            cpu_only_placed=sum(1 for p in placed if not p.pod.gpus),
            cpu_only_unplaced=len(pending) - len(gpu_pending), **_overcommit(cluster, safe=True),
        )

    endless = not isinstance(stream, Sequence)
    for n, pod in enumerate(stream):
        if endless and arrived_percent(arrived + pod.total_milli, cluster.capacity) > top + 1:
            break
        arrived += pod.total_milli
        choice = policy.choose(pod, cluster, rng)
        if choice is None:
            pending.append(pod)
        else:
            i, units = choice
            units = cluster.granted(i, pod, units, rng)
            cheaper = judge.cheaper_free(pod, units, cluster)
            cluster.place(i, pod, units)
            placed.append(Placement(pod, i, units, 0.0, cheaper))
        arrived_series.append(arrived)
        used_series.append(cluster.allocated_milli)
        if progress is not None and n % 200 == 0:
            progress(n)
        while targets and arrived >= targets[0] * cluster.capacity_milli:
            snapshot(targets.pop(0))
    for load in targets:  # the list ended first
        snapshot(load)
    out.curve = allocation_curve(arrived_series, used_series, cluster.capacity, top)
    for load, snap in out.items():
        pct = out.curve.get(int(round(100 * load)))
        snap.gpu_milli_allocation_ratio = None if pct is None else pct / 100
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
    """Replay mode (module docstring) at one load; with defragmentation when ``policy.defrag``
    (``simulator.defrag``: after each event that leaves a GPU pod waiting)."""
    cluster = Cluster(nodes, engine.catalog, engine.policy)
    judge = Judge(engine, nodes, cluster)
    rng = random.Random(seed * 7919 + 1)
    if hasattr(policy, "reset"):
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
    running: dict[str, Placement] = {}  # pod name -> its placement, while it runs
    defrag = Defrag(policy, cluster) if getattr(policy, "defrag", False) else None  # type: ignore[arg-type]
    now = 0.0
    alloc_integral = milli_integral = cost_integral = 0.0

    def advance(t: float) -> None:
        nonlocal now, alloc_integral, milli_integral, cost_integral
        t = min(t, end)
        if t > now:
            alloc_integral += cluster.allocated * (t - now)
            milli_integral += cluster.allocated_milli * (t - now)
            cost_integral += cluster.cost_per_hour * (t - now)
            now = t

    def start(pod: SimPod, arrived: float, t: float, i: int, units: tuple[Unit, ...]) -> None:
        units = cluster.granted(i, pod, units, rng)
        cheaper = judge.cheaper_free(pod, units, cluster)
        cluster.place(i, pod, units)
        p = Placement(pod, i, units, t, cheaper)
        started.append(p)
        delays.append(t - arrived)
        running[pod.name] = p
        heapq.heappush(departures, (t + pod.duration_s, next(seq), p))

    def try_place(pod: SimPod, arrived: float, t: float) -> bool:
        choice = policy.choose(pod, cluster, rng)
        if choice is None:
            return False
        start(pod, arrived, t, *choice)
        return True

    def make_room(t: float) -> None:
        """Defragmentation: plans for the longest-waiting pods a plan may help (``Defrag.worth_trying``),
        in queue order, until ``PLANS_PER_EVENT`` planner calls found no plan."""
        nonlocal queue
        failed = 0
        waiting: list[tuple[SimPod, float]] = []
        for k, (q, arrived) in enumerate(queue):
            if failed == PLANS_PER_EVENT:
                waiting += queue[k:]
                break
            if defrag.worth_trying(q):  # type: ignore[union-attr]
                choice = defrag.make_room(q, running)  # type: ignore[union-attr]
                if choice is not None:
                    start(q, arrived, t, *choice)
                    continue
                failed += 1
            waiting.append((q, arrived))
        queue = waiting

    for n, (t, _, pod) in enumerate(arrivals):
        while departures and departures[0][0] <= t:
            dt_, _, p = heapq.heappop(departures)
            advance(dt_)
            i = p.node
            cluster.release(i, p.pod, p.units)
            running.pop(p.pod.name, None)
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
            if defrag is not None and any(q.gpus for q, _ in queue):
                make_room(dt_)
        advance(t)
        if not try_place(pod, t, t):
            queue.append((pod, t))
            if defrag is not None and pod.gpus:
                make_room(t)
        if progress is not None and n % 200 == 0:
            progress(n)
    stranded, by_model, by_cause = _stranded(cluster, policy, (q for q, _ in queue if q.gpus))
    oom, wasted, fit_cheaper = _placement_totals(started, judge)
    span = max(end, 1e-9)
    cpu_started = sum(1 for p in started if not p.pod.gpus)
    cpu_queued = sum(1 for q, _ in queue if not q.gpus)
    return Snapshot(
        allocation_ratio=alloc_integral / span / cluster.capacity, stranded_gpus=stranded,
        placed=len(started) - cpu_started, unplaced=len(queue) - cpu_queued, oom_risk=oom,
        premium_gpu_hours_wasted=wasted, premium_gpu_hours_fit_cheaper=fit_cheaper,
        cpu_only_placed=cpu_started, cpu_only_unplaced=cpu_queued,
        gpu_milli_allocation_ratio=milli_integral / span / cluster.capacity_milli,
        allocated_gpu_milli=milli_integral / span,
        cost_per_hour=cost_integral / span, allocated_gpus=alloc_integral / span,
        sharing_placed=sum(p.pod.sharing for p in started), sharing_unplaced=sum(q.sharing for q, _ in queue),
        stranded_by_model=by_model, stranded_by_cause=by_cause,
        queue_delay_hours_mean=(sum(delays) / len(delays) / 3600) if delays else None,
        queue_delay_hours_max=(max(delays) / 3600) if delays else None,
        defrag_moves=None if defrag is None else defrag.moves,
        defrag_started=None if defrag is None else defrag.started,
        **_overcommit(cluster),
    )


@dataclass
class RunResult:
    """policy -> load -> one Snapshot per seed; wall-clock seconds per policy; in fill mode, per
    policy one ``FillSnapshots.curve`` per seed (FGD's allocation rate at each arrived percent)."""

    snapshots: dict[str, dict[float, list[Snapshot]]]
    seconds: dict[str, float]
    seeds: list[int]
    meta: dict
    curves: dict[str, list[dict[int, float]]] = field(default_factory=dict)


def simulate(nodes: Sequence[SimNode], policies: Sequence[PlacementPolicy], engine: Engine, *, mode: str,
             loads: Sequence[float], seeds: Sequence[int], pods_for_seed: Callable[[int, float], Iterator[SimPod] | Sequence[SimPod]],
             progress: Callable[[str, int], None] | None = None) -> RunResult:
    """Every policy x seed (x load in replay mode), each policy on the same arrivals per seed.
    ``pods_for_seed(seed, load)`` gives the workload: a stream for fill mode (``load``: the
    highest), a list for replay mode."""
    snaps: dict[str, dict[float, list[Snapshot]]] = {p.name: {l: [] for l in loads} for p in policies}
    curves: dict[str, list[dict[int, float]]] = {p.name: [] for p in policies} if mode == "fill" else {}
    seconds: dict[str, float] = {}
    for pol in policies:
        start = time.perf_counter()
        for seed in seeds:
            cb = (lambda n, _p=pol.name, _s=seed: progress(f"{_p} seed {_s}", n)) if progress else None
            if mode == "fill":
                res = run_fill(nodes, pods_for_seed(seed, max(loads)), pol, engine, loads, seed, cb)
                for l in loads:
                    snaps[pol.name][l].append(res[l])
                curves[pol.name].append(res.curve)
            else:
                for l in loads:
                    snaps[pol.name][l].append(run_replay(nodes, list(pods_for_seed(seed, l)), pol, engine, l, seed, cb))
        seconds[pol.name] = time.perf_counter() - start
    return RunResult(snaps, seconds, list(seeds), {}, curves)
