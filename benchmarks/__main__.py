"""``make bench``: the three benchmarks in one run, a summary, and ``benchmarks/results/*.json``.

    python -m benchmarks            # full run (5-8 minutes on 2 cores)
    python -m benchmarks --smoke    # tiny sizes: checks that everything runs (CI), numbers meaningless
    python -m benchmarks --only extender,cache   # skip the control plane
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks import bench_cache, bench_extender, bench_scheduler
from benchmarks.common import describe_machine, machine, write_results

FULL = {
    "extender": [],
    # The do-nothing extender too, on gpuplace's stack and on two leaner ones: what any Python
    # extender costs kube-scheduler, and how much of that is the web framework and the server.
    "scheduler": ["--floor", "starlette,asgi,protocol"],
    "cache": [],
}
SMOKE = {
    "extender": ["--sizes", "30,60", "--requests", "6", "--concurrency", "2"],
    "scheduler": ["--sizes", "20", "--pods", "12", "--settle", "5"],
    "cache": ["--nodes", "60", "--pods", "200", "--memory-sizes", "60"],
}
MODULES = {"extender": bench_extender, "scheduler": bench_scheduler, "cache": bench_cache}


def summary(results: dict[str, Any]) -> list[str]:
    lines = []
    ext = results.get("extender")
    if ext:
        lines.append(f"extender, static mode, {ext['concurrency']} concurrent clients (p99 ms, ratio to the floor server):")
        for size in ext["sizes"]:
            cells = [c for c in size["cells"] if "skipped" not in c]
            parts = [f"{'names' if c['nodeCacheCapable'] else 'nodelist'} {c['verb']} {c['gpuplace']['p99_ms']:.1f} "
                     f"({c['p99_ratio']:.1f}x)" for c in cells]
            lines.append(f"  {size['nodes']:>6} nodes: " + ", ".join(parts)
                         + f"; peak RSS {size['extender_peak_rss_mib']:.0f} MiB  [load {size['load_average']}]")
    sched = results.get("scheduler")
    if sched:
        lines.append(f"kube-scheduler throughput (client QPS {sched['qps']:.0f}, burst {sched['burst']}):")
        for size in sched["sizes"]:
            a, b = size["without_extender"]["pods_per_s"], size["with_extender"]["pods_per_s"]
            ratio = f"{size['ratio'] * 100:.0f}%" if size["ratio"] else "n/a"
            floor_text = "".join(
                f", with the {label} {size[run]['pods_per_s'] or float('nan'):.1f} pods/s = {size[ratio_key] * 100:.0f}%"
                for label, run, ratio_key in (("floor extender", "with_floor_extender", "floor_ratio"),
                                              ("asgi floor", "with_floor_extender_asgi", "floor_ratio_asgi"),
                                              ("protocol floor", "with_floor_extender_protocol", "floor_ratio_protocol"))
                if size.get(run) and size.get(ratio_key))
            lines.append(f"  {size['nodes']:>6} nodes, {size['pods']} pods: without {a or float('nan'):.1f} pods/s, "
                         f"with gpuplace {b or float('nan'):.1f} pods/s = {ratio}{floor_text}  "
                         f"[load {size['load_average_start']}]")
            cpu = size["with_extender"].get("cpu_ms_per_pod", {}).get("extender")
            handler = size["with_extender"].get("extender_handler_ms") or {}
            if cpu is not None:
                lines.append(f"         extender CPU {cpu:.2f} ms per bound pod; handler mean "
                             + ", ".join(f"{verb} {ms:.2f} ms" for verb, ms in handler.items()))
    cache = results.get("cache")
    if cache:
        ev = cache["events"]
        lines.append(f"cache at {ev['nodes']} nodes / {ev['pods']} pods: list {ev['list_nodes_per_s']:.0f} nodes/s; "
                     f"events/s: node heartbeat {ev['node_heartbeat_events_per_s']:.0f}, inventory change "
                     f"{ev['node_inventory_change_events_per_s']:.0f}, pod added {ev['pod_added_events_per_s']:.0f}, "
                     f"pod deleted {ev['pod_deleted_events_per_s']:.0f}  [load {ev['load_average']}]")
        for mem in cache["memory"]:
            lines.append(f"  {mem['nodes']} nodes x 8 GPUs: {mem['kib_per_node']:.1f} KiB/node, "
                         f"process RSS {mem['process_rss_mib']:.0f} MiB")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, only checks that the benchmarks run")
    p.add_argument("--only", default="extender,scheduler,cache", help="comma list of benchmarks to run")
    args = p.parse_args(argv)
    plan = SMOKE if args.smoke else FULL
    m = machine()
    t0 = time.monotonic()
    results: dict[str, Any] = {"machine": m, "smoke": args.smoke}
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        if name not in MODULES:
            raise SystemExit(f"--only: unknown benchmark {name!r}; choose from {', '.join(MODULES)}")
        extra = ["--out", str(_out(name, args.smoke))] if args.smoke else []
        results[name] = MODULES[name].main(plan[name] + extra)
        print()
    results["wall_s"] = time.monotonic() - t0
    path = write_results("summary-smoke" if args.smoke else "summary", results)
    print("== summary ==")
    print(describe_machine(m))
    for line in summary(results):
        print(line)
    print(f"took {results['wall_s'] / 60:.1f} min; results in {path.parent}/")


def _out(name: str, smoke: bool):  # noqa: ANN202
    from benchmarks.common import RESULTS_DIR
    return RESULTS_DIR / f"{name}{'-smoke' if smoke else ''}.json"


if __name__ == "__main__":
    main()
