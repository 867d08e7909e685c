"""kube-scheduler's extender wire format (``k8s.io/kube-scheduler/extender/v1``), as pydantic models.

The Go types carry no JSON tags, so keys are the Go field names in PascalCase (``Pod``, ``Nodes``,
``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``, ``Host``, ``Score``).
Go's ``encoding/json`` matches keys case-insensitively when decoding; ``parse_extender_args``
does the same so that hand-written requests with ``pod`` or ``nodenames`` work too.

With ``nodeCacheCapable: true`` the scheduler sends ``NodeNames`` and expects ``NodeNames`` back;
with ``false`` it sends full ``Nodes`` (a ``v1.NodeList``) and expects the passing ``Nodes`` back.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scheduler_extender.core.node import node_name
from scheduler_extender.core.pod import ObjectMeta, Pod as DecisionPod, Quantity

# The fields of v1.Node the extender reads, with their API types, so that a body whose Node has,
# say, a list for metadata is a 400 naming the field, not a crash further in; the Pod is validated
# into the decision's own model (``core.pod.Pod``) the same way. Every other field is ignored, as
# kube-scheduler sends whole objects.


class _Shape(BaseModel):
    model_config = ConfigDict(extra="ignore")


class NodeStatus(_Shape):
    allocatable: dict[str, Quantity] | None = None


class NodeFields(_Shape):
    metadata: ObjectMeta | None = None
    status: NodeStatus | None = None


class NodeList(BaseModel):
    model_config = ConfigDict(extra="allow")
    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(BaseModel):
    """Body of ``POST /filter`` and ``POST /prioritize``."""

    model_config = ConfigDict(extra="ignore")
    Pod: DecisionPod
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None

    def node_names(self) -> list[str]:
        if self.NodeNames is not None:
            return list(self.NodeNames)
        if self.Nodes is not None:
            return [node_name(n) for n in self.Nodes.items]  # names validated (parse_extender_args)
        return []


class ExtenderFilterResult(BaseModel):
    """Response of ``/filter``."""

    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(BaseModel):
    Host: str
    Score: int = Field(ge=0, le=10)


class MetaPod(_Shape):
    UID: str


class MetaVictims(_Shape):
    """A node's victims by uid (``nodeCacheCapable: true``), and how many PodDisruptionBudgets evicting them violates."""

    Pods: list[MetaPod] = Field(default_factory=list)
    NumPDBViolations: int = 0


class Victims(_Shape):
    """A node's victims as whole Pods (``nodeCacheCapable: false``); only their uids are read."""

    Pods: list[DecisionPod] = Field(default_factory=list)
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(BaseModel):
    """Body of ``POST /preempt``: the pod and, per node, the victims kube-scheduler's preemption chose."""

    model_config = ConfigDict(extra="ignore")
    Pod: DecisionPod
    NodeNameToVictims: dict[str, Victims] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = None

    def victim_uids(self) -> dict[str, list[str]]:
        """Node -> the uids of the victims proposed there (whichever form was sent)."""
        if self.NodeNameToMetaVictims is not None:
            return {n: [p.UID for p in v.Pods] for n, v in self.NodeNameToMetaVictims.items()}
        return {n: [p.uid or "" for p in v.Pods] for n, v in (self.NodeNameToVictims or {}).items()}


_CANONICAL = {k.lower(): k for k in ("Pod", "Nodes", "NodeNames", "NodeNameToVictims", "NodeNameToMetaVictims")}


class WireError(ValueError):
    """A request body that is not ExtenderArgs; the message says what is wrong."""


def parse_extender_args(body: bytes) -> ExtenderArgs:
    """Decode and validate an ExtenderArgs body.

    Raises:
        WireError: not JSON, not an object, no ``Pod``, neither ``Nodes`` nor ``NodeNames``, or
            a field of the wrong type (also a field of the Pod or a Node that the extender reads:
            metadata, annotations, labels, container resources, allocatable); the message
            names the field. The Pod comes back as the decision's ``core.pod.Pod``.
    """
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise WireError(f"request body is not JSON: {e}") from e
    if not isinstance(raw, dict):
        raise WireError("request body must be a JSON object with Pod and Nodes or NodeNames (ExtenderArgs)")
    data = {_CANONICAL.get(k.lower(), k): v for k, v in raw.items()}
    if data.get("Pod") is None:
        raise WireError("Pod: required (the pod to place)")
    if data.get("Nodes") is None and data.get("NodeNames") is None:
        raise WireError("Nodes or NodeNames: one is required (nodeCacheCapable false or true)")
    try:
        args = ExtenderArgs.model_validate(data)
    except ValidationError as e:
        raise WireError(_first_error(e)) from e
    # The nodes are kept as sent; only the fields the extender reads are type-checked.
    for i, item in enumerate(args.Nodes.items if args.Nodes is not None else ()):
        _check_fields(NodeFields, item, f"Nodes.items.{i}")
    return args


def parse_preemption_args(body: bytes) -> ExtenderPreemptionArgs:
    """Decode and validate an ExtenderPreemptionArgs body (``POST /preempt``).

    Raises:
        WireError: not JSON, not an object, no ``Pod``, or a field of the wrong type (named).
    """
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise WireError(f"request body is not JSON: {e}") from e
    if not isinstance(raw, dict):
        raise WireError("request body must be a JSON object with Pod and NodeNameToMetaVictims "
                        "(ExtenderPreemptionArgs)")
    data = {_CANONICAL.get(k.lower(), k): v for k, v in raw.items()}
    if data.get("Pod") is None:
        raise WireError("Pod: required (the preempting pod)")
    try:
        return ExtenderPreemptionArgs.model_validate(data)
    except ValidationError as e:
        raise WireError(_first_error(e)) from e


def _first_error(e: ValidationError, prefix: str = "") -> str:
    first = e.errors()[0]
    path = ".".join(str(p) for p in (*([prefix] if prefix else []), *first["loc"]))
    return f"{path}: {first['msg'].removeprefix('Value error, ')}"


def _check_fields(model: type[BaseModel], obj: dict[str, Any], prefix: str) -> None:
    try:
        model.model_validate(obj)
    except ValidationError as e:
        raise WireError(_first_error(e, prefix)) from e


def _model_json(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def dumps(obj: Any) -> bytes:
    """JSON bytes of plain data and pydantic models, at any depth.

    orjson calls ``_model_json`` only for types it does not know, so a 5,000-element list of
    plain dicts costs no per-element Python call.
    """
    return orjson.dumps(obj, default=_model_json)
