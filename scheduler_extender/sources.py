"""Where the extender's node states come from: inventory files (static mode) or the cluster cache.

Both answer ``states(names, node_objects)`` for the nodes of one request. Static mode treats the
files as the truth: no staleness check, allocations from ``allocatedTo``. When kube-scheduler
sends full Node objects (``nodeCacheCapable: false``), a node the source does not know is read
from its ``gpuplace.io/inventory`` annotation (parsed once per distinct annotation).
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from node_agent.inventory import ANNOTATION, InventoryError, parse_inventory
from scheduler_extender.cache import ClusterCache, bulk_load, parse_node_inventory
from scheduler_extender.core.catalog import Catalog
from scheduler_extender.core.devices import NodeState, allocation_from_inventory, build_node_view

log = logging.getLogger(__name__)


class StateSource(Protocol):
    def states(self, names: Sequence[str], node_objects: Sequence[Mapping[str, Any]] | None) -> list[NodeState]: ...
    def ready(self) -> bool: ...
    def now(self) -> dt.datetime | None: ...
    def node_names(self) -> list[str]: ...


class ChangeLog(Protocol):
    """Optional: a source that can say which nodes' states changed (``ExtenderService`` keeps the
    states of the last node list between requests and refreshes only those)."""

    generation: int

    def changes_since(self, generation: int) -> tuple[int, set[str]] | None: ...


class _AnnotationFallback:
    """Parses inventories carried by Node objects in the request, memoised per annotation text."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._memo: dict[tuple[str, str], NodeState] = {}

    def state(self, name: str, obj: Mapping[str, Any] | None) -> NodeState:
        annotation = ((obj or {}).get("metadata") or {}).get("annotations", {}) or {}
        text = annotation.get(ANNOTATION)
        if text is None:
            return NodeState(name=name, view=None)
        key = (name, text)
        st = self._memo.get(key)
        if st is None:
            view, error = parse_node_inventory(name, text, self._catalog)
            alloc = allocation_from_inventory(view) if view else None
            st = NodeState(name=name, view=view, inventory_error=error, **({"allocation": alloc} if alloc else {}))
            if len(self._memo) > 50_000:
                self._memo.clear()
            self._memo[key] = st
        return st


def _objects_by_name(node_objects: Sequence[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    return {str((o.get("metadata") or {}).get("name")): o for o in node_objects or ()}


class StaticSource:
    """Inventory files, one NodeGPUInventory (``.json``/``.yaml``/``.yml``) per node.

    A file that fails validation is logged and its node (named by the file's stem) fails GPU pods
    with the validation message; it never stops the server.
    """

    def __init__(self, directory: str | Path, catalog: Catalog) -> None:
        self.directory = Path(directory)
        self._catalog = catalog
        self._states: dict[str, NodeState] = {}
        self._fallback = _AnnotationFallback(catalog)
        self.errors: dict[str, str] = {}
        self.generation = 0
        self.load()

    def load(self) -> None:
        if not self.directory.is_dir():
            raise FileNotFoundError(f"--inventory-dir {self.directory}: not a directory")
        states: dict[str, NodeState] = {}
        errors: dict[str, str] = {}
        files = sorted(p for p in self.directory.iterdir() if p.suffix in (".json", ".yaml", ".yml"))
        with bulk_load():
            self._load_files(files, states, errors)
        self._states, self.errors = states, errors
        self.generation += 1
        log.info("static mode: %d node inventories from %s (%d rejected)", len(states), self.directory, len(errors))

    def _load_files(self, files: list[Path], states: dict[str, NodeState], errors: dict[str, str]) -> None:
        for path in files:
            try:
                inv = parse_inventory(path.read_text(encoding="utf-8"), source=str(path))
            except (InventoryError, OSError, UnicodeDecodeError) as e:
                log.error("inventory file rejected: %s", e)
                errors[path.stem] = str(e)
                states[path.stem] = NodeState(name=path.stem, view=None, inventory_error=str(e))
                continue
            view = build_node_view(inv, self._catalog)
            if inv.node_name in states:
                log.error("%s: node %s already defined by another file; ignored", path, inv.node_name)
                continue
            states[inv.node_name] = NodeState(name=inv.node_name, view=view, allocation=allocation_from_inventory(view))

    def states(self, names: Sequence[str], node_objects: Sequence[Mapping[str, Any]] | None) -> list[NodeState]:
        known = self._states
        if all(map(known.__contains__, names)):  # builtins only: this runs for every node of every request
            return list(map(known.__getitem__, names))
        objs = _objects_by_name(node_objects) if node_objects is not None else {}
        return [known[name] if name in known else self._fallback.state(name, objs.get(name)) for name in names]

    def changes_since(self, generation: int) -> tuple[int, set[str]] | None:
        """Nothing changes between loads; a load changes everything (None: start over)."""
        return (generation, set()) if generation == self.generation else None

    def ready(self) -> bool:
        return True

    def now(self) -> dt.datetime | None:
        return None  # files are the truth: no staleness in static mode

    def node_names(self) -> list[str]:
        return sorted(self._states)


class ClusterSource:
    """The watch-fed cache; ready after the first full list of nodes and pods."""

    def __init__(self, cache: ClusterCache, catalog: Catalog) -> None:
        self.cache = cache
        self._fallback = _AnnotationFallback(catalog)

    def states(self, names: Sequence[str], node_objects: Sequence[Mapping[str, Any]] | None) -> list[NodeState]:
        objs = _objects_by_name(node_objects) if node_objects is not None else {}
        out = []
        for name in names:
            st = self.cache.state(name)
            out.append(st if st is not None else self._fallback.state(name, objs.get(name)))
        return out

    @property
    def generation(self) -> int:
        return self.cache.generation

    def changes_since(self, generation: int) -> tuple[int, set[str]] | None:
        return self.cache.changes_since(generation)

    def ready(self) -> bool:
        return self.cache.synced

    def now(self) -> dt.datetime | None:
        return dt.datetime.now(dt.timezone.utc)

    def node_names(self) -> list[str]:
        return self.cache.node_names()
