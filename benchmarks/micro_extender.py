"""In-process timing of ``filter`` over a static cluster, split into each pod spec's first request
and the requests after it (the same spec again, a different pod name), without HTTP.

``bench_extender`` measures the same through HTTP; this separates the two populations whose mix
makes its p50 and p99, on a machine where HTTP timings are noisy.

    python -m benchmarks.micro_extender --nodes 5000 --requests 300
"""

from __future__ import annotations

import argparse
import time

import orjson

from benchmarks.cluster import generate_pods
from benchmarks.common import percentile
from benchmarks.profile_extender import static_service
from scheduler_extender.wire import parse_extender_args


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--verb", choices=("filter", "prioritize"), default="filter")
    args = p.parse_args(argv)
    service, names = static_service(args.nodes)
    bodies = [orjson.dumps({"Pod": pod, "NodeNames": names}) for pod in generate_pods(args.requests)]
    verb = service.filter_response if args.verb == "filter" else service.prioritize_response
    seen: set[bytes] = set()
    first: list[float] = []
    repeat: list[float] = []
    for body in bodies:
        t = time.perf_counter()
        parsed = parse_extender_args(body)
        verb(parsed)
        elapsed = time.perf_counter() - t
        spec = orjson.dumps([parsed.Pod["metadata"].get("annotations"), parsed.Pod["spec"]], option=orjson.OPT_SORT_KEYS)
        (repeat if spec in seen else first).append(elapsed)
        seen.add(spec)
    for label, values in (("first of its spec", first), ("repeated spec", repeat), ("all", first + repeat)):
        if values:
            print(f"{args.nodes} nodes {args.verb} {label:>17}: n={len(values):4d} p50 {percentile(values, 50) * 1e3:6.2f} ms "
                  f"p99 {percentile(values, 99) * 1e3:6.2f} ms max {max(values) * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
