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
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictStr, ValidationError

# The fields of v1.Pod and v1.Node the extender reads, with their API types, so that a body whose
# Pod or Node has, say, a list for metadata or a number for an annotation is a 400 naming the
# field, not a crash further in. Every other field is ignored, as kube-scheduler sends whole objects.


def _quantity_type(value: Any) -> Any:
    # resource.Quantity is a string on the wire; numbers come from hand-made bodies. Whether the
    # text is a valid quantity is for the parser to say (with the pod's field in the reason).
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("a quantity must be a string such as '1' or '40Gi'")
    return value


Quantity = Annotated[Any, BeforeValidator(_quantity_type)]


class _Shape(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ObjectMeta(_Shape):
    name: StrictStr | None = None
    namespace: StrictStr | None = None
    uid: StrictStr | None = None
    annotations: dict[str, StrictStr] | None = None
    labels: dict[str, StrictStr] | None = None


class ResourceRequirements(_Shape):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class Container(_Shape):
    resources: ResourceRequirements | None = None


class PodSpec(_Shape):
    containers: list[Container] | None = None
    init_containers: list[Container] | None = Field(default=None, alias="initContainers")
    node_name: StrictStr | None = Field(default=None, alias="nodeName")


class PodFields(_Shape):
    metadata: ObjectMeta | None = None
    spec: PodSpec | None = None


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
    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None

    def node_names(self) -> list[str]:
        if self.NodeNames is not None:
            return list(self.NodeNames)
        if self.Nodes is not None:
            return [str((n.get("metadata") or {}).get("name", "")) for n in self.Nodes.items]
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


_CANONICAL = {k.lower(): k for k in ("Pod", "Nodes", "NodeNames")}


class WireError(ValueError):
    """A request body that is not ExtenderArgs; the message says what is wrong."""


def parse_extender_args(body: bytes) -> ExtenderArgs:
    """Decode and validate an ExtenderArgs body.

    Raises:
        WireError: not JSON, not an object, no ``Pod``, neither ``Nodes`` nor ``NodeNames``, or
            a field of the wrong type (also a field of the Pod or a Node that the extender reads:
            metadata, annotations, labels, container resources, allocatable); the message
            names the field.
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
    # The objects are kept as sent; only the fields the extender reads are type-checked.
    _check_fields(PodFields, args.Pod, "Pod")
    for i, item in enumerate(args.Nodes.items if args.Nodes is not None else ()):
        _check_fields(NodeFields, item, f"Nodes.items.{i}")
    return args


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
