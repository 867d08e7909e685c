"""A small TCP proxy for fault tests: a Service in front of extender replicas, or a flaky link.

Two uses in the fault tests:

* **Service**: kube-scheduler has one ``urlPrefix`` per extender; in a cluster it names a Service
  whose ready endpoints are the extender replicas (readinessProbe on ``/readyz``). The proxy
  does the same on loopback: new connections go round-robin (or, with ``session_affinity``, to
  the backend the client last used, as the chart's ``sessionAffinity: ClientIP``) to the backends whose ``ready``
  check last passed (polled every ``check_interval`` seconds, like a kubelet's probe), and a
  connection arriving while none is ready is closed at once (a Service without endpoints).
  The readiness history it records is what the tests read to see ``/readyz`` go false.
* **Link**: between the extender and kube-apiserver, :meth:`drop_connections` cuts every open
  connection, as a restarted load balancer or a NAT timeout does to a long watch.

Bytes pass through unchanged, so TLS is end to end (the apiserver's certificate names 127.0.0.1).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tests.harness.controlplane import free_port


@dataclass
class Backend:
    host: str
    port: int
    ready_check: Callable[[], bool] | None = None
    ready: bool = True


class TCPProxy:
    """Listens on ``127.0.0.1:port`` and forwards to ``backends`` (see module docstring)."""

    def __init__(self, backends: Sequence[tuple[str, int]], *, ready_checks: Sequence[Callable[[], bool]] | None = None,
                 check_interval: float = 0.5, session_affinity: bool = False) -> None:
        """``session_affinity``: as a Service with ``sessionAffinity: ClientIP`` (the chart's) for
        its one client, kube-scheduler: every connection goes to the backend the last one went to
        while it is ready, else to the next ready one, which it then sticks to (kube-proxy)."""
        self.session_affinity = session_affinity
        self._sticky: Backend | None = None
        checks = list(ready_checks) if ready_checks is not None else [None] * len(backends)
        self.backends = [Backend(h, p, c, ready=c is None) for (h, p), c in zip(backends, checks)]
        self.port = free_port()
        self.check_interval = check_interval
        #: (monotonic time, backend index, ready) each time a backend's readiness changes.
        self.readiness_log: list[tuple[float, int, bool]] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._read_done: set[socket.socket] = set()
        self._next = 0
        self.refused = 0

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> TCPProxy:
        threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True).start()
        if any(b.ready_check for b in self.backends):
            self._probe_all()
            threading.Thread(target=self._probe_loop, name="proxy-probe", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.drop_connections()

    def __enter__(self) -> TCPProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults ---------------------------------------------------------------------------
    def drop_connections(self) -> int:
        """Cut every open connection, both sides, mid-stream; returns how many sockets were closed."""
        with self._lock:
            conns, self._conns = self._conns, set()
            self._read_done.clear()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked in recv(); close() alone would not
            with contextlib.suppress(OSError):
                s.close()
        return len(conns)

    # -- internals ------------------------------------------------------------------------
    def _probe_all(self) -> None:
        for i, b in enumerate(self.backends):
            if b.ready_check is None:
                continue
            try:
                ok = bool(b.ready_check())
            except Exception:  # noqa: BLE001 - a probe that errors is a failed probe
                ok = False
            if ok != b.ready or not any(e[1] == i for e in self.readiness_log):
                self.readiness_log.append((time.monotonic(), i, ok))
            b.ready = ok

    def _probe_loop(self) -> None:
        while not self._stop.wait(self.check_interval):
            self._probe_all()

    def _pick(self) -> Backend | None:
        with self._lock:
            ready = [b for b in self.backends if b.ready]
            if not ready:
                return None
            if self.session_affinity and self._sticky is not None and self._sticky.ready:
                return self._sticky
            self._next += 1
            self._sticky = ready[self._next % len(ready)]
            return self._sticky

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            backend = self._pick()
            if backend is None:
                self.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection((backend.host, backend.port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                self.refused += 1
                client.close()
                continue
            with self._lock:
                self._conns.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)  # pass the half-close on
        # The pair is closed by whichever of its two pumps ends second.
        with self._lock:
            if dst in self._read_done:
                self._read_done.discard(dst)
                self._conns.discard(src)
                self._conns.discard(dst)
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.close()
            else:
                self._read_done.add(src)
