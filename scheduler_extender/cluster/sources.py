"""Where the extender's node states come from: inventory files (static mode) or the cluster cache.

Both answer ``states(names, node_objects)`` for the nodes of one request. Static mode treats the
files as the truth: no staleness check, allocations from ``allocatedTo``. When kube-scheduler
sends full Node objects (``nodeCacheCapable: false``), a node the source does not know is read
from its ``gpuplace.io/inventory`` annotation (parsed once per distinct annotation).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError

from node_agent.inventory import ANNOTATION, InventoryError, format_validation_error, parse_inventory
from scheduler_extender.cluster.cache import ClusterCache, bulk_load, parse_node_inventory
from scheduler_extender.core.allocatable import gpu_allocatable, node_mig_strategy
from scheduler_extender.core.gfd import gfd_labels
from scheduler_extender.core.sharing import sharing_labels
from scheduler_extender.core.catalog import Catalog, CatalogEntry
from scheduler_extender.core.devices import NodeState, allocation_from_inventory, build_node_view, resource_usage
from scheduler_extender.core.node import as_node, node_name
from scheduler_extender.served.memo import BoundedMemo, content_digest, retained_bytes

log = logging.getLogger(__name__)


class StateSource(Protocol):
    def states(self, names: Sequence[str], node_objects: Sequence[Mapping[str, Any]] | None) -> list[NodeState]: ...
    def ready(self) -> bool: ...
    def now(self) -> dt.datetime | None: ...
    def node_names(self) -> list[str]: ...
    def allocations(self) -> dict[str, Any]: ...


class ChangeLog(Protocol):
    """Optional: a source that can say which nodes' states changed (``ExtenderService`` keeps the
    states of the last node list between requests and refreshes only those)."""

    generation: int

    def changes_since(self, generation: int) -> tuple[int, set[str]] | None: ...

    def knows(self, name: str) -> bool:
        """Whether ``name`` is one of the source's nodes (the reader keeps states of those only)."""
        ...


FALLBACK_MEMO_ENTRIES = 50_000
FALLBACK_MEMO_BYTES = 128 * 2**20
"""Bounds of the parsed-annotation memo. Each entry is charged what its node state keeps alive
(``served.memo.retained_bytes``, the catalog's rows left out): a parsed inventory holds 2.5x to 25x
its JSON text depending on its shape, so a fixed factor of the text would miss the bound."""
MEMO_SHARED = (CatalogEntry, Catalog)
"""What every parsed view points to and the memo does not keep alive."""


class _AnnotationFallback:
    """Parses inventories carried by Node objects in the request, memoised per annotation text
    (keyed by its digest, bounded in entries and bytes: the text is whatever a client sends)."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._memo: BoundedMemo[NodeState] = BoundedMemo(FALLBACK_MEMO_ENTRIES, FALLBACK_MEMO_BYTES)

    def state(self, name: str, obj: Mapping[str, Any] | None) -> NodeState:
        node = as_node(obj)
        text = node.annotations.get(ANNOTATION)
        labels = gfd_labels(node) if text is None else ()
        if text is None and not labels:
            return NodeState(name=name, view=None)
        allocatable = gpu_allocatable(node)  # the Node's own allocatable: the inventory may not exceed it
        mig_strategy = node_mig_strategy(node, allocatable)
        shared_by = sharing_labels(node)  # GPU sharing is read as the cache reads it (parse_node_inventory)
        if text is not None and not isinstance(text, str):
            text = str(text)
        key = (content_digest(f"{len(name)}:{name}{text}".encode("utf-8", "surrogatepass")),
               None if allocatable is None else allocatable.key(), mig_strategy, labels,
               # Label values as a bounded hashable key: past 64 characters no value reads differently.
               tuple((type(v).__name__, str(v)[:64]) for v in shared_by))
        st = self._memo.get(key)
        if st is None:
            view, error = parse_node_inventory(name, text, self._catalog, allocatable, mig_strategy, labels, shared_by)
            alloc = allocation_from_inventory(view) if view else None
            st = NodeState(name=name, view=view, inventory_error=error, **({"allocation": alloc} if alloc else {}))
            self._memo.put(key, st, retained_bytes(st, MEMO_SHARED))
        return st


def _objects_by_name(node_objects: Sequence[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    return {node_name(o): o for o in node_objects or ()}


class StaticSource:
    """Inventory files, one NodeGPUInventory (``.json``/``.yaml``/``.yml``) per node.

    A file that fails validation is logged and its node (named by the file's stem) fails GPU pods
    with the validation message; it never stops the server.
    """

    def __init__(self, directory: str | Path, catalog: Catalog,
                 namespace_labels: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.directory = Path(directory)
        self._catalog = catalog
        self._namespace_labels = namespace_labels
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

    def knows(self, name: str) -> bool:
        """Whether an inventory file defines node ``name``."""
        return name in self._states

    def ready(self) -> bool:
        return True

    def now(self) -> dt.datetime | None:
        return None  # files are the truth: no staleness in static mode

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """From ``--namespace-labels``; None (unknown) without it or for a namespace it lacks."""
        return None if self._namespace_labels is None else self._namespace_labels.get(namespace)

    def inventory_error_count(self) -> int:
        return len(self.errors)

    def node_names(self) -> list[str]:
        return sorted(self._states)

    def allocations(self) -> dict[str, Any]:
        """``GET /debug/allocations`` in static mode: the files' ``allocatedTo`` (see ClusterCache.snapshot)."""
        nodes = {}
        for name, st in sorted(self._states.items()):
            pods: dict[str, dict[str, int]] = {}
            for resource, units in (st.view.units_by_resource.items() if st.view else ()):
                for u in units:
                    pod = st.allocation.held.get(u.uuid)
                    if pod:
                        pods.setdefault(pod, {})[resource] = pods.get(pod, {}).get(resource, 0) + 1
            nodes[name] = {"inventory": "ok" if st.view is not None else (st.inventory_error or "missing"),
                           "resources": resource_usage(st.view, st.allocation), "pods": pods,
                           "heldUnits": dict(st.allocation.held)}
        return {"synced": True, "nodes": nodes}


NAMESPACE_MISS_RETRY_SECONDS = 5.0
"""After a failed direct read of a namespace, how long its labels stay unknown before the next
read: a missing RBAC ``get`` or an API outage must not add a round trip to every filter call."""

NAMESPACE_READS_PER_SECOND = 5.0
NAMESPACE_READ_BURST = 20
"""Direct namespace reads, over all names: a token bucket. Requests name namespaces at will, and
each unknown name would otherwise cost an API round trip on a decision thread; beyond the rate a
namespace's labels stay unknown (label-selecting tenants deny, kube-scheduler retries the pod)."""

_NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A namespace name: an RFC 1123 DNS label (Kubernetes ``validation.IsDNS1123Label``)."""


class ClusterSource:
    """The watch-fed cache; ready after the first full list of nodes, pods and namespaces.

    ``read_namespace`` (name -> decoded Namespace, or None) covers the moment between a
    namespace's creation and its watch event: a pod created right after its namespace would
    otherwise be denied by a label-selecting tenant as "labels unknown" and wait for
    kube-scheduler's next retry.
    """

    def __init__(self, cache: ClusterCache, catalog: Catalog,
                 read_namespace: Callable[[str], Mapping[str, Any] | None] | None = None) -> None:
        self.cache = cache
        self._fallback = _AnnotationFallback(catalog)
        self._read_namespace = read_namespace
        self._namespace_misses: dict[str, float] = {}  # name -> monotonic time of the failed read
        self._read_tokens = float(NAMESPACE_READ_BURST)
        self._read_tokens_at = time.monotonic()
        self._read_lock = threading.Lock()

    def _may_read_namespace(self) -> bool:
        """Take a token from the direct-read bucket (``NAMESPACE_READS_PER_SECOND``)."""
        with self._read_lock:
            now = time.monotonic()
            self._read_tokens = min(float(NAMESPACE_READ_BURST),
                                    self._read_tokens + (now - self._read_tokens_at) * NAMESPACE_READS_PER_SECOND)
            self._read_tokens_at = now
            if self._read_tokens < 1:
                return False
            self._read_tokens -= 1
            return True

    def states(self, names: Sequence[str], node_objects: Sequence[Mapping[str, Any]] | None) -> list[NodeState]:
        objs = _objects_by_name(node_objects) if node_objects is not None else {}
        out = []
        for name in names:
            st = self.cache.state(name)
            out.append(st if st is not None else self._fallback.state(name, objs.get(name)))
        return out

    def reserve(self, pod: Any, nodes: Sequence[str], job: Any) -> bool:
        """Hold ``pod`` on ``nodes`` until its binding shows (``ClusterCache.reserve``)."""
        return self.cache.reserve(pod, nodes, job)

    def state_without(self, name: str, uids: frozenset[str]) -> NodeState | None:
        """``ClusterCache.state_without``."""
        return self.cache.state_without(name, uids)

    def bound_pods(self, name: str) -> list[Any]:
        """``ClusterCache.bound_pods``."""
        return self.cache.bound_pods(name)

    def nomination(self, uid: str | None) -> str | None:
        """``ClusterCache.nomination``."""
        return self.cache.nomination(uid)

    def nominate(self, uid: str, node: str | None, pod: Any = None, job: Any = None) -> None:
        """``ClusterCache.nominate``."""
        self.cache.nominate(uid, node, pod, job)

    def expire_reservations(self, retried_uid: str | None = None) -> None:
        """End the reservations whose time is up, and the last one of the pod asked about again."""
        self.cache.expire_reservations()
        self.cache.retried(retried_uid)

    @property
    def generation(self) -> int:
        return self.cache.generation

    def changes_since(self, generation: int) -> tuple[int, set[str]] | None:
        return self.cache.changes_since(generation)

    def latest_changes_since(self, generation: int) -> dict[str, int] | None:
        return self.cache.latest_changes_since(generation)

    def knows(self, name: str) -> bool:
        """Whether the cache has Node ``name`` (from the API server's list and watch)."""
        return self.cache.has_node(name)

    def ready(self) -> bool:
        return self.cache.synced

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        labels = self.cache.namespace_labels(namespace)
        if labels is not None or self._read_namespace is None or not self.cache.namespaces_synced:
            return labels
        if not _NAMESPACE_NAME.fullmatch(namespace):
            return None  # no namespace has this name: nothing to ask the API server
        missed = self._namespace_misses.get(namespace)
        if missed is not None and time.monotonic() - missed < NAMESPACE_MISS_RETRY_SECONDS:
            return None
        if not self._may_read_namespace():
            return None
        obj = self._read_namespace(namespace)
        if obj is None:
            if len(self._namespace_misses) > 10_000:
                self._namespace_misses.clear()
            self._namespace_misses[namespace] = time.monotonic()
            return None
        self._namespace_misses.pop(namespace, None)
        self.cache.apply_namespace_event("ADDED", obj)
        return self.cache.namespace_labels(namespace)

    def inventory_error_count(self) -> int:
        return self.cache.inventory_error_count()

    def now(self) -> dt.datetime | None:
        return dt.datetime.now(dt.timezone.utc)

    def node_names(self) -> list[str]:
        return self.cache.node_names()

    def allocations(self) -> dict[str, Any]:
        return self.cache.snapshot()


class _NamespaceMeta(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)


class _NamespaceObject(BaseModel):
    model_config = ConfigDict(extra="ignore")
    metadata: _NamespaceMeta


class _NamespaceList(BaseModel):
    """``kubectl get namespaces -o yaml``."""

    model_config = ConfigDict(extra="ignore")
    items: list[_NamespaceObject]


_LabelsByNamespace = RootModel[dict[str, dict[str, str]]]


class NamespaceLabelsError(ValueError):
    """A ``--namespace-labels`` file that cannot be used; the message names the field."""


def load_namespace_labels(path: str | Path) -> dict[str, dict[str, str]]:
    """Namespace labels for static mode and ``gpuplace explain``: namespace -> labels.

    Accepts either a mapping (``team-a: {tier: gold}``) or the output of
    ``kubectl get namespaces -o yaml`` (a List of Namespaces). Namespaces the file does not name
    have unknown labels (tenants that select by label then deny, see ``core.tenancy``).

    Raises:
        NamespaceLabelsError: unreadable, not YAML/JSON, or neither shape (field path named).
    """
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise NamespaceLabelsError(f"{path}: cannot read: {e}") from e
    except yaml.YAMLError as e:
        raise NamespaceLabelsError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from e
    try:
        if isinstance(data, dict) and "items" in data:
            return {o.metadata.name: o.metadata.labels for o in _NamespaceList.model_validate(data).items}
        return _LabelsByNamespace.model_validate(data).root
    except ValidationError as e:
        raise NamespaceLabelsError(
            f"{path}: {format_validation_error(e)} (expected namespace: {{label: value}}, "
            f"or `kubectl get namespaces -o yaml`)") from e
