"""A node's schedulable units (full GPUs or MIG devices) and which of them are free.

The unit a pod gets depends on the resource it requests and on how the NVIDIA device plugin
exposes MIG (``migStrategy`` in the inventory; NVIDIA k8s-device-plugin README, "MIG support"):

- ``nvidia.com/gpu``: full NVIDIA GPUs without MIG; with strategy ``single`` also the MIG
  devices (the plugin then advertises each MIG device as one ``nvidia.com/gpu``);
- ``nvidia.com/mig-<profile>`` (strategy ``mixed``): MIG devices of that profile;
- ``amd.com/gpu``: AMD GPUs (ROCm k8s-device-plugin).

A ``NodeView`` is built once per inventory (not per request) and is immutable.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from node_agent.inventory import GPU, NodeGPUInventory
from scheduler_extender.core.catalog import Catalog, CatalogEntry
from scheduler_extender.core.quantity import MIB
from scheduler_extender.core.requirements import AMD_GPU, NVIDIA_GPU, mig_resource_name
from scheduler_extender.core.sharing import MILLI, GpuSharing, shared_free_milli  # noqa: F401 - MILLI: re-exported




@dataclass(frozen=True, slots=True)
class Unit:
    """One device a pod can be given: a full GPU or a MIG device.

    ``memory_bytes`` is the unit's own VRAM; ``cost_fraction`` the share of the parent GPU's
    price it stands for (1 for a full GPU, compute slices / 7 for an A100/H100 MIG device).
    ``ecc_enabled``, ``compute_capability``, ``power_limit_w`` (watts, the inventory's
    ``powerLimitW``) and ``temperature_c`` (degrees Celsius when the agent observed the GPU, the
    inventory's ``temperatureC``) are ``None`` when unknown.

    A field named as a field of the inventory's ``GPU`` (``INVENTORY_FIELDS``) is copied from it,
    a MIG device's from its parent GPU: a new inventory field reaches the criteria by one line
    here. A field is part of the equivalence layer's unit key by itself (``served.equivalence``),
    unless a criterion declares it as changing often (``core.criteria.Reads``).
    """

    uuid: str
    kind: Literal["gpu", "mig"]
    gpu_index: int
    gpu_uuid: str
    vendor: str
    name: str
    entry: CatalogEntry | None
    mig_profile: str | None
    memory_bytes: int
    healthy: bool
    health_reason: str
    ecc_enabled: bool | None
    compute_capability: tuple[int, int] | None
    nvlink_peers: frozenset[str]
    allocated_to: str
    cost_fraction: float
    memory_bandwidth_gbps: float | None
    bf16_tflops: float | None
    power_limit_w: float | None = None  # a MIG device: its parent GPU's (the limit binds all its instances)
    temperature_c: int | None = None  # a MIG device: its parent GPU's

    @property
    def model(self) -> str:
        """Short model name for messages: the driver name without the vendor prefix."""
        for prefix in ("NVIDIA ", "AMD "):
            if self.name.startswith(prefix):
                return self.name[len(prefix):]
        return self.name


def _mig_reason(parent_reason: str, mig: Any) -> str:
    """The parent GPU's reasons, then the MIG device's own (an XID scoped to its GPU instance)."""
    own = "; ".join(mig.health_reasons) if mig.health_reasons else ("" if mig.healthy else "reported unhealthy")
    return "; ".join(r for r in (parent_reason, own) if r)


def _gpu_instance_profile(profile: str) -> str:
    """The GPU instance part of a MIG profile name: ``1c.3g.40gb`` -> ``3g.40gb`` (a compute
    instance holds its GPU instance's memory), ``1g.10gb+me`` -> ``1g.10gb``."""
    m = re.match(r"^(?:\d+c\.)?(\d+g\.\d+gb)", profile)
    return m.group(1) if m else profile


def _mig_cost_fraction(entry: CatalogEntry | None, profile: str, memory_mib: int, parent_mib: int) -> float:
    profile = _gpu_instance_profile(profile)
    if entry is not None and entry.mig_profiles:
        p = entry.mig_profile(profile)
        slices_total = max(mp.compute_slices for mp in entry.mig_profiles)
        if p is not None:
            return p.compute_slices / slices_total
    try:  # "3g.40gb" -> 3 compute slices of 7 (A100/H100 have seven)
        return min(1.0, int(profile.split("g.")[0]) / 7)
    except ValueError:
        return min(1.0, memory_mib / parent_mib)


_BUILT_FIELDS = frozenset({"uuid", "kind", "gpu_index", "gpu_uuid", "vendor", "name", "entry", "mig_profile",
                           "memory_bytes", "healthy", "health_reason", "ecc_enabled", "compute_capability",
                           "nvlink_peers", "allocated_to", "cost_fraction", "memory_bandwidth_gbps", "bf16_tflops"})
"""``Unit`` fields ``_gpu_units`` builds itself (a MIG device's differ from its GPU's, or they are
derived from the catalog)."""

INVENTORY_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Unit)
                                          if f.name not in _BUILT_FIELDS and f.name in GPU.model_fields)
"""``Unit`` fields copied as they are from the inventory's ``GPU`` field of the same name."""


def _gpu_units(gpu: GPU, catalog: Catalog) -> tuple[Unit | None, list[Unit]]:
    entry = catalog.resolve_driver_name(gpu.name)
    cc = gpu.compute_capability_tuple or (entry.compute_capability_tuple if entry else None)
    bandwidth = gpu.memory_bandwidth_gbps if gpu.memory_bandwidth_gbps is not None else (
        entry.memory_bandwidth_gbps if entry else None)
    bf16 = entry.bf16_tflops_dense if entry else None
    reason = "; ".join(gpu.health_reasons) if gpu.health_reasons else ("reported unhealthy" if not gpu.healthy else "")
    copied = {name: getattr(gpu, name) for name in INVENTORY_FIELDS}
    if not gpu.mig_enabled:
        unit = Unit(
            uuid=gpu.uuid, kind="gpu", gpu_index=gpu.index, gpu_uuid=gpu.uuid, vendor=gpu.vendor,
            name=gpu.name, entry=entry, mig_profile=None, memory_bytes=gpu.memory_mib * MIB,
            healthy=gpu.healthy, health_reason=reason, ecc_enabled=gpu.ecc_enabled,
            compute_capability=cc, nvlink_peers=frozenset(p.peer_uuid for p in gpu.nvlinks),
            allocated_to=gpu.allocated_to, cost_fraction=1.0,
            memory_bandwidth_gbps=bandwidth, bf16_tflops=bf16, **copied,
        )
        return unit, []
    migs = []
    for m in gpu.mig_devices:
        frac = _mig_cost_fraction(entry, m.profile, m.memory_mib, gpu.memory_mib)
        migs.append(Unit(
            uuid=m.uuid, kind="mig", gpu_index=gpu.index, gpu_uuid=gpu.uuid, vendor=gpu.vendor,
            name=gpu.name, entry=entry, mig_profile=m.profile, memory_bytes=m.memory_mib * MIB,
            healthy=gpu.healthy and m.healthy, health_reason=_mig_reason(reason, m),
            ecc_enabled=gpu.ecc_enabled,
            compute_capability=cc, nvlink_peers=frozenset(),  # MIG devices have no peer-to-peer
            allocated_to=m.allocated_to, cost_fraction=frac,
            memory_bandwidth_gbps=None if bandwidth is None else bandwidth * frac,
            bf16_tflops=None if bf16 is None else bf16 * frac, **copied,
        ))
    return None, migs


@dataclass(frozen=True)
class NodeView:
    """Immutable, precomputed view of one node's inventory, by resource name."""

    name: str
    observed_at: dt.datetime
    """The inventory's ``observedAt`` (timezone-aware)."""
    units_by_resource: Mapping[str, tuple[Unit, ...]]
    description: str = field(default="")
    observed_ts: float = field(default=0.0)  # observed_at as POSIX seconds: cheap to compare
    provenance: str = field(default="")
    """Empty for an agent's inventory; else where it came from (``core.gfd.PROVENANCE``): every
    reason for the node says so, and it is never stale (labels are current while the Node is)."""
    sharing: GpuSharing | None = field(default=None)
    """How the device plugin shares the node's ``nvidia.com/gpu`` (``core.sharing``); None: whole GPUs."""
    mig_gpus: tuple[tuple[str, str], ...] = field(default=())
    """(UUID, driver name) of each GPU in MIG mode, also those without a MIG device (which no unit
    stands for). The view keeps what decisions and metrics read of the inventory, not the parsed
    inventory itself: that model was two thirds of the cluster cache's memory per node
    (benchmarks/README.md, issue 26)."""

    def units(self, resource: str) -> tuple[Unit, ...]:
        return self.units_by_resource.get(resource, ())

    @property
    def all_units(self) -> list[Unit]:
        seen: dict[str, Unit] = {}
        for units in self.units_by_resource.values():
            for u in units:
                seen[u.uuid] = u
        return list(seen.values())


def build_node_view(inventory: NodeGPUInventory, catalog: Catalog, node_name: str | None = None,
                    node_mig_strategy: str | None = None, provenance: str = "",
                    sharing: GpuSharing | None = None) -> NodeView:
    """Index an inventory's units by the resource that schedules them (see module docstring).

    The MIG strategy is the inventory's when the agent states it, else ``node_mig_strategy``
    (what the Node shows, ``allocatable.node_mig_strategy``), else ``none``. ``sharing``: how the
    Node shows its GPUs shared (``sharing.node_gpu_sharing``)."""
    by_resource: dict[str, list[Unit]] = {}
    strategy = inventory.mig_strategy or node_mig_strategy or "none"
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        full, migs = _gpu_units(gpu, catalog)
        if gpu.vendor == "amd":
            if full is not None:
                by_resource.setdefault(AMD_GPU, []).append(full)
            continue
        if full is not None:
            by_resource.setdefault(NVIDIA_GPU, []).append(full)
        for m in migs:
            if strategy == "single":
                by_resource.setdefault(NVIDIA_GPU, []).append(m)
            elif strategy == "mixed":
                by_resource.setdefault(mig_resource_name(m.mig_profile or ""), []).append(m)
            # strategy none: the plugin does not advertise MIG devices at all
    counts = Counter(g.name for g in inventory.gpus)
    desc = ", ".join(f"{n}x {name}" for name, n in counts.most_common()) or "no GPUs"
    return NodeView(
        name=node_name or inventory.node_name,
        observed_at=inventory.observed_at,
        units_by_resource={k: tuple(v) for k, v in by_resource.items()},
        description=f"{desc}, from GPU feature discovery labels" if provenance else desc,
        observed_ts=inventory.observed_at.timestamp(),
        provenance=provenance,
        sharing=sharing,
        mig_gpus=tuple((g.uuid, g.name) for g in inventory.gpus if g.mig_enabled),
    )


def allocatable_from_view(view: NodeView) -> dict[str, int]:
    """The extended resources a device plugin would advertise for this inventory (healthy units;
    on a node whose GPUs are shared, ``replicas`` per healthy GPU)."""
    out = {r: sum(1 for u in units if u.healthy) for r, units in view.units_by_resource.items()}
    if view.sharing is not None and NVIDIA_GPU in out:
        out[NVIDIA_GPU] *= view.sharing.replicas
    return out


@dataclass(frozen=True)
class NodeAllocation:
    """Which units of a node are taken.

    Attributes:
        held: unit UUID -> ``"namespace/pod"`` for units known to be held.
        anonymous: resource -> number of units held by pods whose exact devices are unknown
            (pods bound to the node that no ``allocatedTo`` names); they reduce the free count.
    """

    held: Mapping[str, str] = field(default_factory=dict)
    anonymous: Mapping[str, int] = field(default_factory=dict)
    shared: Mapping[str, tuple[int | None, ...]] = field(default_factory=dict)
    """On a node whose GPUs are shared (``NodeView.sharing``): GPU UUID -> the VRAM needs (bytes;
    None: unknown) of the pods holding its replicas, as the agent placed them."""
    shared_unplaced: tuple[int | None, ...] = ()
    """... and of the pods bound there that no ``allocatedTo`` names yet: on some GPU, which is unknown."""
    partly_free_milli: Mapping[str, int] = field(default_factory=dict)
    """Unit UUID -> thousandths of the unit still free, for units GPU-sharing pods hold a share of
    (``Job.gpu_milli`` < 1000), whether or not ``held`` lists them; a unit not listed is wholly free
    unless held. Read by the score's fragmentation only (``score.free_models``): which units a pod
    may be given is ``held`` (on a shared node, ``shared``). Filled by ``gpuplace simulate``'s share
    model, and in the cluster from the needs of a shared GPU's holders (``sharing.shared_free_milli``)."""

    def held_count(self) -> int:
        return len(self.held) + sum(self.anonymous.values())

    def shared_replicas_in_use(self) -> int:
        """Replicas of the node's shared GPUs that pods hold, placed or not (``shared``, ``shared_unplaced``)."""
        return sum(len(p) for p in self.shared.values()) + len(self.shared_unplaced)


EMPTY_ALLOCATION = NodeAllocation()


def allocation_from_inventory(view: NodeView) -> NodeAllocation:
    """Allocations as the agent reported them (``allocatedTo``): static mode's source of truth,
    and a Node sent in a request that the cache does not know. On a node whose GPUs are shared
    (``view.sharing``) each pod ``allocatedTo`` names on a GPU (comma-separated, once each, at
    most ``replicas``) holds a replica whose VRAM need is unknown here (no pod object), so it
    counts as the whole GPU (``core.sharing``), as the cache counts a pod it cannot estimate."""
    if view.sharing is None:
        return NodeAllocation(held={u.uuid: u.allocated_to for u in view.all_units if u.allocated_to})
    shared_units = {u.uuid for u in view.units(NVIDIA_GPU)}
    shared: dict[str, tuple[int | None, ...]] = {
        u.uuid: (None,) * len(list(dict.fromkeys(u.allocated_to.split(",")))[:view.sharing.replicas])
        for u in view.units(NVIDIA_GPU) if u.allocated_to}
    held = {u.uuid: u.allocated_to for u in view.all_units if u.allocated_to and u.uuid not in shared_units}
    return NodeAllocation(held=held, shared=shared,
                          partly_free_milli=shared_free_milli(view.units(NVIDIA_GPU), shared, ()))


@dataclass(frozen=True)
class NodeState:
    """What the decision knows of one node: its inventory view (or why it has none) and allocations.

    ``view`` is None when the node has no usable inventory; ``inventory_error`` then says why
    (missing annotation, invalid document). The cache builds these on watch events.
    ``cpu_milli_free`` / ``memory_bytes_free``: the Node's ``status.allocatable`` CPU / memory minus
    the requests of the pods bound to it (what kube-scheduler's NodeResourcesFit sees); None when
    unknown (static mode, no allocatable), never 0 for unknown.
    """

    name: str
    view: NodeView | None
    allocation: NodeAllocation = EMPTY_ALLOCATION
    inventory_error: str | None = None
    cpu_milli_free: int | None = None
    memory_bytes_free: int | None = None
    cpu_milli_allocatable: int | None = None
    memory_bytes_allocatable: int | None = None
    """The Node's allocatable CPU / memory (None: unknown), for ``core.kube_scores`` only: not part
    of any equivalence key, since the filter and gpuplace's score read what is free."""



def free_units(view: NodeView | None, allocation: NodeAllocation, resource: str) -> list[Unit]:
    """The units of ``resource`` a pod could be given now: healthy, not held by a pod the
    allocation names, less as many as the resource's anonymous holdings (pods no ``allocatedTo``
    names hold *some* units; which is unknown, so the last ones count as theirs). The one
    definition of free devices; the filter applies it to the units its criteria left eligible."""
    if view is None:
        return []
    held = allocation.held
    free = [u for u in view.units(resource) if u.healthy and u.uuid not in held]
    return free[:max(0, len(free) - allocation.anonymous.get(resource, 0))]


def resource_usage(view: NodeView | None, allocation: NodeAllocation) -> dict[str, dict[str, int | None]]:
    """Per extended resource: ``allocatable`` (healthy units), ``held`` and ``free`` unit counts.

    On a node whose GPUs are shared, ``nvidia.com/gpu`` is counted in replicas, as the kubelet
    counts it. ``held`` counts units named by ``allocation.held`` plus the resource's anonymous units; it can
    exceed ``allocatable`` only if the cache counts more GPUs than the node has (an over-commit, a
    bug or a lying inventory), in which case ``free`` is 0. With no view (no usable inventory),
    allocatable and free are unknown (None) and only anonymous holdings are reported.
    """
    usage: dict[str, dict[str, int | None]] = {}
    if view is not None:
        for resource, units in view.units_by_resource.items():
            healthy = sum(1 for u in units if u.healthy)
            if view.sharing is not None and resource == NVIDIA_GPU:  # counted in replicas (core.sharing)
                replicas = healthy * view.sharing.replicas
                held = allocation.shared_replicas_in_use()
                usage[resource] = {"allocatable": replicas, "held": held, "free": max(0, replicas - held)}
                continue
            held = sum(1 for u in units if u.uuid in allocation.held) + allocation.anonymous.get(resource, 0)
            usage[resource] = {"allocatable": healthy, "held": held, "free": len(free_units(view, allocation, resource))}
    for resource, n in allocation.anonymous.items():
        if resource not in usage:
            known = view is not None  # a resource the inventory lacks: none allocatable
            usage[resource] = {"allocatable": 0 if known else None, "held": n, "free": 0 if known else None}
    return usage
