"""``make soak``: hostile traffic against the real extender for minutes; its RSS over time.

Starts ``gpuplace-extender`` in static mode on the example cluster and sends, from a few client
threads, a mix of what issue 15's attacks sent, each request different from the last:

* ``distinct``: an ordinary GPU pod whose spec is new every time (another VRAM, another name);
* ``giant``: a pod carrying a new 1 MiB annotation outside ``gpuplace.io/`` (left alone, never
  kept);
* ``strangers``: the cluster's nodes and 2,000 node names no cluster has, new every time;
* ``forged-nodes``: full Node objects with an inventory annotation never seen before;
* ``pathological``: ``gpuplace.io/vram`` of 8,000 digits and an ``x``;
* ``oversized``: a 100 MB Content-Length and a chunked 30 MB upload (refused 413 while streaming).

Every ``--interval`` seconds it prints the extender's RSS (``VmRSS``), its peak (``VmHWM``), the
requests answered since, and the slowest ``/healthz`` seen meanwhile, then the RSS growth after
the first interval (warm-up: imports, the index, the first memos). Memos are bounded in entries and
bytes (``scheduler_extender/served/memo.py``), so after warm-up the RSS should stay flat; the numbers are
printed, not asserted (docs/testing.md#hostile-input).

    python -m benchmarks.soak_extender --seconds 180 --interval 10
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import describe_machine, free_port, machine, peak_rss_mib, python, rss_mib, start_server, stop_server
from tests.factories import EXAMPLES, example_inventory, pod

NODES = sorted(p.stem for p in (EXAMPLES / "cluster").glob("*.json"))
KINDS = ("distinct", "giant", "strangers", "forged-nodes", "pathological", "oversized")


def _post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def _chunked_upload(port: int, megabytes: int) -> int:
    """A chunked body of ``megabytes`` MiB (no Content-Length): refused while it streams."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    chunk = b"x" * 2**20
    try:
        conn.putrequest("POST", "/filter")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        try:
            for _ in range(megabytes):
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered 413 and closed while we were still sending
        try:
            r = conn.getresponse()
            r.read()
            return r.status
        except (OSError, http.client.HTTPException):
            return 413
    finally:
        conn.close()


def _request(kind: str, n: int, port: int) -> int:
    if kind == "oversized":
        return _declared_too_large(port) if n % 2 else _chunked_upload(port, 30)
    p = pod({"gpuplace.io/vram": f"{1 + n % 70_000 / 1000:.3f}Gi"}, name=f"{kind}-{n}")
    body: dict[str, Any] = {"Pod": p, "NodeNames": NODES}
    if kind == "giant":
        p["metadata"]["annotations"]["example.com/blob"] = f"{n}:" + "x" * 2**20
    elif kind == "strangers":
        body["NodeNames"] = NODES + [f"stranger-{n}-{i}" for i in range(2000)]
    elif kind == "pathological":
        p["metadata"]["annotations"]["gpuplace.io/vram"] = "1" * 8000 + "x"
    elif kind == "forged-nodes":
        inv = example_inventory("gpu-4090-0")
        inv["nodeName"] = name = f"forged-{n}"
        inv["gpus"][0]["memoryMiB"] = 20_000 + n % 4000
        body = {"Pod": p, "Nodes": {"items": [{"metadata": {"name": name, "annotations": {
            "gpuplace.io/inventory": json.dumps(inv)}}}]}}
    verb = "/prioritize" if n % 3 == 0 else "/filter"
    return _post(port, verb, json.dumps(body).encode())


def _declared_too_large(port: int) -> int:
    """A request declaring a 100 MB body and sending none of it: refused from its Content-Length."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.putrequest("POST", "/filter")
        conn.putheader("Content-Length", str(100 * 10**6))
        conn.endheaders()
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def _healthz_seconds(port: int) -> float:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/healthz")
        conn.getresponse().read()
    finally:
        conn.close()
    return time.perf_counter() - start


def run(seconds: float, interval: float, clients: int = 2, out: Callable[[str], None] = print,
        kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    """Soak the extender for ``seconds``; one row per ``interval``. Returns the rows and totals."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_server([python(), "-m", "scheduler_extender.cli", "--inventory-dir", str(EXAMPLES / "cluster"),
                             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                            port, Path(tmp) / "extender.log")
        try:
            return _soak(proc.pid, port, seconds, interval, clients, out, kinds)
        finally:
            stop_server(proc)


def _soak(pid: int, port: int, seconds: float, interval: float, clients: int, out: Callable[[str], None],
          kinds: tuple[str, ...]) -> dict[str, Any]:
    counter = itertools.count()
    done = threading.Event()
    lock = threading.Lock()
    answered: dict[int, int] = {}
    errors: list[str] = []

    def client() -> None:
        while not done.is_set():
            n = next(counter)
            kind = kinds[n % len(kinds)]
            try:
                status = _request(kind, n, port)
            except OSError as e:
                errors.append(f"{kind}: {e}")
                continue
            with lock:
                answered[status] = answered.get(status, 0) + 1

    out(describe_machine(machine()))
    out(f"soak: {clients} clients, {seconds:g} s, request kinds in turn: {', '.join(kinds)}")
    out(f"{'t (s)':>7} {'RSS MiB':>8} {'peak MiB':>9} {'answers':>8} {'slowest /healthz ms':>20}")
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    rows = []
    start = time.monotonic()
    last_total = 0
    while (elapsed := time.monotonic() - start) < seconds:
        slowest = 0.0
        tick = time.monotonic()
        while time.monotonic() - tick < interval:
            slowest = max(slowest, _healthz_seconds(port))
            time.sleep(0.2)
        with lock:
            total = sum(answered.values())
        row = {"t_seconds": round(time.monotonic() - start, 1), "rss_mib": rss_mib(pid), "peak_rss_mib": peak_rss_mib(pid),
               "answers": total - last_total, "slowest_healthz_seconds": slowest}
        last_total = total
        rows.append(row)
        out(f"{row['t_seconds']:7.1f} {row['rss_mib']:8.1f} {row['peak_rss_mib']:9.1f} {row['answers']:8d} "
            f"{slowest * 1000:20.1f}")
    done.set()
    for t in threads:
        t.join(120)
    growth = rows[-1]["rss_mib"] - rows[0]["rss_mib"] if rows else 0.0
    out(f"answers by status: {dict(sorted(answered.items()))}; client errors: {len(errors)}")
    if rows:
        out(f"RSS after the first interval {rows[0]['rss_mib']:.1f} MiB, at the end {rows[-1]['rss_mib']:.1f} MiB "
            f"({growth:+.1f} MiB over {rows[-1]['t_seconds'] - rows[0]['t_seconds']:.0f} s)")
    return {"rows": rows, "answers_by_status": answered, "client_errors": errors, "rss_growth_mib": growth}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak_extender", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=180, help="how long to soak (default: 180)")
    p.add_argument("--interval", type=float, default=10, help="seconds between RSS rows (default: 10)")
    p.add_argument("--clients", type=int, default=2, help="client threads (default: 2)")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"comma-separated request kinds to send in turn (default: all: {','.join(KINDS)})")
    args = p.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        p.error(f"--kinds {args.kinds}: unknown kinds {unknown}; choose from {','.join(KINDS)}")
    run(args.seconds, args.interval, args.clients, kinds=kinds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
