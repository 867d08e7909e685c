"""How much scoring ``gpuplace simulate``'s gpuplace does per pod: over one fill run on an openb
pod list (FGD's arrivals, seed 0, tuned to 100 % of the openb fleet, CPU-only pods included, as
``gpuplace simulate --trace openb --load 1.0`` runs it), the scoring calls, the candidates scored
per call (scored parts: kinds of passing node) and the node states per call, and the learned
workload's shapes at the end. No timing: what the decision time per pod is spent on, to set beside
``gpuplace simulate``'s run times (benchmarks/README.md, issue 26).

    python -m benchmarks.sim_candidates                      # the default list
    python -m benchmarks.sim_candidates --pods benchmarks/data/alibaba-openb-v2023/openb_pod_list_gpuspec33.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scheduler_extender.served.grouped import GroupedEngine
from scheduler_extender.simulator.baselines import GpuplacePolicy
from scheduler_extender.simulator.model import simulation_catalog
from scheduler_extender.simulator.run import fgd_arrivals, run_fill
from scheduler_extender.simulator.traces import openb_nodes, openb_pods

DATA = Path(__file__).resolve().parent / "data" / "alibaba-openb-v2023"


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv", help="openb pod list CSV")
    p.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv", help="openb node list CSV")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    catalog = simulation_catalog()
    nodes = openb_nodes(args.nodes, catalog)
    pods, _ = openb_pods(args.pods, catalog, cpu_only=True)
    arrivals = fgd_arrivals(pods, args.seed, 1.0, sum(len(n.inventory.gpus) for n in nodes) * 1000)
    engine = GroupedEngine(catalog=catalog)
    policy = GpuplacePolicy(engine)
    calls = scored = states = 0
    served = policy.decider.score

    def counted(job, grouped, supply=None, workload=None):  # type: ignore[no-untyped-def]
        nonlocal calls, scored, states
        out = served(job, grouped, supply, workload)
        calls += 1
        scored += sum(1 for s in out.scores if s is not None)
        states += len(grouped.node_states)
        return out

    policy.decider.score = counted  # type: ignore[method-assign]
    run_fill(nodes, arrivals, policy, engine, [1.0], args.seed)
    out = {"scoring_calls": calls, "scored_parts_per_call": scored / max(calls, 1),
           "node_states_per_call": states / max(calls, 1), "workload_shapes": len(policy.decider.workload_profile().shapes)}
    print(f"{args.pods.name}, seed {args.seed}: {calls} scoring calls (GPU pods the extender scores), "
          f"{out['scored_parts_per_call']:.1f} scored parts and {out['node_states_per_call']:.1f} node states per call; "
          f"{out['workload_shapes']} shapes in the learned workload at the end")
    return out


if __name__ == "__main__":
    main()
