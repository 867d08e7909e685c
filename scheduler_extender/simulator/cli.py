"""``gpuplace simulate``: the command line of the simulator (wired into ``gpuplace``).

Imports numpy/matplotlib only when the command runs, so ``gpuplace`` works without the ``sim``
extra and says how to install it.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_OPENB_NODES = "openb_node_list_gpu_node.csv"
LLM_TARGET_PODS = 5000
"""Pods of the LLM generator that make FGD's target workload for ``--trace llm``."""

EPILOG = """\
examples:
  # Alibaba openb trace (FGD, ATC'23), fill mode at 100% and 130% of the fleet's GPUs
  gpuplace simulate --trace openb --pods benchmarks/data/alibaba-openb-v2023/openb_pod_list_gpuspec33.csv \\
      --policy default --baselines all --load 1.0,1.3
  # generated LLM workload on the built-in mixed fleet, JSON and charts
  gpuplace simulate --trace llm --fleet mixed --load 0.8,1.0,1.3 --json sim.json --charts docs/sim
  # your own workload (kind: Workload YAML) over your inventory files, replaying arrivals
  gpuplace simulate --trace yaml --pods examples/workload.yaml --fleet examples/cluster --mode replay

The node list of --trace openb defaults to openb_node_list_gpu_node.csv next to --pods.
Metrics are defined in docs/simulator.md#report; results: docs/evaluation.md#simulate-before-you-deploy.
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    s = sub.add_parser(
        "simulate", help="replay a workload over a fleet through gpuplace's filter/score and baselines",
        description="Replay a workload over a fleet of GPU nodes through the extender's own filter and "
                    "score, next to baselines (random, kube-scheduler spread, best fit, static "
                    "nodeSelector, FGD), and report FGD's GPU allocation rate, whole-GPU occupancy, "
                    "stranded GPUs, OOM risk, premium GPU-hours and cost.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--trace", required=True, choices=("openb", "llm", "yaml"),
                   help="workload: the Alibaba openb pod list, the generated LLM mix, or a kind: Workload YAML")
    s.add_argument("--pods", metavar="FILE", help="openb pod list CSV (--trace openb) or Workload YAML (--trace yaml)")
    s.add_argument("--fleet", metavar="SPEC",
                   help="openb or spot node list CSV, a directory of NodeGPUInventory files, a YAML/JSON file of "
                        "ResourceSlices (kubectl get resourceslices -o yaml: GPUs as a DRA driver publishes them), or 'mixed' "
                        "(default: the openb node list next to --pods; 'mixed' for --trace llm)")
    s.add_argument("--mode", choices=("fill", "replay"), default="fill",
                   help="fill: pods arrive (FGD's shuffled, tuned list) and never leave, snapshot at each "
                        "load; replay: trace times "
                        "scaled to the offered load, pods leave, a FIFO queue retries (default fill)")
    s.add_argument("--policy", default="default", metavar="default|FILE", help="gpuplace policy (default: shipped)")
    s.add_argument("--baselines", default="all", metavar="LIST",
                   help="comma list of random,spread,bestfit,static,fgd, or all, or none (default all)")
    s.add_argument("--load", default="1.0,1.3", metavar="LIST",
                   help="load levels, comma list: share of the fleet's GPUs arrived, in milli-GPUs (fill; a "
                        "pod list is tuned to the highest, as FGD does) or offered GPU load per unit of "
                        "time (replay) (default 1.0,1.3)")
    s.add_argument("--seed", type=int, default=0, help="first seed; a run is repeatable (default 0)")
    s.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="seeds seed..seed+N-1; the report shows mean ± spread (default 3)")
    s.add_argument("--llm-pods", type=int, default=3000, metavar="N",
                   help="pods of the generated LLM workload in replay mode (default 3000)")
    s.add_argument("--extender-weight", type=float, default=None, metavar="W",
                   help="the extender's weight in the kube-scheduler configuration (default 10, as installed)")
    s.add_argument("--filter-returns-best", action=argparse.BooleanOptionalAction, default=True,
                   help="model the extender as the chart installs it: /filter passes one of gpuplace's "
                        "best-scored nodes, the one kube-scheduler's default resource scores prefer, the "
                        "remaining ties at random (kube-scheduler's order) (default); "
                        "--no-filter-returns-best: filter + prioritize, gpuplace's 0-10 score x weight x 10 "
                        "added to kube-scheduler's")
    s.add_argument("--cpu-only-pods", action=argparse.BooleanOptionalAction, default=True,
                   help="model the chart's scheduler.extender.cpuOnlyPods: kube-scheduler asks the extender about "
                        "pods without GPUs too, and gpuplace places them where their CPU and memory leave the free "
                        "GPUs most usable (default); --no-cpu-only-pods: the default profile places them alone")
    s.add_argument("--sharing", choices=("scheduler", "device-plugin"), default="scheduler",
                   help="scheduler: a GPU-sharing pod takes its share of the GPU the scheduler picks, on any "
                        "node (openb's own setting, FGD's simulator) (default); device-plugin: the cluster's "
                        "model: a share of each model's nodes is time-sliced by the NVIDIA device plugin, "
                        "sharing pods go there (gpuplace.io/gpu-fraction) and only there, and the plugin picks "
                        "the GPU (fewest replicas in use); over-committed GPUs are counted")
    s.add_argument("--time-sliced-share", default="auto", metavar="F|auto",
                   help="with --sharing device-plugin: share of each GPU model's nodes time-sliced (default "
                        "auto: the share of the pod list's milli-GPUs that sharing pods ask for)")
    s.add_argument("--replicas", type=int, default=None, metavar="N",
                   help="with --sharing device-plugin: time-slicing replicas per GPU (default 4)")
    s.add_argument("--defrag", action="store_true",
                   help="with --mode replay: also run gpuplace with defragmentation, as the policy gpuplace+defrag "
                        "next to gpuplace: after each arrival or departure that leaves a whole-GPU pod waiting, "
                        "the extender's planner (gpuplace defrag) finds the fewest moves of running GPU pods (all "
                        "treated as movable, recreated by a controller) that make room for it on one node; the "
                        "moved pods restart at once on their destinations with their remaining run time, the "
                        "waiting pod starts on the room made; the report adds the moves (docs/simulator.md#defragmentation)")
    s.add_argument("--json", metavar="FILE", help="write the report as JSON")
    s.add_argument("--charts", metavar="DIR",
                   help="write gpu_milli_allocation.png, allocation_ratio.png and stranded_by_model.png")
    s.add_argument("--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(fn=cmd_simulate)
    return s


def _loads(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--load {text!r}: expected a comma list of numbers such as 1.0,1.3") from None
    if not loads or any(l <= 0 for l in loads):
        raise ValueError(f"--load {text!r}: expected positive numbers such as 1.0,1.3")
    return sorted(set(loads))


def _baselines(text: str) -> list[str]:
    from scheduler_extender.simulator.baselines import BASELINES
    if text == "all":
        return list(BASELINES)
    if text in ("none", ""):
        return []
    names = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in names if b not in BASELINES]
    if bad:
        raise ValueError(f"--baselines: unknown {', '.join(bad)}; use all, none or a comma list of {', '.join(BASELINES)}")
    return names


class _Refused(Exception):
    """A flag or an input file ``gpuplace simulate`` cannot use; the message says which and how."""


@dataclass
class _Setup:
    """What one ``gpuplace simulate`` run simulates: the policy's engine over the catalog, the
    fleet, the trace's pods (CPU-only pods of openb skipped: ``skipped``) and the sharing model."""

    engine: Any
    catalog: Any
    fleet: str
    nodes: list[Any]
    trace: list[Any]
    skipped: int
    share: Any
    replicas: Any
    loads: list[float]
    baselines: list[str]


def cmd_simulate(args: argparse.Namespace) -> int:
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("gpuplace simulate needs numpy: pip install 'gpuplace[sim]'", file=sys.stderr)
        return 2
    from scheduler_extender.simulator import report
    from scheduler_extender.simulator.cluster import Cluster
    from scheduler_extender.simulator.run import simulate

    t0 = time.perf_counter()
    try:
        setup = _setup(args)
    except _Refused as e:
        print(f"gpuplace simulate: {e}", file=sys.stderr)
        return 2
    nodes, trace, engine = setup.nodes, setup.trace, setup.engine
    capacity = sum(len(n.inventory.gpus) for n in nodes)
    capacity_milli = Cluster(nodes, setup.catalog, engine.policy).capacity_milli  # units (MIG devices count) x 1000
    policies = _policies(args, setup)
    progress = None
    if not args.quiet and sys.stderr.isatty():
        def progress(label: str, n: int) -> None:
            print(f"\r  {label}: {n} pods ...   ", end="", file=sys.stderr, flush=True)
    cpu_only = sum(1 for p in trace if not p.gpus)
    if not args.quiet:
        print(f"fleet: {len(nodes)} nodes, {capacity} GPUs ({setup.fleet}); workload: {args.trace}"
              f"{f' {args.pods}' if args.pods else ''}; {len(trace) - cpu_only or 'generated'} GPU pods"
              f"{f', {cpu_only} CPU-only pods' if cpu_only else ''}"
              f"{f', {setup.skipped} CPU-only pods skipped' if setup.skipped else ''}; mode {args.mode}; "
              f"policies {', '.join(p.name for p in policies)}; seeds {args.seed}..{args.seed + args.repeats - 1}",
              file=sys.stderr)
    result = simulate(nodes, policies, engine, mode=args.mode, loads=setup.loads,
                      seeds=list(range(args.seed, args.seed + args.repeats)),
                      pods_for_seed=_pods_for(args, trace, capacity, capacity_milli), progress=progress)
    if progress is not None:
        print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
    result.meta = _meta(args, setup, capacity, cpu_only, policies[0].extender_weight)
    print(report.render_table(result))
    print(f"wall time {time.perf_counter() - t0:.1f} s")
    return _write_outputs(args, result)


def _setup(args: argparse.Namespace) -> _Setup:
    """Read the flags, the policy, the fleet and the trace (``_Setup``).

    Raises:
        _Refused: a flag out of range, an invalid policy, a missing or unreadable file.
    """
    from scheduler_extender.core.engine import Engine
    from scheduler_extender.core.policy import PolicyError, load_policy
    from scheduler_extender.simulator.model import simulation_catalog
    from scheduler_extender.simulator.traces import TraceError, load_fleet, openb_pods, yaml_pods

    try:
        loads = _loads(args.load)
        baselines = _baselines(args.baselines)
        if args.repeats < 1:
            raise ValueError("--repeats must be >= 1")
        if args.defrag and args.mode != "replay":
            raise ValueError("--defrag applies with --mode replay only (in fill mode no pod waits)")
        policy = load_policy(None if args.policy == "default" else args.policy)
    except (ValueError, PolicyError) as e:
        raise _Refused(str(e)) from None
    catalog = simulation_catalog()
    try:
        if args.trace in ("openb", "yaml") and not args.pods:
            raise TraceError(f"--trace {args.trace} needs --pods FILE")
        if args.pods and not Path(args.pods).is_file():
            raise TraceError(f"--pods {args.pods}: no such file")
        fleet = args.fleet
        if fleet is None:
            if args.trace == "openb":
                fleet = str(Path(args.pods).parent / DEFAULT_OPENB_NODES)
            elif args.trace == "llm":
                fleet = "mixed"
            else:
                raise TraceError("--trace yaml needs --fleet (node list CSV, inventory directory or 'mixed')")
        nodes = load_fleet(fleet, catalog)
        skipped = 0
        if args.trace == "openb":
            trace, skipped = openb_pods(args.pods, catalog, cpu_only=True)
        elif args.trace == "yaml":
            trace = yaml_pods(args.pods, catalog)
        else:
            trace = []
    except (TraceError, OSError) as e:
        raise _Refused(str(e)) from None
    try:
        nodes, trace, share, replicas = sharing_setup(args, policy, nodes, trace)
    except ValueError as e:
        raise _Refused(str(e)) from None
    return _Setup(Engine(policy, catalog), catalog, fleet, nodes, trace, skipped, share, replicas, loads, baselines)


def _pods_for(args: argparse.Namespace, trace: list[Any], capacity: int, capacity_milli: int) -> Any:
    """The pods of one (seed, load) run: the generated LLM mix, or the trace (FGD's arrivals in fill mode)."""
    from scheduler_extender.simulator.run import fgd_arrivals
    from scheduler_extender.simulator.workload import llm_pods, rate_for_load

    def pods_for(seed: int, load: float):  # noqa: ANN202
        if args.trace == "llm":
            if args.mode == "fill":
                return llm_pods(seed)
            gen = llm_pods(seed, rate_per_hour=rate_for_load(load, capacity))
            return [p for p, _ in zip(gen, range(args.llm_pods))]
        return fgd_arrivals(trace, seed, load, capacity_milli) if args.mode == "fill" else trace
    return pods_for


def _policies(args: argparse.Namespace, setup: _Setup) -> list[Any]:
    """gpuplace (as the chart installs the extender, or as the flags say) and the baselines."""
    from scheduler_extender.simulator.baselines import EXTENDER_WEIGHT, GpuplacePolicy, KubeBaseline
    from scheduler_extender.simulator.defrag import DEFRAG_POLICY
    from scheduler_extender.simulator.fgd import FgdPolicy
    from scheduler_extender.simulator.workload import llm_pods

    weight = EXTENDER_WEIGHT if args.extender_weight is None else args.extender_weight
    # FGD's target workload: the pod list (as FGD takes it, before tuning); for the generator, a
    # sample of its stream at the first seed (every seed draws from the same distribution).
    target = setup.trace or [p for p, _ in zip(llm_pods(args.seed), range(LLM_TARGET_PODS))]
    gpuplace = [GpuplacePolicy(setup.engine, name=name, extender_weight=weight,
                               filter_returns_best=args.filter_returns_best, cpu_only_pods=args.cpu_only_pods,
                               defrag=name == DEFRAG_POLICY)
                for name in ("gpuplace", *((DEFRAG_POLICY,) if args.defrag else ()))]
    return [*gpuplace,
            *(FgdPolicy(target) if b == "fgd" else KubeBaseline(b, setup.catalog) for b in setup.baselines)]


def _meta(args: argparse.Namespace, setup: _Setup, capacity: int, cpu_only: int, weight: float) -> dict[str, Any]:
    """The run's description in the JSON report."""
    from scheduler_extender.simulator import report

    nodes = setup.nodes
    return {"mode": args.mode, "trace": args.trace, "pods": args.pods, "fleet": setup.fleet, "nodes": len(nodes),
            "gpus": capacity, "skipped_cpu_only_pods": setup.skipped, "cpu_only_pods": cpu_only,
            "extender_weight": weight, "filter_returns_best": args.filter_returns_best,
            "cpu_only_pods_to_extender": args.cpu_only_pods,
            "sharing": args.sharing, "time_sliced_share": setup.share,
            "time_sliced_nodes": sum(1 for n in nodes if n.sharing is not None),
            "replicas": setup.replicas,
            "policy": args.policy, "loads": [report.load_key(l) for l in setup.loads],
            "title": f"({args.trace}, {args.mode})"}


def _write_outputs(args: argparse.Namespace, result: Any) -> int:
    """``--json`` and ``--charts``; 2 when the charts cannot be drawn (no matplotlib)."""
    from scheduler_extender.simulator import report

    if args.json:
        report.write_json(result, args.json)
        print(f"wrote {args.json}")
    if args.charts:
        try:
            for p in report.write_charts(result, args.charts):
                print(f"wrote {p}")
        except RuntimeError as e:
            print(f"gpuplace simulate: {e}", file=sys.stderr)
            return 2
    return 0


def sharing_setup(args: argparse.Namespace, policy: Any, nodes: list[Any], trace: list[Any]
                  ) -> tuple[list[Any], list[Any], float | None, int | None]:
    """(nodes, pods, time-sliced share, replicas) under ``--sharing``: unchanged with None, None
    for ``scheduler``; ``device_plugin.cluster_model`` for ``device-plugin``. ValueError names the
    option and the accepted form."""
    from scheduler_extender.simulator import device_plugin
    if args.sharing != "device-plugin":
        if args.replicas is not None or args.time_sliced_share != "auto":
            raise ValueError("--replicas and --time-sliced-share apply with --sharing device-plugin only")
        return nodes, trace, None, None
    share = parse_share(args.time_sliced_share)
    replicas = args.replicas or device_plugin.DEFAULT_REPLICAS
    return (*device_plugin.cluster_model(nodes, trace, policy, share, replicas), replicas)


def parse_share(text: str) -> float | None:
    """``--time-sliced-share``: None for ``auto``, else a number from 0 to 1 (ValueError otherwise)."""
    if text == "auto":
        return None
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0 <= share <= 1:
        raise ValueError(f"--time-sliced-share {text!r}: use a number between 0 and 1, or auto")
    return share
