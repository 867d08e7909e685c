"""Every candidate's fragmentation increase in one batch (numpy): ``core.score.fragmentation_deltas``
computed for all the candidates of a scoring call at once, float for float.

``gpuplace simulate``'s gpuplace scores each GPU pod on a few hundred candidates against a
learned workload of about a hundred shapes; candidate by candidate, ``WorkloadProfile._measure``
and its callers were about a quarter of its decision time on the openb default list (2026-11-28,
``py-spy record -f raw -- gpuplace simulate --trace openb --pods
benchmarks/data/alibaba-openb-v2023/openb_pod_list_default.csv --baselines none --load 1.0
--repeats 1``). Here the per-shape test of ``_measure`` runs over a matrix (rows: the distinct free
devices before and after placing the pod, columns: the workload's shapes):

- devices a shape may use with its share free, and the free thousandths below its share, are
  integer sums (``np.add.reduceat`` over the rows' entries: exact in any order);
- each shape's fragment is added to a row's total in the shapes' order (``np.cumsum``, which adds
  sequentially: the same float additions, in the same order, as ``_measure``'s loop);
- host stranding and the three terms' sum use the same operations in the same order as
  ``host_stranding_delta`` and ``fragmentation_deltas``.

So the values equal the plain path's to the last bit: ``tests/unit/test_batch_fragmentation.py``
compares them on generated candidates, and ``tests/unit/test_served_equals_plain.py`` compares
every decision of a simulation run with it against the plain ``Engine``. The extender keeps the
plain path (its image carries no numpy).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from scheduler_extender.core.devices import MILLI, NodeState
from scheduler_extender.core.filter import NodeResult
from scheduler_extender.core.job import Job
from scheduler_extender.core.score import FreeOf, free_models, scarcity_delta, shares_taken
from scheduler_extender.core.score import fragmentation_deltas as plain_deltas
from scheduler_extender.core.workload import FreeByModel, WorkloadProfile, free_by_model_minus


class _Shapes:
    """One resource's shapes of one profile as arrays, in the profile's order: share (``w``),
    thousandths per device (``gm``), devices (``gpus``), CPU and memory requests with whether
    each is known, and per model key which shapes may use it (filled as models are met)."""

    def __init__(self, shapes: Sequence[tuple]) -> None:
        self.shapes = [s for s, _ in shapes]
        self.w = np.array([w for _, w in shapes], dtype=np.float64)
        self.gm = np.array([s.gpu_milli for s in self.shapes], dtype=np.int64)
        self.gpus = np.array([s.gpus for s in self.shapes], dtype=np.int64)
        self.cpu_known = np.array([s.cpu_milli is not None for s in self.shapes])
        self.cpu = np.array([s.cpu_milli or 0 for s in self.shapes], dtype=np.int64)
        self.mem_known = np.array([s.memory_bytes is not None for s in self.shapes])
        self.mem = np.array([s.memory_bytes or 0 for s in self.shapes], dtype=np.int64)
        self.usable: dict[str, np.ndarray] = {}

    def usable_by(self, model: str) -> np.ndarray:
        row = self.usable.get(model)
        if row is None:
            row = self.usable[model] = np.array([s.usable(model) for s in self.shapes], dtype=bool)
        return row


class _ProfileArrays:
    """``_Shapes`` per resource, for the latest profile only (a profile is replaced every
    ``DEFAULT_REFRESH_PODS`` pods; its arrays are built once)."""

    def __init__(self) -> None:
        self.profile: WorkloadProfile | None = None
        self.by_resource: dict[str, _Shapes | None] = {}

    def of(self, workload: WorkloadProfile, resource: str) -> _Shapes | None:
        if self.profile is not workload:
            self.profile = workload
            self.by_resource = {}
        if resource not in self.by_resource:
            shares = workload.shares_of(resource)
            self.by_resource[resource] = None if shares is None else _Shapes(shares)
        return self.by_resource[resource]


_ARRAYS = _ProfileArrays()


BATCH_FROM = 16
"""Candidates from which a scoring call takes the batch; below, the plain loop, which answers such
small calls sooner than the batch's fixed cost of some fifty numpy calls. ``python -m
benchmarks.micro_batch`` (4,000 arrivals of each openb list, 2026-11-28): under 8 candidates the
batch took 69-155 us longer a call, at 8-15 between 45 us less and 83 us longer, from 16 on
53 us less and more (1.5 to 8.9 ms less from 256 candidates)."""


def fragmentation_deltas(job: Job, gpu_pods: Sequence[tuple[NodeState, NodeResult]], workload: WorkloadProfile,
                         scarcity: Mapping[str, float] | None, free_of: FreeOf = free_models) -> dict[str, float]:
    """``core.score.fragmentation_deltas(job, gpu_pods, workload, scarcity, free_of)``, equal
    float for float: ``batch_deltas`` from ``BATCH_FROM`` candidates on, the plain loop below."""
    if len(gpu_pods) < BATCH_FROM:
        return plain_deltas(job, gpu_pods, workload, scarcity, free_of)
    return batch_deltas(job, gpu_pods, workload, scarcity, free_of)


def batch_deltas(job: Job, gpu_pods: Sequence[tuple[NodeState, NodeResult]], workload: WorkloadProfile,
                 scarcity: Mapping[str, float] | None, free_of: FreeOf = free_models) -> dict[str, float]:
    """``core.score.fragmentation_deltas(job, gpu_pods, workload, scarcity, free_of)``, equal
    float for float, in one batch: by node, each candidate's fragmentation increase +
    host-stranding increase (+ scarcity), in devices; for a pod without devices, each node's
    ``host_only_delta``."""
    names = [r.node for _, r in gpu_pods]
    states = [s for s, _ in gpu_pods]
    host = _Host(states, job)
    if job.req.resource is None:
        # host_only_delta's 0.0 plus each resource's increase in turn. The increase is exactly 0.0
        # where it skips a resource (no device free) or the node (CPU and memory unknown): the
        # same rows before and after, nothing to strand.
        total = np.zeros(len(states))
        for resource in workload.resources:
            rows: dict[FreeByModel, int] = {}
            row_of = np.array([rows.setdefault(free_of(s, resource)[1], len(rows)) for s in states], dtype=np.intp)
            total = total + _increases(workload, resource, host, rows, row_of, row_of, np.zeros(len(states)))
        return dict(zip(names, total.tolist()))
    resource = job.req.resource
    rows = {}  # distinct free devices -> row
    # Per (view, free devices, chosen units): the rows before and after, the thousandths taken and
    # the scarcity term; the parts of one class (same state but for CPU/memory) share them. The
    # levels are kept in the value, so that no id in a key is reused during the call (a ``free_of``
    # may build them anew each time; the view and the chosen units are alive in ``gpu_pods``).
    placed: dict[tuple[int, int, int], tuple[object, int, int, int, float]] = {}
    per_candidate = []
    for s, r in gpu_pods:
        levels, before = free_of(s, resource)
        key = (id(s.view), id(levels), id(r.chosen))
        hit = placed.get(key)
        if hit is None:
            shares = shares_taken(job, s, r.chosen)
            taken = [(u, levels[u.uuid], m) for u, m in zip(r.chosen, shares) if u.uuid in levels]
            after = free_by_model_minus(before, taken) if taken else before
            hit = placed[key] = (levels, rows.setdefault(before, len(rows)), rows.setdefault(after, len(rows)),
                                 sum(min(levels.get(u.uuid, 0), m) for u, m in zip(r.chosen, shares)),
                                 scarcity_delta(job, s, r.chosen, scarcity, shares) if scarcity else 0.0)
        per_candidate.append(hit)
    _, before_i, after_i, taken_milli, scarcities = zip(*per_candidate)
    increase = _increases(workload, resource, host, rows, np.array(before_i, dtype=np.intp),
                          np.array(after_i, dtype=np.intp), np.array(taken_milli, dtype=np.float64))
    return dict(zip(names, (increase + np.array(scarcities, dtype=np.float64)).tolist()))


class _Host:
    """The candidates' free CPU and memory before and after the pod's requests, and whether each is
    known (``None`` in the state: unknown, never 0)."""

    def __init__(self, states: Sequence[NodeState], job: Job) -> None:
        cpu = [s.cpu_milli_free for s in states]
        mem = [s.memory_bytes_free for s in states]
        self.cpu_known = np.array([c is not None for c in cpu], dtype=bool)
        self.mem_known = np.array([m is not None for m in mem], dtype=bool)
        self.cpu_before = np.array([c or 0 for c in cpu], dtype=np.int64)
        self.mem_before = np.array([m or 0 for m in mem], dtype=np.int64)
        self.cpu_after = self.cpu_before - (job.cpu_milli or 0)
        self.mem_after = self.mem_before - (job.memory_bytes or 0)


def _increases(workload: WorkloadProfile, resource: str, host: _Host, rows: Mapping[FreeByModel, int],
               before_i: np.ndarray, after_i: np.ndarray, taken_milli: np.ndarray) -> np.ndarray:
    """Per candidate, ``fragmentation_delta`` + ``host_stranding_delta`` of ``resource``: its free
    devices are row ``before_i`` of ``rows`` before the pod and ``after_i`` after it, which takes
    ``taken_milli`` thousandths of them."""
    # The rows' (model, level, count) entries, row after row; bins: the distinct (model, level).
    bins: dict[tuple[str, int], int] = {}
    entries = [entry for free in rows for entry in free]
    at_bin = np.array([bins.setdefault((m, lv), len(bins)) for m, lv, _ in entries], dtype=np.intp)
    level = np.array([lv for _, lv, _ in entries], dtype=np.int64)
    count = np.array([n for _, _, n in entries], dtype=np.int64)
    sizes = np.array(list(map(len, rows)), dtype=np.intp)
    starts = np.cumsum(sizes) - sizes
    filled = sizes > 0

    def per_row(values: np.ndarray) -> np.ndarray:
        # Sums of entries' integer values per row (exact in any order); 0 for a row without entries.
        out = np.zeros((len(rows),) + values.shape[1:], dtype=np.int64)
        if len(values):
            out[filled] = np.add.reduceat(values, starts[filled], axis=0)
        return out

    total = per_row(level * count)  # free thousandths per row
    shapes = _ARRAYS.of(workload, resource)
    if shapes is None or not shapes.shapes:  # no shape of this resource: the measure is 0 everywhere
        frag_delta = np.zeros(len(before_i))
    else:
        enough = level[:, None] >= shapes.gm[None, :]  # per entry and shape: its devices have the share free
        if entries:  # ... of a model the shape may use
            enough &= np.stack([shapes.usable_by(m) for m, _ in bins])[at_bin]
        usable_count = per_row(count[:, None] * enough)  # devices each shape may use, per row
        below = per_row((level * count)[:, None] * (level[:, None] < shapes.gm[None, :]))

        def measure(row_i: np.ndarray, cpu_free: np.ndarray, mem_free: np.ndarray) -> np.ndarray:
            # WorkloadProfile._measure's fragment / MILLI, a row per candidate.
            short = ((host.cpu_known[:, None] & shapes.cpu_known[None, :] & (shapes.cpu[None, :] > cpu_free[:, None]))
                     | (host.mem_known[:, None] & shapes.mem_known[None, :] & (shapes.mem[None, :] > mem_free[:, None])))
            fits = ~short & (usable_count[row_i] >= shapes.gpus[None, :])
            fragment = np.where(fits, below[row_i], total[row_i][:, None]) * shapes.w[None, :]
            return np.cumsum(fragment, axis=1)[:, -1] / MILLI

        frag_delta = measure(after_i, host.cpu_after, host.mem_after) - measure(before_i, host.cpu_before, host.mem_before)

    cpu_mean, mem_mean = workload.mean_request_per_device(resource)

    def host_stranding(g: np.ndarray, cpu_free: np.ndarray, mem_free: np.ndarray) -> np.ndarray:
        # WorkloadProfile.host_stranding, a value per candidate.
        usable = g.copy()
        if cpu_mean:
            usable = np.where(host.cpu_known, np.minimum(usable, np.maximum(cpu_free, 0) / cpu_mean), usable)
        if mem_mean:
            usable = np.where(host.mem_known, np.minimum(usable, np.maximum(mem_free, 0) / mem_mean), usable)
        return np.where(g <= 0, 0.0, g - usable)

    g_before = total[before_i].astype(np.float64) / MILLI
    g_after = g_before - taken_milli / MILLI
    # Where CPU and memory are both unknown, host_stranding_delta returns 0.0 at once; here each
    # side is g - g, 0.0 as well.
    stranding = (host_stranding(g_after, host.cpu_after, host.mem_after)
                 - host_stranding(g_before, host.cpu_before, host.mem_before))
    return frag_delta + stranding
