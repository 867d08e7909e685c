"""In-process timing of ``filter`` over a static cluster, split into each pod spec's first request
and the requests after it (the same spec again, a different pod name), without HTTP.

``bench_extender`` measures the same through HTTP; this separates the two populations whose mix
makes its p50 and p99, on a machine where HTTP timings are noisy.

    python -m benchmarks.micro_extender --nodes 5000 --requests 300
"""

from __future__ import annotations

import argparse
import statistics
import time

import orjson

from benchmarks.bench_extender import first_of_spec
from benchmarks.cluster import POD_MIX, generate_pods, pod
from benchmarks.common import percentile
from benchmarks.profile_extender import static_service
from scheduler_extender.service.wire import parse_extender_args


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--verb", choices=("filter", "prioritize"), default="filter")
    args = p.parse_args(argv)
    service, names = static_service(args.nodes)
    verb = service.filter_response if args.verb == "filter" else service.prioritize_response
    # Warm-up with one pod of each kind in another namespace, as bench_extender does: the class
    # keys of every state for each resource asked are computed once per state, not per spec.
    for i, (ann, resource, gpus, _) in enumerate(POD_MIX):
        verb(parse_extender_args(orjson.dumps({"Pod": pod(i, ann, resource, gpus, "warm-up"),
                                               "NodeNames": names})))
    pods = generate_pods(args.requests)
    firsts = first_of_spec(pods)
    bodies = [orjson.dumps({"Pod": p, "NodeNames": names}) for p in pods]
    first: list[float] = []
    repeat: list[float] = []
    first_parse: list[float] = []
    first_bytes: list[int] = []
    for i, body in enumerate(bodies):
        t = time.perf_counter()
        parsed = parse_extender_args(body)
        t_parsed = time.perf_counter()
        answer = verb(parsed)
        elapsed = time.perf_counter() - t
        if i in firsts:
            first.append(elapsed)
            first_parse.append(t_parsed - t)
            first_bytes.append(len(answer))
        else:
            repeat.append(elapsed)
    for label, values in (("first of its spec", first), ("repeated spec", repeat), ("all", first + repeat)):
        if values:
            print(f"{args.nodes} nodes {args.verb} {label:>17}: n={len(values):4d} p50 {percentile(values, 50) * 1e3:6.2f} ms "
                  f"p99 {percentile(values, 99) * 1e3:6.2f} ms max {max(values) * 1e3:6.2f} ms")
    if first:
        print(f"  first request of a spec, means: parsing the request {statistics.mean(first_parse) * 1e3:.2f} ms, "
              f"the {args.verb} itself {(statistics.mean(first) - statistics.mean(first_parse)) * 1e3:.2f} ms, "
              f"answer {statistics.mean(first_bytes) / 1024:.0f} KiB")

if __name__ == "__main__":
    main()
