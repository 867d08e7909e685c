"""Claims written from the job: the device request of a pod's ResourceClaim, rewritten so that
Dynamic Resource Allocation's first-fit allocator takes the device gpuplace would.

kube-scheduler's ``DynamicResources`` plugin allocates a claim's request to the first device that
matches its selectors; with ``firstAvailable`` (KEP-4816, beta and on in Kubernetes 1.34) it tries
the subrequests in order. So gpuplace writes, for each GPU request of a claim (``exactly`` of a
DeviceClass of a mapped driver, ``core.dra_slices``), a ``firstAvailable`` list:

* one subrequest per device type of the fleet that gpuplace's per-device criteria pass for the pod
  (the same ``core.criteria`` checks the filter runs: VRAM at least the estimate, compute
  capability and precision, model lists, the size class's models and MIG profiles, the
  namespace's entitlement, health), a type being (driver, whole GPU or MIG profile, product name,
  memory, compute capability);
* in gpuplace's order: the size class's last-resort models (premium GPUs) last, then the cheapest
  per device (policy prices; a MIG device its share), then the least memory, then the name;
* each with CEL selectors that state the requirement itself: the driver, the device type, the
  product name, the MIG profile, memory at least the need (``quantity``), compute capability at
  least the need (``semver``), each attribute guarded with ``in`` so that a device without it is
  not selected rather than failing the claim;
* at most ``MAX_ALTERNATIVES`` (the API's ``FirstAvailableDeviceRequestMaxSize``): the cheapest
  eight; the dearer types left out are named in the claim's note.

The pod's own selectors on the request are kept in every subrequest. A request gpuplace does not
write (another class, ``allocationMode: All``, ``adminAccess``, already a ``firstAvailable``
list) is left as it is; so is every request of a pod annotated ``gpuplace.io/claims: leave``.

Everything here is pure: the webhook (``service.claim_webhook``) and ``gpuplace claim`` call
``write_claim`` with the fleet's device types (``fleet_types``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

from scheduler_extender.core import criteria
import dataclasses

from scheduler_extender.core.devices import NodeState, NodeView, Unit, free_units
from scheduler_extender.core.dra_slices import DriverMapping
from scheduler_extender.core.filter import C_FREE, NodeResult, Rejection
from scheduler_extender.core.engine import Decision, Engine
from scheduler_extender.core.job import Job
from scheduler_extender.core.pod import Pod, as_pod
from scheduler_extender.core.policy import Policy
from scheduler_extender.core.quantity import MIB, QuantityError, fmt_gib, parse_count
from scheduler_extender.core.requirements import NVIDIA_GPU, mig_resource_name

CLAIMS_ANNOTATION = "gpuplace.io/claims"
"""On the pod: ``write`` (default) or ``leave`` (gpuplace leaves its claims as the template says)."""
ALTERNATIVES_ANNOTATION = "claims.gpuplace.io/alternatives"
"""On a claim gpuplace wrote: per request, the alternatives in order (JSON), which the extender
reads to predict the device each node would give (``node_result``)."""
MAX_ALTERNATIVES = 8
"""``FirstAvailableDeviceRequestMaxSize`` (k8s.io/api resource/v1 types.go)."""
MAX_REQUESTS = 32
"""``DeviceRequestsMaxSize`` (k8s.io/api resource/v1): requests of one claim."""
MAX_COUNT = 32
"""``AllocationResultsMaxSize``: devices one claim can be allocated; a larger count is refused."""

Kind = Literal["gpu", "mig"]


class ClaimError(ValueError):
    """A claim that gpuplace must not admit as it is: the pod fits no device type of the fleet,
    or its annotations are invalid. The message is gpuplace's reason, for the pod's events."""


@dataclass(frozen=True)
class DeviceType:
    """Devices of the fleet that every criterion reads alike: one representative ``unit``, how
    many there are (``count``), on how many nodes, and the most on one node (``most_on_a_node``:
    a request's devices come from one node)."""

    driver: str
    mapping: DriverMapping
    unit: Unit
    count: int
    nodes: int
    most_on_a_node: int = 1

    @property
    def key(self) -> tuple[Any, ...]:
        u = self.unit
        return (self.driver, u.kind, u.name, u.mig_profile, u.memory_bytes, u.compute_capability)


def fleet_types(nodes: Iterable[tuple[NodeView, Mapping[str, Any]]], drivers: Mapping[str, DriverMapping]) -> list[DeviceType]:
    """The distinct device types of DRA nodes: (view, uuid -> ``DeviceRef``) per node, as
    ``core.dra_slices.SliceInventory`` gives them (its inventory through ``build_node_view``)."""
    found: dict[tuple[Any, ...], list[Any]] = {}
    for view, refs in nodes:
        here: dict[tuple[Any, ...], int] = {}
        parents = view_mig_parents(view)
        for u in view.all_units:
            ref = refs.get(u.uuid)
            mapping = drivers.get(ref.driver) if ref is not None else None
            if mapping is None or (u.kind == "gpu" and u.gpu_uuid in parents):
                continue
            key = (ref.driver, u.kind, u.name, u.mig_profile, u.memory_bytes, u.compute_capability)
            entry = found.setdefault(key, [ref.driver, mapping, u, 0, 0, 0])
            entry[3] += 1
            here[key] = here.get(key, 0) + 1
        for key, n in here.items():
            found[key][4] += 1
            found[key][5] = max(found[key][5], n)
    return [DeviceType(*v) for _, v in sorted(found.items(), key=lambda kv: tuple(str(x) for x in kv[0]))]


def view_mig_parents(view: NodeView) -> frozenset[str]:
    """Uuids of the view's MIG-enabled GPUs: not devices of their own (their MIG devices are)."""
    return frozenset(uuid for uuid, _ in view.mig_gpus)


@dataclass(frozen=True)
class Alternative:
    """One subrequest of ``firstAvailable``: a device type and the need it must meet."""

    name: str
    device_class: str
    driver: str
    kind: Kind
    product_name: str
    mig_profile: str | None
    memory_bytes: int  # the type's memory
    need_bytes: int | None  # at least this much VRAM (None: no need known)
    min_compute_capability: tuple[int, int] | None
    cost_per_hour: float
    model_id: str | None

    def describe(self) -> str:
        what = self.product_name.removeprefix("NVIDIA ")
        return f"{what} {self.mig_profile}" if self.mig_profile else what

    def matches(self, unit: Unit) -> bool:
        """What the subrequest's CEL selects, in Python (``node_result`` predicts with it)."""
        return (unit.kind == self.kind and unit.name == self.product_name
                and (self.kind == "gpu" or unit.mig_profile == self.mig_profile)
                and (self.need_bytes is None or unit.memory_bytes >= self.need_bytes)
                and (self.min_compute_capability is None or (unit.compute_capability is not None
                                                             and unit.compute_capability >= self.min_compute_capability)))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "deviceClassName": self.device_class, "driver": self.driver, "kind": self.kind,
                "productName": self.product_name, "migProfile": self.mig_profile, "memoryBytes": self.memory_bytes,
                "needBytes": self.need_bytes,
                "minComputeCapability": list(self.min_compute_capability) if self.min_compute_capability else None,
                "costPerHour": self.cost_per_hour, "modelId": self.model_id}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Alternative:
        """Raises ValueError (KeyError, TypeError) for a value not of ``to_json``'s form."""
        cc = obj.get("minComputeCapability")
        kind = obj["kind"]
        if kind not in ("gpu", "mig"):
            raise ValueError(f"kind {kind!r}")
        return cls(str(obj["name"]), str(obj["deviceClassName"]), str(obj["driver"]), kind,
                   str(obj["productName"]), None if obj.get("migProfile") is None else str(obj["migProfile"]),
                   int(obj["memoryBytes"]), None if obj.get("needBytes") is None else int(obj["needBytes"]),
                   (int(cc[0]), int(cc[1])) if cc else None, float(obj.get("costPerHour") or 0.0),
                   None if obj.get("modelId") is None else str(obj["modelId"]))


def _cel_string(text: str) -> str:
    return json.dumps(text)  # a CEL string literal: JSON's escapes are CEL's


def cel_of(alt: Alternative, mapping: DriverMapping) -> str:
    """The CEL selector of one alternative (module docstring): every condition on an attribute
    or capacity is guarded by ``in``, so a device without it is not selected. A mapping name in
    another domain (``resource.kubernetes.io/pcieRoot``) is looked up in that domain."""

    def where(kind: str, name: str) -> tuple[str, str]:
        domain, _, key = mapping.qualified(name).rpartition("/")
        return f"device.{kind}[{_cel_string(domain)}]", _cel_string(key)

    def attr(name: str | None, value: str) -> str | None:
        if name is None:
            return None
        m, key = where("attributes", name)
        return f"{key} in {m} && {m}[{key}] == {_cel_string(value)}"

    parts: list[str | None] = [f"device.driver == {_cel_string(mapping.driver)}"]
    if mapping.type_attribute is not None:
        parts.append(attr(mapping.type_attribute, (mapping.mig_type if alt.kind == "mig" else mapping.gpu_type) or ""))
    parts.append(attr(mapping.product_name_attribute, alt.product_name))
    if alt.kind == "mig" and alt.mig_profile is not None:
        parts.append(attr(mapping.mig_profile_attribute, alt.mig_profile))
    if alt.need_bytes is not None:
        m, key = where("capacity", mapping.memory_capacity)
        need_mib = -(-alt.need_bytes // MIB)
        parts.append(f"{key} in {m} && {m}[{key}].compareTo(quantity(\"{need_mib}Mi\")) >= 0")
    if alt.min_compute_capability is not None and mapping.compute_capability_attribute is not None:
        m, key = where("attributes", mapping.compute_capability_attribute)
        major, minor = alt.min_compute_capability
        # A version attribute (DeviceAttribute.version) is a semver in DRA's CEL; the mapping's
        # computeCapabilityAttribute must be one (data/dra-drivers.yaml).
        parts.append(f"{key} in {m} && {m}[{key}].compareTo(semver(\"{major}.{minor}.0\")) >= 0")
    return " && ".join(p for p in parts if p)


_NAME_CHARS = re.compile(r"[^a-z0-9-]+")


def _subrequest_name(i: int, t: DeviceType) -> str:
    u = t.unit
    slug = _NAME_CHARS.sub("-", (u.entry.id if u.entry is not None else u.model).lower()).strip("-")
    if u.mig_profile:
        slug += "-" + _NAME_CHARS.sub("-", u.mig_profile.lower())
    return f"g{i}-{slug}"[:63].rstrip("-")


@dataclass(frozen=True)
class ClaimPlan:
    """The alternatives for one request of ``count`` devices, and why each other type was refused."""

    count: int
    alternatives: tuple[Alternative, ...]
    refused: tuple[tuple[DeviceType, str], ...] = ()
    error: str | None = None  # the request as a whole (invalid annotations, a namespace's entitlement)

    def reason(self, what: str) -> str:
        """Why nothing fits, for a pod's events: the pod, then each device type's first reason."""
        if self.error:
            return f"gpuplace: {what}: {self.error}"
        if not self.refused:
            return f"gpuplace: {what}: no GPU of a mapped DRA driver in the cluster's ResourceSlices"
        per_type = "; ".join(f"{t.unit.model}{' ' + t.unit.mig_profile if t.unit.mig_profile else ''} "
                             f"({t.count} on {t.nodes} node{'s' if t.nodes != 1 else ''}): {why}"
                             for t, why in self.refused[:8])
        more = f"; and {len(self.refused) - 8} more device types" if len(self.refused) > 8 else ""
        return f"gpuplace: {what}: no device type in the cluster fits: {per_type}{more}"


def plan_claim(job: Job, types: Sequence[DeviceType], policy: Policy, count: int) -> ClaimPlan:
    """The ordered alternatives for ``count`` devices for ``job`` over the fleet's ``types``
    (module docstring). ``job`` is resolved as a pod of ``count`` GPUs (``pod_with_gpus``)."""
    if job.errors:
        return ClaimPlan(count, (), error="; ".join(str(e) for e in job.errors))
    if job.tenant_denial:
        return ClaimPlan(count, (), error=job.tenant_denial)
    fitting: list[DeviceType] = []
    refused: list[tuple[DeviceType, str]] = []
    for t in types:
        why = next((msg for _, check in criteria.UNIT_CRITERIA if (msg := check(t.unit, job)) is not None), None)
        if why is None and not t.mapping.device_classes.get(t.unit.kind):
            why = f"no DeviceClass is known for {t.driver}'s {'MIG devices' if t.unit.kind == 'mig' else 'GPUs'}"
        if why is None and t.most_on_a_node < count:
            why = f"at most {t.most_on_a_node} on one node, {count} needed on one node"
        if why is None:
            fitting.append(t)
        else:
            refused.append((t, why))
    last_resort = job.class_last_resort_models

    def order(t: DeviceType) -> tuple[Any, ...]:
        u = t.unit
        premium = u.kind == "gpu" and u.entry is not None and u.entry.id in last_resort
        return (premium, policy.cost_per_gpu_hour(u.entry) * u.cost_fraction, u.memory_bytes, u.name, u.mig_profile or "")

    fitting.sort(key=order)
    need = job.vram.bytes_per_gpu if job.vram is not None and job.req.gpu_fraction_milli is None else None
    cc_need = job.req.required_cc()
    alternatives = []
    for i, t in enumerate(fitting):
        u = t.unit
        alternatives.append(Alternative(
            _subrequest_name(i, t), t.mapping.device_classes[u.kind],
            t.driver, u.kind, u.name, u.mig_profile, u.memory_bytes, need,
            cc_need[0] if cc_need is not None and u.vendor == "nvidia" else None,
            policy.cost_per_gpu_hour(u.entry) * u.cost_fraction, u.entry.id if u.entry else None))
    return ClaimPlan(count, tuple(alternatives), tuple(refused))


def pod_with_gpus(pod: Pod | Mapping[str, Any], count: int) -> Pod:
    """``pod`` as if its first container asked ``count`` ``nvidia.com/gpu``: how a pod whose GPUs
    come from a claim is resolved (the estimate shards over ``count`` GPUs, the criteria read
    the same fields as for a device-plugin pod)."""
    pod = as_pod(pod)
    data = pod.model_dump(by_alias=True, exclude_none=True)
    containers = data.setdefault("spec", {}).setdefault("containers", [])
    if not containers:
        containers.append({"name": "main"})
    limits = containers[0].setdefault("resources", {}).setdefault("limits", {})
    limits[NVIDIA_GPU] = str(count)  # requests are read over limits: a request of it is replaced too
    requests = containers[0]["resources"].get("requests")
    if isinstance(requests, dict):
        requests[NVIDIA_GPU] = str(count)
    return Pod.model_validate(data)


# ---- the claim --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimWrite:
    """What ``write_claim`` did: the new ``spec``, the alternatives per request name it wrote
    (empty: nothing written), and a line per request for logs and ``gpuplace claim``."""

    spec: dict[str, Any]
    written: Mapping[str, tuple[Alternative, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def annotation(self) -> str:
        """The ``ALTERNATIVES_ANNOTATION`` value: request name -> its alternatives, JSON."""
        return json.dumps({k: [a.to_json() for a in v] for k, v in self.written.items()}, separators=(",", ":"),
                          sort_keys=True)


def gpu_classes(drivers: Mapping[str, DriverMapping]) -> dict[str, DriverMapping]:
    """DeviceClass name -> the driver whose GPUs (or MIG devices) it selects."""
    return {cls: m for m in drivers.values() for cls in m.device_classes.values()}


def _selectors(exactly: Mapping[str, Any]) -> list[Any]:
    sel = exactly.get("selectors")
    return list(sel) if isinstance(sel, list) else []


def write_claim(spec: Mapping[str, Any], plan_for: Callable[[int], ClaimPlan], classes: Mapping[str, DriverMapping],
                what: str = "pod") -> ClaimWrite:
    """The claim ``spec`` (a ResourceClaimSpec, decoded) with each GPU request rewritten as
    ``firstAvailable`` in gpuplace's order (module docstring). ``plan_for(count)`` plans a request
    of ``count`` devices for the pod; ``classes``: ``gpu_classes`` of the mapped drivers.

    A request of a MIG class, or with selectors of its own (written for its class's devices), gets
    alternatives of its class only; a request of a GPU class without selectors gets MIG devices too.
    At most ``MAX_ALTERNATIVES`` are written, the cheapest; a note names those left out.

    Raises:
        ClaimError: a GPU request that no device type of the fleet fits (gpuplace's reason, naming
            ``what``); ``devices.requests`` not a list of mappings, or more than
            ``MAX_REQUESTS``; a ``count`` that is not a whole number from 1 to ``MAX_COUNT``.
    """
    new = json.loads(json.dumps(spec))  # a copy we may change; specs are JSON
    devices = new.get("devices")
    requests = devices.get("requests") if isinstance(devices, dict) else None
    if requests is None:
        return ClaimWrite(new, {}, ("no device requests",))
    if not isinstance(requests, list) or not all(isinstance(r, dict) for r in requests):
        raise ClaimError(f"gpuplace: {what}: spec.devices.requests must be a list of requests")
    if len(requests) > MAX_REQUESTS:
        raise ClaimError(f"gpuplace: {what}: spec.devices.requests has {len(requests)} requests; the API allows "
                         f"{MAX_REQUESTS}")
    written: dict[str, tuple[Alternative, ...]] = {}
    notes: list[str] = []
    by_driver = {m.driver: m for m in classes.values()}
    for i, req in enumerate(requests):
        name = req.get("name") if isinstance(req.get("name"), str) else f"#{i}"
        exactly = req.get("exactly")
        if not isinstance(exactly, dict):
            notes.append(f"request {name}: left as written ({'firstAvailable' if 'firstAvailable' in req else 'no exactly'})")
            continue
        cls = exactly.get("deviceClassName")
        if not isinstance(cls, str) or cls not in classes:
            notes.append(f"request {name}: DeviceClass {str(cls)[:64]!r} selects no GPUs of a mapped driver; "
                         "left as written")
            continue
        if exactly.get("allocationMode", "ExactCount") != "ExactCount" or exactly.get("adminAccess"):
            notes.append(f"request {name}: allocationMode All or adminAccess; left as written")
            continue
        count = exactly.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
            raise ClaimError(f"gpuplace: {what}: request {name}: count must be a whole number from 1 to "
                             f"{MAX_COUNT}, not {str(count)[:32]!r}")
        plan = plan_for(count)
        own = _selectors(exactly)
        mapping = classes[cls]
        if own or mapping.device_classes.get("mig") == cls:
            # Its own selectors are written for its class's devices (an attribute another kind lacks
            # is a CEL error, which fails the allocation): alternatives of its class only.
            plan = dataclasses.replace(plan, alternatives=tuple(a for a in plan.alternatives if a.device_class == cls))
        if not plan.alternatives:
            raise ClaimError(plan.reason(what) if plan.error or not plan.refused or not own else
                             f"gpuplace: {what}: request {name}: no device type of DeviceClass {cls} fits")
        used = plan.alternatives[:MAX_ALTERNATIVES]
        subs = [_subrequest(a, plan.count, own, exactly, by_driver[a.driver]) for a in used]
        requests[i] = {"name": req.get("name"), "firstAvailable": subs}
        written[str(req.get("name"))] = used
        left = plan.alternatives[MAX_ALTERNATIVES:]
        notes.append(f"request {name}: {count}x " + ", then ".join(a.describe() for a in used)
                     + (f" ({len(left)} dearer device types left out: the API allows {MAX_ALTERNATIVES} alternatives: "
                        + ", ".join(a.describe() for a in left[:8]) + ")" if left else ""))
    return ClaimWrite(new, written, tuple(notes))


def _subrequest(a: Alternative, count: int, own: list[Any], exactly: Mapping[str, Any], mapping: DriverMapping
                ) -> dict[str, Any]:
    """One ``firstAvailable`` subrequest: the pod's own selectors, then the alternative's CEL."""
    sub: dict[str, Any] = {"name": a.name, "deviceClassName": a.device_class,
                           "selectors": [*own, {"cel": {"expression": cel_of(a, mapping)}}],
                           "allocationMode": "ExactCount", "count": count}
    if isinstance(exactly.get("tolerations"), list):
        sub["tolerations"] = exactly["tolerations"]
    return sub


# ---- the node a DRA pod would get ---------------------------------------------------------------


def alternatives_of(claim: Mapping[str, Any]) -> dict[str, tuple[Alternative, ...]] | None:
    """The alternatives gpuplace wrote into ``claim`` (its ``ALTERNATIVES_ANNOTATION``), by
    request name; None when it wrote none or the value is not of that form."""
    meta = claim.get("metadata") if isinstance(claim, Mapping) else None
    text = (meta.get("annotations") or {}).get(ALTERNATIVES_ANNOTATION) if isinstance(meta, Mapping) else None
    if not isinstance(text, str) or len(text) > 64 * 1024:
        return None
    try:
        obj = json.loads(text)
        return {str(k): tuple(Alternative.from_json(a) for a in v) for k, v in obj.items()}
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError):
        return None


def written_requests(spec: Mapping[str, Any], written: Mapping[str, Sequence[Alternative]]
                     ) -> list[tuple[int, tuple[Alternative, ...]]]:
    """(count, alternatives) of each request of a claim ``spec`` that gpuplace wrote (``written``:
    request name -> alternatives, ``alternatives_of``); the count is the first subrequest's."""
    out: list[tuple[int, tuple[Alternative, ...]]] = []
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    for req in (devices.get("requests") if isinstance(devices, Mapping) else None) or ():
        alts = written.get(str(req.get("name"))) if isinstance(req, Mapping) else None
        subs = req.get("firstAvailable") if alts else None
        if alts and isinstance(subs, list) and subs and isinstance(subs[0], Mapping):
            count = subs[0].get("count", 1)
            out.append((count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1, tuple(alts)))
    return out


def node_result(state: NodeState, requests: Sequence[tuple[int, Sequence[Alternative]]]) -> NodeResult:
    """Whether the node's free devices (its ResourceSlices less the allocated claims) hold the
    pod's GPU requests, each ``(count, alternatives)``, and which units DRA's first-fit
    allocator would give: per request, the first alternative with ``count`` free matching units.

    A node without them fails with the alternatives named: resolvable when its devices, the
    held ones counted, would hold them (freeing would help), unresolvable otherwise.
    """
    view = state.view
    if view is None:
        return NodeResult(state.name, False, (Rejection(criteria.C_INVENTORY, "no GPU in the node's ResourceSlices"),))
    taken: set[str] = set()
    chosen: list[Unit] = []
    for count, alts in requests:
        got = None
        for a in alts:
            resource = NVIDIA_GPU if a.kind == "gpu" else mig_resource_name(a.mig_profile or "")
            free = [u for u in free_units(view, state.allocation, resource) if u.uuid not in taken and a.matches(u)]
            if len(free) >= count:
                got = free[:count]
                break
        if got is None:
            ever = any(sum(a.matches(u) for u in view.units(NVIDIA_GPU if a.kind == "gpu" else
                                                            mig_resource_name(a.mig_profile or ""))) >= count
                       for a in alts)
            listed = ", ".join(a.describe() for a in alts[:4]) + (" ..." if len(alts) > 4 else "")
            why = (f"{count} free device{'s' if count != 1 else ''} of the claim's alternatives ({listed}) needed: "
                   + ("all of them are allocated" if ever else "the node has none"))
            return NodeResult(state.name, False, (Rejection(C_FREE, why, resolvable=ever),))
        taken.update(u.uuid for u in got)
        chosen.extend(got)
    return NodeResult(state.name, True, (), tuple(chosen))


def decide_with_claims(engine: Engine, pod: Pod | Mapping[str, Any], states: Sequence[NodeState],
                       requests: Sequence[tuple[int, Sequence[Alternative]]],
                       namespace_labels: Mapping[str, str] | None = None, workload: Any = None) -> Decision:
    """The decision for a pod whose GPUs come from claims: per node the devices the allocator
    would give (``node_result``), scored by ``core.score`` as a device-plugin pod's (cost, fit,
    fragmentation against ``workload``, scarcity). The fragmentation terms read one resource: the
    chosen devices' when they are of one kind on every node, else whole GPUs. The job is the pod
    resolved as a pod of all its requests' devices (``pod_with_gpus``)."""
    results = [node_result(st, requests) for st in states]
    job = engine.job(pod_with_gpus(pod, sum(c for c, _ in requests) or 1), namespace_labels)
    kinds = {NVIDIA_GPU if u.kind == "gpu" else mig_resource_name(u.mig_profile or "")
             for r in results if r.passed for u in r.chosen}
    resource = kinds.pop() if len(kinds) == 1 else NVIDIA_GPU
    scored_job = dataclasses.replace(job, req=dataclasses.replace(job.req, resource=resource))
    scores = engine.score_with_scarcity(scored_job, states, results, workload,
                                        engine.scarcity(scored_job, workload, None, states))
    return Decision(job, results, scores)


def describe_need(job: Job) -> str:
    """One line for a claim's note: what the pod needs per device."""
    need = job.vram.bytes_per_gpu if job.vram is not None else None
    return job.describe() if need is None else f"{job.describe()} (at least {fmt_gib(need)} per device)"


# ---- pods that opt in with a label: converted to a pod with a claim template ----------------------

DRA_LABEL = "gpuplace.io/dra"
"""On a pod: ``"true"`` opts it in to be converted from ``nvidia.com/gpu`` (or no GPU request at
all: one GPU) to a ResourceClaimTemplate ``gpuplace-gpu-<count>`` (``pod_claim_patch``)."""
POD_CLAIM_NAME = "gpuplace-gpu"
"""The name of the claim in the converted pod's ``spec.resourceClaims`` and its container's
``resources.claims``."""
TEMPLATE_PREFIX = "gpuplace-gpu-"


def template_name(count: int) -> str:
    """``gpuplace-gpu-<count>``: one template per count and namespace, shared by the pods."""
    return f"{TEMPLATE_PREFIX}{count}"


def claim_template(namespace: str, count: int, device_class: str) -> dict[str, Any]:
    """The ResourceClaimTemplate a converted pod names: ``count`` devices of ``device_class``,
    nothing more; the claim webhook writes each claim made from it for its pod."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": template_name(count), "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "gpuplace"}},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}]}}}}


def json_pointer_token(key: str) -> str:
    """``key`` as one reference token of a JSON pointer (RFC 6901): ``~`` -> ``~0``, ``/`` -> ``~1``;
    for the webhooks' JSON patches (``nvidia.com/gpu``, ``claims.gpuplace.io/alternatives``)."""
    return key.replace("~", "~0").replace("/", "~1")


def pod_claim_patch(pod: Mapping[str, Any], what: str = "pod") -> tuple[list[dict[str, Any]], int] | None:
    """The JSON patch that converts an opted-in pod (``DRA_LABEL``) to one whose GPUs come from the
    claim template ``template_name(count)``, and that count; None when the pod has claims already.

    The container that requests ``nvidia.com/gpu`` (requests or limits) loses that request and gets
    the claim (``resources.claims``); a pod requesting none gets one GPU, in its first container.

    Raises:
        ClaimError: several containers request ``nvidia.com/gpu`` (a claim's devices are shared by
            the containers that name it: give the pod a template of its own), a MIG resource is
            requested, or the count is not a whole number from 1 to ``MAX_COUNT``.
    """
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    if spec.get("resourceClaims"):
        return None
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers or not all(isinstance(c, Mapping) for c in containers):
        raise ClaimError(f"gpuplace: {what}: spec.containers must be a non-empty list of containers")
    asking: list[tuple[int, Any]] = []
    for i, c in enumerate(containers):
        res = c.get("resources") if isinstance(c.get("resources"), Mapping) else {}
        for part in ("limits", "requests"):
            values = res.get(part) if isinstance(res.get(part), Mapping) else {}
            mig = [k for k in values if isinstance(k, str) and k.startswith("nvidia.com/mig-")]
            if mig:
                raise ClaimError(f"gpuplace: {what}: container {c.get('name')}: {mig[0]} with label {DRA_LABEL}: "
                                 "a MIG device is asked for through a ResourceClaimTemplate of class mig.nvidia.com")
        limits = res.get("limits") if isinstance(res.get("limits"), Mapping) else {}
        requests = res.get("requests") if isinstance(res.get("requests"), Mapping) else {}
        value = requests.get(NVIDIA_GPU, limits.get(NVIDIA_GPU))
        if value is not None:
            asking.append((i, value))
    if len(asking) > 1:
        raise ClaimError(f"gpuplace: {what}: {len(asking)} containers request {NVIDIA_GPU}; a claim's devices are "
                         "shared by the containers that name it: give the pod a ResourceClaimTemplate instead of "
                         f"the label {DRA_LABEL}")
    index, value = asking[0] if asking else (0, 1)
    try:
        count = parse_count(value)
    except QuantityError:
        count = -1
    if not 1 <= count <= MAX_COUNT:
        raise ClaimError(f"gpuplace: {what}: {NVIDIA_GPU}: {str(value)[:32]!r} with label {DRA_LABEL}: a whole "
                         f"number from 1 to {MAX_COUNT}")
    base = f"/spec/containers/{index}/resources"
    res = containers[index].get("resources") if isinstance(containers[index].get("resources"), Mapping) else None
    patch: list[dict[str, Any]] = []
    if res is None:
        patch.append({"op": "add", "path": base, "value": {"claims": [{"name": POD_CLAIM_NAME}]}})
    else:
        for part in ("limits", "requests"):
            if isinstance(res.get(part), Mapping) and NVIDIA_GPU in res[part]:
                patch.append({"op": "remove", "path": f"{base}/{part}/{json_pointer_token(NVIDIA_GPU)}"})
        if isinstance(res.get("claims"), list):
            patch.append({"op": "add", "path": f"{base}/claims/-", "value": {"name": POD_CLAIM_NAME}})
        else:
            patch.append({"op": "add", "path": f"{base}/claims", "value": [{"name": POD_CLAIM_NAME}]})
    patch.append({"op": "add", "path": "/spec/resourceClaims",
                  "value": [{"name": POD_CLAIM_NAME, "resourceClaimTemplateName": template_name(count)}]})
    return patch, count
