"""``gpuplace defrag``: plans (``core.defrag``) for the pending GPU pods of a cluster, and carrying them out.

Which pods may move (``movable``): bound, running pods that hold devices, carry the label
``gpuplace.io/movable: "true"`` (their owners opt in), are owned by a controller that recreates
them (an ``ownerReferences`` entry with ``controller: true``: a ReplicaSet, a StatefulSet, ...),
are not being deleted, and whose eviction no PodDisruptionBudget forbids now. Which pods wait
(``pending``): unbound pods that request devices, highest priority first, then oldest.

``make_plans`` plans for each pending pod in turn on what the plans before it leave
(``core.defrag.Overlay``). ``execute`` carries a plan out one move at a time through the
Eviction API (never a plain delete): first the pending pod is held on the plan's node (the
annotation ``extender.gpuplace.io/nominated-node``, which every extender replica honours, so
that no replacement lands in the room being made); before each move the cluster is listed again
and the plan made again on it (the step taken is the new plan's first), the evicted pod must be
gone before the next step, and the run stops when the pending pod binds or a bound is reached.
Replacements are placed by kube-scheduler with the extender, wherever gpuplace sends them: the
plan showed that there is room for them.

I/O stays in ``ClusterReader`` and the preemption controller's ``KubePreemptionApi``; the rest
reads decoded objects.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from scheduler_extender.cluster.cache import TERMINAL_PHASES, ClusterCache
from scheduler_extender.cluster.preemption import ANY_NODE, PreemptionApi, protecting_budget
from scheduler_extender.core.defrag import DefragPlan, Movable, Overlay, plan_room
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.pod import PodShapeError, as_pod
from scheduler_extender.core.requirements import pod_gpu_requests

MOVABLE_LABEL = "gpuplace.io/movable"
"""A pod's label that lets ``gpuplace defrag`` move it (value ``"true"``)."""


@dataclass(frozen=True)
class Unplanned:
    """A pending pod no plan was made for, and why."""

    pod: str
    reason: str


@dataclass(frozen=True)
class Plans:
    plans: list[tuple[str, DefragPlan]]  # (the pending pod's uid, its plan), in order
    unplanned: list[Unplanned]


def movable_reason(obj: Mapping[str, Any], budgets: Sequence[Mapping[str, Any]]) -> str | None:
    """None when the bound pod ``obj`` may be moved (module docstring), else why not."""
    meta = obj.get("metadata") or {}
    if (meta.get("labels") or {}).get(MOVABLE_LABEL) != "true":
        return f"no label {MOVABLE_LABEL}=true"
    if meta.get("deletionTimestamp"):
        return "being deleted"
    if not any(isinstance(o, Mapping) and o.get("controller") is True for o in meta.get("ownerReferences") or ()):
        return "no controller owns it (nothing would recreate it)"
    budget = protecting_budget(meta.get("namespace") or "default", meta.get("labels") or {}, budgets)
    if budget is not None:
        return f"PodDisruptionBudget {budget} allows no disruption now"
    return None


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def _gpu_pod(obj: Mapping[str, Any]) -> Any:
    """The pod as the decision reads it, if it requests devices and is not finished; else None."""
    try:
        pod = as_pod(obj)
    except PodShapeError:
        return None
    if pod.status.phase in TERMINAL_PHASES or not pod_gpu_requests(pod)[0]:
        return None
    return pod


def _running(obj: Mapping[str, Any]) -> bool:
    return (obj.get("status") or {}).get("phase") == "Running"


def make_plans(engine: Engine, cache: ClusterCache, pods: Iterable[Mapping[str, Any]],
               budgets: Sequence[Mapping[str, Any]], max_moves: int | None = None) -> Plans:
    """Plans for the pending GPU pods among ``pods`` (all of the cluster's, as listed), on ``cache``
    (the same nodes and pods); ``budgets``: the PodDisruptionBudgets, as listed."""
    movable: list[Movable] = []
    pending: list[tuple[Any, Mapping[str, Any]]] = []
    for obj in pods:
        pod = _gpu_pod(obj)
        if pod is None:
            continue
        if not pod.spec.node_name:
            pending.append((pod, obj))
        elif _running(obj) and movable_reason(obj, budgets) is None and pod.uid:
            job = engine.job(pod, cache.namespace_labels(pod.namespace))
            if not job.errors:
                movable.append(Movable(pod.uid, _key(obj), pod.spec.node_name, job,
                                       sum(pod_gpu_requests(pod)[0].values())))
    pending.sort(key=lambda p: (-p[0].priority, str((p[1].get("metadata") or {}).get("creationTimestamp") or ""),
                                _key(p[1])))
    overlay = Overlay()
    out = Plans([], [])
    now = None  # inventories are not rejected for age here: the plan is for an operator to read
    limits = {} if max_moves is None else {"max_moves": max_moves}
    for pod, obj in pending:
        key = _key(obj)
        job = engine.job(pod, cache.namespace_labels(pod.namespace))
        if job.errors:
            out.unplanned.append(Unplanned(key, "; ".join(str(e) for e in job.errors)))
            continue
        plan = plan_room(job, key, cache, movable, engine.policy, now, overlay, **limits)
        if plan is None:
            out.unplanned.append(Unplanned(key, _why_not(engine, cache, job, overlay, movable, max_moves)))
            continue
        overlay.apply(plan, pod.uid or key, job)
        out.plans.append((pod.uid or key, plan))
    return out


def _why_not(engine: Engine, cache: ClusterCache, job: Any, overlay: Overlay, movable: Sequence[Movable],
             max_moves: int | None) -> str:
    from scheduler_extender.core.filter import filter_node
    names = cache.node_names()
    for name in names:
        st = overlay.state(cache, name)
        if st is not None and filter_node(job, st, engine.policy).passed:
            return f"fits on {name} already: nothing to move (kube-scheduler places it)"
    reasons = []
    for name in names:  # with every movable pod gone from it
        st = overlay.state(cache, name, frozenset(m.uid for m in movable if m.node == name))
        if st is not None:
            r = filter_node(job, st, engine.policy)
            if r.passed:
                return (f"no node can take the movable pods that block it within {max_moves or 'the most'} moves "
                        f"(e.g. {name}'s)")
            reasons.append(f"{name}: {r.reason}")
    return "no node has room even with every movable pod moved off it: " + "; ".join(reasons[:4]) + (
        f"; ... {len(reasons) - 4} more nodes" if len(reasons) > 4 else "")


def plans_json(result: Plans) -> dict[str, Any]:
    """The plans as ``gpuplace defrag --json`` prints them."""
    return {
        "plans": [{"pod": p.pending, "node": p.node, "exact": p.exact, "moves": [
            {"pod": m.pod.key, "from": m.pod.node, "to": m.destination, "devices": m.pod.devices}
            for m in p.moves]} for _, p in result.plans],
        "unplanned": [dataclasses.asdict(u) for u in result.unplanned],
    }


def render_plans(result: Plans) -> str:
    """The plans as text: per pending pod, where it gets room and each move (pod, from, to, what it frees, why)."""
    lines: list[str] = []
    for _, plan in result.plans:
        n = len(plan.moves)
        lines.append(f"{plan.pending}: room on {plan.node} after {n} move{'s' if n != 1 else ''}"
                     + ("" if plan.exact else " (search budget reached: maybe not the fewest)"))
        for i, m in enumerate(plan.moves, 1):
            lines.append(f"  {i}. move {m.pod.key} from {m.pod.node} to {m.destination}: frees {m.pod.devices} "
                         f"device{'s' if m.pod.devices != 1 else ''} on {m.pod.node}"
                         + (f" for {plan.pending}" if m.pod.node == plan.node else f" for {_first_to(plan, m.pod.node)}"))
    for u in result.unplanned:
        lines.append(f"{u.pod}: no plan: {u.reason}")
    if not lines:
        lines.append("no GPU pod is waiting")
    return "\n".join(lines)


def _first_to(plan: DefragPlan, node: str) -> str:
    """The moved pod a chained move makes room for (the first move into ``node``)."""
    return next((m.pod.key for m in plan.moves if m.destination == node), node)


class ClusterReader:
    """Nodes, pods, namespaces and PodDisruptionBudgets listed once through the official client."""

    def __init__(self, api_client: Any, engine: Engine) -> None:
        self._api, self._engine = api_client, engine

    def read(self) -> tuple[ClusterCache, list[Mapping[str, Any]], list[Mapping[str, Any]]]:
        """(cache of the nodes and pods, the pods, the budgets).

        Raises:
            kubernetes.client.ApiException: the API server refused a list.
        """
        import orjson
        from kubernetes import client

        core, policy = client.CoreV1Api(self._api), client.PolicyV1Api(self._api)
        cache = ClusterCache(self._engine.catalog, self._engine.vram_need_bytes)
        nodes = orjson.loads(core.list_node(_preload_content=False).data).get("items") or []
        pods = orjson.loads(core.list_pod_for_all_namespaces(_preload_content=False).data).get("items") or []
        namespaces = orjson.loads(core.list_namespace(_preload_content=False).data).get("items") or []
        budgets = orjson.loads(policy.list_pod_disruption_budget_for_all_namespaces(
            _preload_content=False).data).get("items") or []
        cache.replace_nodes(nodes)
        cache.replace_pods(pods)
        cache.replace_namespaces(namespaces)
        return cache, pods, budgets


@dataclass
class StepLog:
    """What ``execute`` did, line by line, for the command's output."""

    lines: list[str] = dataclasses.field(default_factory=list)

    def __call__(self, text: str) -> None:
        self.lines.append(text)


def execute(engine: Engine, reader: Callable[[], tuple[ClusterCache, list[Mapping[str, Any]], list[Mapping[str, Any]]]],
            api: PreemptionApi, pending_uid: str, plan: DefragPlan, log: Callable[[str], None],
            timeout_seconds: float = 300.0, poll_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep, seconds_between_moves: float = 0.0,
            max_moves: int | None = None, keep_going: Callable[[], bool] = lambda: True) -> bool:
    """Carry ``plan`` out (module docstring); True when the pending pod is bound at the end.
    ``seconds_between_moves``: the least time from one eviction to the next (a rate limit);
    ``max_moves``: the most moves a re-made plan may have (``make_plans``'s); ``keep_going()``:
    False stops it before the next step (the extender's replica lost the Lease), the hold
    withdrawn."""
    ns, name = plan.pending.split("/", 1)
    deadline = clock() + timeout_seconds
    node = plan.node
    if api.nominate(ns, name, pending_uid, node) != "nominated":
        log(f"{plan.pending}: cannot hold it on {node} (the patch was refused, or the pod is gone): nothing done")
        return False
    refused: set[str] = set()
    evicted: set[str] = set()
    last_move = -float("inf")
    moves_left = len(plan.moves) + 2  # a re-plan may need a move more; never more than this
    while clock() < deadline:
        if not keep_going():
            log(f"{plan.pending}: stopped (this replica no longer leads); its hold on {node} is withdrawn")
            api.nominate(ns, name, pending_uid, None)
            return False
        cache, pods, budgets = reader()
        uids = {(p.get("metadata") or {}).get("uid"): p for p in pods}
        current = uids.get(pending_uid)
        if current is None:
            log(f"{plan.pending}: gone")
            return False
        if (current.get("spec") or {}).get("nodeName"):
            log(f"{plan.pending}: bound to {current['spec']['nodeName']}")
            return True
        if any(u in uids for u in evicted) or clock() - last_move < seconds_between_moves:
            sleep(poll_seconds)  # a moved pod still holds its devices: wait for it to go (or the rate limit)
            continue
        visible = [p for p in pods if (p.get("metadata") or {}).get("uid") not in refused]
        again = make_plans(engine, cache, visible, budgets, max_moves)
        fresh = next((p for uid, p in again.plans if uid == pending_uid), None)
        if fresh is None:
            sleep(poll_seconds)  # room made (kube-scheduler binds it), or no plan any more: wait, then say
            continue
        if fresh.node != node:
            node = fresh.node
            api.nominate(ns, name, pending_uid, node)
            log(f"{plan.pending}: re-planned: room on {node} now")
        if moves_left <= 0:
            log(f"{plan.pending}: stopped: more moves than planned were needed; its hold on {node} is withdrawn")
            api.nominate(ns, name, pending_uid, None)
            return False
        move = fresh.moves[0]
        mns, mname = move.pod.key.split("/", 1)
        result = api.evict(mns, mname, move.pod.uid)
        last_move = clock()
        moves_left -= 1
        log(f"{plan.pending}: evict {move.pod.key} from {move.pod.node} (its replacement fits on "
            f"{move.destination}): {result}")
        if result in ("evicted", "gone"):
            evicted.add(move.pod.uid)
        else:
            refused.add(move.pod.uid)  # a budget forbids it now, say: planned without it from here on
        sleep(poll_seconds)
    log(f"{plan.pending}: not bound within {timeout_seconds:g} s; its hold on {node} is withdrawn")
    api.nominate(ns, name, pending_uid, None)
    return False



def static_cluster(inventory_dir: str, pods_file: str, engine: Engine
                   ) -> tuple[ClusterCache, list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """``ClusterReader.read`` for files: one NodeGPUInventory per node in ``inventory_dir`` (as the
    extender's static mode reads them; each becomes a Node with that annotation, no allocatable),
    and the Pods and PodDisruptionBudgets of ``pods_file`` (YAML or JSON documents, or ``kind:
    List`` of them, as ``kubectl get pods,pdb -A -o yaml`` prints them).

    Raises:
        ValueError: a file that is not an inventory, not YAML, or a document of another kind
            (the message names the file).
        OSError: a file cannot be read.
    """
    import json
    from pathlib import Path

    import yaml

    from node_agent.inventory import ANNOTATION, InventoryError, parse_inventory
    nodes = []
    directory = Path(inventory_dir)
    if not directory.is_dir():
        raise ValueError(f"--inventory-dir {inventory_dir}: not a directory")
    for path in sorted(p for p in directory.iterdir() if p.suffix in (".json", ".yaml", ".yml")):
        raw = path.read_text(encoding="utf-8")
        try:
            inv = parse_inventory(raw, source=str(path))
        except InventoryError as e:
            raise ValueError(str(e)) from None
        text = json.dumps(yaml.safe_load(raw))  # the annotation is JSON; the file may be YAML
        nodes.append({"metadata": {"name": inv.node_name, "annotations": {ANNOTATION: text}}})
    try:
        docs = [d for d in yaml.safe_load_all(Path(pods_file).read_text(encoding="utf-8")) if d]
    except yaml.YAMLError as e:
        raise ValueError(f"--pods {pods_file}: not YAML: {e}") from None
    items: list[Mapping[str, Any]] = []
    for d in docs:
        items.extend(d.get("items") or [] if isinstance(d, Mapping) and d.get("kind") == "List" else [d])
    pods = [d for d in items if isinstance(d, Mapping) and d.get("kind", "Pod") == "Pod"]
    budgets = [d for d in items if isinstance(d, Mapping) and d.get("kind") == "PodDisruptionBudget"]
    other = [d.get("kind") if isinstance(d, Mapping) else type(d).__name__ for d in items
             if not (isinstance(d, Mapping) and d.get("kind", "Pod") in ("Pod", "PodDisruptionBudget"))]
    if other:
        raise ValueError(f"--pods {pods_file}: only Pods and PodDisruptionBudgets are read, not {other[0]}")
    cache = ClusterCache(engine.catalog, engine.vram_need_bytes)
    cache.replace_nodes(nodes)
    cache.replace_pods(pods)
    return cache, pods, budgets


def what_would_free(engine: Engine, cache: ClusterCache, pods: Sequence[Mapping[str, Any]],
                    budgets: Sequence[Mapping[str, Any]], pod: Any) -> dict[str, Any]:
    """For ``gpuplace explain`` of a waiting pod: what preemption would evict for it (the
    controller's choice, ``core.preemption``: lower-priority pods, budgets honoured) and what
    defragmentation would move (``make_plans``'s plan for it, the pods waiting before it planned
    first). Shape: ``{"preemption": {"node", "victims": [...]} | {"reason"}, "defragmentation":
    {"node", "moves": [{"pod", "from", "to", "devices"}]} | {"reason"}}``."""
    from scheduler_extender.cluster.preemption import plan_preemption
    from scheduler_extender.served.grouped import as_grouped
    job = engine.job(pod, cache.namespace_labels(pod.namespace))
    out: dict[str, Any] = {}
    best, refusals = plan_preemption(as_grouped(engine), cache, pod, job, budgets)
    if best is not None:
        out["preemption"] = {"node": best.node, "victims": [v.key for v in best.victims]}
    else:
        out["preemption"] = {"reason": "; ".join(c.reason if c.node == ANY_NODE else f"{c.node}: {c.reason}"
                                                 for c in refusals[:4])}
        if refusals and refusals[0].reason.startswith("fits on "):
            out["defragmentation"] = {"reason": refusals[0].reason.replace("evict", "move")}
            return out
    key = _key({"metadata": {"namespace": pod.namespace, "name": pod.name}})
    if pod.spec.node_name:
        out["defragmentation"] = {"reason": "bound already"}
        return out
    listed = [p for p in pods if _key(p) != key] + [pod.model_dump(by_alias=True, exclude_none=True)]
    plans = make_plans(engine, cache, listed, budgets)
    plan = next((p for _, p in plans.plans if p.pending == key), None)
    if plan is not None:
        out["defragmentation"] = {"node": plan.node, "moves": [
            {"pod": m.pod.key, "from": m.pod.node, "to": m.destination, "devices": m.pod.devices} for m in plan.moves]}
    else:
        out["defragmentation"] = {"reason": next((u.reason for u in plans.unplanned if u.pod == key), "no plan")}
    return out


def render_freeing(room: Mapping[str, Any]) -> list[str]:
    """``what_would_free``'s answer as ``gpuplace explain``'s closing lines."""
    pre, de = room["preemption"], room["defragmentation"]
    lines = [f"preemption: evicting {', '.join(pre['victims'])} on {pre['node']} makes room" if "victims" in pre
             else f"preemption: nothing to evict: {pre['reason']}"]
    if "moves" in de:
        lines.append(f"defragmentation (gpuplace defrag): room on {de['node']} after {len(de['moves'])} moves: "
                     + "; ".join(f"{m['pod']} {m['from']} -> {m['to']}" for m in de["moves"]))
    else:
        lines.append(f"defragmentation (gpuplace defrag): {de['reason']}")
    return lines


class Defragmenter:
    """``--defrag-interval-seconds``: ``gpuplace defrag --execute`` inside the extender, on the
    replica that holds the Lease, one plan at a time: every interval the cluster is listed and
    planned; the first plan is carried out (``execute``), at most one eviction per interval.
    Metrics: moves planned, plans by outcome; evictions are counted with the preemption
    controller's (``gpuplace_extender_evictions_total``)."""

    def __init__(self, engine: Callable[[], Engine], reader: Callable[[Engine], Any], api: PreemptionApi,
                 metrics: Any, interval_seconds: float, log: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        """``engine()``: the engine in force (a policy reload swaps it); ``reader(engine)``: the
        cluster as ``ClusterReader.read`` lists it."""
        self._engine, self._reader, self._api, self._metrics = engine, reader, api, metrics
        self.interval_seconds, self._log, self._clock, self._sleep = interval_seconds, log, clock, sleep

    def once(self, leading: Callable[[], bool] = lambda: True) -> bool | None:
        """One pass: plan, and carry the first plan out (while ``leading()``); None when there was
        nothing to do."""
        engine = self._engine()
        cache, pods, budgets = self._reader(engine)
        result = make_plans(engine, cache, pods, budgets)
        if self._metrics is not None:
            self._metrics.defrag_moves_planned.inc(sum(len(p.moves) for _, p in result.plans))
        if not result.plans:
            return None
        uid, plan = result.plans[0]
        bound = execute(engine, lambda: self._reader(engine), _CountingApi(self._api, self._metrics), uid, plan,
                        self._log, timeout_seconds=max(300.0, 4 * self.interval_seconds * (len(plan.moves) + 1)),
                        poll_seconds=min(5.0, self.interval_seconds), seconds_between_moves=self.interval_seconds,
                        clock=self._clock, sleep=self._sleep, keep_going=leading)
        if self._metrics is not None:
            self._metrics.defrag_plans.labels("bound" if bound else "not_bound").inc()
        return bound

    def run(self, leading: Callable[[], bool]) -> None:
        """Forever (a thread of its own): every interval, while ``leading()``, ``once``."""
        while True:
            self._sleep(self.interval_seconds)
            if not leading():
                continue
            try:
                self.once(leading)
            except Exception as e:  # noqa: BLE001 - keep going; the next pass lists everything again
                self._log(f"defragmentation pass failed: {type(e).__name__}: {e}")


class _CountingApi:
    """``PreemptionApi`` that counts each eviction's result (``gpuplace_extender_evictions_total``)."""

    def __init__(self, api: PreemptionApi, metrics: Any) -> None:
        self._api, self._metrics = api, metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def evict(self, namespace: str, name: str, uid: str) -> str:
        result = self._api.evict(namespace, name, uid)
        if self._metrics is not None:
            self._metrics.evictions.labels(result).inc()
        return result
