"""No request blocks the others: decisions run on worker threads, the event loop stays free for
the health endpoints and for other requests (``server.create_app``), on a real uvicorn server."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator

import pytest
import uvicorn

from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.service.server import create_app
from scheduler_extender.cluster.sources import StaticSource
from tests.factories import EXAMPLES, pod
from tests.harness.controlplane import free_port, wait_for

NODES = sorted(p.stem for p in (EXAMPLES / "cluster").glob("*.json"))


class StuckService(ExtenderService):
    """``filter_response`` for pods named ``stuck`` waits until ``release`` is set: a stand-in for
    any decision that takes long, without timing anything."""

    def __init__(self) -> None:
        super().__init__(Engine(), StaticSource(EXAMPLES / "cluster", default_catalog()))
        self.entered = threading.Event()
        self.release = threading.Event()

    def filter_response(self, args):  # type: ignore[override]
        if args.Pod.name == "stuck":
            self.entered.set()
            assert self.release.wait(60), "the test never released the stuck request"
        return super().filter_response(args)


@pytest.fixture
def served() -> Iterator[tuple[StuckService, int]]:
    service = StuckService()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service, decision_threads=2), host="127.0.0.1", port=port,
                                          log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, message="uvicorn did not start")
    yield service, port
    service.release.set()
    server.should_exit = True
    thread.join(timeout=10)


def request(port: int, method: str, path: str, body: dict | None = None, timeout: float = 10) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def filter_body(name: str) -> dict:
    return {"Pod": pod({"gpuplace.io/vram": "20Gi"}, name=name), "NodeNames": NODES}


def test_health_endpoints_and_other_pods_are_answered_while_one_request_is_being_decided(served):
    service, port = served
    stuck: dict[str, tuple[int, bytes]] = {}
    t = threading.Thread(target=lambda: stuck.setdefault("r", request(port, "POST", "/filter", filter_body("stuck"),
                                                                      timeout=60)))
    t.start()
    assert service.entered.wait(10), "the stuck request never reached the decision"

    assert request(port, "GET", "/healthz") == (200, b"ok")
    assert request(port, "GET", "/readyz") == (200, b"ok")
    assert request(port, "GET", "/metrics")[0] == 200
    status, body = request(port, "POST", "/filter", filter_body("other"))
    assert status == 200 and json.loads(body)["NodeNames"]
    assert "r" not in stuck  # all of that while the first request was still being decided

    service.release.set()
    t.join(30)
    status, body = stuck["r"]
    assert status == 200 and json.loads(body)["NodeNames"]


def test_requests_beyond_the_decision_threads_wait_without_holding_up_the_health_endpoints(served):
    service, port = served
    answers: list[tuple[int, bytes]] = []
    threads = [threading.Thread(target=lambda: answers.append(request(port, "POST", "/filter", filter_body("stuck"),
                                                                        timeout=60))) for _ in range(4)]
    for t in threads:  # four stuck requests on two threads: two decide, two wait for a thread
        t.start()
    assert service.entered.wait(10)
    assert request(port, "GET", "/healthz") == (200, b"ok")
    service.release.set()
    for t in threads:
        t.join(30)
    assert [s for s, _ in answers] == [200] * 4


def test_fewer_than_one_decision_thread_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        create_app(StuckService(), decision_threads=0)


def _chunked_post(port: int, megabytes: int) -> int:
    """POST /filter with a chunked body of ``megabytes`` MiB; the status, or 413 assumed when the
    server closed mid-upload after answering (read what it answered if we can)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    chunk = b"x" * 2**20
    sent = 0
    try:
        conn.putrequest("POST", "/filter")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        try:
            for _ in range(megabytes):
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += 1
            conn.send(b"0\r\n\r\n")
        except OSError:
            pass  # refused while we were still sending
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def test_a_chunked_30_mb_body_and_a_declared_100_mb_one_are_refused_413_and_the_server_goes_on(served):
    _, port = served
    assert _chunked_post(port, 30) == 413
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("POST", "/filter")
        conn.putheader("Content-Length", str(100 * 10**6))
        conn.endheaders()  # and not one byte of the body
        r = conn.getresponse()
        assert r.status == 413 and b"exceeds" in r.read()
    finally:
        conn.close()
    status, body = request(port, "POST", "/filter", filter_body("after"))
    assert status == 200 and json.loads(body)["NodeNames"]


def test_bodies_beyond_the_in_flight_budget_are_answered_503_and_the_budget_is_given_back():
    service = StuckService()
    port = free_port()
    body = json.dumps(filter_body("stuck")).encode()
    # Room for two stuck bodies at once, not three.
    app = create_app(service, decision_threads=4, max_body_bytes=len(body), max_inflight_body_bytes=2 * len(body) + 10)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, message="uvicorn did not start")
    try:
        answers: list[tuple[int, bytes]] = []
        stuck = [threading.Thread(target=lambda: answers.append(request(port, "POST", "/filter", filter_body("stuck"),
                                                                          timeout=60))) for _ in range(2)]
        for t in stuck:
            t.start()
        wait_for(lambda: service.entered.is_set(), 10, message="no stuck request reached the decision")
        wait_for(lambda: request(port, "POST", "/filter", filter_body("stuck"))[0] == 503, 10,
                 message="a third body was not refused while two filled the budget")
        status, text = request(port, "POST", "/filter", filter_body("stuck"))
        assert status == 503 and b"busy" in text
        assert request(port, "GET", "/healthz") == (200, b"ok")
        service.release.set()
        for t in stuck:
            t.join(30)
        assert [s for s, _ in answers] == [200, 200]
        # Both bodies given back: the next ones pass again.
        for _ in range(3):
            assert request(port, "POST", "/filter", filter_body("other"))[0] == 200
    finally:
        service.release.set()
        server.should_exit = True
        thread.join(timeout=10)


def test_an_in_flight_budget_smaller_than_one_body_is_refused():
    with pytest.raises(ValueError, match="max in-flight body bytes"):
        create_app(StuckService(), max_body_bytes=100, max_inflight_body_bytes=99)
