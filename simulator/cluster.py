"""The simulated cluster: per-node allocations kept exactly as the extender's cache keeps them
(``NodeAllocation.held``: unit UUID -> pod), plus CPU/memory and vectors the policies read.

Equivalence classes: nodes with the same inventory view and the same held units get the same
filter verdict and the same score for any pod (the engine's filter and score read no CPU or
memory), so the engine filters and scores one representative ``NodeState`` per class
(``class_state``) instead of every node. A node moves to another class whenever a pod is placed
on it or leaves it; classes are keyed by (view, held unit UUIDs). When the policy scores
fragmentation, the engine reads the node's free CPU and memory too (``NodeState.cpu_milli_free``,
``memory_bytes_free``): they join the key, so partly used nodes then each form their own class.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from scheduler_extender.core.catalog import Catalog
from scheduler_extender.core.devices import NodeAllocation, NodeState, NodeView, Unit, build_node_view
from scheduler_extender.core.policy import Policy
from scheduler_extender.core.quantity import MIB
from scheduler_extender.core.requirements import NVIDIA_GPU
from simulator.model import SimNode, SimPod


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
                views[key] = build_node_view(n.inventory, catalog, n.name)
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
        self.held: list[dict[str, str]] = [{} for _ in self.nodes]
        self.host_in_state = policy.scoring.fragmentation > 0
        self.allocated = 0
        self.cost_per_hour = 0.0
        self._class_ids: dict[tuple[int, frozenset[str]], int] = {}
        self._class_states: list[NodeState] = []
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
        key = (id(self.views[i]), frozenset(self.held[i]), *host)
        cid = self._class_ids.get(key)
        if cid is None:
            cid = len(self._class_states)
            self._class_ids[key] = cid
            alloc = NodeAllocation(held=dict(self.held[i]))
            self._class_states.append(NodeState(name=f"class-{cid}", view=self.views[i], allocation=alloc,
                                                cpu_milli_free=host[0], memory_bytes_free=host[1]))
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
            return [int(c) for c in np.unique(self.class_of[nodes_mask])]
        return [c for c, n in enumerate(self._class_count) if n > 0]

    def class_state(self, cid: int) -> NodeState:
        return self._class_states[cid]

    @property
    def class_total(self) -> int:
        return len(self._class_states)

    # ---- masks -----------------------------------------------------------------------------------

    def fits_resources(self, pod: SimPod) -> np.ndarray:
        """Nodes with the pod's CPU and memory free (kube-scheduler's NodeResourcesFit filter)."""
        ok = np.ones(len(self.nodes), dtype=bool)
        if pod.cpu_milli:
            ok &= self.cpu_free >= pod.cpu_milli
        if pod.memory_mib:
            ok &= self.mem_free >= pod.memory_mib
        return ok

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

    def free_units(self, i: int) -> list[Unit]:
        held = self.held[i]
        return [u for u in self.units[i] if u.uuid not in held]

    # ---- bookkeeping -----------------------------------------------------------------------------

    def place(self, i: int, pod: SimPod, units: Sequence[Unit]) -> None:
        """Mark ``units`` of node ``i`` as held by ``pod`` (raises if one is already held)."""
        held = self.held[i]
        for u in units:
            if u.uuid in held:
                raise RuntimeError(f"{self.nodes[i].name}: {u.uuid} already held by {held[u.uuid]}")
            held[u.uuid] = pod.name
        self.gpu_free[i] -= len(units)
        self.cpu_free[i] -= pod.cpu_milli or 0
        self.mem_free[i] -= pod.memory_mib or 0
        self.allocated += len(units)
        self.cost_per_hour += self.units_cost(units)
        self._reclass(i)

    def release(self, i: int, pod: SimPod, units: Sequence[Unit]) -> None:
        """Free the units ``pod`` held on node ``i`` (the pod was deleted)."""
        held = self.held[i]
        for u in units:
            if held.get(u.uuid) != pod.name:
                raise RuntimeError(f"{self.nodes[i].name}: {u.uuid} is not held by {pod.name}")
            del held[u.uuid]
        self.gpu_free[i] += len(units)
        self.cpu_free[i] += pod.cpu_milli or 0
        self.mem_free[i] += pod.memory_mib or 0
        self.allocated -= len(units)
        self.cost_per_hour -= self.units_cost(units)
        self._reclass(i)

    def units_cost(self, units: Sequence[Unit]) -> float:
        return sum(self.policy.cost_per_gpu_hour(u.entry) * u.cost_fraction for u in units)
