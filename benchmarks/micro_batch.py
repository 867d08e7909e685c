"""The simulator's batch of fragmentation increases against the plain loop, per scoring call.

Runs ``gpuplace simulate``'s gpuplace policy over the first ``--pods`` arrivals of an openb list
(fill mode, seed 0, the whole openb fleet) with the batch on every call, and records each scoring
call. Then, in the run's order, it times each call twice:

1. through the plain loop (``core.score.fragmentation_deltas``), whose learned-workload memos fill
   as a plain run would fill them;
2. through the batch (``simulator.batch_fragmentation.batch_deltas``).

It prints the mean time per call, by number of candidates, and checks that both give the same
floats. ``batch_fragmentation.BATCH_FROM`` is where the batch starts to win.

    python -m benchmarks.micro_batch --list default --pods 4000
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from scheduler_extender.core.score import fragmentation_deltas as plain_deltas
from scheduler_extender.served.grouped import GroupedEngine
from scheduler_extender.simulator import batch_fragmentation
from scheduler_extender.simulator.baselines import GpuplacePolicy
from scheduler_extender.simulator.model import simulation_catalog
from scheduler_extender.simulator.run import fgd_arrivals, run_fill
from scheduler_extender.simulator.traces import openb_nodes, openb_pods
from tests.factories import ROOT

OPENB = ROOT / "benchmarks" / "data" / "alibaba-openb-v2023"
BUCKETS = (8, 16, 32, 64, 128, 256)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", default="default", help="openb pod list: default, gpuspec33, multigpu50 (default default)")
    p.add_argument("--pods", type=int, default=4000, help="arrivals replayed (default 4000)")
    args = p.parse_args(argv)
    catalog = simulation_catalog()
    nodes = openb_nodes(OPENB / "openb_node_list_gpu_node.csv", catalog)
    pods, _ = openb_pods(OPENB / f"openb_pod_list_{args.list}.csv", catalog, cpu_only=True)
    arrivals = fgd_arrivals(pods, 0, 1.0, sum(len(n.inventory.gpus) for n in nodes) * 1000)[:args.pods]
    engine = GroupedEngine(catalog=catalog)
    policy = GpuplacePolicy(engine)
    calls = []

    def recording(job, gpu_pods, workload, scarcity, free_of):
        # The free devices each candidate was scored on, as the call read them.
        resources = [job.req.resource] if job.req.resource is not None else list(workload.resources)
        frees = {(id(s), r): free_of(s, r) for s, _ in gpu_pods for r in resources}
        calls.append((job, list(gpu_pods), workload, scarcity, frees))
        return batch_fragmentation.batch_deltas(job, gpu_pods, workload, scarcity, free_of)

    engine.fragmentation_deltas = recording  # the batch on every call: the profiles' memos stay empty
    run_fill(nodes, arrivals, policy, engine, [1.0], seed=0)

    per_bucket: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for job, gpu_pods, workload, scarcity, frees in calls:
        def free_of(state, resource, frees=frees):
            return frees[(id(state), resource)]
        t0 = time.perf_counter()
        plain = plain_deltas(job, gpu_pods, workload, scarcity, free_of)
        t1 = time.perf_counter()
        batch = batch_fragmentation.batch_deltas(job, gpu_pods, workload, scarcity, free_of)
        t2 = time.perf_counter()
        if plain != batch:
            raise SystemExit(f"the batch differs from the plain loop on a call of {len(gpu_pods)} candidates")
        bucket = next((b for b in BUCKETS if len(gpu_pods) < b), None) or 10**9
        cell = per_bucket[bucket]
        cell[0] += 1
        cell[1] += t1 - t0
        cell[2] += t2 - t1
    print(f"openb {args.list}, {len(arrivals)} arrivals, {len(calls)} scoring calls (BATCH_FROM = "
          f"{batch_fragmentation.BATCH_FROM}); mean time per call, plain loop / batch:")
    low = 0
    for bucket in sorted(per_bucket):
        n, plain_s, batch_s = per_bucket[bucket]
        label = f"{low}-{bucket - 1}" if bucket < 10**9 else f"{low}+"
        print(f"  {label:>8} candidates: {n:5} calls  plain {plain_s / n * 1e6:7.0f} us  batch {batch_s / n * 1e6:7.0f} us  "
              f"batch - plain {(batch_s - plain_s) / n * 1e6:+6.0f} us")
        low = bucket


if __name__ == "__main__":
    main()
