"""Filter: can this node run this pod? Each criterion is a small named unit with a reason.

Per-unit criteria (``core.criteria.UNIT_CRITERIA``, declared in ``core.criteria``) look at one device (full GPU or MIG device) and return a
reason or ``None``. Node criteria look at the node as a whole (inventory present and fresh, enough
devices of the requested kind, free, joined by NVLink). ``filter_node`` composes them and reports
*every* failing reason, grouped by devices ("GPU 0-3: 24 GiB VRAM < 30.3 GiB needed (13B
inference, bf16)"), as kube-scheduler's ``NodeResourcesFit`` reports all insufficient resources.

Failures a pod can never overcome on the node (wrong model, too little VRAM, no NVLink) are
*unresolvable* (kube-scheduler's ``UnschedulableAndUnresolvable``, the extender's
``FailedAndUnresolvableNodes``); failures that freeing GPUs would fix are *resolvable*
(``FailedNodes``), which lets kube-scheduler's preemption consider the node.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Protocol, Sequence

from scheduler_extender.core.devices import MILLI, NodeAllocation, NodeState, NodeView, Unit
from scheduler_extender.core.job import Job
from scheduler_extender.core.policy import Policy
from scheduler_extender.core.quantity import fmt_gib, fmt_gib_below
from scheduler_extender.core.sharing import GpuSharing, used_vram_bytes
from scheduler_extender.core import criteria
from scheduler_extender.core.criteria import (  # noqa: F401 - the names and checks: re-exported
    C_ANNOTATION, C_CC, C_CLASS, C_COUNT, C_DEVICE_KIND, C_ECC, C_FREE, C_HEALTHY, C_INVENTORY, C_MODEL, C_NVLINK,
    C_RESOURCE, C_RUNTIME, C_SHARED, C_TENANT, C_TEMPERATURE, C_VRAM, UnitCheck, check_class_allowed,
    check_compute_capability, check_device_kind, check_ecc, check_healthy, check_model_allowed, check_runtime,
    check_tenant_allowed, check_vram,
)
from scheduler_extender.core.requirements import A_REQUIRE, AMD_GPU, MIG_PREFIX, NVIDIA_GPU

CRITERIA = criteria.CRITERION_NAMES  # every criterion's name (``core.criteria`` declares them)


@dataclass(frozen=True)
class Rejection:
    criterion: str
    message: str
    resolvable: bool = False


@dataclass(frozen=True)
class NodeResult:
    """The filter's verdict for one node.

    Attributes:
        passed: the pod can run here now.
        rejections: every failing criterion with its reason (empty when passed).
        chosen: the units the pod would get (for the score); empty when failed.
    """

    node: str
    passed: bool
    rejections: tuple[Rejection, ...] = ()
    chosen: tuple[Unit, ...] = ()
    untouched: bool = False  # pod is not a GPU pod: passed without looking

    @property
    def unresolvable(self) -> bool:
        return any(not r.resolvable for r in self.rejections)

    @property
    def reason(self) -> str:
        return "; ".join(r.message for r in self.rejections)


# ---- helpers ----------------------------------------------------------------------------------

def _ranges(indices: Iterable[int]) -> str:
    nums = sorted(set(indices))
    parts: list[str] = []
    start = prev = nums[0]
    for n in nums[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(f"{start}-{prev}" if prev > start + 1 else (f"{start},{prev}" if prev == start + 1 else f"{start}"))
        if n is not None:
            start = prev = n
    return ",".join(parts)


def label_units(units: Sequence[Unit]) -> str:
    """'GPU 0-3', 'MIG 3g.40gb on GPU 0-1' (several devices per GPU counted: 'x4')."""
    gpus = [u for u in units if u.kind == "gpu"]
    migs = [u for u in units if u.kind == "mig"]
    parts = []
    if gpus:
        parts.append(f"GPU {_ranges(u.gpu_index for u in gpus)}")
    by_profile: dict[str, list[Unit]] = {}
    for u in migs:
        by_profile.setdefault(u.mig_profile or "?", []).append(u)
    for profile, us in by_profile.items():
        count = f" x{len(us)}" if len(us) > 1 else ""
        parts.append(f"MIG {profile}{count} on GPU {_ranges(u.gpu_index for u in us)}")
    return ", ".join(parts)


def find_nvlink_group(units: Sequence[Unit], size: int) -> tuple[Unit, ...] | None:
    """``size`` units every pair of which is joined by NVLink (a clique), or None.

    NVLink does not route through a third GPU, so NCCL's peer-to-peer paths need direct links
    (NVSwitch systems report every other GPU as a peer). Prefers the group whose units have the
    least memory (best fit); nodes have at most 16 GPUs, so exhaustive search is cheap.
    """
    if size <= 1:
        return tuple(units[:size]) if len(units) >= size else None
    candidates = [u for u in units if u.kind == "gpu" and u.nvlink_peers]
    if len(candidates) < size:
        return None
    candidates.sort(key=lambda u: (u.memory_bytes, u.gpu_index))
    by_uuid = {u.uuid: u for u in candidates}

    def extend(group: list[Unit], rest: list[Unit]) -> list[Unit] | None:
        if len(group) == size:
            return group
        for i, u in enumerate(rest):
            if len(group) + len(rest) - i < size:
                return None
            if all(u.uuid in g.nvlink_peers or g.uuid in u.nvlink_peers for g in group):
                found = extend(group + [u], rest[i + 1:])
                if found:
                    return found
        return None

    found = extend([], [by_uuid[u.uuid] for u in candidates])
    return tuple(found) if found else None


def _device_word(resource: str) -> str:
    return "MIG devices" if resource.startswith(MIG_PREFIX) else "GPUs"


def inventory_rejection(state: NodeState, policy: Policy, now: dt.datetime | None) -> Rejection | None:
    """No inventory, an invalid one, or one older than the policy's staleness limit.

    ``now=None`` skips the staleness check (static mode: files are the truth).
    """
    if state.view is None:
        if state.inventory_error:
            return Rejection(C_INVENTORY, f"GPU inventory rejected: {state.inventory_error}")
        return Rejection(C_INVENTORY, "no GPU inventory (annotation gpuplace.io/inventory missing; is gpuplace-agent running on this node?)")
    if state.view.provenance:
        if policy.inventory.on_missing != "gfd-labels":
            return Rejection(C_INVENTORY, "no GPU inventory (annotation gpuplace.io/inventory missing; is gpuplace-agent "
                                          "running on this node?); its GPU feature discovery labels are not used "
                                          "(policy inventory.onMissing: reject; gfd-labels would use them)")
        return None  # labels are current while the Node is: never stale
    if now is not None and policy.inventory.on_stale == "reject":
        age = (now - state.view.observed_at).total_seconds()
        limit = policy.inventory.stale_after_seconds
        if age > limit:
            return Rejection(C_INVENTORY, f"GPU inventory is stale: observed {age:.0f} s ago, limit {limit:.0f} s (policy inventory.staleAfterSeconds)")
    return None


def _resource_rejection(view: NodeView, job: Job) -> Rejection | None:
    resource = job.req.resource or ""
    units = view.units(resource)
    if units:
        return None
    offered = sorted(view.units_by_resource)
    if resource == NVIDIA_GPU and offered == [AMD_GPU]:
        why = f"only AMD GPUs here ({view.description}); a CUDA job needs NVIDIA GPUs"
    elif resource == AMD_GPU and AMD_GPU not in offered:
        why = f"no AMD GPUs here ({view.description})"
    elif offered:
        why = f"offers {', '.join(offered)} ({view.description})"
    else:
        why = f"no schedulable GPUs ({view.description})"
    return Rejection(C_RESOURCE, f"no {resource} on this node: {why}")


# ---- composition ------------------------------------------------------------------------------

class UnitVerdicts(Protocol):
    """A memo ``filter_node`` may be given for the calls of one job (``served.grouped.UnitVerdicts``
    is the one the grouped engine keeps): a mapping that also says under which keys to keep what
    does not depend on the allocation. Its keys are the speed-up layer's business; the filter
    only promises to store a verdict under the key the memo gives for what it was computed from.
    """

    def get(self, key: Hashable) -> Any: ...
    def __setitem__(self, key: Hashable, value: Any) -> None: ...

    def structure_key(self, view: NodeView, resource: str) -> Hashable:
        """A key equal for views whose devices the filter cannot tell apart."""

    def unit_keys(self, view: NodeView, resource: str) -> Sequence[Hashable]:
        """Per unit of ``view.units(resource)``, a key equal for units every per-unit criterion treats alike."""


def filter_node(job: Job, state: NodeState, policy: Policy, now: dt.datetime | None = None,
                unit_verdicts: UnitVerdicts | None = None) -> NodeResult:
    """Decide whether ``job`` can run on the node now, and on which units (``_filter_node``);
    every reason for a node decided on a derived inventory says where it came from."""
    result = _filter_node(job, state, policy, now, unit_verdicts)
    provenance = state.view.provenance if state.view is not None else ""
    if result.passed or not provenance or any(r.criterion == C_INVENTORY for r in result.rejections):
        return result
    return dataclasses.replace(result, rejections=tuple(
        dataclasses.replace(r, message=f"{r.message} ({provenance})") for r in result.rejections))


def _filter_node(job: Job, state: NodeState, policy: Policy, now: dt.datetime | None = None,
                 unit_verdicts: UnitVerdicts | None = None) -> NodeResult:
    """Decide whether ``job`` can run on the node now, and on which units.

    Args:
        job: the resolved pod.
        state: the node's inventory view and allocations.
        policy: the running policy.
        now: current time for the staleness check; None skips it.
        unit_verdicts: a memo shared by calls for the same job (and policy): what does not
            depend on the allocation (every per-unit criterion, the device count, NVLink among
            all units) is decided once per node structure. None: decided here. Not used for a
            job a criterion over often-changing fields applies to (``criteria.per_node_fields``).

    Returns:
        ``NodeResult`` with every failing reason, or the chosen units when the node passes.
    """
    req = job.req
    if not req.wants_gpu and not req.has_annotations and not req.errors:
        return NodeResult(state.name, True, untouched=True)
    if req.errors:
        return NodeResult(state.name, False, tuple(Rejection(C_ANNOTATION, str(e)) for e in req.errors))
    if not req.wants_gpu:
        # Annotated but asks for no GPU: nothing to place; the device plugin would give it none.
        return NodeResult(state.name, True, untouched=True)
    if job.tenant_denial is not None:
        return NodeResult(state.name, False, (Rejection(C_TENANT, job.tenant_denial),))

    inv = inventory_rejection(state, policy, now)
    if inv is not None:
        return NodeResult(state.name, False, (inv,))
    view = state.view
    assert view is not None
    resource = req.resource or ""
    if unit_verdicts is not None and criteria.per_node_fields(job):
        unit_verdicts = None  # its keys leave often-changing fields out: this node's own values decide
    if unit_verdicts is None:
        rejections, eligible_at = _structure_verdict(view, job, None)
    else:
        key = unit_verdicts.structure_key(view, resource)
        hit = unit_verdicts.get(key)
        if hit is None:
            hit = unit_verdicts[key] = _structure_verdict(view, job, unit_verdicts)
        rejections, eligible_at = hit
    if rejections:
        return NodeResult(state.name, False, rejections)

    units = view.units(resource)
    if view.sharing is not None and resource == NVIDIA_GPU:
        return _shared_gpu_verdict(job, state.name, view.sharing, [units[i] for i in eligible_at], state.allocation,
                                   any_replica=policy.sharing.replica_choice == "any")

    # Everything left can only be fixed by GPUs becoming free: resolvable.
    n = req.gpu_count
    word = _device_word(resource)
    wants_nvlink = "nvlink" in req.require and n > 1
    alloc = state.allocation
    held = alloc.held
    free = [units[i] for i in eligible_at if units[i].uuid not in held]
    partly = alloc.partly_free_milli
    if partly and job.gpu_milli < MILLI:
        # A share of a GPU: the unit with the least left that holds it first (best fit, as GPU-sharing
        # schedulers choose; FGD's simulator, gpuSelMethod "best"), best-fit order among equals.
        free.sort(key=lambda u: partly.get(u.uuid, MILLI))
    anonymous = alloc.anonymous.get(resource, 0)
    free_count = len(free) - anonymous
    if free_count < n:
        in_use = len(eligible_at) - max(free_count, 0)
        return NodeResult(state.name, False, (Rejection(
            C_FREE, f"{max(free_count, 0)} of {len(eligible_at)} eligible {word} free ({in_use} in use), {n} requested",
            resolvable=True),))
    chosen = choose_units(free, n, nvlink_required=wants_nvlink, nvlink_preferred="nvlink" in req.prefer and n > 1,
                          presorted=True)
    if chosen is None:  # only when NVLink is required: a linked group exists, but not among free units
        return NodeResult(state.name, False, (Rejection(
            C_NVLINK, f"no {n} free {word} all joined by NVLink ({A_REQUIRE}: nvlink)", resolvable=True),))
    return NodeResult(state.name, True, chosen=chosen)


def _shared_gpu_verdict(job: Job, node: str, sharing: GpuSharing, eligible: Sequence[Unit],
                        alloc: NodeAllocation, any_replica: bool = False) -> NodeResult:
    """A one-GPU pod on a node whose GPUs the device plugin shares (``core.sharing``): it gets one
    replica of a GPU it cannot choose, so the node passes only if every GPU with a free replica
    can hold the pod's VRAM need (MPS: within one replica's enforced limit)."""
    how = sharing.describe()
    cls = job.size_class
    if not cls.share_gpus:
        return NodeResult(node, False, (Rejection(
            C_SHARED, f"GPUs here are shared ({how}); class {cls.name} may not share a GPU (policy shareGpus)"),))
    if job.req.gpu_count > 1:
        return NodeResult(node, False, (Rejection(
            C_SHARED, f"GPUs here are shared ({how}); {job.req.gpu_count} replicas give no more VRAM than one: "
                      f"request 1 {NVIDIA_GPU} or use a node with whole GPUs"),))
    replicas = sharing.replicas
    held = {u.uuid: alloc.shared.get(u.uuid, ()) for u in eligible}
    with_room = [u for u in eligible if len(held[u.uuid]) < replicas]
    if alloc.shared_replicas_in_use() >= replicas * len(eligible) or not with_room:
        return NodeResult(node, False, (Rejection(
            C_FREE, f"all {replicas * len(eligible)} replicas in use ({how})", resolvable=True),))
    need = {u.uuid: job.vram_need_on(u) for u in with_room}  # a gpu-fraction is of each GPU's memory
    if sharing.strategy == "mps":
        limit = min(u.memory_bytes for u in with_room) // replicas
        over = [u for u in with_room if (need[u.uuid] or 0) > limit]
        if over:
            worst = max(need[u.uuid] or 0 for u in over)
            (limit_text,), need_text = fmt_gib_below([limit], worst)
            return NodeResult(node, False, (Rejection(
                C_VRAM, f"{limit_text} VRAM per MPS replica (the GPU's / {replicas}) < {_need_text(job, need_text)}"),))
        return NodeResult(node, True, chosen=(with_room[0],))
    # Time-slicing: no memory isolation. The plugin hands out a replica of a GPU with the fewest in
    # use (ties in an order we cannot know); while a holder's GPU is unknown, so are the counts,
    # and any GPU with a free replica may be the one (policy sharing.replicaChoice: any, always).
    candidates = with_room
    if not alloc.shared_unplaced and not any_replica:
        fewest = min(len(held[u.uuid]) for u in with_room)
        candidates = [u for u in with_room if len(held[u.uuid]) == fewest]
    left = {u.uuid: u.memory_bytes - used_vram_bytes(u.memory_bytes, (*held[u.uuid], *alloc.shared_unplaced))
            for u in candidates}
    short = [u for u in candidates if left[u.uuid] < (need[u.uuid] if need[u.uuid] is not None else u.memory_bytes)]
    if short:
        unplaced = len(alloc.shared_unplaced)
        if need[short[0].uuid] is not None:
            worst = max(need[u.uuid] or 0 for u in short)
            lefts, need_text = fmt_gib_below([max(0, left[u.uuid]) for u in short], worst)
            wanted = _need_text(job, need_text)
        else:
            lefts, wanted = [fmt_gib(max(0, left[u.uuid])) for u in short], "the whole GPU needed (VRAM need unknown)"
        parts = "; ".join(f"GPU {u.gpu_index}: {shown} of {fmt_gib(u.memory_bytes)} VRAM left "
                          f"({len(held[u.uuid]) + unplaced} pods share it)" for u, shown in zip(short, lefts))
        unplaced_note = f"; {unplaced} pods on a GPU the agent has not reported yet count on each" if unplaced else ""
        return NodeResult(node, False, (Rejection(
            C_VRAM, f"{parts} < {wanted} ({how}: the device plugin gives a replica of "
                    f"{'a GPU with the fewest in use' if candidates is not with_room else 'any GPU with one free'}"
                    f"{unplaced_note})", resolvable=True),))
    return NodeResult(node, True, chosen=(max(candidates, key=lambda u: (left[u.uuid], -u.gpu_index)),))


def _need_text(job: Job, amount: str) -> str:
    """The pod's VRAM need in a reason, with where it comes from."""
    if job.req.gpu_fraction_milli is not None:
        return f"{amount} needed (gpuplace.io/gpu-fraction {job.req.gpu_fraction_milli / 1000:g} of the GPU)"
    return job.vram.describe(amount) if job.vram is not None else f"{amount} needed"


def _structure_verdict(view: NodeView, job: Job, memo: UnitVerdicts | None
                       ) -> tuple[tuple[Rejection, ...], tuple[int, ...]]:
    """What ``filter_node`` decides from the node's devices alone, whatever is allocated: the
    rejections (none: the node can run the pod once enough of its eligible units are free) and
    the positions, in ``view.units(resource)``, of the units eligible for the pod. ``memo``: the
    job's ``UnitVerdicts``, where each unit's failed criteria are kept under the memo's
    ``unit_keys`` (a pod's first request meets the same few GPU models on many node structures)."""
    res = _resource_rejection(view, job)
    if res is not None:
        return (res,), ()
    req = job.req
    resource = req.resource or ""
    n = req.gpu_count
    units = view.units(resource)
    word = _device_word(resource)
    rejections: list[Rejection] = []

    failed_by: dict[tuple[str, str], list[Unit]] = {}
    eligible_at: list[int] = []
    props = memo.unit_keys(view, resource) if memo is not None else ()
    for i, u in enumerate(units):
        failures = _unit_failures(u, job) if memo is None else _remembered_unit_failures(u, job, props[i], memo)
        for criterion_msg in failures:
            failed_by.setdefault(criterion_msg, []).append(u)
        if not failures:
            eligible_at.append(i)
    for (criterion, msg), us in failed_by.items():
        rejections.append(Rejection(criterion, f"{label_units(us)}: {msg}"))

    if len(units) < n:
        rejections.append(Rejection(C_COUNT, f"has {len(units)} {resource}, {n} requested"))
    elif 0 < len(eligible_at) < n:
        rejections.append(Rejection(C_COUNT, f"{len(eligible_at)} of {len(units)} {word} can run this pod, {n} requested"))

    wants_nvlink = "nvlink" in req.require and n > 1
    eligible = [units[i] for i in eligible_at]
    if wants_nvlink and len(units) >= n and find_nvlink_group(units, n) is None:
        linked = [u for u in units if u.nvlink_peers]
        detail = f"{label_units(units)} have no NVLink" if not linked else f"no {n} {word} all joined by NVLink"
        rejections.append(Rejection(C_NVLINK, f"{detail}; {n} GPUs joined by NVLink needed ({A_REQUIRE}: nvlink)"))
    elif wants_nvlink and len(eligible) >= n and find_nvlink_group(eligible, n) is None:
        rejections.append(Rejection(C_NVLINK, f"no {n} eligible {word} all joined by NVLink ({A_REQUIRE}: nvlink)"))
    # In choose_units' order, so that the per-allocation part need not sort.
    eligible_at.sort(key=lambda i: _choice_order(units[i]))
    return tuple(rejections), tuple(eligible_at)


def _unit_failures(u: Unit, job: Job) -> tuple[tuple[str, str], ...]:
    """(criterion, message) of each per-unit criterion ``u`` fails for ``job``, in check order."""
    return tuple((name, msg) for name, check in criteria.UNIT_CRITERIA if (msg := check(u, job)) is not None)


def _remembered_unit_failures(u: Unit, job: Job, props: Hashable, memo: UnitVerdicts) -> tuple[tuple[str, str], ...]:
    """``_unit_failures``, kept in the job's ``memo`` under the unit's properties."""
    try:
        key = ("unit", props)
        hit = memo.get(key)
    except TypeError:  # an unhashable property: decided directly
        return _unit_failures(u, job)
    if hit is None:
        hit = memo[key] = _unit_failures(u, job)
    return hit


def _choice_order(u: Unit) -> tuple[int, float, int, str]:
    """Best fit first: least VRAM, cheapest, then by GPU index and UUID (a stable order)."""
    return (u.memory_bytes, u.cost_fraction, u.gpu_index, u.uuid)


def choose_units(free: Sequence[Unit], n: int, *, nvlink_required: bool = False,
                 nvlink_preferred: bool = False, presorted: bool = False) -> tuple[Unit, ...] | None:
    """Which free units the pod would most sensibly get: best fit (least VRAM, cheapest first).

    With NVLink required or preferred an NVLink-joined group is taken when one exists. Returns
    None when there are fewer than ``n`` units, or NVLink is required and no group exists.
    ``presorted``: ``free`` is in best-fit order already (``_choice_order``).
    """
    if nvlink_required or nvlink_preferred:
        group = find_nvlink_group(free, n)
        if group is not None:
            return group
        if nvlink_required:
            return None
    ordered = free if presorted else sorted(free, key=_choice_order)
    if len(ordered) < n:
        return None
    return tuple(ordered[:n])
