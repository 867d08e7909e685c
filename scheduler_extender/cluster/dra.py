"""The cluster's Dynamic Resource Allocation devices: ResourceSlices and ResourceClaims, kept in
sync by two watchers (``watchers``), read as node states for pods with claims and as the fleet's
device types for the claim webhook.

A node's GPUs are read from its slices (``core.dra_slices``), its held devices from the allocated
claims; each node is rebuilt only when one of its slices, or a claim allocating its devices,
changes. Pods with claims are decided on these states; pods that request ``nvidia.com/gpu`` on
the agent's inventory (``cluster.cache``): each kind of pod reads the inventory of the mechanism
that gives it devices, and ``gpuplace explain`` says which.

No Kubernetes client is imported here (``gpuplace explain``'s and the tests' static fleets use
the same class); ``watchers`` takes the API's list functions.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable, Mapping

from scheduler_extender.core.catalog import Catalog
from scheduler_extender.core.devices import NodeAllocation, NodeState, allocation_from_inventory, build_node_view
from scheduler_extender.core.dra_claims import DeviceType, fleet_types
from scheduler_extender.core.dra_slices import DriverMapping, SliceInventory, claim_holders, inventories_from_slices

log = logging.getLogger(__name__)


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name") or "")


def _claim_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def _slice_node(obj: Mapping[str, Any]) -> str | None:
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return node if isinstance(node, str) and node else None


def _slice_pool(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    if not isinstance(spec, Mapping) or not isinstance(spec.get("pool"), Mapping):
        return None
    return str(spec.get("driver")), str(spec["pool"].get("name"))


class DraFleet:
    """Slices and claims by name, and per node its ``SliceInventory`` and ``NodeState``.
    Thread-safe; methods take decoded API objects (dicts)."""

    def __init__(self, catalog: Catalog, drivers: Mapping[str, DriverMapping],
                 fetch_claim: Callable[[str, str], Mapping[str, Any] | None] | None = None) -> None:
        """``fetch_claim(namespace, name)``: read one claim from the API server when the watch has
        not shown it yet (kube-scheduler may ask about a pod the moment its claim is created);
        None: a claim the watch has not shown is unknown."""
        self.catalog, self.drivers = catalog, drivers
        self.fetch_claim = fetch_claim
        self._lock = threading.RLock()
        self._slices: dict[str, Mapping[str, Any]] = {}
        self._slices_of_node: dict[str, set[str]] = {}
        self._node_of_pool: dict[tuple[str, str], str] = {}
        self._claims: dict[str, Mapping[str, Any]] = {}
        self._claim_devices: dict[str, dict[tuple[str, str, str], str]] = {}
        self._holders: dict[tuple[str, str, str], str] = {}
        self._inventories: dict[str, SliceInventory] = {}
        self._states: dict[str, NodeState] = {}
        self._types: list[DeviceType] | None = None
        self.slices_synced = False
        self.claims_synced = False
        self.generation = 0

    @property
    def synced(self) -> bool:
        return self.slices_synced and self.claims_synced

    # ---- slices ----------------------------------------------------------------------------------
    def _changed(self, nodes: Iterable[str | None], devices: bool = True) -> None:
        """Forget the inventories and states of ``nodes``; ``devices``: the fleet's device types
        may have changed too (a slice did; a claim, which only holds devices, does not)."""
        for n in nodes:
            if n:
                self._inventories.pop(n, None)
                self._states.pop(n, None)
        if devices:
            self._types = None
        self.generation += 1

    def _drop_slice(self, name: str) -> str | None:
        old = self._slices.pop(name, None)
        node = _slice_node(old) if old is not None else None
        if node is not None:
            names = self._slices_of_node.get(node)
            if names is not None:
                names.discard(name)
                if not names:  # the node's last slice: forget the node and its pools
                    del self._slices_of_node[node]
                    for pool in [p for p, n in self._node_of_pool.items() if n == node]:
                        del self._node_of_pool[pool]
        return node

    def _put_slice(self, obj: Mapping[str, Any]) -> list[str | None]:
        name = _name(obj)
        old_node = self._drop_slice(name)
        node = _slice_node(obj)
        self._slices[name] = obj
        if node is not None:
            self._slices_of_node.setdefault(node, set()).add(name)
            pool = _slice_pool(obj)
            if pool is not None:
                self._node_of_pool[pool] = node
        return [old_node, node]

    def replace_slices(self, objs: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            self._slices.clear()
            self._slices_of_node.clear()
            self._node_of_pool.clear()
            for obj in objs:
                self._put_slice(obj)
            self._inventories.clear()
            self._states.clear()
            self._changed(())
            self.slices_synced = True

    def apply_slice_event(self, event_type: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            nodes = [self._drop_slice(_name(obj))] if event_type == "DELETED" else self._put_slice(obj)
            self._changed(nodes)

    # ---- claims ----------------------------------------------------------------------------------
    def _nodes_of(self, devices: Iterable[tuple[str, str, str]]) -> list[str | None]:
        return [self._node_of_pool.get((d, p)) for d, p, _ in devices]

    def _drop_claim(self, key: str) -> list[str | None]:
        self._claims.pop(key, None)
        old = self._claim_devices.pop(key, {})
        for k, holder in old.items():
            if self._holders.get(k) == holder:  # not a device another claim holds now
                del self._holders[k]
        return self._nodes_of(old)

    def _put_claim(self, obj: Mapping[str, Any]) -> list[str | None]:
        key = _claim_key(obj)
        nodes = self._drop_claim(key)
        self._claims[key] = obj
        held = claim_holders([obj])
        if held:
            self._claim_devices[key] = held
            self._holders.update(held)
        return nodes + self._nodes_of(held)

    def replace_claims(self, objs: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            self._claims.clear()
            self._claim_devices.clear()
            self._holders.clear()
            for obj in objs:
                self._put_claim(obj)
            self._inventories.clear()
            self._states.clear()
            self._changed(())
            self.claims_synced = True

    def apply_claim_event(self, event_type: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            nodes = self._drop_claim(_claim_key(obj)) if event_type == "DELETED" else self._put_claim(obj)
            self._changed(nodes, devices=False)

    def claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The claim from the watch, else (once, outside the lock) from ``fetch_claim``; a fetched
        claim is not kept: the watch brings it."""
        with self._lock:
            known = self._claims.get(f"{namespace}/{name}")
        if known is not None or self.fetch_claim is None:
            return known
        try:
            return self.fetch_claim(namespace, name)
        except Exception as e:  # noqa: BLE001 - an API error: the pod is decided as if it had no such claim
            log.warning("cannot read ResourceClaim %s/%s: %s: %s", namespace, name, type(e).__name__, e)
            return None

    # ---- reads -----------------------------------------------------------------------------------
    def inventory(self, node: str) -> SliceInventory | None:
        """The node's GPUs from its slices; None when it has no slice of a mapped or unmapped driver."""
        with self._lock:
            cached = self._inventories.get(node)
            if cached is not None:
                return cached
            names = self._slices_of_node.get(node)
            if not names:
                return None
            built = inventories_from_slices([self._slices[n] for n in sorted(names)], (), self.catalog,
                                            self.drivers, holders=self._holders).get(node)
            if built is not None:
                self._inventories[node] = built
            return built

    def state(self, node: str) -> NodeState | None:
        """The node's state for a pod with claims: its slices' devices, those of allocated claims
        held; None without slices."""
        with self._lock:
            cached = self._states.get(node)
            if cached is not None:
                return cached
            inv = self.inventory(node)
            if inv is None:
                return None
            view = build_node_view(inv.inventory, self.catalog, node)
            st = self._states[node] = NodeState(name=node, view=view, allocation=allocation_from_inventory(view))
            return st

    def states(self, names: Iterable[str]) -> list[NodeState]:
        """A state per name; a node without slices gets one without a view (no GPU there)."""
        return [self.state(n) or NodeState(name=n, view=None, allocation=NodeAllocation(),
                                           inventory_error="no ResourceSlice publishes GPUs on this node")
                for n in names]

    def node_names(self) -> list[str]:
        with self._lock:
            return sorted(n for n, names in self._slices_of_node.items() if names)

    def types(self) -> list[DeviceType]:
        """The distinct device types over every node's slices (``core.dra_claims.fleet_types``)."""
        with self._lock:
            if self._types is None:
                nodes = []
                for n in self.node_names():
                    st, inv = self.state(n), self.inventory(n)
                    if st is not None and st.view is not None and inv is not None:
                        nodes.append((st.view, inv.devices))
                self._types = fleet_types(nodes, self.drivers)
            return self._types


def static_fleet(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]], catalog: Catalog,
                 drivers: Mapping[str, DriverMapping]) -> DraFleet:
    """A fleet from listed objects (files, a one-off list): ``gpuplace claim``, ``explain``, tests."""
    fleet = DraFleet(catalog, drivers)
    fleet.replace_slices(slices)
    fleet.replace_claims(claims)
    return fleet


def watchers(fleet: DraFleet, list_slices: Callable[..., Any], list_claims: Callable[..., Any],
             stop: threading.Event, on_relist: Callable[[str], None] | None = None,
             watch_timeout_seconds: int | None = None) -> list[Any]:
    """``cluster.watch.ResourceWatcher`` s for the fleet's two kinds (not started): list then
    watch, relisting on 410 and errors, as the node and pod watches do."""
    from scheduler_extender.cluster.watch import WATCH_TIMEOUT_SECONDS, ResourceWatcher
    timeout = watch_timeout_seconds or WATCH_TIMEOUT_SECONDS
    return [
        ResourceWatcher("resourceslices", list_slices, None, stop, on_relist=on_relist, watch_timeout_seconds=timeout,
                        replace=fleet.replace_slices, apply=fleet.apply_slice_event,
                        unsynced=lambda: setattr(fleet, "slices_synced", False)),
        ResourceWatcher("resourceclaims", list_claims, None, stop, on_relist=on_relist, watch_timeout_seconds=timeout,
                        replace=fleet.replace_claims, apply=fleet.apply_claim_event,
                        unsynced=lambda: setattr(fleet, "claims_synced", False)),
    ]
