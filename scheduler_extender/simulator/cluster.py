"""The simulated cluster: per-GPU shares in thousandths of a GPU (``milli_free``: node x unit,
FGD's ``MilliGpuLeftList``), the pods on each GPU, CPU/memory, and vectors the policies read.

Share model (every policy places under it): a unit (a full GPU, or a MIG device as the device
plugin advertises it) has 1000 milli. A pod of ``gpu_milli`` = 1000 takes ``gpus`` units that are
wholly free; a GPU-sharing pod (``gpus`` = 1, ``gpu_milli`` < 1000) takes ``gpu_milli`` of one unit
with that much free, and other sharing pods may take the rest of that unit (FGD's simulator:
``Filter`` and ``allocateGpuId`` in ``pkg/simulator/plugin/open_gpu_share.go``, ``NodeResource.Sub``
in ``pkg/type/resource.go``); a CPU-only pod (``gpus`` = 0) takes no unit. ``held`` is the
extender's view of a node (``NodeAllocation.held``: unit UUID -> the pods on it, comma-joined):
a unit with any share taken is held for a whole-GPU pod.

Equivalence classes: nodes with the same inventory view and the same free share on each unit get
the same filter verdict and the same score for any pod (the engine's filter and score read no CPU
or memory), so the engine filters and scores one representative ``NodeState`` per class
(``class_state``) instead of every node. A node moves to another class whenever a pod is placed
on it or leaves it; classes are keyed by (view, free milli per unit). For a pod of ``m`` milli per
GPU the class's state holds the units with less than ``m`` free (``class_state(cid, m)``): for a
whole-GPU pod every unit with a share taken; and it lists what is left of each partly taken unit
(``NodeAllocation.partly_free_milli``), which the score's fragmentation reads. When the policy scores fragmentation, the engine
reads the node's free CPU and memory too (``NodeState.cpu_milli_free``, ``memory_bytes_free``):
they join the key, so partly used nodes then each form their own class.

Time-sliced nodes (``SimNode.sharing``, ``--sharing device-plugin``: ``simulator.device_plugin``)
count replicas as kube-scheduler does and take what the device plugin gives
(``Cluster.granted``), which may over-commit a GPU's share (``milli_free`` below 0); their class
key holds each GPU's holders' shares, and their engine state lists the holders' VRAM needs
(``NodeAllocation.shared``) as the cluster cache does for a gpu-fraction pod.
"""

from __future__ import annotations

import math
import random
from typing import Sequence

import numpy as np

from scheduler_extender.core.catalog import Catalog
from scheduler_extender.core.devices import NodeAllocation, NodeState, NodeView, Unit, build_node_view
from scheduler_extender.core.policy import Policy
from scheduler_extender.core.quantity import MIB
from scheduler_extender.core.requirements import NVIDIA_GPU
from scheduler_extender.core.sharing import fraction_bytes, shared_free_milli
from scheduler_extender.simulator.device_plugin import plugin_choice
from scheduler_extender.simulator.model import SimNode, SimPod

MILLI = 1000
"""Thousandths of a GPU in one unit (FGD's ``gpushareutils.MILLI``)."""


class Cluster:
    """Mutable state of one simulation run. Node ``i`` of every vector is ``nodes[i]``."""

    def __init__(self, nodes: Sequence[SimNode], catalog: Catalog, policy: Policy) -> None:
        if not nodes:
            raise ValueError("the fleet has no GPU nodes")
        self.nodes = list(nodes)
        self.policy = policy
        views: dict[str, NodeView] = {}
        self.views: list[NodeView] = []
        for n in self.nodes:
            key = n.template or f"node:{n.name}"
            if key not in views:
                views[key] = build_node_view(n.inventory, catalog, n.name, sharing=n.sharing)
            self.views.append(views[key])
        # Simulated pods request nvidia.com/gpu: its units (full GPUs; MIG devices under the
        # single strategy, as the device plugin advertises them) are the capacity.
        self.units: list[tuple[Unit, ...]] = [v.units(NVIDIA_GPU) for v in self.views]
        self.gpu_total = np.array([len(u) for u in self.units], dtype=np.int64)
        self.gpu_free = self.gpu_total.copy()
        self.capacity = int(self.gpu_total.sum())
        self.cpu_free = np.array([math.inf if n.cpu_milli is None else n.cpu_milli for n in self.nodes], dtype=float)
        self.mem_free = np.array([math.inf if n.memory_mib is None else n.memory_mib for n in self.nodes], dtype=float)
        self.cpu_cap = self.cpu_free.copy()
        self.mem_cap = self.mem_free.copy()
        # A node's GPU model, as a label/nodeSelector would name it: its first GPU's catalog row.
        self.models: list[str] = []
        model_ix: list[int] = []
        for units in self.units:
            mid = units[0].entry.id if units and units[0].entry else "unknown"
            if mid not in self.models:
                self.models.append(mid)
            model_ix.append(self.models.index(mid))
        self.model_of = np.array(model_ix, dtype=np.int64)
        width = max((len(u) for u in self.units), default=0)
        self.milli_free = np.zeros((len(self.nodes), max(width, 1)), dtype=np.int64)
        for i, u in enumerate(self.units):
            self.milli_free[i, :len(u)] = MILLI  # columns past a node's units stay 0: never free
        self.milli_total = self.gpu_total * MILLI
        # Time-sliced nodes: replicas per GPU, and replicas in use per node (kube-scheduler's count).
        self.replicas = np.array([n.sharing.replicas if n.sharing else 0 for n in self.nodes], dtype=np.int64)
        self.shared = self.replicas > 0
        self.any_shared = bool(self.shared.any())
        self.replicas_total = self.replicas * self.gpu_total
        self.replicas_used = np.zeros(len(self.nodes), dtype=np.int64)
        self.capacity_milli = self.capacity * MILLI
        self.on_unit: list[list[dict[str, int]]] = [[{} for _ in u] for u in self.units]  # pod -> milli
        self.held: list[dict[str, str]] = [{} for _ in self.nodes]
        self.version = np.zeros(len(self.nodes), dtype=np.int64)  # bumped on every change of a node
        self.host_in_state = policy.scoring.fragmentation > 0
        self.allocated = 0  # units with any share taken (whole-GPU occupancy)
        self.allocated_milli = 0  # milli taken (FGD's used GPU milli)
        self.cost_per_hour = 0.0
        self._class_ids: dict[tuple, int] = {}
        self._class_keys: list[tuple] = []
        self._class_states: dict[tuple[int, int], NodeState] = {}
        self._engine_states: dict[tuple, NodeState] = {}
        self._class_count: list[int] = []
        self.class_of = np.zeros(len(self.nodes), dtype=np.int64)
        for i in range(len(self.nodes)):
            self.class_of[i] = self._class(i)
            self._class_count[self.class_of[i]] += 1
        self._model_masks: dict[frozenset[str] | None, np.ndarray] = {}

    # ---- classes ---------------------------------------------------------------------------------

    def _host_free(self, i: int) -> tuple[int | None, int | None]:
        """(CPU millicores, memory bytes) free on node ``i`` as the engine sees them; None: not modelled."""
        if not self.host_in_state:
            return None, None
        cpu, mem = self.cpu_free[i], self.mem_free[i]
        return (None if math.isinf(cpu) else int(cpu)), (None if math.isinf(mem) else int(mem) * MIB)

    def _class(self, i: int) -> int:
        host = self._host_free(i)
        free = tuple(self.milli_free[i, :len(self.units[i])].tolist())
        # A shared GPU's holders, by share: the filter counts them (replicas) and sums their needs.
        holders = tuple(tuple(sorted(d.values())) for d in self.on_unit[i]) if self.shared[i] else ()
        key = (id(self.views[i]), free, holders, *host)
        cid = self._class_ids.get(key)
        if cid is None:
            cid = len(self._class_keys)
            self._class_ids[key] = cid
            self._class_keys.append((self.views[i], self.units[i], free, dict(self.held[i]), holders, *host))
            self._class_count.append(0)
        return cid

    def _reclass(self, i: int) -> None:
        self._class_count[self.class_of[i]] -= 1
        cid = self._class(i)
        self.class_of[i] = cid
        self._class_count[cid] += 1

    def live_classes(self, nodes_mask: np.ndarray | None = None) -> list[int]:
        """Classes with at least one node (of ``nodes_mask``, when given)."""
        if nodes_mask is not None:
            return np.unique(self.class_of[nodes_mask]).tolist()  # type: ignore[no-any-return]
        return [c for c, n in enumerate(self._class_count) if n > 0]

    def class_state(self, cid: int, milli: int = MILLI) -> NodeState:
        """The engine's state of class ``cid`` for a pod of ``milli`` per GPU: the units with less
        than ``milli`` free are held (for a whole-GPU pod, every unit with a share taken). Classes
        that look the same to that pod (same view, same held units, same free CPU and memory) get
        the same ``NodeState`` object, so a policy can filter and score it once."""
        state = self._class_states.get((cid, milli))
        if state is None:
            view, units, free, names, holders, cpu, mem = self._class_keys[cid]
            if view.sharing is not None:
                state = self._shared_state(view, units, holders, cpu, mem)
                self._class_states[(cid, milli)] = state
                return state
            held_ix = tuple(j for j, f in enumerate(free) if f < milli)
            partly = tuple((j, f) for j, f in enumerate(free) if 0 < f < MILLI)
            key = (id(view), held_ix, partly, cpu, mem)
            state = self._engine_states.get(key)
            if state is None:
                held = {units[j].uuid: names.get(units[j].uuid, "") for j in held_ix}
                allocation = NodeAllocation(held=held, partly_free_milli={units[j].uuid: f for j, f in partly})
                state = NodeState(name=f"state-{len(self._engine_states)}", view=view,
                                  allocation=allocation, cpu_milli_free=cpu, memory_bytes_free=mem)
                self._engine_states[key] = state
            self._class_states[(cid, milli)] = state
        return state

    def class_states(self, cids: Sequence[int], milli: int = MILLI) -> list[NodeState]:
        """``class_state(cid, milli)`` of each of ``cids``, in order (the ones built before are
        read without a call each)."""
        cache = self._class_states
        out = [cache.get((cid, milli)) for cid in cids]
        if None in out:
            out = [st if st is not None else self.class_state(cid, milli) for cid, st in zip(cids, out)]
        return out  # type: ignore[return-value]

    def _shared_state(self, view: NodeView, units: tuple[Unit, ...], holders: tuple[tuple[int, ...], ...],
                      cpu: int | None, mem: int | None) -> NodeState:
        """A time-sliced class's engine state: each GPU's holders as VRAM needs, their gpu-fraction
        of its memory, and the share they leave, as the cluster cache builds it (``_shared_allocation``)."""
        key = (id(view), holders, cpu, mem)
        state = self._engine_states.get(key)
        if state is None:
            shared = {u.uuid: tuple(fraction_bytes(u.memory_bytes, m) for m in h) for u, h in zip(units, holders) if h}
            allocation = NodeAllocation(shared=shared, partly_free_milli=shared_free_milli(units, shared, ()))
            state = NodeState(name=f"state-{len(self._engine_states)}", view=view, allocation=allocation,
                              cpu_milli_free=cpu, memory_bytes_free=mem)
            self._engine_states[key] = state
        return state

    @property
    def class_total(self) -> int:
        return len(self._class_keys)

    # ---- masks -----------------------------------------------------------------------------------

    def fits_resources(self, pod: SimPod) -> np.ndarray:
        """Nodes with the pod's CPU and memory free (kube-scheduler's NodeResourcesFit filter) that
        the cluster's sharing rules let it use (``sharing_rule``)."""
        ok = self.sharing_rule(pod).copy()
        if pod.cpu_milli:
            ok &= self.cpu_free >= pod.cpu_milli
        if pod.memory_mib:
            ok &= self.mem_free >= pod.memory_mib
        return ok

    def sharing_rule(self, pod: SimPod) -> np.ndarray:
        """Where time-sliced nodes exist (``device_plugin``): sharing pods only there (their
        nodeSelector), whole-GPU pods never (the taint), CPU-only pods anywhere (they tolerate it)."""
        if not self.any_shared or pod.gpus == 0:
            return np.ones(len(self.nodes), dtype=bool)
        return self.shared if pod.sharing else ~self.shared

    def model_mask(self, allowed: frozenset[str] | None) -> np.ndarray:
        """Nodes whose GPU model is in ``allowed`` (a nodeSelector on the model label); None: all."""
        m = self._model_masks.get(allowed)
        if m is None:
            if allowed is None:
                m = np.ones(len(self.nodes), dtype=bool)
            else:
                m = np.isin(self.model_of, [i for i, mid in enumerate(self.models) if mid in allowed])
            self._model_masks[allowed] = m
        return m

    def fits_gpus(self, pod: SimPod) -> np.ndarray:
        """Nodes with the GPU share the pod needs free (module docstring): ``gpus`` wholly free
        units, a unit with ``gpu_milli`` free for a sharing pod, any node for a CPU-only pod."""
        if pod.gpus == 0:
            return np.ones(len(self.nodes), dtype=bool)
        if pod.sharing:
            if self.any_shared:  # kube-scheduler counts the device plugin's replicas
                return self.replicas_used < self.replicas_total
            return self.milli_free.max(axis=1) >= pod.gpu_milli
        return self.gpu_free >= pod.gpus

    def fits_gpus_at(self, i: int, pod: SimPod) -> bool:
        """``fits_gpus`` for node ``i`` alone."""
        if pod.gpus == 0:
            return True
        if pod.sharing:
            if self.any_shared:
                return bool(self.shared[i] and self.replicas_used[i] < self.replicas_total[i])
            return bool(self.milli_free[i].max() >= pod.gpu_milli)
        return bool(self.gpu_free[i] >= pod.gpus and not self.shared[i])

    def free_units(self, i: int) -> list[Unit]:
        """Node ``i``'s wholly free units, by index."""
        free = self.milli_free[i]
        return [u for j, u in enumerate(self.units[i]) if free[j] == MILLI]

    def best_fit_unit(self, i: int, milli: int) -> Unit:
        """The unit of node ``i`` with the least share free that still has ``milli``, the lowest
        index among equals: the GPU a sharing pod gets under every policy but FGD (FGD's
        simulator, ``allocateGpuIdBasedOnBestFit`` in ``pkg/simulator/plugin/open_gpu_share.go``,
        the default ``gpuSelMethod`` "best")."""
        free = self.milli_free[i, :len(self.units[i])]
        fit = np.flatnonzero(free >= milli)
        if not len(fit):
            raise RuntimeError(f"{self.nodes[i].name}: no unit with {milli} milli free")
        return self.units[i][int(fit[np.argmin(free[fit])])]

    def units_for(self, i: int, pod: SimPod) -> tuple[Unit, ...]:
        """The units a pod gets on node ``i`` when the policy does not choose them: the first
        wholly free ones by index (the device plugin; FGD's ``AllocateExclusiveGpuId``), the best
        fitting one for a sharing pod, none for a CPU-only pod."""
        if pod.gpus == 0 or self.shared[i]:
            return ()  # a time-sliced node's replica is the device plugin's (``granted``)
        if pod.sharing:
            return (self.best_fit_unit(i, pod.gpu_milli),)
        return tuple(self.free_units(i)[:pod.gpus])

    def granted(self, i: int, pod: SimPod, units: tuple[Unit, ...], rng: random.Random) -> tuple[Unit, ...]:
        """The units the pod gets on node ``i`` after a policy chose ``units``: on a time-sliced
        node the device plugin's replica (``device_plugin.plugin_choice``), whatever the policy
        chose; elsewhere ``units``."""
        if not self.shared[i] or not pod.gpus:
            return units
        j = plugin_choice([len(d) for d in self.on_unit[i]], int(self.replicas[i]), rng)
        if j is None:
            raise RuntimeError(f"{self.nodes[i].name}: every replica in use")
        return (self.units[i][j],)

    def overcommit(self) -> tuple[int, int, int]:
        """(GPUs whose holders' shares add up to more than the GPU, i.e. VRAM over-committed; the
        pods holding them, each at risk of running out of memory; the milli-GPUs those pods asked,
        a pod on a shared GPU holding that one GPU only)."""
        holders = [self.on_unit[i][j] for i, j in zip(*np.nonzero(self.milli_free < 0))]
        return len(holders), sum(len(h) for h in holders), sum(sum(h.values()) for h in holders)

    # ---- bookkeeping -----------------------------------------------------------------------------

    def _take(self, i: int, pod: SimPod, units: Sequence[Unit], sign: int) -> None:
        index = {u.uuid: j for j, u in enumerate(self.units[i])}
        for u in units:  # check every unit before changing any
            j = index[u.uuid]
            if sign > 0 and self.shared[i]:
                if len(self.on_unit[i][j]) >= self.replicas[i]:
                    raise RuntimeError(f"{self.nodes[i].name}: every replica of {u.uuid} in use")
                continue  # time-slicing: no memory isolation, a share may over-commit the GPU
            if sign > 0 and self.milli_free[i, j] < pod.gpu_milli:
                raise RuntimeError(f"{self.nodes[i].name}: {u.uuid} already held by {self.held[i][u.uuid]}")
            if sign < 0 and pod.name not in self.on_unit[i][j]:
                raise RuntimeError(f"{self.nodes[i].name}: {u.uuid} is not held by {pod.name}")
        for u in units:
            j = index[u.uuid]
            pods = self.on_unit[i][j]
            was_free = self.milli_free[i, j] == MILLI
            if sign > 0:
                pods[pod.name] = pod.gpu_milli
            else:
                del pods[pod.name]
            self.milli_free[i, j] -= sign * pod.gpu_milli
            self.allocated_milli += sign * pod.gpu_milli
            is_free = self.milli_free[i, j] == MILLI
            if was_free != is_free:  # the unit became occupied, or free again
                self.gpu_free[i] += 1 if is_free else -1
                self.allocated += -1 if is_free else 1
                self.cost_per_hour += (-1 if is_free else 1) * self.units_cost([u])
            if pods:
                self.held[i][u.uuid] = ",".join(pods)
            else:
                self.held[i].pop(u.uuid, None)
        if self.shared[i]:
            self.replicas_used[i] += sign * len(units)
        self.cpu_free[i] -= sign * (pod.cpu_milli or 0)
        self.mem_free[i] -= sign * (pod.memory_mib or 0)
        self.version[i] += 1
        self._reclass(i)

    def place(self, i: int, pod: SimPod, units: Sequence[Unit]) -> None:
        """Give ``pod`` its ``gpu_milli`` of each of ``units`` of node ``i`` (raises if a unit has
        less free: already held)."""
        self._take(i, pod, units, 1)

    def release(self, i: int, pod: SimPod, units: Sequence[Unit]) -> None:
        """Free what ``pod`` took of ``units`` on node ``i`` (the pod was deleted)."""
        self._take(i, pod, units, -1)

    def units_cost(self, units: Sequence[Unit]) -> float:
        """USD per hour of ``units`` (a unit with any share taken costs its whole price)."""
        return sum(self.policy.cost_per_gpu_hour(u.entry) * u.cost_fraction for u in units)
