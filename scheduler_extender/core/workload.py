"""The target workload: what the pods arriving lately ask for, learned online, and how much of a
node's free GPUs it could not use (fragmentation).

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent" (USENIX ATC'23, section 3) measure a node's fragmentation against the *target
workload*, the distribution of recent tasks' demands: for one task, the node's free GPUs are
fragments when the task cannot run there (too few free GPUs, too little CPU or memory, a GPU model
it may not use); over the workload, the fragmentation is the popularity-weighted sum. Their
scheduler places each task where it increases that sum least ("fragmentation gradient descent").
A device is counted by its free share, in thousandths (a wholly free one 1000; one that GPU-sharing
pods hold part of, ``NodeAllocation.partly_free_milli``, what they left), and a task by the share
of each device it takes (``DemandShape.gpu_milli``): where the task fits, the free shares of the
devices too small for it are its fragment (the paper's case Q-III); where it does not, all of them.
With whole devices only, a task that fits leaves no fragment.

- ``DemandShape``: one kind of pod (device resource and count, CPU, memory, allowed models);
- ``WorkloadTracker``: a decayed histogram of the shapes seen (the extender feeds it the pods
  passing through ``/filter``, the simulator the arrivals so far: never a future pod). It is mutable
  and lives at the edge; the decision gets its immutable snapshot,
- ``WorkloadProfile``: the snapshot, with the fragmentation measure the score reads, and the
  host-stranding measure beside it (``host_stranding``: free devices the node's free CPU or memory
  could not feed at the workload's mean request per device).

Pure: no I/O; the profile's memos are internal caches of pure functions, bounded.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Mapping

from scheduler_extender.core.devices import MILLI, Unit
from scheduler_extender.core.job import Job

DEFAULT_HALF_LIFE_PODS = 2000
"""Observations after which a shape's weight halves: long enough to cover the mix of a busy
cluster's last hours, short enough to follow a shift (the FGD paper samples the target workload
from the trace's task population; we use the recent past, since the future is unknown)."""

DEFAULT_REFRESH_PODS = 50
"""A new profile snapshot every this many observations (the memo of a snapshot stays valid
between refreshes; a few dozen pods barely move a 2,000-pod histogram)."""

DEFAULT_MAX_SHAPES = 512
"""Shapes kept; beyond, the least weighted is dropped (bounds memory and the score's work)."""

DEFAULT_MIN_PODS = 1
"""Pods to see before the profile is used. 1: from the first pod on, the pods seen so far (the
one being placed included) are the best guess of the workload; without a profile the score
falls back to cost first, which is what strands GPUs early on (openb: waiting for 50 or 200
pods allocated less at 130% load, measured with ``gpuplace simulate`` when the component was
added; docs/ does not record that run)."""

_MEMO_ENTRIES = 200_000
"""Entries each of a profile's memos keeps; beyond, it starts over (memory must not grow with
what requests bring)."""

_USABLE_ENTRIES = 1_000
"""Model lists whose usable models per shape a profile keeps (``scarcity``): a request's list is
the models free among its nodes, a few dozen lists in a cluster."""

_MISSING = object()

_SEEN_KEYS = 10_000
"""Pod keys remembered, so that kube-scheduler's retries of a pending pod count it once."""


@dataclass(frozen=True, slots=True)
class DemandShape:
    """One kind of pod, as far as fitting a node goes.

    ``gpus``: devices of ``resource`` (``nvidia.com/gpu``, ``nvidia.com/mig-3g.40gb``, ...);
    ``cpu_milli`` / ``memory_bytes``: requests, None when the pod gives none;
    ``allowed_models``: catalog ids the pod may run on, None: any model; ``denied_models``:
    catalog ids it may not run on (``exclude-gpu-models``, the class's ``deniedModels``).
    """

    resource: str
    gpus: int
    cpu_milli: int | None = None
    memory_bytes: int | None = None
    allowed_models: frozenset[str] | None = None
    denied_models: frozenset[str] = frozenset()
    gpu_milli: int = 1000  # thousandths of each device it takes (``Job.gpu_milli``)

    @property
    def devices(self) -> float:
        """Devices' worth it takes: ``gpus`` x ``gpu_milli`` / 1000."""
        return self.gpus * self.gpu_milli / MILLI

    def usable(self, model: str) -> bool:
        """May this shape run on a device of catalog id ``model`` (``mig:<id>`` for a MIG device:
        a class's model lists apply to full GPUs only, as in the filter)?"""
        if model.startswith(MIG_KEY):
            return True
        return (self.allowed_models is None or model in self.allowed_models) and model not in self.denied_models


MIG_KEY = "mig:"
FreeByModel = tuple[tuple[str, int, int], ...]
"""A node's free devices of one resource: (catalog id (``""`` for a GPU not in the catalog), free
thousandths, count), sorted; a wholly free device has 1000 free, a device with none free is left out."""


@dataclass(frozen=True, eq=False)
class WorkloadProfile:
    """An immutable snapshot of the target workload: shapes and their shares (summing to 1 per
    resource). ``version`` identifies the snapshot (a memo of scores can key on it)."""

    shapes: tuple[tuple[DemandShape, float], ...]
    version: int = 0
    _by_resource: dict[str, tuple[list[tuple[DemandShape, float]], list[int], list[int]]] = field(
        default_factory=dict, init=False, repr=False)
    _memo: dict[tuple, tuple[float, float]] = field(default_factory=dict, init=False, repr=False)
    _per_device: dict[str, tuple[float | None, float | None]] = field(default_factory=dict, init=False, repr=False)
    _host_classes: dict[tuple, Hashable] = field(default_factory=dict, init=False, repr=False)
    _exact: dict[tuple, tuple[float, float] | None] = field(default_factory=dict, init=False, repr=False)
    _usable: dict[tuple, list[tuple[float, tuple[str, ...]]]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        groups: dict[str, list[tuple[DemandShape, float]]] = {}
        for s, w in self.shapes:
            if w > 0:
                groups.setdefault(s.resource, []).append((s, w))
        for resource, items in groups.items():
            total = sum(w for _, w in items)
            norm = [(s, w / total) for s, w in items]
            cpus = sorted({s.cpu_milli for s, _ in norm if s.cpu_milli is not None})
            mems = sorted({s.memory_bytes for s, _ in norm if s.memory_bytes is not None})
            self._by_resource[resource] = (norm, cpus, mems)
            self._per_device[resource] = (_mean_per_device(norm, "cpu_milli"), _mean_per_device(norm, "memory_bytes"))

    def __bool__(self) -> bool:
        return bool(self._by_resource)

    @property
    def resources(self) -> tuple[str, ...]:
        """The device resources the workload has shapes for, sorted."""
        return tuple(sorted(self._by_resource))

    def shares_of(self, resource: str) -> list[tuple[DemandShape, float]] | None:
        """This resource's shapes with their shares (summing to 1), in the order the measures add
        them up; None when the workload has none (callers must not modify the list)."""
        group = self._by_resource.get(resource)
        return None if group is None else group[0]

    def host_ranks(self, resource: str, cpu_milli_free: int | None,
                   memory_bytes_free: int | None) -> tuple[int | None, int | None]:
        """Where free CPU and memory fall among the requests of this resource's shapes (ranks;
        None: unknown). Which shapes fit a node depends on its free CPU/memory only through
        these ranks, so nodes with the same free devices and ranks have the same ``fit_share``
        and ``fragmentation``."""
        group = self._by_resource.get(resource)
        if group is None:
            return (None, None)
        _, cpus, mems = group
        return (None if cpu_milli_free is None else bisect.bisect_right(cpus, cpu_milli_free),
                None if memory_bytes_free is None else bisect.bisect_right(mems, memory_bytes_free))

    def host_class(self, resource: str, cpu_milli_free: int | None, memory_bytes_free: int | None) -> Hashable:
        """Equal for free CPU/memory amounts that nothing here tells apart: nodes with the same
        free devices and the same ``host_class`` have the same ``fit_share``, ``fragmentation``
        and ``host_stranding``, and the engine scores them once (``GroupedEngine.score_grouped`` (``served.grouped``)). The
        ranks (``host_ranks``), and the exact amount of each of CPU and memory the workload gives
        a mean request per device for (``host_stranding`` divides by it)."""
        key = (resource, cpu_milli_free, memory_bytes_free)
        hit = self._host_classes.get(key)
        if hit is not None:
            return hit
        cpu_mean, mem_mean = self.mean_request_per_device(resource)
        exact_cpu = max(0, cpu_milli_free) if cpu_milli_free is not None and cpu_mean else None
        exact_mem = max(0, memory_bytes_free) if memory_bytes_free is not None and mem_mean else None
        hit = (*self.host_ranks(resource, cpu_milli_free, memory_bytes_free), exact_cpu, exact_mem)
        if len(self._host_classes) > _MEMO_ENTRIES:
            self._host_classes.clear()
        self._host_classes[key] = hit
        return hit

    def fit_share(self, resource: str, free: FreeByModel, cpu_milli_free: int | None,
                  memory_bytes_free: int | None) -> float:
        """Share of the workload (of this ``resource``) that fits a node with ``free`` devices and
        this much CPU and memory free; an unknown (None) CPU or memory is not checked. 0 to 1."""
        measured = self._measured(resource, free, cpu_milli_free, memory_bytes_free)
        return 1.0 if measured is None else measured[0]

    def _measured(self, resource: str, free: FreeByModel, cpu_milli_free: int | None,
                  memory_bytes_free: int | None) -> tuple[float, float] | None:
        """``_measure`` of this resource's shapes, memoized per (free devices, host ranks), and
        per (free devices, free CPU and memory) in front of that (no ranks to look up); None when
        the workload has no shape of ``resource``."""
        exact = (resource, free, cpu_milli_free, memory_bytes_free)
        hit = self._exact.get(exact, _MISSING)
        if hit is not _MISSING:
            return hit  # type: ignore[return-value]
        group = self._by_resource.get(resource)
        if group is None:
            hit = None
        else:
            ci, mi = self.host_ranks(resource, cpu_milli_free, memory_bytes_free)
            key = (resource, free, ci, mi)
            hit = self._memo.get(key)
            if hit is None:
                hit = self._measure(group[0], free, ci, mi, cpu_milli_free, memory_bytes_free)
                if len(self._memo) > _MEMO_ENTRIES:
                    self._memo.clear()
                self._memo[key] = hit
        if len(self._exact) > _MEMO_ENTRIES:
            self._exact.clear()
        self._exact[exact] = hit
        return hit

    @staticmethod
    def _measure(shapes: list[tuple[DemandShape, float]], free: FreeByModel, ci: int | None, mi: int | None,
                 cpu_milli_free: int | None, memory_bytes_free: int | None) -> tuple[float, float]:
        """(share of the shapes that fit, their expected fragment in thousandths): a shape fits
        with ``gpus`` usable devices that have its ``gpu_milli`` free and its CPU/memory free; its
        fragment is then the free share of the devices with less than its ``gpu_milli`` free, else
        all the free share (module docstring)."""
        total_milli = sum(level * n for _, level, n in free)
        share = fragment = 0.0
        # Per gpu_milli, what every shape asking it reads (exact integer sums, so computed once they
        # are the same numbers): devices with that much free (unconstrained shapes), thousandths below it.
        usable_at: dict[int, int] = {}
        below: dict[int, int] = {}
        for s, w in shapes:
            fits = not (ci is not None and s.cpu_milli is not None and s.cpu_milli > cpu_milli_free  # type: ignore[operator]
                        or mi is not None and s.memory_bytes is not None and s.memory_bytes > memory_bytes_free)  # type: ignore[operator]
            gm = s.gpu_milli
            if fits:
                if s.allowed_models is not None or s.denied_models:
                    fits = sum(n for m, level, n in free if level >= gm and s.usable(m)) >= s.gpus
                else:
                    usable = usable_at.get(gm)
                    if usable is None:
                        usable = usable_at[gm] = sum(n for _, level, n in free if level >= gm)
                    fits = usable >= s.gpus
            if fits:
                share += w
                b = below.get(gm)
                if b is None:
                    b = below[gm] = sum(level * n for _, level, n in free if level < gm)
                fragment += w * b
            else:
                fragment += w * total_milli
        return share, fragment

    def fragmentation(self, resource: str, free: FreeByModel, cpu_milli_free: int | None,
                      memory_bytes_free: int | None) -> float:
        """Expected free devices the workload cannot use on such a node (FGD's F_n(M), in devices:
        thousandths / 1000; module docstring). 0 to the node's free devices (with whole devices
        only: free devices x share of the workload that does not fit)."""
        measured = self._measured(resource, free, cpu_milli_free, memory_bytes_free) if free else None
        return 0.0 if measured is None else measured[1] / MILLI

    def scarcity(self, resource: str, supply: Mapping[str, float]) -> dict[str, float]:
        """Per model key of ``supply`` (as in ``FreeByModel``): the demand that one device of that
        model taken away would be missed by, in devices: for each shape that may use the model,
        share x devices x (all free devices / the free devices that shape may use), summed.
        ``supply``: free devices (shares counted, ``MILLI``) of ``resource`` per model key over
        the nodes the pod may go to; rounded to 0.01 (a memo can key on it). {} without shapes.

        FGD's fragmentation looks at one node: taking a T4 from a node with T4s to spare costs a
        T4-only pod nothing there, however few T4s the cluster has left. This adds the cluster's
        side: an unconstrained shape weighs the same on every model (it cancels out between
        candidates), a shape that may use only a scarce model weighs by how scarce its models are,
        so unconstrained pods leave scarce models to the pods that need them (openb gpuspec33:
        T4-only pods ask for more GPUs than the fleet's T4s;
        docs/evaluation-fragmentation.md#step-by-step). Our measure; the demand over supply ratio is that of capacity planning."""
        group = self._by_resource.get(resource)
        if group is None or not supply:
            return {}
        total = sum(supply.values())
        if total <= 0:
            return {}
        out = dict.fromkeys(supply, 0.0)
        for w_devices, usable in self._usable_models(resource, tuple(supply)):
            free = sum(supply[m] for m in usable)
            if free <= 0:
                continue
            weight = w_devices * total / free
            for m in usable:
                out[m] += weight
        return {m: round(v, 2) for m, v in out.items()}

    def _usable_models(self, resource: str, models: tuple[str, ...]) -> list[tuple[float, tuple[str, ...]]]:
        """Per shape of ``resource``, in order: (share x devices, the ``models`` it may use, in
        their order), remembered per model list (``scarcity`` reads it on every request)."""
        key = (resource, models)
        hit = self._usable.get(key)
        if hit is None:
            hit = [(w * s.devices, tuple(m for m in models if s.usable(m))) for s, w in self._by_resource[resource][0]]
            if len(self._usable) > _USABLE_ENTRIES:
                self._usable.clear()
            self._usable[key] = hit
        return hit

    def mean_request_per_device(self, resource: str) -> tuple[float | None, float | None]:
        """(CPU millicores, memory bytes) the workload requests per device of ``resource``: the
        demand-weighted mean sum(share x request) / sum(share x devices) over the shapes that give
        that request; None when none does (or the resource was not seen)."""
        return self._per_device.get(resource, (None, None))

    def host_stranding(self, resource: str, free_devices: float, cpu_milli_free: int | None,
                       memory_bytes_free: int | None) -> float:
        """Free devices a node's free CPU or memory could not feed, were they filled with the
        workload's mean pod: ``g - min(g, C / c, M / m)`` for ``g`` free devices, ``C`` / ``M`` free
        millicores / bytes and ``c`` / ``m`` the ``mean_request_per_device``; an unknown (None) free
        amount or mean is not checked, a negative free amount counts as 0. 0 to ``g``.

        FGD (Weng et al., ATC'23, section 3) counts a node's GPUs as fragments for a task whose CPU or
        memory the node cannot host *now*; with whole devices that check only fires on the last
        placement before the node runs dry. This fluid look-ahead over all of the node's free devices
        sees it coming: a pod asking more CPU/memory per device than the workload's mean lowers
        ``C / c`` by more than one device, so it is steered to nodes with host resources to spare, and
        a light pod on a node short of them lowers the measure. The idea is that of multi-resource
        packing (Grandl et al., "Multi-Resource Packing for Cluster Schedulers", SIGCOMM'14: keep a
        machine's resources in the proportion the tasks ask for); the mean as the expected demand is
        our choice. On the Alibaba openb trace it is what lets the free GPUs of a full cluster stay
        usable (docs/evaluation-fragmentation.md#what-we-measured-on-the-way).
        """
        if free_devices <= 0:
            return 0.0
        cpu_mean, mem_mean = self.mean_request_per_device(resource)
        usable = float(free_devices)
        if cpu_milli_free is not None and cpu_mean:
            usable = min(usable, max(0, cpu_milli_free) / cpu_mean)
        if memory_bytes_free is not None and mem_mean:
            usable = min(usable, max(0, memory_bytes_free) / mem_mean)
        return free_devices - usable


def _mean_per_device(shapes: list[tuple[DemandShape, float]], attr: str) -> float | None:
    known = [(v, s.devices, w) for s, w in shapes if (v := getattr(s, attr)) is not None]
    devices = sum(g * w for _, g, w in known)
    return sum(v * w for v, _, w in known) / devices if devices > 0 else None


EMPTY_PROFILE = WorkloadProfile(())


class WorkloadTracker:
    """Decayed histogram of the pods seen; ``profile()`` gives its current snapshot.

    Each observation weighs 2^(1/half_life) times the one before (equivalently, older ones decay),
    so a shape's share halves every ``half_life_pods`` observations it does not recur in. Not
    thread-safe: the caller serializes ``observe`` (the extender holds a lock).
    """

    def __init__(self, half_life_pods: int = DEFAULT_HALF_LIFE_PODS, refresh_pods: int = DEFAULT_REFRESH_PODS,
                 max_shapes: int = DEFAULT_MAX_SHAPES, min_pods: int = DEFAULT_MIN_PODS) -> None:
        if half_life_pods < 1 or refresh_pods < 1 or max_shapes < 1 or min_pods < 1:
            raise ValueError("half_life_pods, refresh_pods, max_shapes and min_pods must be at least 1")
        self._min = min_pods
        self._count = 0
        self._seen: dict[str, None] = {}
        self._growth = 2.0 ** (1.0 / half_life_pods)
        self._scale = 1.0
        self._refresh = refresh_pods
        self._max = max_shapes
        self._weights: dict[DemandShape, float] = {}
        self._since = 0
        self._version = 0
        self._profile = EMPTY_PROFILE

    def observe(self, shape: DemandShape, key: str | None = None) -> None:
        """Count one pod (the newest); a ``key`` (pod UID) seen lately is not counted again."""
        if key is not None:
            if key in self._seen:
                return
            self._seen[key] = None
            if len(self._seen) > _SEEN_KEYS:
                del self._seen[next(iter(self._seen))]
        self._count += 1
        self._scale *= self._growth
        if self._scale > 1e12:  # renormalize before floats overflow
            self._weights = {s: w / self._scale for s, w in self._weights.items()}
            self._scale = 1.0
        self._weights[shape] = self._weights.get(shape, 0.0) + self._scale
        if len(self._weights) > self._max:
            del self._weights[min(self._weights, key=self._weights.__getitem__)]
        self._since += 1
        if self._count >= self._min and (self._profile is EMPTY_PROFILE or self._since >= self._refresh):
            self._snapshot()

    def observe_job(self, job: Job, key: str | None = None) -> None:
        """Count one resolved pod (``demand_shape``; one without a shape counts as nothing): how
        the extender learns from the pods it is asked about, and the simulator likewise."""
        shape = demand_shape(job)
        if shape is not None:
            self.observe(shape, key)

    def _snapshot(self) -> None:
        self._since = 0
        self._version += 1
        self._profile = WorkloadProfile(tuple(sorted(self._weights.items(), key=_shape_key)), self._version)

    def profile(self) -> WorkloadProfile:
        """The latest snapshot (empty until ``min_pods`` pods were seen)."""
        return self._profile


def _shape_key(item: tuple[DemandShape, float]) -> tuple:
    s = item[0]
    return (s.resource, s.gpus, s.gpu_milli, s.cpu_milli or 0, s.memory_bytes or 0, sorted(s.allowed_models or ()),
            sorted(s.denied_models))


def free_by_model(units: Iterable[Unit], levels: Mapping[str, int] | None = None) -> FreeByModel:
    """``FreeByModel`` of a list of units: catalog id (``""`` when not in the catalog), prefixed
    with ``mig:`` for MIG devices; each unit's free thousandths from ``levels`` (by UUID), 1000
    where it is not listed."""
    counts: dict[tuple[str, int], int] = {}
    for u in units:  # a plain dict: a Counter costs more to build than these few units
        k = (model_key(u), MILLI if levels is None else levels.get(u.uuid, MILLI))
        counts[k] = counts.get(k, 0) + 1
    return tuple(sorted((m, level, n) for (m, level), n in counts.items() if level > 0))


def free_by_model_minus(free: FreeByModel, taken: Iterable[tuple[Unit, int, int]]) -> FreeByModel:
    """``free`` after pods take shares of units counted in it: ``taken`` lists (unit, its free
    thousandths before, thousandths taken)."""
    counts = {(m, level): n for m, level, n in free}
    for u, level, milli in taken:
        k = model_key(u)
        counts[(k, level)] = counts.get((k, level), 0) - 1
        after = (k, max(0, level - milli))
        counts[after] = counts.get(after, 0) + 1
    return tuple(sorted((m, level, n) for (m, level), n in counts.items() if n > 0 and level > 0))


def model_key(u: Unit) -> str:
    """A unit's model key in ``FreeByModel``: its catalog id (``""`` when not in the catalog),
    prefixed with ``mig:`` for a MIG device."""
    return (MIG_KEY if u.kind == "mig" else "") + (u.entry.id if u.entry is not None else "")


def profile_of(shapes: Mapping[DemandShape, float], version: int = 0) -> WorkloadProfile:
    """A profile from explicit weights (tests, a platform team's declared mix)."""
    return WorkloadProfile(tuple(sorted(shapes.items(), key=_shape_key)), version)


def demand_shape(job: Job) -> DemandShape | None:
    """The shape of a resolved pod, for the tracker; None for a pod without a GPU request or with
    annotation errors (the filter rejects it everywhere). Allowed models: the pod's
    ``gpu-models`` and its class's ``allowedModels`` (both when both are set); denied: its
    ``exclude-gpu-models`` and the class's ``deniedModels``."""
    req = job.req
    if req.resource is None or req.gpu_count < 1 or req.errors:
        return None
    allowed = req.allowed_models
    if job.class_allowed_models is not None:
        allowed = job.class_allowed_models if allowed is None else allowed & job.class_allowed_models
    return DemandShape(resource=req.resource, gpus=req.gpu_count, cpu_milli=job.cpu_milli,
                       memory_bytes=job.memory_bytes, allowed_models=allowed,
                       denied_models=req.excluded_models | job.class_denied_models, gpu_milli=job.gpu_milli)
