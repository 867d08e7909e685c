"""The header deadline and the connection cap, on a real uvicorn server on loopback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import uvicorn

from scheduler_extender.service.connections import bounded_http_protocol
from tests.harness.controlplane import free_port, wait_for

HEADER_TIMEOUT_SECONDS = 0.5
MAX_CONNECTIONS = 3


async def app(scope, receive, send):  # the smallest ASGI app: 200 "ok"
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def port() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                            http=bounded_http_protocol(HEADER_TIMEOUT_SECONDS, MAX_CONNECTIONS))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, message="uvicorn did not start")
    yield port
    server.should_exit = True
    thread.join(timeout=10)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def closed_by_server(sock: socket.socket) -> bool:
    """True when the server closed the connection (recv gives EOF) within the socket's timeout."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def get(sock: socket.socket) -> bytes:
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock.recv(1024)


def test_a_connection_that_never_finishes_its_headers_is_closed_after_the_deadline(port):
    with connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: the headers never end
        assert closed_by_server(sock)


def test_a_connection_that_sends_nothing_is_closed_after_the_deadline(port):
    with connect(port) as sock:
        assert closed_by_server(sock)


def test_a_keep_alive_connection_serves_requests_and_a_stalled_next_request_is_closed(port):
    with connect(port) as sock:
        assert get(sock).startswith(b"HTTP/1.1 200")
        assert get(sock).startswith(b"HTTP/1.1 200")  # the deadline was lifted for each full request
        sock.sendall(b"GET / HTTP/1.1\r\n")
        assert closed_by_server(sock)


def test_a_connection_beyond_the_cap_is_closed_at_once_and_the_others_are_served(port):
    held = [connect(port) for _ in range(MAX_CONNECTIONS)]
    try:
        with connect(port) as extra:
            extra.settimeout(HEADER_TIMEOUT_SECONDS / 5)  # well before the header deadline
            assert closed_by_server(extra)
        assert get(held[0]).startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize("timeout, cap", [(0, 10), (-1, 10), (1, 0)])
def test_a_deadline_that_is_not_positive_or_a_cap_below_one_is_refused(timeout, cap):
    with pytest.raises(ValueError):
        bounded_http_protocol(timeout, cap)
