"""Score: among the nodes that pass the filter, which suits the pod best (0-10, kube-scheduler's
extender range, ``MaxExtenderPriority``).

Each component is a pure function returning a value in [0, 1] or ``None`` when it does not apply
to this pod; the score is the weighted mean of the components that apply (weights from the
policy), x10, rounded. Components, in order of default weight:

- ``cost``: cheapest GPUs that fit first: cheapest placement's price / this placement's price
  (policy ``catalog`` overrides the catalog's indicative price; a MIG device costs its share of
  compute slices).
- ``vramFit``: least VRAM left unused: need / unit VRAM (only when the need is known).
- ``mig``: MIG devices for classes with ``preferMig`` or ``prefer: mig``; full GPUs for
  ``prefer: full-gpu``.
- ``throughput``: training and fine-tuning only: memory bandwidth and dense BF16 TFLOPS relative
  to the best candidate (unknown earns no credit).
- ``nvlink`` / ``ecc``: ``gpuplace.io/prefer`` — the chosen GPUs are NVLink-joined / have ECC on.
- ``packing``: fill nodes that are already partly used (kube-scheduler's MostAllocated), and
  keep a wholly free node of 8+ GPUs for a job that needs all of them. Left out where
  ``fragmentation`` applies: the learned workload then measures what packing guesses (a whole
  node is kept when the pods seen need whole nodes); kept, the GPU-only MostAllocated fills nodes
  whatever their CPU and memory, which stranded GPUs on the openb trace at 130 % load
  (docs/evaluation-fragmentation.md#what-we-measured-on-the-way).
- ``fragmentation``: keep free GPUs usable by the pods the cluster sees: how much placing the pod
  raises the node's expected unusable free GPUs (a GPU that sharing pods hold part of counts its
  free share, ``NodeAllocation.partly_free_milli``; a sharing pod takes ``Job.gpu_milli``) against
  the learned target workload
  (``core.workload``; Weng et al., "Beware of Fragmentation", USENIX ATC'23, "fragmentation
  gradient descent"), plus how much it raises the free GPUs the node's free CPU and memory could
  not feed at the workload's mean request per GPU (``host_stranding_delta``, a look-ahead over all
  of the node's free GPUs where FGD's check sees only the next pod), plus the demand the taken
  GPUs' model would be missed by across the request's nodes (``scarcity_delta``,
  ``WorkloadProfile.scarcity``), relative to the best candidate (``fragmentation_values``). Placing on GPUs
  of a model many expected pods may not use lowers it (those GPUs were fragments already), so
  the models constrained pods need are kept for them; leaving free GPUs on a node whose CPU or
  memory the expected pods would not find raises it. Its default weight (100 against cost 5)
  makes it decide first. When it tells no candidate apart it is left out, so cost and
  the rest order equally fragmenting nodes exactly as without it (with a constant 100 in the mean,
  they would move a score by less than one step). Applies only when the caller passes a
  non-empty ``WorkloadProfile``; a node's unknown (None) CPU or memory is not checked.

A pod that asks for no device (it reaches the extender with the chart's
``scheduler.extender.cpuOnlyPods``) gets ``fragmentation`` of its CPU and memory requests
(``host_only_delta``) and ``packing`` as the share of the node's devices in use
(``_score_without_devices``).

Then one rule over the candidates, not a weighted component: **last-resort models** (a size
class's ``lastResortModels``, e.g. premium GPUs for classes small and medium instead of denying
them outright with ``deniedModels``). A
node where the pod would get a full GPU of such a model scores 0 while some other node that passes
would give it none; those others score at least 1. kube-scheduler multiplies an extender's score by
its weight x 10 (the chart's weight 10: 100 points a step), more than its own plugins usually tell
nodes apart by, so an H100 is taken only when no cheaper GPU that fits is free; when every
candidate is such a node, they are scored as usual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from scheduler_extender.core.components import COMPONENTS
from scheduler_extender.core.devices import MILLI, NodeState, Unit, free_units
from scheduler_extender.core.filter import NodeResult, find_nvlink_group
from scheduler_extender.core.job import Job
from scheduler_extender.core.policy import Policy
from scheduler_extender.core.requirements import NVIDIA_GPU
from scheduler_extender.core.sharing import share_milli
from scheduler_extender.core.workload import (FreeByModel, WorkloadProfile, free_by_model, free_by_model_minus,
                                              model_key)

MAX_SCORE = 10
WHOLE_NODE_GPUS = 8


@dataclass(frozen=True)
class NodeScore:
    node: str
    score: int
    components: Mapping[str, float]  # component -> value in [0, 1], only those that apply
    cost_per_hour: float
    last_resort: bool = False  # scored 0: its GPUs are the class's lastResortModels and others pass
    value: float = 0.0  # the weighted mean before rounding to kube-scheduler's 0-10 integers, in [0, 1]
    tie_value: float = 0.0  # the weighted mean of the components but fragmentation, in [0, 1]

    @property
    def best_rank(self) -> tuple[int, float]:
        """How ``--filter-returns-best`` ranks nodes: the 0-10 score, its ties broken by
        ``tie_value`` (cost, VRAM fit, preferences), not by fragmentation's sub-step differences,
        which on the openb trace placed worse than kube-scheduler's own spread among the tied
        nodes (``gpuplace simulate``, default list, seed 0: 92.25 % milli-GPU allocation at 100 %
        against 94.04 %; docs/evaluation-fragmentation.md#probes-not-shipped)."""
        return self.score, round(self.tie_value, 9)


def placement_cost(units: Sequence[Unit], policy: Policy) -> float:
    """USD per hour of the units a pod would get (policy prices, MIG devices pro rata)."""
    return sum(policy.cost_per_gpu_hour(u.entry) * u.cost_fraction for u in units)


def _throughput(u: Unit, best_bw: float, best_tflops: float) -> float:
    bw = (u.memory_bandwidth_gbps or 0) / best_bw if best_bw else 0.0
    tf = (u.bf16_tflops or 0) / best_tflops if best_tflops else 0.0
    return 0.5 * bw + 0.5 * tf


def _packing(state: NodeState, result: NodeResult, job: Job) -> float:
    view = state.view
    if view is None:
        return 0.0
    total = len(view.units(job.req.resource or ""))
    if total == 0:
        return 0.0
    alloc = state.allocation
    if view.sharing is not None and job.req.resource == NVIDIA_GPU:
        # GPUs shared by replicas (core.sharing): fill what holders already use of the GPUs first,
        # by share (MostAllocated over thousandths, as the simulator counts a shared GPU).
        levels, _ = free_models(state, NVIDIA_GPU)
        healthy = sum(1 for u in view.units(NVIDIA_GPU) if u.healthy)
        taken = sum(min(levels.get(u.uuid, 0), share_taken(job, state, u)) for u in result.chosen)
        return min(1.0, (healthy * MILLI - sum(levels.values()) + taken) / (healthy * MILLI)) if healthy else 0.0
    used_before = alloc.held_count()
    n = len(result.chosen)
    if used_before == 0 and total >= WHOLE_NODE_GPUS and n < total:
        return 0.0  # breaking a whole 8-GPU node: keep it for a job that needs all of it
    return min(1.0, (used_before + n) / total)


FreeModels = tuple[Mapping[str, int], FreeByModel]


def free_models(state: NodeState, resource: str) -> FreeModels:
    """The free thousandths of the node's units of ``resource`` that have any (UUID -> 1 to 1000)
    and their ``free_by_model``: ``devices.free_units`` wholly free, unless
    ``NodeAllocation.partly_free_milli`` lists what GPU-sharing pods left of them, plus the healthy
    units it lists that are held for this pod (too little left for it)."""
    free = free_units(state.view, state.allocation, resource)
    partly = state.allocation.partly_free_milli
    if not partly:
        return {u.uuid: MILLI for u in free}, free_by_model(free)
    levels = {u.uuid: partly.get(u.uuid, MILLI) for u in free}
    units = list(free)
    for u in state.view.units(resource) if state.view is not None else ():
        if u.uuid in partly and u.uuid not in levels and u.healthy and partly[u.uuid] > 0:
            levels[u.uuid] = partly[u.uuid]
            units.append(u)
    return levels, free_by_model(units, levels)


FreeOf = Callable[[NodeState, str], FreeModels]
"""``free_models`` or a function equal to it (a caller's memo of it: ``served.grouped``)."""


def share_taken(job: Job, state: NodeState, unit: Unit) -> int:
    """Thousandths of ``unit`` the pod takes: ``Job.gpu_milli`` (1000 for whole devices; a
    GPU-sharing pod's share in ``gpuplace simulate``), and on a node whose GPUs the device plugin
    shares (``NodeView.sharing``) the pod's VRAM need over the GPU's memory
    (``sharing.share_milli``), as its holders' shares are counted there; a
    ``gpuplace.io/gpu-fraction`` pod on a GPU that is not shared takes all of it."""
    same = _share_of_every_unit(job, state)
    return same if same is not None else share_milli(job.vram_need_on(unit), unit.memory_bytes)


def _share_of_every_unit(job: Job, state: NodeState) -> int | None:
    """``share_taken`` where it is the same for every unit of the node (no device plugin shares
    them, or the pod asks for other devices); None where it depends on the unit's memory."""
    view = state.view
    if view is None or view.sharing is None or job.req.resource != NVIDIA_GPU:
        # A gpu-fraction pod on a GPU no device plugin shares gets the whole GPU.
        return MILLI if job.req.gpu_fraction_milli is not None else job.gpu_milli
    return None


def shares_taken(job: Job, state: NodeState, chosen: Sequence[Unit]) -> list[int]:
    """``share_taken`` of each of ``chosen``, in order: what the three deltas below read (a
    caller computing all three passes it to each)."""
    same = _share_of_every_unit(job, state)
    if same is not None:
        return [same] * len(chosen)
    return [share_milli(job.vram_need_on(u), u.memory_bytes) for u in chosen]


def fragmentation_delta(job: Job, state: NodeState, chosen: Sequence[Unit], workload: WorkloadProfile,
                        free: FreeModels | None = None, resource: str | None = None,
                        shares: Sequence[int] | None = None) -> float:
    """FGD's gradient for one placement: the node's expected unusable free devices after placing
    the pod minus before (``WorkloadProfile.fragmentation``), in devices; between -len(chosen) and
    the free devices left. The pod's CPU/memory requests lower the node's free CPU/memory when
    both are known. ``free``: ``free_models(state, resource)`` when the caller has it already.
    The pod takes ``Job.gpu_milli`` of each unit (a GPU-sharing pod, a share). ``resource``: the
    devices measured, the pod's own by default (a pod without devices: each of the workload's).
    ``shares``: ``shares_taken(job, state, chosen)`` when the caller has it already."""
    resource = resource or job.req.resource or ""
    levels, before = free or free_models(state, resource)
    if shares is None:
        shares = shares_taken(job, state, chosen)
    taken = [(u, levels[u.uuid], m) for u, m in zip(chosen, shares) if u.uuid in levels]
    after = free_by_model_minus(before, taken) if taken else before
    cpu, mem = state.cpu_milli_free, state.memory_bytes_free
    before_f = workload.fragmentation(resource, before, cpu, mem)
    cpu_after = None if cpu is None else cpu - (job.cpu_milli or 0)
    mem_after = None if mem is None else mem - (job.memory_bytes or 0)
    return workload.fragmentation(resource, after, cpu_after, mem_after) - before_f


def host_stranding_delta(job: Job, state: NodeState, chosen: Sequence[Unit], workload: WorkloadProfile,
                         free: FreeModels | None = None, resource: str | None = None,
                         shares: Sequence[int] | None = None) -> float:
    """The change in ``WorkloadProfile.host_stranding`` of the node when the pod takes ``chosen``
    and its CPU/memory requests: free devices the node's free CPU or memory could not feed at the
    workload's mean request per device, after minus before; in devices, between -len(chosen) and
    the free devices left. 0 when the node's CPU and memory are unknown. ``free``, ``resource``
    and ``shares`` as in ``fragmentation_delta``."""
    resource = resource or job.req.resource or ""
    cpu, mem = state.cpu_milli_free, state.memory_bytes_free
    if cpu is None and mem is None:
        return 0.0
    levels, before = free or free_models(state, resource)
    if shares is None:
        shares = shares_taken(job, state, chosen)
    g_before = sum(levels.values()) / MILLI  # = sum(level x n) over ``before``: the same integer
    g_after = g_before - sum(min(levels.get(u.uuid, 0), m) for u, m in zip(chosen, shares)) / MILLI
    cpu_after = None if cpu is None else cpu - (job.cpu_milli or 0)
    mem_after = None if mem is None else mem - (job.memory_bytes or 0)
    return (workload.host_stranding(resource, g_after, cpu_after, mem_after)
            - workload.host_stranding(resource, g_before, cpu, mem))


def host_only_delta(job: Job, state: NodeState, workload: WorkloadProfile, free_of: FreeOf = free_models) -> float:
    """For a pod without devices: how much its CPU and memory requests raise the node's expected
    unusable free devices (``fragmentation_delta`` plus ``host_stranding_delta`` with no device
    taken), summed over the device resources of the workload; in devices, 0 or more. 0 on a node
    whose CPU and memory are unknown, or with no device free. ``free_of``: ``free_models`` or
    the caller's memo of it."""
    if state.cpu_milli_free is None and state.memory_bytes_free is None:
        return 0.0
    total = 0.0
    for resource in workload.resources:
        free = free_of(state, resource)
        if free[1]:
            total += (fragmentation_delta(job, state, (), workload, free, resource)
                      + host_stranding_delta(job, state, (), workload, free, resource))
    return total


def devices_in_use(state: NodeState, free_of: FreeOf = free_models) -> float:
    """Share of the node's devices (every resource's healthy units) that pods hold, 0 to 1; 1 for a
    node without devices (its CPU serves no device). What sharing pods left of a unit counts as free.
    ``free_of``: as for ``host_only_delta``."""
    view = state.view
    if view is None:
        return 1.0
    total = free = 0.0
    for resource in view.units_by_resource:
        levels, _ = free_of(state, resource)
        total += sum(1 for u in view.units(resource) if u.healthy)
        free += sum(levels.values()) / MILLI
    return 1.0 - free / total if total else 1.0


def supply_of(states: Sequence[tuple[NodeState, int]], resource: str, free_of: FreeOf = free_models) -> dict[str, float]:
    """Free devices of ``resource`` per model key (``workload.FreeByModel``'s), shares counted,
    over ``states`` given with how many nodes each stands for: what ``WorkloadProfile.scarcity``
    reads. ``free_of``: ``free_models``, or the caller's memo of it."""
    supply: dict[str, float] = {}
    for state, count in states:
        for m, level, n in free_of(state, resource)[1]:
            supply[m] = supply.get(m, 0.0) + count * level * n / MILLI
    return supply


def scarcity_delta(job: Job, state: NodeState, chosen: Sequence[Unit], scarcity: Mapping[str, float],
                   shares: Sequence[int] | None = None) -> float:
    """The demand the pod's units would be missed by (``WorkloadProfile.scarcity`` per device),
    for the share of each it takes (``share_taken``); in devices. ``shares`` as in
    ``fragmentation_delta``."""
    if shares is None:
        shares = shares_taken(job, state, chosen)
    if all(s == job.gpu_milli for s in shares):  # one share for all: summed as before, to the last bit
        return sum(scarcity.get(model_key(u), 0.0) for u in chosen) * job.gpu_milli / MILLI
    return sum(scarcity.get(model_key(u), 0.0) * s for u, s in zip(chosen, shares)) / MILLI


FRAG_SCALE_GPUS = 1.0
"""A candidate whose fragmentation increase exceeds the best candidate's by this many devices
(or more) earns 0 on ``fragmentation``; in between, linearly."""


def fragmentation_values(deltas: Mapping[str, float]) -> dict[str, float]:
    """Component values from each candidate's increase (``score_nodes`` passes
    ``fragmentation_delta`` + ``host_stranding_delta``): 1 for the least increase, down to 0 at
    ``FRAG_SCALE_GPUS`` devices more."""
    best = min(deltas.values(), default=0.0)
    return {k: max(0.0, 1.0 - (d - best) / FRAG_SCALE_GPUS) for k, d in deltas.items()}


@dataclass(frozen=True)
class Candidates:
    """What a component compares one candidate with, computed once per ``score_nodes`` call: the
    pod, the policy, every candidate's placement cost (USD per hour, by node), the cheapest, the
    best memory bandwidth and BF16 TFLOPS among the chosen units, and the ``fragmentation``
    values (empty: that component does not apply, ``packing`` does)."""

    job: Job
    policy: Policy
    costs: Mapping[str, float]
    min_cost: float
    best_bw: float
    best_tflops: float
    fragmentation: Mapping[str, float]


ComponentValue = Callable[[Candidates, NodeState, NodeResult], float]
ComponentApplies = Callable[[Candidates], bool]
COMPONENT_VALUES: dict[str, tuple[ComponentApplies, ComponentValue]] = {}
"""Each declared component's functions (``core.components``), by name: whether it applies to the
pod (decided once per ``score_nodes`` call, from the pod and the candidates) and each candidate's
value in [0, 1] where it does."""


def _always(c: Candidates) -> bool:
    return True


def component(name: str, applies: ComponentApplies = _always) -> Callable[[ComponentValue], ComponentValue]:
    """Register the value function of the component declared as ``name`` in ``core.components``,
    with ``applies``: whether it applies to the pod at all (default: always)."""
    def register(fn: ComponentValue) -> ComponentValue:
        if name not in {c.name for c in COMPONENTS} or name in COMPONENT_VALUES:
            raise ValueError(f"score component {name!r}: not declared in core.components, or registered twice")
        COMPONENT_VALUES[name] = (applies, fn)
        return fn
    return register


@component("cost")
def _cost(c: Candidates, state: NodeState, result: NodeResult) -> float:
    cost = c.costs[result.node]
    return c.min_cost / cost if cost > 0 else 1.0


@component("vramFit", applies=lambda c: c.job.vram is not None)
def _vram_fit(c: Candidates, state: NodeState, result: NodeResult) -> float:
    need = c.job.vram.bytes_per_gpu  # type: ignore[union-attr]  # applies: known
    units = result.chosen
    return sum(min(1.0, need / u.memory_bytes) for u in units) / len(units)


def _full_gpus_preferred(c: Candidates) -> bool:
    return "full-gpu" in c.job.req.prefer


@component("mig", applies=lambda c: _full_gpus_preferred(c) or c.job.size_class.prefer_mig or "mig" in c.job.req.prefer)
def _mig(c: Candidates, state: NodeState, result: NodeResult) -> float:
    units = result.chosen
    kind = "gpu" if _full_gpus_preferred(c) else "mig"
    return [u.kind for u in units].count(kind) / len(units)


@component("throughput", applies=lambda c: c.job.workload in ("training", "finetune-lora"))
def _throughput_component(c: Candidates, state: NodeState, result: NodeResult) -> float:
    units = result.chosen
    return sum(_throughput(u, c.best_bw, c.best_tflops) for u in units) / len(units)


@component("nvlink", applies=lambda c: "nvlink" in c.job.req.prefer and c.job.req.gpu_count > 1)
def _nvlink(c: Candidates, state: NodeState, result: NodeResult) -> float:
    return 1.0 if find_nvlink_group(result.chosen, c.job.req.gpu_count) is not None else 0.0


@component("ecc", applies=lambda c: "ecc" in c.job.req.prefer)
def _ecc(c: Candidates, state: NodeState, result: NodeResult) -> float:
    units = result.chosen
    return sum(u.ecc_enabled is True for u in units) / len(units)


@component("packing", applies=lambda c: not c.fragmentation)
def _packing_component(c: Candidates, state: NodeState, result: NodeResult) -> float:
    return _packing(state, result, c.job)


@component("fragmentation", applies=lambda c: bool(c.fragmentation))
def _fragmentation(c: Candidates, state: NodeState, result: NodeResult) -> float:
    return c.fragmentation[result.node]


def fragmentation_deltas(job: Job, gpu_pods: Sequence[tuple[NodeState, NodeResult]], workload: WorkloadProfile,
                         scarcity: Mapping[str, float] | None, free_of: FreeOf = free_models) -> dict[str, float]:
    """Each candidate's increase, by node: ``fragmentation_delta`` + ``host_stranding_delta`` (+
    ``scarcity_delta`` when ``scarcity`` is given), in devices; what ``fragmentation_values``
    turns into the component's values. ``gpu_pods``: (state, result with ``chosen``). For a pod
    that asks for no device, each node's ``host_only_delta`` (``scarcity`` is not read)."""
    if job.req.resource is None:
        return {r.node: host_only_delta(job, s, workload, free_of) for s, r in gpu_pods}
    resource = job.req.resource
    deltas = {}
    for s, r in gpu_pods:
        free = free_of(s, resource)
        shares = shares_taken(job, s, r.chosen)
        deltas[r.node] = (fragmentation_delta(job, s, r.chosen, workload, free, shares=shares)
                          + host_stranding_delta(job, s, r.chosen, workload, free, shares=shares)
                          + (scarcity_delta(job, s, r.chosen, scarcity, shares) if scarcity else 0.0))
    return deltas


FragmentationDeltas = Callable[[Job, Sequence[tuple[NodeState, NodeResult]], WorkloadProfile,
                                Mapping[str, float] | None, FreeOf], dict[str, float]]
"""``fragmentation_deltas`` or a function equal to it, float for float (a caller's batch of it:
``simulator.batch_fragmentation``)."""


def _fragmentation_values(job: Job, gpu_pods: Sequence[tuple[NodeState, NodeResult]], policy: Policy,
                          workload: WorkloadProfile | None, scarcity: Mapping[str, float] | None,
                          free_of: FreeOf = free_models,
                          deltas_of: FragmentationDeltas = fragmentation_deltas) -> dict[str, float]:
    """The ``fragmentation`` component's values (``fragmentation_values``) where it applies: a
    learned workload, a weight, and candidates it tells apart; else empty."""
    if not workload or policy.scoring.fragmentation <= 0 or not gpu_pods:
        return {}
    frag = fragmentation_values(deltas_of(job, gpu_pods, workload, scarcity, free_of))
    # Telling no candidate apart, it is left out: the other components keep their full say.
    return {} if len(set(frag.values())) == 1 else frag


def score_nodes(job: Job, passed: Sequence[tuple[NodeState, NodeResult]], policy: Policy,
                workload: WorkloadProfile | None = None, scarcity: Mapping[str, float] | None = None,
                free_of: FreeOf = free_models, deltas_of: FragmentationDeltas = fragmentation_deltas) -> list[NodeScore]:
    """Score every node that passed the filter; pods the filter left untouched score 0.

    Each declared component (``core.components``, functions ``COMPONENT_VALUES``) that applies
    gives a value in [0, 1]; the score is their weighted mean (policy weights) x10, rounded.

    Args:
        job: the resolved pod.
        passed: (node state, filter result) for nodes whose result passed, with ``chosen`` set.
        policy: weights and prices.
        workload: the learned target workload (``core.workload``) for ``fragmentation``; None or
            empty: the component does not apply.
        scarcity: ``WorkloadProfile.scarcity`` over the nodes of the request (``supply_of``):
            added to each candidate's fragmentation increase (``scarcity_delta``); None: not.
        free_of: ``free_models``, or a function equal to it (the served layer's memo of it).
        deltas_of: ``fragmentation_deltas``, or a function equal to it (the simulator's batch).

    Returns:
        One ``NodeScore`` per input, in input order.
    """
    if job.req.resource is None:
        return _score_without_devices(job, passed, policy, workload, free_of, deltas_of)
    gpu_pods = [(s, r) for s, r in passed if r.chosen]
    costs = {r.node: placement_cost(r.chosen, policy) for _, r in gpu_pods}
    all_units = [u for _, r in gpu_pods for u in r.chosen]
    candidates = Candidates(
        job, policy, costs, min(costs.values(), default=0.0),
        max((u.memory_bandwidth_gbps or 0 for u in all_units), default=0.0),
        max((u.bf16_tflops or 0 for u in all_units), default=0.0),
        _fragmentation_values(job, gpu_pods, policy, workload, scarcity, free_of, deltas_of))
    weight_of = policy.scoring.by_component()
    # Whether a component applies is the same for every candidate: decided once, with its weight.
    applying = [(c.name, COMPONENT_VALUES[c.name][1]) for c in COMPONENTS if COMPONENT_VALUES[c.name][0](candidates)]
    weights = _Weights([(name, weight_of[name]) for name, _ in applying])
    out: list[NodeScore] = []
    for state, result in passed:
        if not result.chosen:
            out.append(NodeScore(result.node, 0, {}, 0.0))
            continue
        comps = {name: value(candidates, state, result) for name, value in applying}
        value = weights.mean(comps)
        out.append(NodeScore(result.node, int(round(MAX_SCORE * value)), comps, costs[result.node], value=value,
                             tie_value=weights.tie_mean(comps)))
    return _last_resort(job, gpu_pods, out)


def scores_without_devices(job: Job, policy: Policy, workload: WorkloadProfile | None) -> bool:
    """Whether a pod that asks for no device gets scores other than 0 (``_score_without_devices``):
    it requests CPU or memory, and a learned workload and the ``fragmentation`` weight are there."""
    return (job.req.resource is None and not job.errors and bool(job.cpu_milli or job.memory_bytes)
            and bool(workload) and policy.scoring.fragmentation > 0)


def _score_without_devices(job: Job, passed: Sequence[tuple[NodeState, NodeResult]], policy: Policy,
                           workload: WorkloadProfile | None, free_of: FreeOf = free_models,
                           deltas_of: FragmentationDeltas = fragmentation_deltas) -> list[NodeScore]:
    """A pod that asks for no device (it reaches the extender when the chart sends every pod of its
    scheduler there, ``scheduler.extender.cpuOnlyPods``): ``fragmentation`` of its CPU and memory
    requests (``host_only_delta``, through ``deltas_of``), and ``packing``: the share of the node's
    devices in use (``devices_in_use``), so that among nodes it does not fragment it goes where
    the CPU serves the fewest free GPUs, as FGD places such pods. 0 everywhere without a learned
    workload, or when the pod requests neither CPU nor memory (nothing of a node's changes)."""
    w = policy.scoring
    if not passed or not scores_without_devices(job, policy, workload):
        return [NodeScore(r.node, 0, {}, 0.0) for _, r in passed]
    frag = fragmentation_values(deltas_of(job, passed, workload, None, free_of))  # type: ignore[arg-type]  # workload: checked
    out = []
    weights = _Weights([("fragmentation", w.fragmentation), ("packing", w.packing)])
    for state, result in passed:
        comps = {"fragmentation": frag[result.node], "packing": devices_in_use(state, free_of)}
        value = weights.mean(comps)
        out.append(NodeScore(result.node, int(round(MAX_SCORE * value)), comps, 0.0, value=value,
                             tie_value=weights.tie_mean(comps)))
    return out


class _Weights:
    """The weights of the components that apply, in their order, with their sums computed once
    per scoring call: ``mean`` is the score's weighted mean, ``tie_mean`` the same without
    ``fragmentation`` (``NodeScore.tie_value``); 0 where the weights sum to 0."""

    def __init__(self, weights: Sequence[tuple[str, float]]) -> None:
        self.weights = list(weights)
        self.tie_weights = [(name, w) for name, w in self.weights if name != "fragmentation"]
        self.total = sum(w for _, w in self.weights)
        self.tie_total = sum(w for _, w in self.tie_weights)

    def mean(self, comps: Mapping[str, float]) -> float:
        return sum(w * comps[name] for name, w in self.weights) / self.total if self.total else 0.0

    def tie_mean(self, comps: Mapping[str, float]) -> float:
        return sum(w * comps[name] for name, w in self.tie_weights) / self.tie_total if self.tie_total else 0.0


def _last_resort(job: Job, gpu_pods: Sequence[tuple[NodeState, NodeResult]], scores: list[NodeScore]) -> list[NodeScore]:
    """The last-resort rule (module doc): nodes whose chosen full GPUs include one of
    ``job.class_last_resort_models`` score 0 while another candidate's include none."""
    models = job.class_last_resort_models
    if not models or not gpu_pods:
        return scores
    flagged = {r.node for _, r in gpu_pods
               if any(u.kind == "gpu" and u.entry is not None and u.entry.id in models for u in r.chosen)}
    if not flagged or len(flagged) == len({r.node for _, r in gpu_pods}):
        return scores  # none of them, or nothing else to fall back from
    chosen = {r.node for _, r in gpu_pods}
    # Built field by field: dataclasses.replace, per candidate, was a tenth of the score's time.
    return [NodeScore(s.node, 0, s.components, s.cost_per_hour, last_resort=True, value=s.value, tie_value=s.tie_value)
            if s.node in flagged
            else NodeScore(s.node, max(1, s.score), s.components, s.cost_per_hour, last_resort=s.last_resort, value=s.value,
                           tie_value=s.tie_value) if s.node in chosen else s
            for s in scores]


if set(COMPONENT_VALUES) != {c.name for c in COMPONENTS}:  # a declared component without its function
    raise ImportError(f"score components without a function: {sorted({c.name for c in COMPONENTS} - set(COMPONENT_VALUES))}")
