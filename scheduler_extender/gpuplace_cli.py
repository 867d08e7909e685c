"""``gpuplace``: the operator's command line (explain a placement, check a policy, list the catalog)."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from node_agent.version import add_version_argument
from scheduler_extender.core.catalog import CatalogEntry, UnknownModelError, default_catalog, normalize_token
from scheduler_extender.core.engine import Decision, Engine
from scheduler_extender.core.pod import Pod, PodShapeError, as_pod
from scheduler_extender.core.policy import Policy, PolicyError, load_policy, policy_json_schema
from scheduler_extender.service.explain import component_weights, explain_decision
from scheduler_extender.core.quantity import fmt_gib
from scheduler_extender.core.tenancy import UNRESTRICTED


def _load_pod(path: str) -> Pod:
    """The first Pod manifest of a YAML file (``-``: stdin). Raises ValueError (also
    ``PodShapeError``, naming the field), OSError, yaml.YAMLError."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    docs = [d for d in yaml.safe_load_all(text) if d]
    pods = [d for d in docs if isinstance(d, dict) and d.get("kind", "Pod") == "Pod"]
    if not pods:
        raise ValueError(f"{path}: no Pod manifest found")
    try:
        return as_pod(pods[0])
    except PodShapeError as e:
        raise ValueError(f"{path}: {e}") from None


def render_decision(decision: Decision, policy: Policy | None = None) -> str:
    """Every node with pass/fail, its reasons or score components, and the VRAM estimate's terms.

    With ``policy``, each component is printed with its weight and a legend explains the score.
    """
    job = decision.job
    lines = [f"pod {job.req.key}: {job.describe()}"]
    lines.append(f"size class: {job.size_class.name} ({job.class_reason})")
    if not job.tenancy.unrestricted or job.tenancy.rule != UNRESTRICTED.rule:  # a tenant matched, or limits
        grant = job.tenancy
        classes = f"classes {grant.classes_text}" if grant.classes is not None else "every class"
        lines.append(f"tenancy: {grant.rule}: {classes}; {grant.models_text()}" if grant.undecided is None
                     else f"tenancy: {grant.undecided}")
    if job.vram is not None:
        lines.append(f"VRAM per GPU: {fmt_gib(job.vram.bytes_per_gpu)} ({job.vram.source})")
        for name, value in job.vram.terms:
            lines.append(f"  + {fmt_gib(value):>10}  {name}")
    elif job.req.wants_gpu:
        lines.append("VRAM per GPU: unknown (no gpuplace.io/model-params or gpuplace.io/vram): not checked")
    for e in job.errors:
        lines.append(f"annotation error: {e}")
    lines.append("")
    ranked = sorted(decision.results, key=lambda r: (not r.passed, -(decision.scores[r.node].score if r.node in decision.scores else 0), r.node))
    width = max((len(r.node) for r in ranked), default=4)
    weights = component_weights(policy) if policy is not None else {}
    if policy is not None:
        lines.append("PASS: can run now, score 0-10 = 10 x weighted mean of the components shown as value x weight;")
        lines.append("FAIL: never on this node (reasons); BUSY: would fit once GPUs are freed.")
        if any(sc.last_resort for sc in decision.scores.values() if sc is not None):
            lines.append(f"-> 0: last resort: a model class {decision.job.size_class.name} keeps for when no other "
                         "node passes (lastResortModels).")
    for r in ranked:
        if r.passed:
            s = decision.scores.get(r.node)
            comps = " ".join(f"{k}={v:.2f}" + (f"x{weights[k]:g}" if k in weights else "")
                             for k, v in (s.components.items() if s else []))
            units = ", ".join(f"{u.model}{' ' + u.mig_profile if u.mig_profile else ''} #{u.gpu_index}" for u in r.chosen)
            last = "  -> 0: last resort" if s is not None and s.last_resort else ""
            lines.append(f"PASS {r.node:<{width}}  score {s.score if s else 0:>2}  ${s.cost_per_hour if s else 0:.2f}/h  "
                         f"[{units}]  {comps}{last}")
        else:
            kind = "FAIL" if r.unresolvable else "BUSY"
            lines.append(f"{kind} {r.node:<{width}}  {r.reason}")
    best = decision.best()
    lines.append("")
    top = decision.top()
    if best is None:
        lines.append("best node: none: the pod stays Pending")
    elif len(top) == 1:
        lines.append(f"best node: {best.node} (score {best.score})")
    else:
        lines.append(f"best nodes: {', '.join(top)} (tied at score {best.score}: kube-scheduler's own scores pick one)")
    return "\n".join(lines)


def _live_source(kubeconfig: str, engine: Engine) -> Any:
    """Nodes and pods listed once from the cluster of ``kubeconfig``, in the extender's cache."""
    from kubernetes import client, config
    from scheduler_extender.service.explain import cluster_states_from_api
    config.load_kube_config(config_file=kubeconfig)
    with client.ApiClient() as api:
        return cluster_states_from_api(api, engine.catalog, engine.vram_need_bytes)


def cmd_explain(args: argparse.Namespace) -> int:
    from scheduler_extender.cluster.sources import NamespaceLabelsError, StaticSource, load_namespace_labels
    try:
        policy = load_policy(args.policy)
    except PolicyError as e:
        print(f"gpuplace: invalid policy: {e}", file=sys.stderr)
        return 2
    try:
        labels = load_namespace_labels(args.namespace_labels) if args.namespace_labels else None
    except NamespaceLabelsError as e:
        print(f"gpuplace: --namespace-labels {e}", file=sys.stderr)
        return 2
    engine = Engine(policy)
    try:
        pod = _load_pod(args.pod)
    except (OSError, ValueError, yaml.YAMLError) as e:
        print(f"gpuplace: {e}", file=sys.stderr)
        return 2
    try:
        if args.kubeconfig:
            source = _live_source(args.kubeconfig, engine)
        else:
            source = StaticSource(args.inventory_dir, engine.catalog, labels)
    except Exception as e:  # noqa: BLE001 - config, connection and API errors all end here
        where = f"--kubeconfig {args.kubeconfig}" if args.kubeconfig else f"--inventory-dir {args.inventory_dir}"
        print(f"gpuplace: cannot read the cluster from {where}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    names = source.node_names()
    decision = engine.decide(pod, source.states(names, None), source.now(), source.namespace_labels(pod.namespace))
    if args.json:
        print(json.dumps(explain_decision(decision, policy), indent=2))
    else:
        print(render_decision(decision, policy))
    return 0


def cmd_policy_check(args: argparse.Namespace) -> int:
    try:
        load_policy(args.file)
    except PolicyError as e:
        print(f"invalid: {e}", file=sys.stderr)
        return 1
    print(f"{args.file}: valid")
    return 0


def cmd_policy_schema(args: argparse.Namespace) -> int:
    print(json.dumps(policy_json_schema(), indent=2))
    return 0


def cmd_inventory_schema(args: argparse.Namespace) -> int:
    from node_agent.inventory import json_schema
    print(json.dumps(json_schema(), indent=2))
    return 0


def _catalog_details(e: CatalogEntry) -> list[str]:
    """The lines ``gpuplace catalog --sources`` prints under a row: names, precisions, MIG, sources."""
    mig = ", ".join(f"{p.profile} x{p.max_instances}" for p in e.mig_profiles) or "none catalogued"
    lines = [f"{e.display_name}; driver names: {', '.join(e.driver_names)}",
             f"precisions: {', '.join(e.precisions)}",
             f"MIG: {mig}"]
    lines += [f"source: {s}" for s in e.sources]
    return ["    " + line for line in lines]


def cmd_catalog(args: argparse.Namespace) -> int:
    cat = default_catalog()
    entries = list(cat.entries.values())
    if args.models:
        try:
            wanted = set().union(*(cat.resolve_token(t) for t in args.models))
        except UnknownModelError as e:
            near = difflib.get_close_matches(normalize_token(str(e)), cat.tokens(), n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            print(f"gpuplace catalog: unknown GPU model {str(e)!r}{hint}; models are catalog ids or families, "
                  f"exact tokens: `gpuplace catalog` lists them", file=sys.stderr)
            return 2
        entries = [e for e in entries if e.id in wanted]
    width = max(len("id"), *(len(e.id) for e in entries))
    print(f"{'id':<{width}} {'vendor':<6} {'cc':<4} {'VRAM':>9} {'GB/s':>6} {'tier':<11} {'$/h':>5}  aliases")
    for e in entries:
        print(f"{e.id:<{width}} {e.vendor:<6} {e.compute_capability or '-':<4} {fmt_gib(e.memory_mib * 2**20):>9} "
              f"{e.memory_bandwidth_gbps:>6.0f} {e.tier:<11} {e.cost_per_gpu_hour:>5.2f}  {', '.join(e.aliases)}")
        if args.sources:
            print("\n".join(_catalog_details(e)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuplace", description="gpuplace operator tools: explain placements, check policies.")
    add_version_argument(p)
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("explain", help="why a pod goes where it goes: every node, reasons, score components, VRAM estimate")
    e.add_argument("pod", help="pod manifest (YAML/JSON), '-' for stdin")
    where = e.add_mutually_exclusive_group(required=True)
    where.add_argument("--inventory-dir", metavar="DIR", help="one NodeGPUInventory file per node")
    where.add_argument("--kubeconfig", metavar="FILE",
                       help="a live cluster: list its Nodes (gpuplace.io/inventory) and Pods as the extender sees them")
    e.add_argument("--policy", metavar="FILE", help="policy YAML (default: the shipped policy)")
    e.add_argument("--namespace-labels", metavar="FILE",
                   help="labels of namespaces for tenants with a namespaceSelector (YAML namespace: {label: value}, "
                        "or `kubectl get namespaces -o yaml`); without it such tenants deny (labels unknown)")
    e.add_argument("--json", action="store_true", help="print the explanation as JSON (the POST /explain answer)")
    e.set_defaults(fn=cmd_explain)
    pol = sub.add_parser("policy", help="validate a policy file or print its JSON Schema")
    psub = pol.add_subparsers(dest="policy_command", required=True)
    c = psub.add_parser("check", help="validate FILE; errors name the field path")
    c.add_argument("file")
    c.set_defaults(fn=cmd_policy_check)
    psub.add_parser("schema", help="print the policy's JSON Schema").set_defaults(fn=cmd_policy_schema)
    inv = sub.add_parser("inventory", help="NodeGPUInventory tools")
    isub = inv.add_subparsers(dest="inventory_command", required=True)
    isub.add_parser("schema", help="print the NodeGPUInventory JSON Schema").set_defaults(fn=cmd_inventory_schema)
    cat = sub.add_parser("catalog", help="list the GPU catalog: ids, aliases, VRAM, price (--sources: where each figure comes from)")
    cat.add_argument("models", nargs="*", metavar="MODEL",
                     help="only these ids or families (exact tokens, as gpuplace.io/gpu-models takes them)")
    cat.add_argument("--sources", action="store_true",
                     help="under each row: driver names, precisions, MIG profiles and the sources of its figures")
    cat.set_defaults(fn=cmd_catalog)
    from scheduler_extender.simulator.cli import add_parser as add_simulate_parser
    add_simulate_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
