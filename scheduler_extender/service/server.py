"""HTTP layer: kube-scheduler's extender verbs on Starlette, around ``ExtenderService``
(``service.decisions``, the decisions without HTTP).

Endpoints: ``POST /filter``, ``POST /prioritize``, ``POST /preempt`` (extender wire format, see ``wire.py``),
``GET /healthz`` (process up), ``GET /readyz`` (caches synced), ``GET /metrics`` (Prometheus),
``POST /explain`` (body: a v1.Pod; answer: ``explain.explain_decision`` for every known node).
``GET /debug/allocations`` (read-only: per node, the GPUs the extender believes free and held, and
by which pods; for operators comparing the extender's view with the API server's), served only
with ``debug_endpoints`` (``--debug-endpoints``): it lists every tenant's pods to whoever can reach
the port.
A malformed body gets HTTP 400 with ``{"Error": "..."}``; an unexpected failure gets 500 with the
same shape and is logged; the server keeps serving either way.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from scheduler_extender.core.pod import Pod, PodShapeError, as_pod
from scheduler_extender.service.decisions import ExtenderService, explain_pod
from scheduler_extender.service.wire import WireError, dumps, parse_extender_args, parse_preemption_args

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 2**20
"""Default limit of a request body (``--max-body-bytes``). With ``nodeCacheCapable: true`` (the
chart's) a body is a pod (at most ~1.5 MiB, etcd's object limit) and node names (15,000 names of
at most 253 characters: under 4 MiB); a full NodeList (``nodeCacheCapable: false``) is ~2.7 kB per
node with its inventory, so clusters beyond ~5,000 nodes in that mode need a higher limit."""

MAX_INFLIGHT_BODY_BYTES = 64 * 2**20
"""Default bound on the request bodies held at once, being read or waiting for or in a decision,
summed over every connection (``--max-inflight-body-bytes``): without it, 512 connections each
sending a body just under the limit would hold 8 GiB."""

DEFAULT_DECISION_THREADS = 4
"""Worker threads deciding requests (``create_app``). Decisions hold the GIL, so more threads add
no throughput; a few let a short request pass a long one, and requests beyond them wait for a
thread without holding up the event loop."""


def parse_pod_body(body: bytes) -> Pod:
    """The body of ``POST /explain``: one v1.Pod as JSON, as the decision's ``core.pod.Pod``.

    Raises:
        WireError: not JSON, not an object with ``metadata`` and ``spec`` mappings, or a field the
            extender reads of the wrong type (the message names it).
    """
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise WireError(f"POST /explain: body is not JSON: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict) or not isinstance(obj.get("spec"), dict):
        raise WireError("POST /explain: expected a Pod object (JSON with metadata and spec mappings)")
    try:
        return as_pod(obj)
    except PodShapeError as e:
        raise WireError(f"POST /explain: {e}") from None


class BodyBudget:
    """Bytes of request bodies held at once across all requests (``MAX_INFLIGHT_BODY_BYTES``).
    Used from the event loop only (``read_body`` and the endpoint that gives the bytes back), so
    it needs no lock."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes; False (nothing held) when that would exceed the bound."""
        if self.used + n > self.max_bytes:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


class ServerBusy(Exception):
    """The bodies in flight already fill the :class:`BodyBudget`: answered 503, to be retried."""


class BodyTooLarge(Exception):
    """A request body over the limit (``create_app``'s ``max_body_bytes``), by its Content-Length
    or as it streams in."""


async def read_body(request: Request, limit: int, budget: BodyBudget | None = None) -> bytes:
    """The request body, refused as soon as it is known to exceed ``limit`` bytes: at once when its
    Content-Length says so, else when the chunks read so far do, so at most ``limit`` bytes (plus one
    chunk) are ever held, whatever a client sends. With a ``budget``, the body's bytes are taken
    from it as they arrive and stay taken when it is returned (the caller gives ``len(body)`` back
    once done with it); on any error they are given back here.

    Raises:
        BodyTooLarge: with the size seen so far.
        ServerBusy: the budget cannot hold this body's next chunk.
        starlette.requests.ClientDisconnect: the client went away mid-upload.
    """
    declared = request.headers.get("content-length", "")
    # More than 18 digits is over any limit (and int() of thousands of digits is slow).
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise BodyTooLarge(f"request body of {declared[:20]} bytes exceeds {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            if size + len(chunk) > limit:
                raise BodyTooLarge(f"request body of more than {limit} bytes (at least {size + len(chunk)} sent)")
            if budget is not None and not budget.take(len(chunk)):
                raise ServerBusy(f"extender busy: request bodies in flight would exceed {budget.max_bytes} bytes; "
                                 "retry shortly")
            size += len(chunk)  # taken from the budget
            chunks.append(chunk)
    except BaseException:
        if budget is not None:
            budget.give(size)
        raise
    return b"".join(chunks)


def _error(status: int, message: str) -> Response:
    return Response(dumps({"Error": message}), status_code=status, media_type="application/json")


def create_app(service: ExtenderService, *, debug_endpoints: bool = False,
               decision_threads: int = DEFAULT_DECISION_THREADS, max_body_bytes: int = MAX_BODY_BYTES,
               max_inflight_body_bytes: int = MAX_INFLIGHT_BODY_BYTES) -> Starlette:
    """The Starlette application serving ``service``; ``GET /debug/allocations`` only with
    ``debug_endpoints`` (404 otherwise, like any unknown path).

    No request blocks the others: the event loop only reads bodies (streamed, refused past
    ``max_body_bytes``) and writes answers; parsing and deciding run on at most
    ``decision_threads`` worker threads, so ``/healthz``, ``/readyz``, ``/metrics`` and the next
    request's body are served while a large request is decided. A body over ``max_body_bytes`` is
    answered 413 as soon as that is known, never buffered whole (``read_body``); bodies held at once,
    over all connections, are bounded by ``max_inflight_body_bytes`` (beyond it: 503 with
    ``Retry-After``, which kube-scheduler reports as an extender error and retries the pod). The
    interpreter hands the GIL between threads every ``sys.getswitchinterval()`` (5 ms), so the loop
    waits at most about that per step, whatever a worker decides. Each decision is itself linear in the request's size (the
    parsers are linear, ``core.quantity``; values are capped, ``core.requirements``), so a
    request's cost is bounded by its size.

    Raises:
        ValueError: ``decision_threads`` below 1, ``max_body_bytes`` below 1, or
            ``max_inflight_body_bytes`` below ``max_body_bytes`` (a largest body could never pass).
    """
    if decision_threads < 1:
        raise ValueError(f"decision threads must be at least 1, got {decision_threads}")
    if max_body_bytes < 1:
        raise ValueError(f"max body bytes must be at least 1, got {max_body_bytes}")
    if max_inflight_body_bytes < max_body_bytes:
        raise ValueError(f"max in-flight body bytes ({max_inflight_body_bytes}) must be at least the max body "
                         f"bytes ({max_body_bytes})")
    m = service.metrics
    limiters: list[anyio.CapacityLimiter] = []

    def limiter() -> anyio.CapacityLimiter:
        # Made in the event loop, on first use: anyio 4.0 (the declared floor) refuses to make one
        # outside an async context (sniffio's "unknown async library"), and the app is built before.
        if not limiters:
            limiters.append(anyio.CapacityLimiter(decision_threads))
        return limiters[0]
    budget = BodyBudget(max_inflight_body_bytes)

    def decide(name: str, fn: Any, parse: Any, body: bytes) -> tuple[int, bytes]:
        """(status, JSON body) of one verb; runs on a worker thread."""
        try:
            args = parse(body)
        except WireError as e:
            return 400, dumps({"Error": str(e)})
        try:
            result = fn(args)
        except Exception as e:  # noqa: BLE001 - never take the server down for one pod
            log.exception("%s failed", name)
            return 500, dumps({"Error": f"internal error in {name}: {type(e).__name__}: {e}"})
        return 200, result if isinstance(result, bytes) else dumps(result)

    def verb(name: str, fn: Any, parse: Any = parse_extender_args) -> Any:
        async def endpoint(request: Request) -> Response:
            start = time.perf_counter()
            code = 200
            try:
                try:
                    body = await read_body(request, max_body_bytes, budget)
                except BodyTooLarge as e:
                    code = 413
                    return _error(413, str(e))
                except ServerBusy as e:
                    code = 503
                    return Response(dumps({"Error": str(e)}), status_code=503, media_type="application/json",
                                    headers={"Retry-After": "1"})
                except ClientDisconnect:
                    # An aborted upload is nobody's error to answer: counted, not logged as a crash.
                    code = 499
                    return _error(499, "client disconnected before sending the whole body")
                try:
                    code, answer = await anyio.to_thread.run_sync(decide, name, fn, parse, body, limiter=limiter())
                finally:
                    budget.give(len(body))
                return Response(answer, status_code=code, media_type="application/json")
            finally:
                m.requests.labels(name, str(code)).inc()
                m.request_duration.labels(name).observe(time.perf_counter() - start)
        return endpoint

    async def debug_allocations(request: Request) -> Response:
        body = await anyio.to_thread.run_sync(lambda: dumps(service.source.allocations()), limiter=limiter())
        return Response(body, media_type="application/json")

    return Starlette(routes=[
        Route("/filter", verb("filter", service.filter_response), methods=["POST"]),
        Route("/prioritize", verb("prioritize", service.prioritize_response), methods=["POST"]),
        Route("/preempt", verb("preempt", service.preempt_response, parse_preemption_args), methods=["POST"]),
        Route("/explain", verb("explain", lambda pod: explain_pod(service, pod), parse_pod_body), methods=["POST"]),
        *_health_routes(service),
        *([Route("/debug/allocations", debug_allocations, methods=["GET"])] if debug_endpoints else []),
    ])


def create_webhook_app(webhook: Any, *, max_body_bytes: int = MAX_BODY_BYTES) -> Starlette:
    """``POST /mutate/resourceclaims`` and ``POST /mutate/pods`` (``service.claim_webhook.ClaimWebhook``'s
    ``respond`` and ``respond_pod``) and ``GET /healthz``: served on ``--claim-webhook-port``, over
    TLS without a client certificate (kube-apiserver presents none). A body that is not an
    AdmissionReview gets HTTP 400 with the reason; the answer is decided on a worker thread, as
    the verbs are."""
    def mutate(respond: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            try:
                body = await read_body(request, max_body_bytes)
            except BodyTooLarge as e:
                return _error(413, str(e))
            except ClientDisconnect:
                return _error(499, "client disconnected before sending the whole body")

            def answer() -> tuple[int, bytes]:
                try:
                    return 200, respond(body)
                except ValueError as e:  # service.claim_webhook.WebhookError
                    return 400, dumps({"Error": str(e)})
            code, payload = await anyio.to_thread.run_sync(answer)
            return Response(payload, status_code=code, media_type="application/json")
        return endpoint

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/mutate/resourceclaims", mutate(webhook.respond), methods=["POST"]),
                             Route("/mutate/pods", mutate(webhook.respond_pod), methods=["POST"]),
                             Route("/healthz", healthz, methods=["GET"])])


def create_health_app(service: ExtenderService) -> Starlette:
    """Only ``GET /healthz``, ``/readyz`` and ``/metrics`` of ``service``: served over plain HTTP
    on ``--health-port`` for kubelet probes and Prometheus, which present no client certificate
    when the main port requires one."""
    return Starlette(routes=_health_routes(service))


def _health_routes(service: ExtenderService) -> list[Route]:
    m = service.metrics

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

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
