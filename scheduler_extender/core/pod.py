"""The pod as the decision reads it: one typed value, validated once where a pod enters.

``Pod`` holds the fields of a ``v1.Pod`` the extender reads, with their API types (metadata's
name, namespace, uid, annotations; each container's and init container's resources and restart
policy; pod-level resources and overhead; the node name); every other field is ignored, as kube-scheduler and the API server send whole objects. The
wire layer validates a request's ``Pod`` straight into it (a wrong type is a 400 naming the field);
pods from the API server or a file go through ``as_pod``. This module is the one place for the
pod's shape: the rest of the decision reads typed fields, never ``pod.get("metadata")``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Hashable, Mapping

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr, ValidationError


def _quantity_type(value: Any) -> Any:
    # resource.Quantity is a string on the wire; numbers come from hand-made bodies. Whether the
    # text is a valid quantity is for the parser to say (with the pod's field in the reason).
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("a quantity must be a string such as '1' or '40Gi'")
    return value


Quantity = Annotated[Any, BeforeValidator(_quantity_type)]
"""A ``resource.Quantity`` as sent: a string, or a number in a hand-made body (not yet parsed)."""


class _Shape(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class ObjectMeta(_Shape):
    name: StrictStr | None = None
    namespace: StrictStr | None = None
    uid: StrictStr | None = None
    annotations: dict[str, StrictStr] | None = None
    labels: dict[str, StrictStr] | None = None
    deletion_timestamp: StrictStr | None = Field(default=None, alias="deletionTimestamp")
    """Set when the pod is being deleted (an eviction, a graceful deletion): preemption leaves it be."""


class ResourceRequirements(_Shape):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None

    def merged(self) -> dict[str, Any]:
        """Limits overlaid with requests (requests win where both are set; the API server sets an
        extended resource's request equal to its limit, and a missing request to the limit)."""
        out = dict(self.limits or {})
        out.update(self.requests or {})
        return out


class Container(_Shape):
    name: StrictStr | None = None
    resources: ResourceRequirements | None = None
    restart_policy: StrictStr | None = Field(default=None, alias="restartPolicy")
    """``Always`` on an init container makes it a sidecar (a restartable init container, GA in
    Kubernetes 1.33): it runs beside the app containers, so its requests add to theirs."""

    @property
    def is_sidecar(self) -> bool:
        return self.restart_policy == "Always"


class PodResourceClaim(_Shape):
    """``spec.resourceClaims[]``: a claim the pod uses, by name or from a ResourceClaimTemplate."""

    name: StrictStr | None = None
    resource_claim_name: StrictStr | None = Field(default=None, alias="resourceClaimName")
    resource_claim_template_name: StrictStr | None = Field(default=None, alias="resourceClaimTemplateName")


class PodResourceClaimStatus(_Shape):
    """``status.resourceClaimStatuses[]``: the claim kube-controller-manager made from a template."""

    name: StrictStr | None = None
    resource_claim_name: StrictStr | None = Field(default=None, alias="resourceClaimName")


class PodSpec(_Shape):
    containers: list[Container] | None = None
    init_containers: list[Container] | None = Field(default=None, alias="initContainers")
    node_name: StrictStr | None = Field(default=None, alias="nodeName")
    resources: ResourceRequirements | None = None
    """Pod-level resources (``PodLevelResources``, beta and on by default in Kubernetes 1.34):
    where set for CPU or memory, they replace the containers' sum for that resource."""
    overhead: dict[str, Quantity] | None = None
    """What the pod's RuntimeClass adds to its requests (``spec.overhead``, set at admission)."""
    resource_claims: list[PodResourceClaim] | None = Field(default=None, alias="resourceClaims")
    """Dynamic Resource Allocation: the claims whose devices the pod uses (``core.dra_claims``)."""
    priority: StrictInt | None = None
    preemption_policy: StrictStr | None = Field(default=None, alias="preemptionPolicy")
    """``Never``: the pod waits rather than have others evicted (its PriorityClass's ``preemptionPolicy``)."""
    """``spec.priority``, set at admission from the pod's PriorityClass (or the global default);
    read by preemption only (``core.preemption``)."""


class PodStatus(_Shape):
    phase: StrictStr | None = None
    resource_claim_statuses: list[PodResourceClaimStatus] | None = Field(default=None, alias="resourceClaimStatuses")




class Pod(_Shape):
    """A ``v1.Pod`` as far as the decision and the cluster cache read it (immutable)."""

    metadata: ObjectMeta = ObjectMeta()
    spec: PodSpec = PodSpec()
    status: PodStatus = PodStatus()

    @property
    def name(self) -> str:
        return self.metadata.name or ""

    @property
    def namespace(self) -> str:
        """The pod's namespace; ``default`` when the object names none (as the API server defaults it)."""
        return self.metadata.namespace or "default"

    @property
    def uid(self) -> str | None:
        return self.metadata.uid or None

    @property
    def key(self) -> str:
        """The uid, else ``namespace/name`` (a hand-made object without one)."""
        return self.metadata.uid or f"{self.namespace}/{self.name}"

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.metadata.annotations or {}

    @property
    def priority(self) -> int:
        """``spec.priority``; 0 when unset, as kube-scheduler reads it (``corev1helpers.PodPriority``)."""
        return self.spec.priority or 0

    def claim_names(self) -> list[str]:
        """Names of the ResourceClaims the pod uses: ``resourceClaimName``, or for a template the
        claim kube-controller-manager created (``status.resourceClaimStatuses``); a template's
        claim not created yet is left out."""
        made = {s.name: s.resource_claim_name for s in self.status.resource_claim_statuses or () if s.name}
        out = []
        for c in self.spec.resource_claims or ():
            name = c.resource_claim_name or (made.get(c.name) if c.name else None)
            if name:
                out.append(name)
        return out

    def container_requests(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(containers, init containers): each one's resources, requests over limits (``merged``)."""
        spec = self.spec
        return ([c.resources.merged() if c.resources else {} for c in spec.containers or ()],
                [c.resources.merged() if c.resources else {} for c in spec.init_containers or ()])

    def content_key(self, ignored_annotations: frozenset[str] = frozenset()) -> tuple[Hashable, int]:
        """What resolving the pod reads but its name and uid, as a hashable value, and about how
        many bytes that value holds (for a memo's byte budget: the characters, plus
        ``KEY_ITEM_BYTES`` per string and tuple). Two pods with the same key resolve alike; nothing
        a request claims about a pod's identity (uid) is in it."""
        annotations = tuple(sorted((k, v) for k, v in self.annotations.items() if k not in ignored_annotations))
        containers, init = self.container_requests()
        spec = self.spec
        # Pod-level requests and limits apart: a pod-level limit does not replace the containers'
        # request as a pod-level request does (core.pod_requests).
        pod_level = [(spec.resources.requests or {}) if spec.resources else {},
                     (spec.resources.limits or {}) if spec.resources else {}, spec.overhead or {}]
        resources = tuple(tuple(tuple(sorted((k, str(v)) for k, v in c.items())) for c in group)
                          for group in (containers, init, pod_level))
        # Which init containers are sidecars changes the sum (pod_requests), so it is read too.
        sidecars = tuple(c.is_sidecar for c in spec.init_containers or ())
        pairs = [*annotations, *(kv for group in resources for c in group for kv in c)]
        size = len(self.namespace) + sum(len(k) + len(v) + 3 * KEY_ITEM_BYTES for k, v in pairs)
        items = len(containers) + len(init) + len(sidecars) + 8
        return (self.namespace, annotations, resources, sidecars), size + KEY_ITEM_BYTES * items


KEY_ITEM_BYTES = 64
"""What CPython spends on one small string or tuple beside its characters (``sys.getsizeof('')``
is 49, of a pair 56), rounded up."""


SHOWN_CHARS = 64
"""How much of a user's value a reason repeats. A reason is copied into the answer for every node
(and into the pod's events), so a 200 KB annotation echoed whole would make a 1,000-node answer
200 MB."""


def shown(value: Any) -> str:
    """``repr`` of a user's value for a reason, cut after ``SHOWN_CHARS`` characters."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= SHOWN_CHARS:
        return repr(text) if isinstance(value, str) else repr(value)
    return f"{text[:SHOWN_CHARS]!r}... ({len(text)} characters)"


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """Text as the user wrote it (for reasons and log lines), cut after ``limit`` characters, the
    full length then noted."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


@dataclass(frozen=True)
class FieldError:
    """One unusable pod field: ``field`` is the annotation or resource, ``message`` the fix (what
    was sent, where, and the accepted form). The filter fails every node with it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class PodShapeError(ValueError):
    """A pod object whose fields the extender reads have the wrong type; ``field`` is its path
    (``metadata.annotations.gpuplace.io/vram``) and the message says what the API accepts."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def as_pod(obj: Pod | Mapping[str, Any]) -> Pod:
    """``obj`` as a ``Pod``: a ``Pod`` as it is, a decoded ``v1.Pod`` validated.

    Raises:
        PodShapeError: a field the extender reads has the wrong type (a list for metadata, a
            number for an annotation, a mapping for a quantity); the first one, by path.
    """
    if isinstance(obj, Pod):
        return obj
    try:
        return Pod.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "pod"
        raise PodShapeError(field, first["msg"].removeprefix("Value error, ")) from None
