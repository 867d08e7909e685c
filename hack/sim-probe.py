#!/usr/bin/env python3
"""Probes behind docs/evaluation-fragmentation.md ("How gpuplace got ahead on the openb trace"):
where a policy's GPUs went on an openb pod list, one seed, in fill mode, as ``gpuplace simulate``
runs it.

    python hack/sim-probe.py --pods benchmarks/data/alibaba-openb-v2023/openb_pod_list_gpuspec33.csv \\
        --policy gpuplace --until 1.0
    python hack/sim-probe.py --pods .../openb_pod_list_multigpu50.csv --policy fgd --until 0.6 --big-cores 120

Prints, when the GPU demand arrived reaches ``--until`` x the fleet's GPUs: GPUs' worth used per
(GPU model, pods without a model constraint / constrained / CPU-only), refused per kind of pod,
free GPUs per model, and the pods on 8-GPU nodes with at least ``--big-cores`` cores (how many,
by GPUs and cores, and how many such nodes are still whole). ``--fill`` instead runs the whole list
(``run_fill``) and prints the milli-GPU allocation at 100 % and 130 %.

Variants docs/evaluation-fragmentation.md reports (#step-by-step, #probes-not-shipped):
``--fgd-cpu-only-by-default-profile`` (FGD with the pods without GPUs placed by kube-scheduler's
default profile, as gpuplace's were before ``cpuOnlyPods``) and
``--workload-from-list`` (gpuplace given FGD's target workload, the whole list's typical pods
known in advance, instead of learning it).
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler_extender.core.engine import Engine  # noqa: E402
from scheduler_extender.core.policy import load_policy  # noqa: E402
from scheduler_extender.core.workload import DemandShape, profile_of  # noqa: E402
from scheduler_extender.simulator.baselines import GpuplacePolicy, _pick, kube_scores  # noqa: E402
from scheduler_extender.simulator.cluster import Cluster  # noqa: E402
from scheduler_extender.simulator.fgd import FgdPolicy, typical_pods  # noqa: E402
from scheduler_extender.simulator.model import simulation_catalog  # noqa: E402
from scheduler_extender.simulator.run import fgd_arrivals, run_fill  # noqa: E402
from scheduler_extender.simulator.traces import load_fleet, openb_pods  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", required=True, help="openb pod list CSV")
    ap.add_argument("--nodes", help="openb node list CSV (default: openb_node_list_gpu_node.csv next to --pods)")
    ap.add_argument("--policy", choices=("gpuplace", "fgd"), default="gpuplace")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--until", type=float, default=1.0, help="arrived share of the fleet's GPUs (default 1.0)")
    ap.add_argument("--big-cores", type=int, default=120, help="cores of the 8-GPU nodes counted apart (default 120)")
    ap.add_argument("--fill", action="store_true", help="run the whole list; print milli-alloc at 100 / 130 %%")
    ap.add_argument("--fgd-cpu-only-by-default-profile", action="store_true")
    ap.add_argument("--workload-from-list", action="store_true")
    args = ap.parse_args()

    catalog = simulation_catalog()
    policy = load_policy(None)
    engine = Engine(policy, catalog)
    nodes = load_fleet(args.nodes or str(Path(args.pods).parent / "openb_node_list_gpu_node.csv"), catalog)
    trace, _ = openb_pods(args.pods, catalog, cpu_only=True)
    capacity = Cluster(nodes, catalog, policy).capacity_milli
    pol = GpuplacePolicy(engine) if args.policy == "gpuplace" else FgdPolicy(trace)
    if args.fgd_cpu_only_by_default_profile:
        fgd_choose = pol.choose

        def choose(pod, cluster, rng):  # noqa: ANN001, ANN202
            if pod.gpus:
                return fgd_choose(pod, cluster, rng)
            i = _pick(np.where(cluster.fits_resources(pod), kube_scores(pod, cluster), -np.inf), rng)
            return None if i is None else (i, ())
        pol.choose = choose  # type: ignore[method-assign]
    if args.workload_from_list:
        fixed = profile_of({DemandShape("nvidia.com/gpu", t.gpus, t.cpu_milli, None, t.allowed_models,
                                        gpu_milli=t.gpu_milli): t.share for t in typical_pods(trace) if t.gpus})

        class Fixed:
            def observe(self, *_args: object, **_kw: object) -> None: ...

            def profile(self):  # noqa: ANN202
                return fixed
        pol.tracker = Fixed()  # type: ignore[union-attr]
        pol.reset = lambda: None  # type: ignore[union-attr]
    arrivals = fgd_arrivals(trace, args.seed, 1.3, capacity)
    if args.fill:
        res = run_fill(nodes, arrivals, pol, engine, [1.0, 1.3], args.seed)
        print(" / ".join(f"{100 * res[x].gpu_milli_allocation_ratio:.2f} %" for x in (1.0, 1.3)),
              "milli-alloc at 100 / 130 %")
        return 0

    cluster = Cluster(nodes, catalog, policy)
    if hasattr(pol, "reset"):
        pol.reset()
    rng = random.Random(args.seed * 7919 + 1)  # as run_fill seeds it
    big = {i for i, n in enumerate(nodes) if (n.cpu_milli or 0) >= args.big_cores * 1000 and len(n.inventory.gpus) == 8}
    used: collections.Counter = collections.Counter()
    refused: collections.Counter = collections.Counter()
    on_big: collections.Counter = collections.Counter()
    arrived = 0
    for pod in arrivals:
        if arrived >= args.until * capacity:
            break
        arrived += pod.total_milli
        kind = "cpu-only" if not pod.gpus else "any model" if pod.allowed_models is None else "constrained"
        choice = pol.choose(pod, cluster, rng)
        if choice is None:
            refused[(kind, pod.gpus, pod.sharing, (pod.cpu_milli or 0) // 1000)] += pod.total_milli
            continue
        i, units = choice
        cluster.place(i, pod, units)
        used[(cluster.models[cluster.model_of[i]], kind)] += pod.total_milli
        if i in big:
            on_big[(pod.gpus, pod.sharing, (pod.cpu_milli or 0) // 1000)] += 1
    print(f"{args.policy}, seed {args.seed}, at {100 * args.until:.0f} % arrived: "
          f"{100 * cluster.allocated_milli / capacity:.2f} % of the milli-GPUs allocated")
    for (model, kind), milli in sorted(used.items()):
        print(f"  used  {model:16} {kind:12} {milli / 1000:8.1f} GPUs")
    for (kind, gpus, sharing, cores), milli in refused.most_common(12):
        print(f"  refused {kind:12} {gpus} GPU{' (share)' if sharing else ''}, {cores} cores: {milli / 1000:.1f} GPUs")
    free = collections.Counter()
    for i in range(len(nodes)):
        free[cluster.models[cluster.model_of[i]]] += int(cluster.milli_free[i].sum()) // 1000
    print("  free GPUs by model:", dict(free))
    whole = sum(1 for i in big if cluster.gpu_free[i] == 8 and cluster.cpu_free[i] >= args.big_cores * 1000)
    print(f"  8-GPU nodes with >= {args.big_cores} cores: {len(big)}; pods on them {sum(on_big.values())} "
          f"(8-GPU pods {sum(n for k, n in on_big.items() if k[0] == 8)}); still whole: {whole}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
