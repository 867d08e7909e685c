"""``make demo``: a real control plane, a mixed GPU cluster, the extender, the example pods.

Starts etcd, kube-apiserver and kube-scheduler (built from the Go module proxy, cached), creates
the nodes of ``examples/cluster`` with their inventories published by ``gpuplace-agent --probe
fake``, starts ``gpuplace-extender`` in cluster mode and a ``gpuplace-scheduler`` that calls it,
applies ``examples/pods`` and prints where each pod went, and why a pod waits.

    python -m examples.demo            # run, print the table, stop everything
    python -m examples.demo --keep     # leave the cluster up; prints the kubectl commands to use
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
import time
from pathlib import Path

from kubernetes import client as k8s

from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.quantity import fmt_gib
from scheduler_extender.cluster.sources import StaticSource
from tests.harness.controlplane import ControlPlane, ensure_binaries, pod_events
from tests.harness.gpucluster import (
    ROOT, add_gpuplace_scheduler, create_gpu_nodes, create_pods, load_pod_manifests, start_extender, wait_placements,
)

CLUSTER = ROOT / "examples" / "cluster"
PODS = ROOT / "examples" / "pods"


def gpu_on(engine: Engine, source: StaticSource, pod: dict, node: str) -> str:
    """Which GPU (model, MIG profile) the pod gets on ``node``, by the same filter."""
    result = engine.filter(engine.job(pod), source.states([node], None), None)[0]
    if not result.chosen:
        return "?"
    u = result.chosen[0]
    model = u.model + (f" MIG {u.mig_profile}" if u.mig_profile else "")
    return f"{len(result.chosen)}x {model}" if len(result.chosen) > 1 else model


def scheduler_reason(api: k8s.ApiClient, name: str) -> str:
    msgs = [m for m in pod_events(api, "default", name) if "nodes are available" in m]
    if not msgs:
        return "(no FailedScheduling event yet)"
    return msgs[-1].split(". no new claims")[0].split(". preemption:")[0]


def table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="leave the control plane running until Ctrl-C")
    ap.add_argument("--workdir", default=str(ROOT / ".demo"), help="where logs, certs and the kubeconfig go")
    args = ap.parse_args(argv)

    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    print("== building/checking the control plane binaries (first run: several minutes)", flush=True)
    binaries = ensure_binaries()
    started = time.monotonic()
    cp = ControlPlane(workdir, scheduler_configs=[])
    extender = None
    try:
        cp.start()
        print(f"== control plane up at {cp.api_url} ({cp.timings['total']:.1f} s); logs in {cp.logs}")
        nodes = create_gpu_nodes(cp, CLUSTER, publish="agent")
        print(f"== {len(nodes)} GPU nodes created, inventories published by gpuplace-agent --probe fake")
        extender = start_extender(cp.kubeconfig_path, cp.logs)
        add_gpuplace_scheduler(cp, extender)
        print(f"== gpuplace-extender ready on {extender.url}; kube-scheduler 'gpuplace-scheduler' calls it")
        api = cp.api_client()
        manifests = load_pod_manifests(PODS)
        names = create_pods(api, manifests)
        print(f"== applied {len(names)} pods from examples/pods; waiting for kube-scheduler ...", flush=True)
        placed = wait_placements(api, names, timeout=90, settle_pending=8)
        time.sleep(1)  # let the last FailedScheduling events land

        engine = Engine()
        source = StaticSource(CLUSTER, default_catalog())
        rows = []
        pending = []
        for m in manifests:
            name = m["metadata"]["name"]
            job = engine.job(m)
            node = placed[name]
            vram = fmt_gib(job.vram.bytes_per_gpu) if job.vram else "-"
            if node:
                rows.append([name, job.describe(), vram, node, gpu_on(engine, source, m, node), ""])
            else:
                pending.append(name)
                rows.append([name, job.describe(), vram, "Pending", "-", "see below"])
        print()
        print(table(rows, ["POD", "ASKED", "VRAM/GPU", "NODE", "GPU", "REASON"]))
        for name in pending:
            print(f"\n{name} is Pending; kube-scheduler recorded:")
            print(textwrap.indent(textwrap.fill(scheduler_reason(api, name), 110), "  "))
        kubectl = binaries.kubectl
        print(f"\n== done in {time.monotonic() - started:.0f} s. Look yourself:")
        print(f"  {kubectl} --kubeconfig {cp.kubeconfig_path} get pods -o wide")
        if pending:
            print(f"  {kubectl} --kubeconfig {cp.kubeconfig_path} describe pod {pending[0]}")
        print("  gpuplace explain examples/pods/03-llm-13b-inference.yaml --inventory-dir examples/cluster")
        if args.keep:
            print("\n== cluster kept running; Ctrl-C stops it")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        else:
            print("  (the cluster stops now; run `make demo ARGS=--keep` to keep it)")
        return 0
    finally:
        if extender is not None:
            extender.stop()
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
