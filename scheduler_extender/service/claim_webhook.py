"""The claim webhook: a mutating admission webhook on ResourceClaims, so that a pod's GPU claim
asks for the devices gpuplace would choose (``core.dra_claims``).

kube-controller-manager's resourceclaim controller creates a pod's claim from its
ResourceClaimTemplate, owned by the pod; the API server sends that CREATE here
(``AdmissionReview``, ``admission.k8s.io/v1``; the chart's MutatingWebhookConfiguration matches only
claims owned by a pod). The webhook reads the owning pod (its ``gpuplace.io/*`` annotations),
writes the claim's GPU requests as ``firstAvailable`` lists in gpuplace's order, and answers with
a JSON patch. What it answers:

* allowed, unchanged: the claim has no owning pod; the pod has no ``gpuplace.io/*`` annotation;
  ``gpuplace.io/claims: leave``; no request of a GPU DeviceClass;
* allowed, with the patch (``spec`` and the annotation ``claims.gpuplace.io/alternatives`` that the
  extender reads to score nodes): the claim as gpuplace writes it;
* refused (HTTP 403 in ``status``): no device type of the cluster fits the pod (gpuplace's reason,
  which the resourceclaim controller records on the pod as a ``FailedResourceClaimCreation``
  event: ``kubectl describe pod`` shows it); invalid annotations; the ResourceSlices not read yet
  or the pod not readable (the controller retries).

Nothing falls back silently: a claim gpuplace should write and cannot is refused with the reason.
What the API server does when the webhook cannot be reached is the configuration's
``failurePolicy`` (the chart: ``Fail``).
"""

from __future__ import annotations

import base64
import logging
from typing import Any, Callable, Mapping

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from scheduler_extender.cluster.dra import DraFleet
from scheduler_extender.core.annotations import PREFIX
from scheduler_extender.core.dra_claims import (ALTERNATIVES_ANNOTATION, CLAIMS_ANNOTATION, ClaimError, ClaimPlan,
                                                gpu_classes, json_pointer_token, plan_claim, pod_claim_patch,
                                                pod_with_gpus, template_name, write_claim)
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.pod import Pod, PodShapeError, as_pod

log = logging.getLogger(__name__)

ADMISSION_API = "admission.k8s.io/v1"
CLAIMS_VALUES = ("write", "leave")


class WebhookError(ValueError):
    """A body that is not an AdmissionReview with a request (answered HTTP 400)."""


class _Shape(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class AdmissionRequest(_Shape):
    uid: StrictStr
    namespace: StrictStr | None = None
    operation: StrictStr | None = None
    dry_run: bool = Field(default=False, alias="dryRun")
    object: dict[str, Any] | None = Field(default=None, alias="object")


class AdmissionReview(_Shape):
    api_version: StrictStr | None = Field(default=None, alias="apiVersion")
    request: AdmissionRequest


def parse_review(body: bytes) -> AdmissionReview:
    """Raises WebhookError naming what is wrong."""
    try:
        return AdmissionReview.model_validate(orjson.loads(body))
    except orjson.JSONDecodeError as e:
        raise WebhookError(f"body is not JSON: {e}") from None
    except ValidationError as e:
        first = e.errors()[0]
        raise WebhookError(f"not an AdmissionReview ({ADMISSION_API}): "
                           f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None


def _owner_pod(claim: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """(name, uid) of the pod that owns ``claim``; None when no pod does."""
    meta = claim.get("metadata")
    for o in (meta.get("ownerReferences") if isinstance(meta, Mapping) else None) or ():
        if isinstance(o, Mapping) and o.get("kind") == "Pod" and o.get("apiVersion", "v1") == "v1" and o.get("name"):
            return str(o["name"]), (str(o["uid"]) if o.get("uid") else None)
    return None


class ClaimWebhook:
    """Answers ``POST /mutate/resourceclaims``.

    ``fleet``: the cluster's slices and claims; ``engine``: the current decision engine (policy and
    catalog; a callable, since the policy reloads); ``read_pod(namespace, name)``: the pod as a
    decoded object, None when it does not exist, raising on an API error;
    ``namespace_labels(name)``: for policy tenants (None: unknown); ``outcomes``: a counter with
    an ``outcome`` label, or None.
    """

    def __init__(self, fleet: DraFleet, engine: Callable[[], Engine], read_pod: Callable[[str, str], Any],
                 namespace_labels: Callable[[str], Mapping[str, str] | None] = lambda ns: None,
                 outcomes: Any = None, ensure_template: Callable[[str, int], None] | None = None) -> None:
        """``ensure_template(namespace, count)``: create the claim template ``gpuplace-gpu-<count>``
        in the namespace if it is missing (raising on an API error), for ``respond_pod``; None:
        opted-in pods are refused (the extender cannot create templates)."""
        self.fleet, self.engine, self.read_pod, self.namespace_labels = fleet, engine, read_pod, namespace_labels
        self.outcomes = outcomes
        self.ensure_template = ensure_template

    def respond(self, body: bytes) -> bytes:
        """The AdmissionReview answer for ``body``, a ResourceClaim's CREATE.

        Raises:
            WebhookError: ``body`` is not an AdmissionReview with a request.
        """
        return self._respond(body, self._decide)

    def respond_pod(self, body: bytes) -> bytes:
        """The AdmissionReview answer for ``body``, the CREATE of a pod labelled ``gpuplace.io/dra:
        "true"`` (``POST /mutate/pods``): the pod converted to name the claim template
        ``gpuplace-gpu-<count>`` (``core.dra_claims.pod_claim_patch``), which is created in its
        namespace when missing (not on a dry run); the claim made from it for the pod is then
        written by ``respond``. Refused with the reason when the pod cannot be converted.

        Raises:
            WebhookError: ``body`` is not an AdmissionReview with a request.
        """
        return self._respond(body, self._decide_pod)

    def _decide_pod(self, req: AdmissionRequest) -> tuple[str, list[dict[str, Any]] | None, str | None, list[str]]:
        pod = req.object
        if req.operation not in (None, "CREATE") or not isinstance(pod, dict):
            return "left", None, None, []
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
        ns = meta.get("namespace") or req.namespace or "default"
        what = f"pod {ns}/{meta.get('name') or meta.get('generateName') or '?'}"
        try:
            converted = pod_claim_patch(pod, what)
        except ClaimError as e:
            return "refused", None, str(e), []
        if converted is None:
            return "left", None, None, [f"gpuplace: {what} has resourceClaims: left as written"]
        patch, count = converted
        if self.ensure_template is None:
            return "refused", None, f"gpuplace: {what}: this extender does not create claim templates", []
        if not req.dry_run:
            self.ensure_template(ns, count)
        return "converted", patch, None, [f"gpuplace: {what}: {count} nvidia.com/gpu asked through the claim "
                                          f"template {template_name(count)}"]

    def _respond(self, body: bytes, decide: Callable[[AdmissionRequest], Any]) -> bytes:
        review = parse_review(body)
        req = review.request
        try:
            outcome, patch, message, warnings = decide(req)
        except Exception as e:  # noqa: BLE001 - one object never takes the server down; refused, with the cause
            log.exception("webhook failed")
            outcome, patch, message, warnings = "error", None, f"gpuplace: internal error: {type(e).__name__}: {e}", []
        if self.outcomes is not None:
            self.outcomes.labels(outcome).inc()
        response: dict[str, Any] = {"uid": req.uid, "allowed": message is None}
        if message is not None:
            response["status"] = {"code": 403, "reason": "Forbidden", "message": message}
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
        if warnings:
            response["warnings"] = [w[:256] for w in warnings[:8]]
        return orjson.dumps({"apiVersion": ADMISSION_API, "kind": "AdmissionReview", "response": response})

    def _decide(self, req: AdmissionRequest) -> tuple[str, list[dict[str, Any]] | None, str | None, list[str]]:
        """(outcome, JSON patch or None, refusal message or None, warnings)."""
        claim = req.object
        if req.operation not in (None, "CREATE") or not isinstance(claim, dict):
            return "left", None, None, []
        found = _owner_pod(claim)
        meta = claim.get("metadata") if isinstance(claim.get("metadata"), dict) else {}
        ns = meta.get("namespace") or req.namespace or "default"
        if found is None:
            return "left", None, None, []
        owner, owner_uid = found
        obj = self.read_pod(ns, owner)
        if obj is None:
            return "refused", None, f"gpuplace: pod {ns}/{owner} that owns this claim was not found; retried", []
        try:
            pod = as_pod(obj)
        except PodShapeError as e:
            return "refused", None, f"gpuplace: pod {ns}/{owner}: {e}", []
        if owner_uid is not None and pod.uid is not None and owner_uid != pod.uid:
            # Written for that pod's annotations, not another's of the same name.
            return "refused", None, (f"gpuplace: the claim's owner is pod {ns}/{owner} uid {owner_uid[:40]}, but that "
                                     f"pod is uid {pod.uid}"), []
        annotations = pod.annotations
        choice = annotations.get(CLAIMS_ANNOTATION, "write")
        if choice not in CLAIMS_VALUES:
            return "refused", None, (f"gpuplace: pod {ns}/{owner}: {CLAIMS_ANNOTATION}: {choice[:64]!r} is not "
                                     f"one of {', '.join(CLAIMS_VALUES)}"), []
        ours = [k for k in annotations if k.startswith(PREFIX) and k != CLAIMS_ANNOTATION]
        if choice == "leave" or not ours:
            return "left", None, None, []
        if not self.fleet.synced:
            return "refused", None, ("gpuplace: the extender has not read the cluster's ResourceSlices and "
                                     "ResourceClaims yet; kube-controller-manager retries"), []
        spec = claim.get("spec")
        if not isinstance(spec, dict):
            return "left", None, None, []
        write = claim_writer(self.engine(), self.fleet, pod, self.namespace_labels(ns))
        try:
            written = write(spec, f"pod {ns}/{owner}")
        except ClaimError as e:
            log.info("claim for pod %s/%s refused: %s", ns, owner, e)
            return "refused", None, str(e), []
        if not written.written:
            return "left", None, None, list(written.notes)
        annotations_path = "/metadata/annotations"
        patch: list[dict[str, Any]] = [{"op": "replace", "path": "/spec", "value": written.spec}]
        if isinstance(meta.get("annotations"), dict):
            patch.append({"op": "add", "path": f"{annotations_path}/{json_pointer_token(ALTERNATIVES_ANNOTATION)}",
                          "value": written.annotation()})
        else:
            patch.append({"op": "add", "path": annotations_path, "value": {ALTERNATIVES_ANNOTATION: written.annotation()}})
        log.info("claim for pod %s/%s written: %s", ns, owner, "; ".join(written.notes))
        return "written", patch, None, ["gpuplace: " + n for n in written.notes]


def claim_writer(engine: Engine, fleet: DraFleet, pod: Pod, namespace_labels: Mapping[str, str] | None
                 ) -> Callable[[Mapping[str, Any], str], Any]:
    """``write(spec, what) -> ClaimWrite`` for ``pod`` over ``fleet`` (``core.dra_claims.write_claim``):
    the one function behind the webhook and ``gpuplace claim``."""
    types = fleet.types()
    classes = gpu_classes(fleet.drivers)
    plans: dict[int, ClaimPlan] = {}

    def plan_for(count: int) -> ClaimPlan:
        if count not in plans:
            job = engine.job(pod_with_gpus(pod, count), namespace_labels)
            plans[count] = plan_claim(job, types, engine.policy, count)
        return plans[count]

    def write(spec: Mapping[str, Any], what: str) -> Any:
        return write_claim(spec, plan_for, classes, what)
    return write
