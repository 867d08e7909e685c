"""The extender's view of the cluster: node inventories and the GPUs pods hold, per node.

Fed by watch events (``watch.py``) in cluster mode; pure state, no I/O, thread-safe. Each node's
``NodeState`` is rebuilt only when that node's inventory annotation or its pods change, so a
request reads precomputed states instead of parsing inventories.

Allocation rules:
- a pod holds GPUs on a node when ``spec.nodeName`` is set and its phase is neither Succeeded nor
  Failed (a pod being deleted still holds its GPUs until it is gone);
- units whose ``allocatedTo`` names such a pod are held by it; the agent's ``allocatedTo`` for a
  pod the API server no longer has is ignored (the agent may not have caught up yet);
- GPU requests of pods no ``allocatedTo`` names are counted per resource as ``anonymous``: they
  lower the free count without pinning a device.
- free CPU / memory (``NodeState.cpu_milli_free`` / ``memory_bytes_free``, read by the
  fragmentation score): the Node's ``status.allocatable`` minus the requests of every pod bound
  to it, GPU or not (a pod without a request takes none); None when the Node gives no allocatable.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from node_agent.inventory import ANNOTATION, InventoryError, parse_inventory
from scheduler_extender.core.allocatable import allocatable_contradiction, gpu_allocatable, host_allocatable, node_mig_strategy
from scheduler_extender.core.catalog import Catalog
from scheduler_extender.core.gfd import PROVENANCE as GFD_PROVENANCE, gfd_labels, inventory_from_labels
from scheduler_extender.core.devices import NodeAllocation, NodeState, NodeView, build_node_view, resource_usage
from scheduler_extender.core.job import Job
from scheduler_extender.core.node import as_node, node_name
from scheduler_extender.core.pod import Pod, PodShapeError, as_pod
from scheduler_extender.core.requirements import cut
from scheduler_extender.core.pod_requests import NVIDIA_GPU, PodRequests, pod_requests
from scheduler_extender.cluster.reservations import DEFAULT_TTL_SECONDS, Reservations
from scheduler_extender.core.sharing import (SharingLabels, fraction_bytes, node_gpu_sharing, shareable_gpus,
                                             shared_free_milli, sharing_labels)

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
MAX_UID_CHARS = 320
"""Longest uid a reservation is made for (a uid is 36 characters), and the longest pod name kept in one."""
CHANGE_LOG_SIZE = 100_000
"""Node-state changes remembered for ``changes_since``; a reader further behind starts over."""


@dataclass
class _Node:
    name: str
    annotation: str | None
    view: NodeView | None
    error: str | None
    allocatable: Mapping[str, int] | None = None
    host: tuple[int | None, int | None] = (None, None)  # allocatable (CPU millicores, memory bytes)
    mig_strategy: str | None = None  # what the Node shows (node_mig_strategy)
    gfd: tuple[tuple[str, str], ...] = ()  # its GPU feature discovery labels (core.gfd)
    sharing_labels: tuple[Any, Any] = (None, None)  # GFD's sharing-strategy and replicas labels (core.sharing)


@dataclass(frozen=True)
class _Pod:
    key: str
    node: str
    requests: Mapping[str, int]
    pod: Pod | None = None  # what the decision reads of it: its VRAM need, where it shares a GPU (pod_vram)
    reserved_vram: int | None = None  # a reserved pod's need, estimated when it was reserved
    reserved: bool = False
    reserved_fraction: int | None = None  # ... or its gpuplace.io/gpu-fraction, thousandths of the GPU
    priority: int = 0  # spec.priority (core.preemption reads it)
    terminating: bool = False  # a deletionTimestamp is set: it still holds its devices until it is gone
    labels: tuple[tuple[str, str], ...] = ()  # for PodDisruptionBudget selectors (cluster.preemption)


@dataclass(frozen=True)
class _Reserved:
    """What a reserved pod takes on each node it is reserved on (``reserve``): its name (cut),
    device requests, VRAM need per GPU (bytes, None: unknown), CPU and memory. No pod object:
    a reservation stays small whatever a request carried."""

    key: str
    requests: Mapping[str, int]
    vram_bytes: int | None
    cpu_milli: int | None
    memory_bytes: int | None
    gpu_fraction_milli: int | None = None


PodVram = Callable[[Pod, int], "int | None"]
"""(bound pod, memory of the GPU it shares in bytes) -> its VRAM need there in bytes, or None."""


@dataclass
class CacheStats:
    node_events: int = 0
    pod_events: int = 0
    relists: int = 0
    inventory_errors: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def bulk_load() -> Iterator[None]:
    """Build many long-lived objects at once (a full list): collector paused, then the result frozen.

    CPython's cyclic collector runs full collections as the heap grows, each one walking every
    tracked object: building 5,000 node views took 10x longer with it on, and a full collection
    over a large cache stalls requests. What a list builds lives until the next list, so it is
    moved out of the collector's way (``gc.freeze``); objects are still freed by reference
    counting when replaced.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def parse_node_inventory(name: str, annotation: str | None, catalog: Catalog,
                         allocatable: Mapping[str, int] | None = None,
                         mig_strategy: str | None = None,
                         labels: tuple[tuple[str, str], ...] = (),
                         sharing: SharingLabels = (None, None)) -> tuple[NodeView | None, str | None]:
    """(view, None) for a valid annotation, (None, reason) otherwise; never raises. The one reading
    of a Node's GPUs, for Nodes from the cache's watch and Nodes sent in a request alike.

    ``allocatable``: the Node's GPU resources from ``status.allocatable`` (None: unknown, not
    checked); an inventory claiming more than it is rejected (``core.allocatable``).
    ``mig_strategy``: what the Node shows (``node_mig_strategy``), used when the inventory does
    not state one. ``labels``: the Node's GPU feature discovery labels (``core.gfd.gfd_labels``);
    without an annotation they give a view marked with its provenance (the policy decides
    whether it is used). ``sharing``: the Node's ``core.sharing.sharing_labels``; the view's GPUs
    are shared as they and ``allocatable`` say (``node_gpu_sharing``).
    """
    if annotation is None:
        derived = inventory_from_labels(name, labels) if labels else None
        if derived is None:
            return None, None
        view = build_node_view(derived, catalog, name, provenance=GFD_PROVENANCE)
        return checked_view(view, allocatable, sharing, "GPU feature discovery labels")
    try:
        inv = parse_inventory(annotation, source=ANNOTATION)
    except InventoryError as e:
        return None, str(e)
    if inv.node_name != name:
        return None, f"{ANNOTATION}: nodeName {inv.node_name!r} is not this node ({name!r})"
    return checked_view(build_node_view(inv, catalog, name, mig_strategy), allocatable, sharing, ANNOTATION)


def checked_view(view: NodeView, allocatable: Mapping[str, int] | None, sharing: SharingLabels,
                 source: str = ANNOTATION) -> tuple[NodeView | None, str | None]:
    """``view`` with its GPUs shared as the Node says (``node_gpu_sharing``), checked against
    ``allocatable`` (GPUs x replicas on a shared node): (view, None), or (None, reason starting
    with ``source``) when the view claims more than the Node offers."""
    shared = node_gpu_sharing(sharing, allocatable, *shareable_gpus(view))
    if shared != view.sharing:
        view = dataclasses.replace(view, sharing=shared)
    contradiction = allocatable_contradiction(view, allocatable)
    return (None, f"{source}: {contradiction}") if contradiction else (view, None)


class ClusterCache:
    """Nodes and GPU pods, indexed by node. Methods take decoded API objects (dicts)."""

    def __init__(self, catalog: Catalog, pod_vram: PodVram | None = None,
                 reservation_seconds: float = DEFAULT_TTL_SECONDS) -> None:
        """``pod_vram``: a bound pod's VRAM need in bytes on a GPU of the given memory (None:
        unknown), for nodes whose GPUs are shared (``core.sharing``); without it every pod sharing
        a GPU counts as the whole GPU.
        ``reservation_seconds``: how long a reservation waits for its binding (``reservations``)."""
        self._catalog = catalog
        self._pod_vram = pod_vram
        # Pods the extender sent to nodes and the watch does not show bound yet (cluster.reservations).
        self._reservations: Reservations[_Reserved] = Reservations(reservation_seconds)
        self._lock = threading.RLock()
        self._nodes: dict[str, _Node] = {}
        self._pods: dict[str, _Pod] = {}  # uid -> pod holding GPUs on a node
        self._pods_by_node: dict[str, set[str]] = {}
        self._host_pods: dict[str, tuple[str, int | None, int | None]] = {}  # uid -> (node, CPU, memory) requested
        self._host_by_node: dict[str, set[str]] = {}
        self._states: dict[str, NodeState] = {}
        # uid -> (node, what it takes): pods preemption made room for (nominate)
        self._nominations: dict[str, tuple[str, _Reserved, float]] = {}  # uid -> (node, entry, held until)
        self._nominated_on: dict[str, set[str]] = {}
        self._namespaces: dict[str, Mapping[str, str]] = {}  # name -> labels
        self.nodes_synced = False
        self.pods_synced = False
        self.namespaces_synced: bool | None = None  # None: namespaces are not watched
        self.stats = CacheStats()
        # Change log for readers that keep per-node results between requests (changes_since).
        self.generation = 0
        self._changes: collections.deque[tuple[int, str]] = collections.deque(maxlen=CHANGE_LOG_SIZE)
        self._reset_at = 0

    # ---- change log --------------------------------------------------------------------------
    def _invalidate(self, name: str) -> None:
        self._states.pop(name, None)
        self.generation += 1
        self._changes.append((self.generation, name))

    def _reset_changes(self) -> None:
        self.generation += 1
        self._reset_at = self.generation

    def changes_since(self, generation: int) -> tuple[int, set[str]] | None:
        """(current generation, names of nodes whose state changed after ``generation``).

        None when that is no longer known (a full pod list replaced every state, or more than
        ``CHANGE_LOG_SIZE`` changes ago): the reader must start over.
        """
        with self._lock:
            latest = self._latest_changes(generation)
            return None if latest is None else (self.generation, set(latest))

    def latest_changes_since(self, generation: int) -> dict[str, int] | None:
        """``changes_since`` with, per node, the generation of its latest change (a reader that
        decided several things at different generations tells which changes each one missed)."""
        with self._lock:
            return self._latest_changes(generation)

    def _latest_changes(self, generation: int) -> dict[str, int] | None:
        if generation == self.generation:
            return {}
        if generation < self._reset_at or not self._changes or self._changes[0][0] > generation + 1:
            return None
        latest: dict[str, int] = {}
        for g, name in reversed(self._changes):
            if g <= generation:
                break
            latest.setdefault(name, g)
        return latest

    # ---- readiness ---------------------------------------------------------------------------
    @property
    def synced(self) -> bool:
        return self.nodes_synced and self.pods_synced and self.namespaces_synced is not False

    # ---- nodes -------------------------------------------------------------------------------
    def _set_node(self, obj: Mapping[str, Any]) -> None:
        node = as_node(obj)
        name = node.name
        if not name:
            return
        annotation = node.annotations.get(ANNOTATION)
        allocatable = gpu_allocatable(node)
        host = host_allocatable(node)
        mig_strategy = node_mig_strategy(node, allocatable)
        gfd = gfd_labels(node) if annotation is None else ()
        shared_by = sharing_labels(node)
        current = self._nodes.get(name)
        if current is not None and current.host != host:
            current.host = host
            self._invalidate(name)  # free CPU/memory moved: readers that keep states must see it
        same_inventory = (current is not None and current.annotation == annotation
                          and current.mig_strategy == mig_strategy and current.gfd == gfd
                          and current.sharing_labels == shared_by)
        if same_inventory and current is not None and current.allocatable == allocatable:
            return  # unchanged inventory, MIG strategy and GPU allocatable: keep the parsed view
        if same_inventory and current is not None and current.view is not None:
            # Only allocatable changed: re-check the parsed view instead of parsing again.
            view, error = checked_view(current.view, allocatable, shared_by,
                                       ANNOTATION if annotation is not None else "GPU feature discovery labels")
        else:
            view, error = parse_node_inventory(name, annotation, self._catalog, allocatable, mig_strategy, gfd, shared_by)
        self._nodes[name] = _Node(name, annotation, view, error, allocatable, host, mig_strategy, gfd, shared_by)
        if error:
            self.stats.inventory_errors[name] = error
        else:
            self.stats.inventory_errors.pop(name, None)
        self._invalidate(name)

    def apply_node_event(self, event_type: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self.stats.node_events += 1
            if event_type == "DELETED":
                name = node_name(obj)
                self._nodes.pop(name, None)
                self._invalidate(name)
                self.stats.inventory_errors.pop(name, None)
            else:
                self._set_node(obj)

    def replace_nodes(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list: nodes not in it are gone."""
        with self._lock, bulk_load():
            seen = set()
            for obj in objs:
                self._set_node(obj)
                seen.add(node_name(obj))
            for name in list(self._nodes):
                if name not in seen:
                    self._nodes.pop(name)
                    self._invalidate(name)
                    self.stats.inventory_errors.pop(name, None)
            self.nodes_synced = True

    # ---- pods --------------------------------------------------------------------------------
    def _remove_pod(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is not None:
            self._pods_by_node.get(old.node, set()).discard(uid)
            self._invalidate(old.node)

    def _remove_host_pod(self, uid: str) -> None:
        old = self._host_pods.pop(uid, None)
        if old is not None:
            self._host_by_node.get(old[0], set()).discard(uid)
            self._invalidate(old[0])  # its free CPU/memory moved

    def _set_host_pod(self, uid: str, node: str | None, live: bool, asked: PodRequests) -> None:
        """Track the CPU/memory requests of every pod bound to a node (GPU or not)."""
        if not node or not live:
            self._remove_host_pod(uid)
            return
        entry = (node, asked.cpu_milli, asked.memory_bytes)
        if self._host_pods.get(uid) == entry:
            return
        self._remove_host_pod(uid)
        self._host_pods[uid] = entry
        self._host_by_node.setdefault(node, set()).add(uid)
        self._invalidate(node)  # its free CPU/memory moved: the score and the tie break read them

    def _set_pod(self, obj: Mapping[str, Any]) -> None:
        try:
            pod = as_pod(obj)
        except PodShapeError as e:  # not from an API server; nothing to count
            log.warning("pod event ignored: %s", e)
            return
        uid, node, phase = pod.key, pod.spec.node_name, pod.status.phase
        asked = pod_requests(pod)
        if node and phase not in TERMINAL_PHASES:
            self._invalidate_all(self._reservations.bound(uid, node))
        elif phase in TERMINAL_PHASES:
            self._invalidate_all(self._reservations.released(uid))
        self._set_host_pod(uid, node, phase not in TERMINAL_PHASES, asked)
        requests = dict(asked.gpu)
        if not node or phase in TERMINAL_PHASES or not requests:
            self._remove_pod(uid)
            return
        entry = _Pod(f"{pod.namespace}/{pod.name}", node, requests, pod if NVIDIA_GPU in requests else None,
                     priority=pod.priority, terminating=pod.metadata.deletion_timestamp is not None,
                     labels=tuple(sorted((pod.metadata.labels or {}).items())))
        if self._pods.get(uid) == entry:
            return
        self._remove_pod(uid)
        self._pods[uid] = entry
        self._pods_by_node.setdefault(node, set()).add(uid)
        self._invalidate(node)

    def apply_pod_event(self, event_type: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self.stats.pod_events += 1
            if event_type == "DELETED":
                try:
                    uid = as_pod(obj).key
                except PodShapeError:
                    return  # never tracked (_set_pod ignores such objects)
                self._remove_pod(uid)
                self._remove_host_pod(uid)
                self._invalidate_all(self._reservations.released(uid))
            else:
                self._set_pod(obj)

    # ---- reservations (cluster.reservations) ---------------------------------------------------
    def _invalidate_all(self, names: Iterable[str]) -> None:
        for name in names:
            self._invalidate(name)

    def reserve(self, pod: Pod, nodes: Iterable[str], job: Job, now: float | None = None) -> bool:
        """Hold ``pod`` on ``nodes`` as if bound there until the watch shows its binding, it goes
        away, or the reservation expires; every node state read after this counts it. What it
        takes is read from ``job``, the pod as the answer decided it: devices, CPU and memory
        (``core.pod_requests``), the VRAM need per GPU (None: unknown, counted as the whole GPU
        where GPUs are shared) or its ``gpuplace.io/gpu-fraction``. False (nothing held) for a pod
        without uid, one already bound, one whose job has errors, or one that asks for nothing."""
        uid = pod.uid
        if uid is None or len(uid) > MAX_UID_CHARS or job.errors:
            return False
        req = job.req
        if not req.wants_gpu and not job.cpu_milli and not job.memory_bytes:
            return False
        entry = _reserved_entry(f"{pod.namespace}/{pod.name}", job)
        with self._lock:
            if uid in self._pods or uid in self._host_pods:
                return False  # the watch shows it bound already: it counts as such
            # Only the cluster's nodes: a request may name any (Node objects sent whole).
            known = tuple(n for n in nodes if n in self._nodes)
            if not known:
                return False
            self._invalidate_all(self._reservations.reserve(uid, known, entry, _monotonic(now)))
            return True

    def retried(self, uid: str | None) -> None:
        """kube-scheduler asks about pod ``uid`` again (a new attempt): end its last reservation
        before the pod is decided, so that it does not count against itself."""
        if uid:
            with self._lock:
                self._invalidate_all(self._reservations.retried(uid))

    def pod_gone(self, uid: str, now: float | None = None) -> None:
        """Pod ``uid`` left the pending-pods watch (deleted, or bound: that watch cannot tell):
        its reservation ends shortly unless the binding shows (``Reservations.left_pending``)."""
        with self._lock:
            self._reservations.left_pending(uid, _monotonic(now))
            if uid in self._nominations:  # bound or deleted: the room it was nominated to is its own or free
                self.nominate(uid, None)

    def expire_reservations(self, now: float | None = None) -> None:
        """End the reservations and nominations whose time is up (called before each decision and
        by the requeue loop)."""
        at = _monotonic(now)
        with self._lock:
            self._invalidate_all(self._reservations.expire(at))
            for uid in [u for u, (_, _, until) in self._nominations.items() if until <= at]:
                self.nominate(uid, None)

    def reservation_counts(self) -> tuple[int, int, dict[str, int]]:
        """(held now, made in all, ended by outcome) for metrics."""
        with self._lock:
            r = self._reservations
            return len(r), r.made, dict(r.outcomes)

    def replace_pods(self, objs: Iterable[Mapping[str, Any]]) -> None:
        with self._lock, bulk_load():
            self._pods.clear()
            self._pods_by_node.clear()
            self._host_pods.clear()
            self._host_by_node.clear()
            self._states.clear()
            self._reset_changes()
            for obj in objs:
                self._set_pod(obj)
            self.pods_synced = True

    # ---- namespaces (labels, for policy tenants that select namespaces by label) --------------
    @staticmethod
    def _namespace_entry(obj: Mapping[str, Any]) -> tuple[str | None, dict[str, str]]:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        return meta.get("name"), {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}

    def apply_namespace_event(self, event_type: str, obj: Mapping[str, Any]) -> None:
        name, labels = self._namespace_entry(obj)
        if not name:
            return
        with self._lock:
            if event_type == "DELETED":
                self._namespaces.pop(name, None)
            else:
                self._namespaces[name] = labels

    def replace_namespaces(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list: namespaces not in it are gone."""
        entries = dict(self._namespace_entry(o) for o in objs)
        entries.pop(None, None)
        with self._lock:
            self._namespaces = entries  # type: ignore[assignment]
            self.namespaces_synced = True

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        """Labels of namespace ``name``; None when unknown (not watched, or not seen yet)."""
        with self._lock:
            return self._namespaces.get(name)

    def inventory_error_count(self) -> int:
        """Nodes whose inventory is rejected (invalid, for another node, or contradicted by allocatable)."""
        with self._lock:
            return len(self.stats.inventory_errors)

    # ---- reads -------------------------------------------------------------------------------
    def _held_for(self, name: str) -> dict[str, _Reserved]:
        """Pods held on node ``name`` that the watch does not show bound: its reservations, and
        the pods nominated there (``nominate``) that hold no reservation (one counts once)."""
        held = dict(self._reservations.on_node(name))
        for uid in self._nominated_on.get(name, ()):
            if uid not in held and uid not in self._pods and uid not in self._host_pods:
                held[uid] = self._nominations[uid][1]
        return held

    def _allocation(self, node: _Node, without: frozenset[str] = frozenset(),
                    added: Mapping[str, _Reserved] | None = None) -> NodeAllocation:
        pods = [self._pods[uid] for uid in self._pods_by_node.get(node.name, ()) if uid not in without]
        pods += [_Pod(f"reserved:{uid}", node.name, r.requests, None, r.vram_bytes, True, r.gpu_fraction_milli)
                 for uid, r in (added or {}).items() if r.requests]
        # Reserved pods count as bound here; on a shared node the agent has placed none of them
        # on a GPU, so each counts on every GPU (_shared_allocation's unplaced).
        # Keyed by uid, apart from pod names: a pod recreated under a bound pod's name (a
        # StatefulSet's web-0) is another pod, and no allocatedTo names a reserved one yet.
        pods += [_Pod(f"reserved:{uid}", node.name, r.requests, None, r.vram_bytes, True, r.gpu_fraction_milli)
                 for uid, r in self._held_for(node.name).items() if r.requests and uid not in without]
        if not pods:
            return NodeAllocation()
        if node.view is not None and node.view.sharing is not None:
            return _shared_allocation(node.view, pods, self._pod_vram)
        live = {p.key for p in pods}
        held: dict[str, str] = {}
        named: set[str] = set()
        if node.view is not None:
            for u in node.view.all_units:
                if u.allocated_to and u.allocated_to in live:
                    held[u.uuid] = u.allocated_to
                    named.add(u.allocated_to)
        anonymous = _sum_requests(p.requests for p in pods if p.key not in named)
        return NodeAllocation(held=held, anonymous=anonymous)

    def _host_free(self, node: _Node, without: frozenset[str] = frozenset(),
                   added: Mapping[str, _Reserved] | None = None) -> tuple[int | None, int | None]:
        """Allocatable CPU/memory minus the bound pods' requests; None where either is unknown."""
        pods = [self._host_pods[uid] for uid in self._host_by_node.get(node.name, ()) if uid not in without]
        pods += [(node.name, r.cpu_milli, r.memory_bytes) for r in (added or {}).values()]
        pods += [(node.name, r.cpu_milli, r.memory_bytes) for uid, r in self._held_for(node.name).items()
                 if uid not in without]
        out: list[int | None] = []
        for k, cap in enumerate(node.host):
            used = [p[k + 1] for p in pods]
            # A pod that requests no CPU/memory takes none (kube-scheduler counts 0 for it).
            out.append(None if cap is None else cap - sum(u or 0 for u in used))
        return out[0], out[1]

    def _build_state(self, node: _Node, without: frozenset[str] = frozenset(),
                     added: Mapping[str, _Reserved] | None = None) -> NodeState:
        """``node``'s state from its pods, reservations and nominations, the pods of ``without``
        (uids) gone and ``added`` held there as reservations are. Call with the lock held."""
        cpu, mem = self._host_free(node, without, added)
        return NodeState(name=node.name, view=node.view, allocation=self._allocation(node, without, added),
                         inventory_error=node.error, cpu_milli_free=cpu, memory_bytes_free=mem,
                         cpu_milli_allocatable=node.host[0], memory_bytes_allocatable=node.host[1])

    def state(self, name: str) -> NodeState | None:
        """The node's current state, or None if the node is unknown."""
        with self._lock:
            cached = self._states.get(name)
            if cached is not None:
                return cached
            node = self._nodes.get(name)
            if node is None:
                return None
            st = self._states[name] = self._build_state(node)
            return st

    def state_without(self, name: str, uids: frozenset[str]) -> NodeState | None:
        """The node's state with the pods (bound, reserved or nominated) of ``uids`` gone: their
        devices, shares, CPU and memory free (``core.preemption``'s ``state_without``); the
        current state for no uid; None if the node is unknown. Not kept."""
        return self.state_with(name, uids, ())

    def state_with(self, name: str, without: frozenset[str], added: Iterable[tuple[str, Job]]) -> NodeState | None:
        """The node's state with the pods of ``without`` (uids) gone and ``added`` ((uid, job):
        a replacement, a pending pod given room) held there as reservations are
        (``core.defrag``'s ``Snapshot``); the current state for neither; None if the node is
        unknown. Not kept."""
        extra = {uid: _reserved_entry(uid, job) for uid, job in added}
        if not extra and not without:
            return self.state(name)
        with self._lock:
            node = self._nodes.get(name)
            return None if node is None else self._build_state(node, without, extra)

    def bound_pods(self, name: str) -> list[BoundPod]:
        """The pods bound to node ``name`` that hold devices there (``_Pod``), by uid order."""
        with self._lock:
            return [BoundPod(uid, p.key, p.priority, p.terminating, dict(p.labels))
                    for uid in sorted(self._pods_by_node.get(name, ())) for p in (self._pods[uid],)]

    # ---- nominations (the room preemption makes for a pod, cluster.preemption) -----------------
    def nominate(self, uid: str, node: str | None, pod: Pod | None = None, job: Job | None = None,
                 now: float | None = None) -> None:
        """Hold pod ``uid`` on ``node`` for as long as it is neither bound nor reserved, whatever
        kube-scheduler asks meanwhile (a reservation ends when the pod is asked about again; a
        nomination does not: victims take seconds to go, and the room must not go to another pod
        meanwhile); ``node`` None ends it. What it takes is read from ``job`` as for ``reserve``.
        Every replica nominates from the pod's ``extender.gpuplace.io/nominated-node``
        annotation, which the preempting replica writes. A nomination ends by itself
        ``NOMINATION_HOLD_SECONDS`` after this call (the controller withdraws its own after
        ``cluster.preemption.NOMINATION_SECONDS``; an annotation anyone else wrote holds no longer:
        the pod's author could bind it to a node outright with ``spec.nodeName``, so honouring the
        annotation grants nothing more for that time)."""
        with self._lock:
            old = self._nominations.pop(uid, None)
            if old is not None:
                self._nominated_on.get(old[0], set()).discard(uid)
                self._invalidate(old[0])
            if node is None or pod is None or job is None or job.errors or len(uid) > MAX_UID_CHARS:
                return
            entry = _reserved_entry(f"{pod.namespace}/{pod.name}", job)
            if len(self._nominations) >= MAX_NOMINATIONS:
                return
            self._nominations[uid] = (node, entry, _monotonic(now) + NOMINATION_HOLD_SECONDS)
            self._nominated_on.setdefault(node, set()).add(uid)
            self._invalidate(node)

    def nomination(self, uid: str | None) -> str | None:
        """The node pod ``uid`` is nominated on, if any."""
        with self._lock:
            held = self._nominations.get(uid) if uid else None
            return held[0] if held is not None else None

    def node_names(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def has_node(self, name: str) -> bool:
        """Whether Node ``name`` is in the cache (listed or watched, not deleted since)."""
        return name in self._nodes

    def pods_on(self, name: str) -> list[str]:
        with self._lock:
            return sorted(self._pods[uid].key for uid in self._pods_by_node.get(name, ()))

    def snapshot(self) -> dict[str, Any]:
        """The whole view, for ``GET /debug/allocations``: what the extender believes, per node.

        Shape: ``{"synced": bool, "nodes": {node: {"inventory": "ok" | "missing" | <error>,
        "resources": {resource: {"allocatable", "held", "free"}}, "pods": {"ns/name":
        {resource: units}}, "heldUnits": {unit UUID: "ns/name"}, "reserved": {"ns/name":
        {resource: units}}}}}``; ``held`` and ``free`` count the reserved pods (``reserve``). Pods bound to a node the
        cache does not know (deleted, or not listed yet) are reported under that node name with
        ``"inventory": "node unknown"``, so an operator sees them instead of losing them.
        """
        with self._lock:
            out: dict[str, Any] = {}
            for name in sorted(set(self._nodes) | {p.node for p in self._pods.values()}):
                node = self._nodes.get(name)
                pods = {self._pods[uid].key: dict(self._pods[uid].requests)
                        for uid in sorted(self._pods_by_node.get(name, ()))}
                if node is None:
                    alloc = NodeAllocation(anonymous=_sum_requests(pods.values()))
                    inventory, view = "node unknown", None
                else:
                    alloc = self.state(name).allocation  # type: ignore[union-attr]
                    view = node.view
                    inventory = "ok" if view is not None else (node.error or "missing")
                reserved = {r.key: dict(r.requests) for r in self._reservations.on_node(name).values()}
                out[name] = {"inventory": inventory, "resources": resource_usage(view, alloc),
                             "pods": pods, "heldUnits": dict(alloc.held), "reserved": reserved}
            return {"synced": self.synced, "nodes": out}


def _reserved_entry(key: str, job: Job) -> _Reserved:
    """What a pod held on a node without being bound there takes (a reservation, a nomination, a
    planned replacement), read from its ``job``: its devices (the resource is one the filter
    accepted, a MIG name of its form: no made-up name is held), VRAM need per GPU or
    gpu-fraction, CPU and memory."""
    req = job.req
    devices = {req.resource: req.gpu_count} if req.wants_gpu and req.resource else {}
    return _Reserved(cut(key, MAX_UID_CHARS), devices, job.vram.bytes_per_gpu if job.vram is not None else None,
                     job.cpu_milli, job.memory_bytes, req.gpu_fraction_milli)


NOMINATION_HOLD_SECONDS = 150.0
"""How long a nomination holds its node (``nominate``): longer than the preemption controller
waits before it withdraws one (120 s), so that its own are withdrawn first."""

MAX_NOMINATIONS = 20_000
"""Nominated pods held at once (``nominate``): as for reservations, a bound on what a cluster's
annotations can make the cache hold."""


@dataclass(frozen=True)
class BoundPod:
    """A pod bound to a node and holding devices there, as preemption reads it (``bound_pods``)."""

    uid: str
    key: str  # namespace/name
    priority: int
    terminating: bool
    labels: Mapping[str, str] = field(default_factory=dict)


MAX_REPLICAS_PER_POD = 64
"""Replicas of one pod counted on a shared node (a pod bound by another scheduler may hold several)."""


def _shared_allocation(view: NodeView, pods: list[_Pod], pod_vram: PodVram | None) -> NodeAllocation:
    """On a node whose GPUs are shared: per GPU the VRAM needs of the pods the agent lists on it
    (``allocatedTo``, comma-separated; a name once per GPU, at most ``replicas`` of them), each
    pod's other replicas as unplaced, every other resource's pods as anonymous, as on any node,
    and per GPU the share its holders leave (``core.sharing.shared_free_milli``: what the score's
    fragmentation, scarcity and packing read, as in ``gpuplace simulate``). A need is estimated when the node's state is built (``pod_vram``, the policy in force
    then, on a GPU of that memory: a ``gpuplace.io/gpu-fraction`` is of the GPU's memory; a pod
    on no GPU the agent has reported is counted on the largest; None without it: unknown, counted
    as the whole GPU)."""
    replicas = view.sharing.replicas if view.sharing is not None else 1
    by_key = {p.key: p for p in pods if NVIDIA_GPU in p.requests}
    needs: dict[tuple[str, int], int | None] = {}

    def need(p: _Pod, memory_bytes: int) -> int | None:
        if p.reserved:
            if p.reserved_fraction is not None:
                return fraction_bytes(memory_bytes, p.reserved_fraction)
            return p.reserved_vram
        key = (p.key, memory_bytes)
        if key not in needs:
            needs[key] = pod_vram(p.pod, memory_bytes) if pod_vram is not None and p.pod is not None else None
        return needs[key]

    largest = max((u.memory_bytes for u in view.units(NVIDIA_GPU)), default=0)  # for holders on no known GPU

    shared: dict[str, tuple[int | None, ...]] = {}
    placed: dict[str, int] = {}
    for u in view.units(NVIDIA_GPU):
        if not u.allocated_to:
            continue
        holders = [by_key[k] for k in dict.fromkeys(u.allocated_to.split(",")) if k in by_key][:replicas]
        if holders:
            shared[u.uuid] = tuple(need(p, u.memory_bytes) for p in holders)
            for p in holders:
                placed[p.key] = placed.get(p.key, 0) + 1
    unplaced = tuple(need(p, largest) for k, p in by_key.items()
                     for _ in range(max(0, min(p.requests[NVIDIA_GPU], MAX_REPLICAS_PER_POD) - placed.get(k, 0))))
    anonymous = _sum_requests({r: n for r, n in p.requests.items() if r != NVIDIA_GPU} for p in pods)
    return NodeAllocation(anonymous=anonymous, shared=shared, shared_unplaced=unplaced,
                          partly_free_milli=shared_free_milli(view.units(NVIDIA_GPU), shared, unplaced))


def _monotonic(now: float | None) -> float:
    return time.monotonic() if now is None else now


def _sum_requests(requests: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for req in requests:
        for resource, n in req.items():
            total[resource] = total.get(resource, 0) + n
    return total
