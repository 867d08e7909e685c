"""Extender HTTP benchmark: gpuplace-extender (static mode) against the floor, over generated clusters.

For each cluster size, both servers run as real uvicorn processes on loopback; concurrent
keep-alive clients (plain asyncio HTTP/1.1, so the client costs as little as possible on a shared
machine) POST ``/filter`` and ``/prioritize`` bodies as kube-scheduler would: with
``nodeCacheCapable: true`` (``NodeNames``) and ``false`` (a full ``NodeList`` whose Nodes carry
the ``gpuplace.io/inventory`` annotation). Every request is a different pod (own name, annotation
mix of ``benchmarks/cluster.py``), as in a burst of new pods. Reported per cell: p50/p99 latency
(client-side, request written to response read), requests/s, and the ratio of gpuplace's
p50/p99 to the floor's (``benchmarks/refserver.py``). Per size: the extender's peak RSS.

    python -m benchmarks.bench_extender                  # 100, 1000, 5000, 15000 nodes
    python -m benchmarks.bench_extender --sizes 100 --requests 20   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.cluster import POD_MIX, generate_cluster, generate_pods, pod, write_cluster
from benchmarks.common import (
    describe_machine, free_port, load_average, machine, peak_rss_mib, percentile, python, rss_mib, start_server,
    stop_server, write_results,
)
from node_agent.inventory import ANNOTATION

VERBS = ("filter", "prioritize")


MAX_BODY_BYTES = 64 * 2**20
"""``--max-body-bytes`` of the benchmarked extender: full NodeLists of 5,000 nodes are ~25 MiB,
over the default 16 MiB; the cells measure speed, not the limit."""


def node_object(doc: dict[str, Any]) -> dict[str, Any]:
    """A v1.Node as kube-scheduler sends it with nodeCacheCapable false (annotation carries the inventory)."""
    name = doc["nodeName"]
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                         "annotations": {ANNOTATION: json.dumps(doc, separators=(",", ":"))}},
            "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


async def _client(port: int, path: str, bodies: list[bytes], start: int, step: int, count: int,
                  latencies: list[tuple[int, float]], errors: list[str]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**26)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
    try:
        for i in range(start, count, step):
            body = bodies[i % len(bodies)]
            msg = head + b"Content-Length: %d\r\n\r\n" % len(body)
            t0 = time.perf_counter()
            writer.write(msg)
            writer.write(body)
            await writer.drain()
            header = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in header.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            data = await reader.readexactly(length)
            latencies.append((i, time.perf_counter() - t0))
            status = header.split(b" ", 2)[1]
            if status != b"200":
                errors.append(f"HTTP {status.decode()}: {data[:200]!r}")
    finally:
        writer.close()


def run_cell(port: int, path: str, bodies: list[bytes], requests: int, concurrency: int,
             firsts: set[int] | None = None) -> dict[str, Any]:
    """p50/p99 and requests/s of ``requests`` requests (bodies in turn) from ``concurrency``
    keep-alive clients. ``firsts``: indices of the requests that are the first of their pod spec
    (the rest repeat a spec already asked): their latencies are also reported apart."""
    timed: list[tuple[int, float]] = []
    errors: list[str] = []

    async def main() -> None:
        await asyncio.gather(*(_client(port, path, bodies, c, concurrency, requests, timed, errors)
                               for c in range(concurrency)))

    t0 = time.perf_counter()
    asyncio.run(main())
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{path}: {len(errors)} failed requests, first: {errors[0]}")
    latencies = [t for _, t in timed]
    out = {"requests": len(latencies), "p50_ms": percentile(latencies, 50) * 1e3,
           "p99_ms": percentile(latencies, 99) * 1e3, "requests_per_s": len(latencies) / wall}
    if firsts is not None:
        first = [t for i, t in timed if i in firsts]
        repeat = [t for i, t in timed if i not in firsts]
        out["first_of_spec"] = {"requests": len(first), "p50_ms": percentile(first, 50) * 1e3,
                                "max_ms": max(first, default=float("nan")) * 1e3}
        out["repeated_spec"] = {"requests": len(repeat), "p50_ms": percentile(repeat, 50) * 1e3,
                                "p99_ms": percentile(repeat, 99) * 1e3}
    return out


def first_of_spec(pods: list[dict[str, Any]]) -> set[int]:
    """Indices of the pods whose spec (namespace, annotations, containers) no earlier pod has:
    for those the extender decides every class of node; for the others it reuses that."""
    seen: set[bytes] = set()
    out: set[int] = set()
    for i, p in enumerate(pods):
        key = orjson.dumps([p["metadata"].get("namespace"), p["metadata"].get("annotations"), p["spec"]],
                           option=orjson.OPT_SORT_KEYS)
        if key not in seen:
            seen.add(key)
            out.add(i)
    return out


def _bodies(pods: list[dict[str, Any]], nodes_part: bytes, key: bytes) -> list[bytes]:
    # The big part is encoded once and spliced: client CPU is not what we measure.
    return [b'{"Pod":' + orjson.dumps(p) + b',"' + key + b'":' + nodes_part + b"}" for p in pods]


def requests_for(nodes: int, cache_capable: bool, budget: int) -> int:
    """Fewer requests where one is expensive (full NodeLists), so the whole run stays short."""
    if cache_capable:
        return budget
    return max(min(budget, 10), min(budget, budget * 500 // max(nodes, 1)))


def bench_size(nodes: int, args: argparse.Namespace, workdir: Path, log_dir: Path) -> dict[str, Any]:
    docs = generate_cluster(nodes)
    inv_dir = write_cluster(workdir / f"cluster-{nodes}", docs)
    names = [d["nodeName"] for d in docs]
    names_part = orjson.dumps(names)
    nodelist_part = orjson.dumps({"apiVersion": "v1", "kind": "NodeList", "items": [node_object(d) for d in docs]})
    del docs
    out: dict[str, Any] = {"nodes": nodes, "gpus": nodes * 8, "load_average": load_average(), "cells": []}

    ext_port, ref_port = free_port(), free_port()
    t0 = time.perf_counter()
    ext = start_server([python(), "-m", "scheduler_extender.cli", "--inventory-dir", str(inv_dir),
                        "--host", "127.0.0.1", "--port", str(ext_port), "--max-body-bytes", str(MAX_BODY_BYTES),
                        # every client's body at once (a NodeList of 5,000 nodes is ~14 MiB): the
                        # default bound of bodies in flight answers 503 to the fourth
                        "--max-inflight-body-bytes", str((args.concurrency + 1) * MAX_BODY_BYTES)],
                       ext_port, log_dir / f"extender-{nodes}.log")
    out["extender_startup_s"] = time.perf_counter() - t0
    out["extender_rss_after_load_mib"] = rss_mib(ext.pid)
    ref = start_server([python(), "-m", "benchmarks.refserver", "--port", str(ref_port)], ref_port,
                       log_dir / f"refserver-{nodes}.log")
    try:
        for cache_capable in (True, False):
            part, key = (names_part, b"NodeNames") if cache_capable else (nodelist_part, b"Nodes")
            if len(part) + 4096 > MAX_BODY_BYTES:
                out["cells"].append({"nodeCacheCapable": cache_capable, "skipped":
                                     f"body of {len(part) / 2**20:.0f} MiB exceeds the extender's "
                                     f"{MAX_BODY_BYTES // 2**20} MiB limit"})
                continue
            n = requests_for(nodes, cache_capable, args.requests)
            # Every pod once per verb, filter then prioritize, as kube-scheduler asks; fresh pods per
            # mode, so the engine's per-pod memory only helps where it would in a cluster.
            pods = generate_pods(n, namespace=f"bench-{str(cache_capable).lower()}")
            firsts = first_of_spec(pods)
            bodies = _bodies(pods, part, key)
            # Warm-up with one pod of each kind: first-touch imports, and the class keys of every
            # state for each resource asked (computed once per state and resource).
            warm = _bodies([pod(i, a, r, g, "warm-up") for i, (a, r, g, _) in enumerate(POD_MIX)], part, key)
            for verb in VERBS:
                path = f"/{verb}"
                run_cell(ext_port, path, warm, len(warm), 1)
                run_cell(ref_port, path, warm, len(warm), 1)
                ours = run_cell(ext_port, path, bodies, n, args.concurrency, firsts)
                floor = run_cell(ref_port, path, bodies, n, args.concurrency)
                cell = {"nodeCacheCapable": cache_capable, "verb": verb, "body_mib": len(bodies[0]) / 2**20,
                        "gpuplace": ours, "floor": floor,
                        "p50_ratio": ours["p50_ms"] / floor["p50_ms"], "p99_ratio": ours["p99_ms"] / floor["p99_ms"],
                        "load_average": load_average()}
                out["cells"].append(cell)
                print(f"  {nodes:>6} nodes  cache={str(cache_capable):5}  {verb:10} "
                      f"gpuplace p50 {ours['p50_ms']:8.2f} ms p99 {ours['p99_ms']:8.2f} ms {ours['requests_per_s']:7.1f} req/s | "
                      f"floor p50 {floor['p50_ms']:7.2f} p99 {floor['p99_ms']:7.2f} | "
                      f"ratio p50 {cell['p50_ratio']:4.1f}x p99 {cell['p99_ratio']:4.1f}x  (n={ours['requests']}, load {cell['load_average']})",
                      flush=True)
                first, repeat = ours["first_of_spec"], ours["repeated_spec"]
                print(f"  {'':>6}        {'':5}  {'':10} first request of a pod spec (n={first['requests']}): "
                      f"p50 {first['p50_ms']:.2f} ms, max {first['max_ms']:.2f} ms; the {repeat['requests']} others: "
                      f"p50 {repeat['p50_ms']:.2f} ms, p99 {repeat['p99_ms']:.2f} ms "
                      f"({repeat['p99_ms'] / floor['p99_ms']:.1f}x the floor's p99)", flush=True)
            del bodies
    finally:
        out["extender_peak_rss_mib"] = peak_rss_mib(ext.pid)
        out["floor_peak_rss_mib"] = peak_rss_mib(ref.pid)
        stop_server(ext)
        stop_server(ref)
    print(f"  {nodes:>6} nodes  extender: started in {out['extender_startup_s']:.1f} s, "
          f"RSS after load {out['extender_rss_after_load_mib']:.0f} MiB, peak {out['extender_peak_rss_mib']:.0f} MiB "
          f"(floor server peak {out['floor_peak_rss_mib']:.0f} MiB)", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="100,1000,5000,15000", help="comma list of node counts (8 GPUs each)")
    p.add_argument("--requests", type=int, default=200, help="requests per cell with NodeNames (default 200)")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent keep-alive clients (default 4)")
    p.add_argument("--out", type=Path, help="JSON results file (default benchmarks/results/extender.json)")
    args = p.parse_args(argv)
    m = machine()
    print("== extender HTTP benchmark (static mode) ==")
    print(describe_machine(m), flush=True)
    results: dict[str, Any] = {"benchmark": "extender", "machine": m, "concurrency": args.concurrency, "sizes": []}
    with tempfile.TemporaryDirectory(prefix="gpuplace-bench-") as tmp:
        log_dir = Path(tmp) / "logs"
        log_dir.mkdir()
        for size in [int(s) for s in args.sizes.split(",") if s]:
            results["sizes"].append(bench_size(size, args, Path(tmp), log_dir))
    path = write_results("extender", results, args.out)
    print(f"results: {path}")
    return results


if __name__ == "__main__":
    main()
