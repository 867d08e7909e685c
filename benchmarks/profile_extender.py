"""Profile filter and prioritize in-process (no HTTP) with pyinstrument, over a generated cluster.

Builds the static-mode service over N generated nodes and runs R requests (each a different pod)
through the same code the HTTP endpoints run (``parse_extender_args`` -> verb -> ``dumps``);
prints pyinstrument's call tree and the mean time per request, and writes an HTML profile.

    python -m benchmarks.profile_extender --nodes 5000 --requests 200
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import orjson

from benchmarks.cluster import generate_cluster, generate_pods, write_cluster
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.cluster.sources import StaticSource
from scheduler_extender.service.wire import parse_extender_args


def static_service(nodes: int) -> tuple[ExtenderService, list[str]]:
    """A static-mode ``ExtenderService`` over ``nodes`` generated nodes, and their names."""
    with tempfile.TemporaryDirectory() as tmp:
        docs = generate_cluster(nodes)
        source = StaticSource(write_cluster(Path(tmp), docs), default_catalog())
    return ExtenderService(Engine(), source), [d["nodeName"] for d in docs]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--html", type=Path, default=Path("benchmarks/results/profile-extender.html"))
    args = p.parse_args(argv)
    from pyinstrument import Profiler  # bench extra

    service, names = static_service(args.nodes)
    def run(namespace: str) -> float:
        # New pods every run, as in a burst: the engine remembers verdicts per pod (filter, then prioritize).
        bodies = [orjson.dumps({"Pod": pod, "NodeNames": names})
                  for pod in generate_pods(args.requests, namespace=namespace)]
        t = time.perf_counter()
        for body in bodies:
            args_ = parse_extender_args(body)
            service.filter_response(args_)
            service.prioritize_response(args_)
        return (time.perf_counter() - t) / len(bodies)

    run("warm-up")  # per-state equivalence keys are computed on first use
    unprofiled = run("measured")
    profiler = Profiler(interval=0.0005)
    with profiler:
        run("profiled")
    print(profiler.output_text(unicode=True, color=False, show_all=False))
    args.html.parent.mkdir(parents=True, exist_ok=True)
    args.html.write_text(profiler.output_html(), encoding="utf-8")
    print(f"{args.nodes} nodes: filter + prioritize {unprofiled * 1e3:.2f} ms per pod (unprofiled); profile: {args.html}")


if __name__ == "__main__":
    main()
