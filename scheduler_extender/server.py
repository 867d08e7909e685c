"""HTTP layer: kube-scheduler's extender verbs on Starlette, around ``ExtenderService``.

Endpoints: ``POST /filter``, ``POST /prioritize`` (extender wire format, see ``wire.py``),
``GET /healthz`` (process up), ``GET /readyz`` (caches synced), ``GET /metrics`` (Prometheus),
``POST /explain`` (body: a v1.Pod; answer: ``explain.explain_decision`` for every known node).
A malformed body gets HTTP 400 with ``{"Error": "..."}``; an unexpected failure gets 500 with the
same shape and is logged; the server keeps serving either way.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from scheduler_extender.core.engine import Engine
from scheduler_extender.core.filter import NodeResult
from scheduler_extender.core.workload import WorkloadProfile, WorkloadTracker, demand_shape
from scheduler_extender.explain import explain_decision
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.sources import StateSource
from scheduler_extender.wire import ExtenderArgs, WireError, dumps, parse_extender_args

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 2**20
"""A NodeList of 15,000 nodes with inventory annotations is ~40 MiB; anything larger is refused."""


class ExtenderService:
    """The verbs, without HTTP. ``engine`` is swapped whole on a policy reload."""

    def __init__(self, engine: Engine, source: StateSource, metrics: ExtenderMetrics | None = None) -> None:
        self.engine = engine
        self.source = source
        self.metrics = metrics or ExtenderMetrics()
        # The target workload for the fragmentation score, learned from the pods /filter sees.
        self.workload = WorkloadTracker()
        self._workload_lock = threading.Lock()

    def _learn(self, job: Any, pod: Any) -> None:
        shape = demand_shape(job)
        if shape is None:
            return
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        uid = meta.get("uid") if isinstance(meta, dict) else None
        with self._workload_lock:
            self.workload.observe(shape, str(uid) if uid else None)

    def workload_profile(self) -> WorkloadProfile:
        """The learned target workload's current snapshot (immutable; empty until enough pods were seen)."""
        with self._workload_lock:
            return self.workload.profile()

    def _decide(self, args: ExtenderArgs) -> tuple[Engine, Any, list[str], list[NodeResult], list[Any]]:
        engine = self.engine  # one policy for the whole request
        names = args.node_names()
        states = self.source.states(names, args.Nodes.items if args.Nodes is not None else None)
        job = engine.job(args.Pod, self.namespace_labels_of(args.Pod))
        results = engine.filter(job, states, self.source.now())
        return engine, job, names, results, states

    def namespace_labels_of(self, pod: Any) -> Any:
        """Labels of the pod's namespace from the source (for policy tenants); None: unknown."""
        lookup = getattr(self.source, "namespace_labels", None)
        if lookup is None:
            return None
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        namespace = (meta.get("namespace") if isinstance(meta, dict) else None) or "default"
        return lookup(str(namespace))

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        engine, job, names, results, _ = self._decide(args)
        self._learn(job, args.Pod)
        passing = [r.node for r in results if r.passed]
        failed = {r.node: r.reason for r in results if not r.passed and not r.unresolvable}
        unresolvable = {r.node: r.reason for r in results if not r.passed and r.unresolvable}
        m = self.metrics
        if results and all(r.untouched for r in results):
            m.decisions.labels("not_gpu").inc()
        elif job.errors:
            m.decisions.labels("invalid").inc()
        else:
            m.decisions.labels("schedulable" if passing else "unschedulable").inc()
            if job.vram is not None:
                m.vram_estimate.observe(job.vram.bytes_per_gpu)
        for r in results:
            for rej in r.rejections:
                m.rejections.labels(rej.criterion).inc()
            if not r.passed and not r.untouched:
                m.quality.failed_nodes.labels("false" if r.unresolvable else "true").inc()
        if len(passing) == 1 and not job.errors and not results[0].untouched:
            # kube-scheduler skips prioritize when one node is feasible: this is the placement
            self._count_placement(job, next(r for r in results if r.passed))
        if not passing and results and not job.errors:
            log.info("pod %s fits no node: %s", job.req.key,
                     "; ".join(f"{r.node}: {r.reason}" for r in results[:5]) + (" ..." if len(results) > 5 else ""))
        body: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
        if args.NodeNames is not None:
            body["NodeNames"] = passing
            body["Nodes"] = None
        else:
            keep = set(passing)
            items = [n for n in (args.Nodes.items if args.Nodes else []) if (n.get("metadata") or {}).get("name") in keep]
            body["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "items": items}
            body["NodeNames"] = None
        return body

    def _count_placement(self, job: Any, result: NodeResult) -> None:
        """Count where the pod goes: by the chosen unit's catalog model and the pod's size class."""
        unit = result.chosen[0] if result.chosen else None
        model = unit.entry.id if unit is not None and unit.entry else "unknown"
        self.metrics.placements.labels(model, job.size_class.name).inc()
        if unit is not None:
            self._observe_fit(job, unit.memory_bytes)

    def _observe_fit(self, job: Any, granted_bytes: int) -> None:
        """Estimated versus granted VRAM of the best placement (dashboard: "VRAM estimate vs GPU size")."""
        q = self.metrics.quality
        q.granted_memory.labels(job.size_class.name).observe(granted_bytes)
        if job.vram is not None and granted_bytes > 0:
            q.placed_estimate.labels(job.size_class.name).observe(job.vram.bytes_per_gpu)
            q.vram_fit.labels(job.size_class.name).observe(job.vram.bytes_per_gpu / granted_bytes)

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        engine, job, names, results, states = self._decide(args)
        scores = engine.score(job, states, results, self.workload_profile())
        best = max(scores.values(), key=lambda s: (s.score, -s.cost_per_hour), default=None)
        if best is not None and best.score > 0:
            by_node = {r.node: r for r in results}
            self._count_placement(job, by_node[best.node])
        return [{"Host": n, "Score": scores[n].score if n in scores else 0} for n in names]


def parse_pod_body(body: bytes) -> dict[str, Any]:
    """The body of ``POST /explain``: one v1.Pod as JSON.

    Raises:
        WireError: not JSON, or not an object with ``metadata`` and ``spec`` mappings.
    """
    try:
        pod = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise WireError(f"POST /explain: body is not JSON: {e}") from None
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict) or not isinstance(pod.get("spec"), dict):
        raise WireError("POST /explain: expected a Pod object (JSON with metadata and spec mappings)")
    return pod


def explain_pod(service: ExtenderService, pod: dict[str, Any]) -> dict[str, Any]:
    """``POST /explain``: the decision for ``pod`` (a v1.Pod) over every node the source knows."""
    engine = service.engine
    names = service.source.node_names()
    decision = engine.decide(pod, service.source.states(names, None), service.source.now(),
                             service.namespace_labels_of(pod), workload=service.workload_profile())
    return explain_decision(decision, engine.policy)


def _error(status: int, message: str) -> Response:
    return Response(dumps({"Error": message}), status_code=status, media_type="application/json")


def create_app(service: ExtenderService) -> Starlette:
    """The Starlette application serving ``service``."""
    m = service.metrics

    def verb(name: str, fn: Any, parse: Any = parse_extender_args) -> Any:
        async def endpoint(request: Request) -> Response:
            start = time.perf_counter()
            code = 200
            try:
                body = await request.body()
                if len(body) > MAX_BODY_BYTES:
                    code = 413
                    return _error(413, f"request body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
                try:
                    args = parse(body)
                except WireError as e:
                    code = 400
                    return _error(400, str(e))
                try:
                    result = fn(args)
                except Exception as e:  # noqa: BLE001 - never take the server down for one pod
                    code = 500
                    log.exception("%s failed", name)
                    return _error(500, f"internal error in {name}: {type(e).__name__}: {e}")
                return Response(dumps(result), media_type="application/json")
            finally:
                m.requests.labels(name, str(code)).inc()
                m.request_duration.labels(name).observe(time.perf_counter() - start)
        return endpoint

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        ready = service.source.ready()
        m.cache_synced.set(1 if ready else 0)
        if ready:
            return PlainTextResponse("ok")
        return PlainTextResponse("cache not synced with the API server yet", status_code=503)

    async def metrics(request: Request) -> Response:
        m.cache_synced.set(1 if service.source.ready() else 0)
        rejected = getattr(service.source, "inventory_error_count", None)
        if rejected is not None:  # nodes whose inventory is invalid or contradicted by allocatable
            m.inventory_errors.set(rejected())
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    async def not_allowed(request: Request) -> Response:
        return JSONResponse({"Error": f"{request.method} {request.url.path}: use POST"}, status_code=405)

    return Starlette(routes=[
        Route("/filter", verb("filter", service.filter), methods=["POST"]),
        Route("/prioritize", verb("prioritize", service.prioritize), methods=["POST"]),
        Route("/explain", verb("explain", lambda pod: explain_pod(service, pod), parse_pod_body), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ])
