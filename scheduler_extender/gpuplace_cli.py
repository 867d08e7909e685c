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
from scheduler_extender.core.dra_claims import MAX_COUNT
from scheduler_extender.core.engine import Decision, Engine
from scheduler_extender.core.pod import Pod, PodShapeError, as_pod
from scheduler_extender.core.policy import Policy, PolicyError, load_policy, policy_json_schema
from scheduler_extender.service.explain import component_weights, explain_decision
from scheduler_extender.core.quantity import fmt_gib
from scheduler_extender.core.tenancy import UNRESTRICTED


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


def _live_cluster(kubeconfig: str, engine: Engine) -> tuple[Any, list[Any], list[Any]]:
    """Nodes, pods, namespaces and PodDisruptionBudgets listed once from the cluster of
    ``kubeconfig``: (a ``ClusterSource`` over the extender's cache of them, the pods, the budgets)."""
    from kubernetes import client, config

    from scheduler_extender.cluster.defrag import ClusterReader
    from scheduler_extender.cluster.sources import ClusterSource
    config.load_kube_config(config_file=kubeconfig)
    with client.ApiClient() as api:
        cache, pods, budgets = ClusterReader(api, engine).read()
    return ClusterSource(cache, engine.catalog), pods, budgets


def _policy(path: str | None) -> Policy | None:
    """The policy of ``path`` (None: the shipped one); None after printing why it is invalid."""
    try:
        return load_policy(path)
    except PolicyError as e:
        print(f"gpuplace: invalid policy: {e}", file=sys.stderr)
        return None


def _pod_file(path: str) -> tuple[list[Any], Pod] | None:
    """The documents of ``path`` and its pod (``_pod_of``); None after printing why not."""
    try:
        docs = _load_docs(path)
        return docs, _pod_of(docs, path)
    except (OSError, ValueError, yaml.YAMLError) as e:
        print(f"gpuplace: {e}", file=sys.stderr)
        return None


def _count_in_range(count: int) -> bool:
    """Whether ``--count`` is a claim's device count the API allows; prints why not."""
    if 1 <= count <= MAX_COUNT:
        return True
    print(f"gpuplace: --count {count}: must be from 1 to {MAX_COUNT}", file=sys.stderr)
    return False


def cmd_explain(args: argparse.Namespace) -> int:
    from scheduler_extender.cluster.sources import NamespaceLabelsError, StaticSource, load_namespace_labels
    policy = _policy(args.policy)
    if policy is None:
        return 2
    try:
        labels = load_namespace_labels(args.namespace_labels) if args.namespace_labels else None
    except NamespaceLabelsError as e:
        print(f"gpuplace: --namespace-labels {e}", file=sys.stderr)
        return 2
    engine = Engine(policy)
    loaded = _pod_file(args.pod)
    if loaded is None:
        return 2
    docs, pod = loaded
    if args.resource_slices or (args.kubeconfig and pod.spec.resource_claims):
        if not _count_in_range(args.count):
            return 2
        return _explain_with_claims(args, engine, policy, pod, docs, labels)
    live = None
    try:
        if args.kubeconfig:
            live = _live_cluster(args.kubeconfig, engine)
            source = live[0]
        else:
            source = StaticSource(args.inventory_dir, engine.catalog, labels)
    except Exception as e:  # noqa: BLE001 - config, connection and API errors all end here
        where = f"--kubeconfig {args.kubeconfig}" if args.kubeconfig else f"--inventory-dir {args.inventory_dir}"
        print(f"gpuplace: cannot read the cluster from {where}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    names = source.node_names()
    decision = engine.decide(pod, source.states(names, None), source.now(), source.namespace_labels(pod.namespace))
    room = None
    if live is not None and decision.best() is None and pod.spec.node_name is None and not decision.job.errors:
        # A waiting pod in a live cluster: what preemption and gpuplace defrag would free for it.
        from scheduler_extender.cluster.defrag import what_would_free
        _, pods, budgets = live
        same = next((p for p in pods if (p.get("metadata") or {}).get("namespace", "default") == pod.namespace
                     and (p.get("metadata") or {}).get("name") == pod.name), None)
        room = what_would_free(engine, source.cache, pods, budgets, as_pod(same) if same is not None else pod)
    if args.json:
        print(json.dumps({**explain_decision(decision, policy), **({"room": room} if room is not None else {})},
                         indent=2))
    else:
        print(render_decision(decision, policy))
        if room is not None:
            from scheduler_extender.cluster.defrag import render_freeing
            print("\n".join(render_freeing(room)))
    return 0


WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")


def _load_docs(path: str) -> list[Any]:
    """Every YAML document of ``path`` (``-``: stdin). Raises OSError, yaml.YAMLError."""
    from node_agent.inventory import NoAliasLoader
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return [d for d in yaml.load_all(text, Loader=NoAliasLoader) if d]  # noqa: S506 - a SafeLoader


def _pod_of(docs: list[Any], path: str) -> Pod:
    """The first Pod of ``docs``, else the pod template of the first workload (Deployment,
    StatefulSet, DaemonSet, ReplicaSet, Job, CronJob). Raises ValueError naming the file."""
    for d in docs:
        if not isinstance(d, dict):
            continue
        obj = None
        if d.get("kind", "Pod") == "Pod":
            obj = d
        elif d.get("kind") in WORKLOAD_KINDS:
            obj = ((d.get("spec") or {}).get("template") or None)
        elif d.get("kind") == "CronJob":
            obj = ((((d.get("spec") or {}).get("jobTemplate") or {}).get("spec") or {}).get("template") or None)
        if isinstance(obj, dict):
            meta = dict(obj.get("metadata") or {})
            meta.setdefault("name", (d.get("metadata") or {}).get("name"))
            meta.setdefault("namespace", (d.get("metadata") or {}).get("namespace"))
            try:
                return as_pod({**obj, "metadata": meta})
            except PodShapeError as e:
                raise ValueError(f"{path}: {e}") from None
    raise ValueError(f"{path}: no Pod manifest or workload with a pod template found")


def _dra_fleet(args: argparse.Namespace, engine: Engine) -> Any:
    """The DRA fleet of ``--resource-slices FILE`` (ResourceSlices, and ResourceClaims marking their
    devices held) or of the live cluster of ``--kubeconfig``. Raises ValueError, OSError,
    yaml.YAMLError; API and configuration errors from the client."""
    from scheduler_extender.cluster.dra import static_fleet
    from scheduler_extender.core.dra_slices import drivers_with_file, split_objects
    drivers = drivers_with_file(getattr(args, "dra_drivers", None))  # DriverTableError is a ValueError
    if getattr(args, "resource_slices", None):
        objects = split_objects(_load_docs(args.resource_slices))
        if not objects.get("ResourceSlice"):
            raise ValueError(f"--resource-slices {args.resource_slices}: no ResourceSlice in it "
                             "(kubectl get resourceslices,resourceclaims -A -o yaml)")
        return static_fleet(objects["ResourceSlice"], objects.get("ResourceClaim", []), engine.catalog, drivers)
    from kubernetes import client, config
    config.load_kube_config(config_file=args.kubeconfig)
    with client.ApiClient() as api_client:
        api = client.ResourceV1Api(api_client)
        slices = json.loads(api.list_resource_slice(_preload_content=False).data).get("items") or []
        claims = json.loads(api.list_resource_claim_for_all_namespaces(_preload_content=False).data).get("items") or []
    return static_fleet(slices, claims, engine.catalog, drivers)


def _claim_template(docs: list[Any], pod: Pod, args: argparse.Namespace) -> dict[str, Any]:
    """The ResourceClaimTemplate of ``docs`` that ``pod`` names, else a generic one of
    ``--count`` devices of ``--device-class`` named ``--name`` (default ``<pod>-gpu``)."""
    wanted = {c.resource_claim_template_name for c in pod.spec.resource_claims or () if c.resource_claim_template_name}
    for d in docs:
        if isinstance(d, dict) and d.get("kind") == "ResourceClaimTemplate" and \
                (not wanted or (d.get("metadata") or {}).get("name") in wanted):
            return d
    name = args.name or (next(iter(sorted(wanted))) if wanted else f"{pod.name or 'pod'}-gpu")
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, **({"namespace": pod.metadata.namespace} if pod.metadata.namespace else {})},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": args.device_class, "count": args.count}}]}}}}


def cmd_claim(args: argparse.Namespace) -> int:
    """``gpuplace claim POD.yaml``: the pod's ResourceClaimTemplate as the claim webhook writes it."""
    from scheduler_extender.core.dra_claims import ALTERNATIVES_ANNOTATION, CLAIMS_ANNOTATION, ClaimError
    from scheduler_extender.service.claim_webhook import claim_writer
    if not _count_in_range(args.count):
        return 2
    policy = _policy(args.policy)
    if policy is None:
        return 2
    engine = Engine(policy)
    loaded = _pod_file(args.pod)
    if loaded is None:
        return 2
    docs, pod = loaded
    try:
        fleet = _dra_fleet(args, engine)
    except Exception as e:  # noqa: BLE001 - files, config, connection and API errors all end here
        print(f"gpuplace: cannot read the cluster's ResourceSlices: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    template = _claim_template(docs, pod, args)
    if pod.annotations.get(CLAIMS_ANNOTATION) == "leave":
        print(f"# {CLAIMS_ANNOTATION}: leave: the template as written", file=sys.stderr)
        print(yaml.safe_dump(template, sort_keys=False), end="")
        return 0
    spec = ((template.get("spec") or {}).get("spec")) if isinstance(template.get("spec"), dict) else None
    if not isinstance(spec, dict):
        print(f"gpuplace: ResourceClaimTemplate {(template.get('metadata') or {}).get('name')}: no spec.spec",
              file=sys.stderr)
        return 2
    try:
        written = claim_writer(engine, fleet, pod, None)(spec, f"pod {pod.namespace}/{pod.name}")
    except ClaimError as e:
        print(str(e), file=sys.stderr)
        return 1
    out = json.loads(json.dumps(template))
    out["spec"]["spec"] = written.spec
    if written.written:
        meta = out["spec"].setdefault("metadata", {})
        meta.setdefault("annotations", {})[ALTERNATIVES_ANNOTATION] = written.annotation()
    if not any(k.startswith("gpuplace.io/") for k in pod.annotations):
        print("# the pod has no gpuplace.io/ annotation: the claim webhook would leave its claims as written; "
              "here they are written by price alone", file=sys.stderr)
    for note in written.notes:
        print(f"# {note}", file=sys.stderr)
    print(yaml.safe_dump(out, sort_keys=False), end="")
    return 0


def _explain_with_claims(args: argparse.Namespace, engine: Engine, policy: Policy, pod: Pod, docs: list[Any],
                         labels: Any) -> int:
    """``gpuplace explain --resource-slices`` (or ``--kubeconfig`` for a pod with claims): the
    alternatives gpuplace wrote into the pod's claims (the cluster's) or would write, and per node
    the device DRA's allocator would give there and its score."""
    from scheduler_extender.core.dra_claims import ClaimError, decide_with_claims, written_requests
    from scheduler_extender.service.claim_webhook import claim_writer
    try:
        fleet = _dra_fleet(args, engine)
    except Exception as e:  # noqa: BLE001 - files, their contents, config, connection and API errors
        where = f"--resource-slices {args.resource_slices}" if args.resource_slices else f"--kubeconfig {args.kubeconfig}"
        print(f"gpuplace: cannot read the ResourceSlices of {where}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    ns_labels = labels.get(pod.namespace) if isinstance(labels, dict) else None
    written = _written_claims(fleet, pod)
    if written is None:
        args.name, args.device_class = None, getattr(args, "device_class", "gpu.nvidia.com")
        template = _claim_template(docs, pod, args)
        spec = (template.get("spec") or {}).get("spec") or {}
        try:
            written = claim_writer(engine, fleet, pod, ns_labels)(spec, f"pod {pod.namespace}/{pod.name}")
        except ClaimError as e:
            if args.json:
                print(json.dumps({"claim": {"refused": str(e)}}, indent=2))
            else:
                print(f"claim: refused: {e}\nthe pod stays Pending (its claim is not created)")
            return 0
    requests = written_requests(written.spec, written.written)
    names = fleet.node_names()
    decision = decide_with_claims(engine, pod, fleet.states(names), requests, ns_labels)
    if args.json:
        print(json.dumps({"claim": {"alternatives": {k: [a.to_json() for a in v] for k, v in written.written.items()},
                                    "notes": list(written.notes)},
                          "inventory": {n: {"source": inv.source, "notes": list(inv.notes)}
                                        for n in names if (inv := fleet.inventory(n)) is not None},
                          **explain_decision(decision, policy)}, indent=2))
        return 0
    print("claim: " + ("; ".join(written.notes) or "nothing to write"))
    for n in names:
        inv = fleet.inventory(n)
        if inv is not None and inv.notes:
            print(f"  {n}: " + "; ".join(inv.notes[:5]))
    print(f"inventory: {', '.join(sorted({inv.source for n in names if (inv := fleet.inventory(n)) is not None}))}")
    print(render_decision(decision, policy))
    return 0


def _written_claims(fleet: Any, pod: Pod) -> Any:
    """A ``ClaimWrite`` of the claims of ``pod`` (a pod from the cluster: its status names them)
    that gpuplace wrote already, as the fleet holds them; None when it holds none."""
    from scheduler_extender.core.dra_claims import ClaimWrite, alternatives_of
    requests: list[Any] = []
    written: dict[str, Any] = {}
    for name in pod.claim_names():
        claim = fleet.claim(pod.namespace, name)
        alts = alternatives_of(claim) if claim is not None else None
        if alts:
            written.update(alts)
            requests.extend(((claim.get("spec") or {}).get("devices") or {}).get("requests") or [])
    return ClaimWrite({"devices": {"requests": requests}}, written, (f"as written in the pod's claims: {len(written)} "
                                                                      "request(s)",)) if written else None


def cmd_defrag(args: argparse.Namespace) -> int:
    from scheduler_extender.cluster.defrag import (ClusterReader, StepLog, execute, make_plans, plans_json,
                                                   render_plans, static_cluster)
    policy = _policy(args.policy)
    if policy is None:
        return 2
    if args.max_moves < 1:
        print(f"gpuplace: --max-moves {args.max_moves}: must be at least 1", file=sys.stderr)
        return 2
    if args.execute and not args.kubeconfig:
        print("gpuplace: --execute carries a plan out in a live cluster: it needs --kubeconfig", file=sys.stderr)
        return 2
    if args.inventory_dir and not args.pods:
        print("gpuplace: --inventory-dir needs --pods FILE (the Pods, bound and pending, and "
              "PodDisruptionBudgets)", file=sys.stderr)
        return 2
    engine = Engine(policy)
    api_client = None
    try:
        if args.kubeconfig:
            from kubernetes import client, config
            config.load_kube_config(config_file=args.kubeconfig)
            api_client = client.ApiClient()
            reader = ClusterReader(api_client, engine).read
            cache, pods, budgets = reader()
        else:
            cache, pods, budgets = static_cluster(args.inventory_dir, args.pods, engine)
    except Exception as e:  # noqa: BLE001 - config, connection, API and file errors all end here
        where = f"--kubeconfig {args.kubeconfig}" if args.kubeconfig else f"--inventory-dir {args.inventory_dir}"
        print(f"gpuplace: cannot read the cluster from {where}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    result = make_plans(engine, cache, pods, budgets, args.max_moves)
    if not args.execute:
        print(json.dumps(plans_json(result), indent=2) if args.json else render_plans(result))
        return 0
    from scheduler_extender.cluster.preemption import KubePreemptionApi
    api = KubePreemptionApi(api_client)
    log = StepLog()
    bound = [execute(engine, reader, api, uid, plan, lambda line: (log(line), None if args.json else print(line, flush=True)),
                     args.timeout_seconds, max_moves=args.max_moves) for uid, plan in result.plans]
    if args.json:
        print(json.dumps({**plans_json(result), "executed": log.lines, "bound": sum(bound)}, indent=2))
    return 0 if all(bound) else 1


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
    where.add_argument("--resource-slices", metavar="FILE",
                       help="a fleet given as ResourceSlices (kubectl get resourceslices,resourceclaims -A -o yaml): "
                            "the pod as a pod with a GPU claim (its ResourceClaimTemplate from the pod's file, else "
                            "one of --count devices): the alternatives gpuplace writes, and per node the device "
                            "the allocator would give and its score")
    e.add_argument("--count", type=int, default=1, help="with --resource-slices: devices of the generic claim (default: 1)")
    e.add_argument("--dra-drivers", metavar="FILE", help="with --resource-slices: DRA driver mappings to add")
    e.add_argument("--policy", metavar="FILE", help="policy YAML (default: the shipped policy)")
    e.add_argument("--namespace-labels", metavar="FILE",
                   help="labels of namespaces for tenants with a namespaceSelector (YAML namespace: {label: value}, "
                        "or `kubectl get namespaces -o yaml`); without it such tenants deny (labels unknown)")
    e.add_argument("--json", action="store_true", help="print the explanation as JSON (the POST /explain answer)")
    e.set_defaults(fn=cmd_explain)
    cl = sub.add_parser(
        "claim", help="print the pod's ResourceClaimTemplate with its GPU requests as gpuplace writes them (DRA)",
        description="Print the ResourceClaimTemplate of a pod (or of a workload's pod template) with each GPU request "
                    "written as a firstAvailable list of the device types of the cluster that fit the pod, cheapest "
                    "first, premium GPUs last, each with CEL selectors for what gpuplace's filter requires: what the "
                    "claim webhook writes at admission, for GitOps repositories. The template is the one in the "
                    "file that the pod names (spec.resourceClaims), else a generic one of --count devices of "
                    "--device-class. Exit 1 with gpuplace's reason when no device type fits.")
    cl.add_argument("pod", help="pod or workload manifest (YAML/JSON, may hold its ResourceClaimTemplate), '-' for stdin")
    where = cl.add_mutually_exclusive_group(required=True)
    where.add_argument("--resource-slices", metavar="FILE",
                       help="the fleet's ResourceSlices (kubectl get resourceslices -o yaml)")
    where.add_argument("--kubeconfig", metavar="FILE", help="a live cluster: list its ResourceSlices and ResourceClaims")
    cl.add_argument("--count", type=int, default=1, help="devices of a generic claim (default: 1)")
    cl.add_argument("--device-class", default="gpu.nvidia.com",
                    help="DeviceClass of a generic claim (default: gpu.nvidia.com, NVIDIA's DRA driver's)")
    cl.add_argument("--name", help="name of a generic claim template (default: POD-gpu)")
    cl.add_argument("--dra-drivers", metavar="FILE", help="DRA driver mappings to add (form of data/dra-drivers.yaml)")
    cl.add_argument("--policy", metavar="FILE", help="policy YAML (default: the shipped policy)")
    cl.set_defaults(fn=cmd_claim)
    d = sub.add_parser(
        "defrag", help="room for waiting GPU pods by moving movable pods: the fewest moves, as a plan (dry run) "
                       "or carried out (--execute)",
        description="Plan the fewest moves of movable pods that make room for each waiting GPU pod (a move evicts a "
                    "pod and its controller's replacement goes to another node where it fits). A pod is movable "
                    "when it carries the label gpuplace.io/movable=true, a controller owns it (a ReplicaSet, a "
                    "StatefulSet, ...) and no PodDisruptionBudget forbids its eviction now. Waiting pods are planned "
                    "highest priority first. Prints each plan: pod, from, to, what it frees, for whom. Nothing is "
                    "changed without --execute.")
    where = d.add_mutually_exclusive_group(required=True)
    where.add_argument("--kubeconfig", metavar="FILE", help="a live cluster: its Nodes, Pods, Namespaces and "
                                                            "PodDisruptionBudgets")
    where.add_argument("--inventory-dir", metavar="DIR", help="one NodeGPUInventory file per node (with --pods)")
    d.add_argument("--pods", metavar="FILE", help="with --inventory-dir: the Pods (bound: spec.nodeName; waiting: "
                                                  "none) and PodDisruptionBudgets, e.g. kubectl get pods,pdb -A -o yaml")
    d.add_argument("--policy", metavar="FILE", help="policy YAML (default: the shipped policy)")
    d.add_argument("--max-moves", type=int, default=8, metavar="N", help="the most moves one plan may have (default: 8)")
    d.add_argument("--json", action="store_true", help="print the plans (and with --execute the steps) as JSON")
    d.add_argument("--execute", action="store_true",
                   help="carry the plans out, one move at a time: hold the waiting pod on its node (annotation "
                        "extender.gpuplace.io/nominated-node), evict through the Eviction API (never a plain "
                        "delete), re-plan on the cluster as it is before each move, wait for the evicted pod to go; "
                        "exit 1 unless every planned pod was bound")
    d.add_argument("--timeout-seconds", type=float, default=300.0, metavar="S",
                   help="with --execute: how long to wait for one waiting pod to be bound (default: 300)")
    d.set_defaults(fn=cmd_defrag)
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
