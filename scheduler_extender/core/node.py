"""The Node as the decision reads it: one typed value, read once where a Node enters.

``Node`` holds the fields of a ``v1.Node`` the extender reads: metadata's name, labels,
annotations and resourceVersion, and ``status.allocatable``. A Node comes from the API server
(the cluster cache's watch and lists, ``gpuplace explain``) or inside a request
(``nodeCacheCapable: false``: whatever a client sends), so ``as_node`` never raises: a field of
the wrong type reads as absent (unknown, never a default value), and what that leaves unknown is
for the readers to say (no inventory, no allocatable). This module is the one place for the
Node's shape: the rest reads typed fields, never ``obj.get("metadata")``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

_EMPTY: Mapping[str, Any] = {}


@dataclass(frozen=True)
class Node:
    """A ``v1.Node`` as far as the extender reads it (immutable).

    Attributes:
        name: ``metadata.name``; empty when absent or not a string.
        labels: ``metadata.labels`` as sent (values may be of any type in a hand-made object);
            empty when absent or not a mapping.
        annotations: ``metadata.annotations``, likewise.
        allocatable: ``status.allocatable`` as sent (quantities unparsed); None when absent or
            not a mapping (unknown, not empty).
        resource_version: ``metadata.resourceVersion``; empty when absent.
    """

    name: str
    labels: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, Any] = field(default_factory=dict)
    allocatable: Mapping[str, Any] | None = None
    resource_version: str = ""


def _mapping(value: Any) -> Mapping[str, Any] | None:
    # type() first: decoded JSON is plain dicts, and an ABC isinstance costs ten times more
    return value if type(value) is dict or isinstance(value, Mapping) else None


def as_node(obj: Node | Mapping[str, Any] | None) -> Node:
    """``obj`` (a decoded ``v1.Node``, or a ``Node`` already) as a ``Node``; never raises (module
    docstring): a field of the wrong type reads as absent."""
    if isinstance(obj, Node):
        return obj
    obj = _mapping(obj) or _EMPTY
    meta = _mapping(obj.get("metadata")) or _EMPTY
    status = _mapping(obj.get("status"))
    name = meta.get("name")
    version = meta.get("resourceVersion")
    return Node(name if type(name) is str else "", _mapping(meta.get("labels")) or _EMPTY,
                _mapping(meta.get("annotations")) or _EMPTY,
                _mapping(status.get("allocatable")) if status is not None else None,
                version if type(version) is str else "")


def node_name(obj: Node | Mapping[str, Any] | None) -> str:
    """``metadata.name`` of a decoded ``v1.Node``, read as ``as_node`` reads it; empty when absent.
    Without building the ``Node``: it runs for every node of a request's NodeList, three times."""
    if type(obj) is dict:
        meta = obj.get("metadata")
    elif isinstance(obj, Node):
        return obj.name
    else:
        meta = _mapping(obj) and obj.get("metadata")  # type: ignore[union-attr]
    if type(meta) is not dict and not isinstance(meta, Mapping):
        return ""
    name = meta.get("name")
    return name if type(name) is str else ""
