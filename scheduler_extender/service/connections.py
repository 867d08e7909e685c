"""Connection limits the HTTP server lacks: a deadline for each request's headers, and a cap on
open connections.

uvicorn closes a keep-alive connection that stays idle between requests, but not one that never
finishes its request headers: each such connection (slowloris) holds a file descriptor for ever, and
about 20,000 of them exhausted the extender's descriptors, so that ``/healthz`` went silent. Here the
HTTP protocol (uvicorn's httptools one, which the extender runs) gets

* a **header deadline**: from a connection's start, and from the first byte of each later request
  on it, the request line and headers must arrive within ``header_timeout_seconds``, else the
  connection is closed (what nginx's ``client_header_timeout`` does, default 60 s);
* a **connection cap**: a connection beyond ``max_connections`` open ones is closed at once, before
  it holds anything but its descriptor.

kube-scheduler keeps a few keep-alive connections per extender URL, and probes and Prometheus open
one each, so the defaults (:data:`DEFAULT_HEADER_TIMEOUT_SECONDS`, :data:`DEFAULT_MAX_CONNECTIONS`)
leave them far from either limit.
"""

from __future__ import annotations

import asyncio
from typing import Any

DEFAULT_HEADER_TIMEOUT_SECONDS = 10.0
DEFAULT_MAX_CONNECTIONS = 512


def bounded_http_protocol(header_timeout_seconds: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's httptools HTTP protocol with a header deadline and a connection cap (module doc);
    pass it as ``uvicorn.Config(http=...)``.

    Raises:
        ValueError: a deadline that is not positive, or a cap below 1.
    """
    if not header_timeout_seconds > 0:
        raise ValueError(f"header timeout must be positive, got {header_timeout_seconds}")
    if max_connections < 1:
        raise ValueError(f"max connections must be at least 1, got {max_connections}")
    # Imported here: `gpuplace-extender --help` and the decision core need no HTTP server.
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()  # connection_lost forgets it
                return
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()  # a later request on a keep-alive connection

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_deadline is None:
                self._header_deadline = self.loop.call_later(header_timeout_seconds, self._expire)

        def _disarm(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _expire(self) -> None:
            self._header_deadline = None
            self.transport.close()

    return BoundedHttpToolsProtocol
