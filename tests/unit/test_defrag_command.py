"""``gpuplace defrag``: which pods move, the plans as printed, and what ``gpuplace explain`` says would free room."""

from __future__ import annotations

import json

import pytest

from scheduler_extender.cluster.defrag import make_plans, movable_reason, static_cluster, what_would_free
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.pod import as_pod
from scheduler_extender.gpuplace_cli import main
from tests.factories import ROOT

EXAMPLE = ROOT / "examples" / "defrag"
ARGS = ["defrag", "--inventory-dir", str(EXAMPLE / "cluster"), "--pods", str(EXAMPLE / "pods.yaml")]


def _pod(labels=None, owners=None, deleting=False, namespace="ml"):
    meta = {"name": "p", "namespace": namespace, "labels": labels or {}, "ownerReferences": owners or []}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    return {"metadata": meta}


RS = [{"kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": True}]


@pytest.mark.parametrize("obj, budgets, reason", [
    (_pod({"gpuplace.io/movable": "true"}, RS), [], None),
    (_pod({}, RS), [], "no label gpuplace.io/movable=true"),
    (_pod({"gpuplace.io/movable": "false"}, RS), [], "no label gpuplace.io/movable=true"),
    (_pod({"gpuplace.io/movable": "true"}, [{**RS[0], "controller": False}]), [], "no controller owns it"),
    (_pod({"gpuplace.io/movable": "true"}, RS, deleting=True), [], "being deleted"),
    (_pod({"gpuplace.io/movable": "true", "app": "a"}, RS),
     [{"metadata": {"name": "keep", "namespace": "ml"}, "spec": {"selector": {"matchLabels": {"app": "a"}}},
       "status": {"disruptionsAllowed": 0}}], "PodDisruptionBudget keep allows no disruption now"),
    (_pod({"gpuplace.io/movable": "true", "app": "a"}, RS),
     [{"metadata": {"name": "loose", "namespace": "ml"}, "spec": {"selector": {"matchLabels": {"app": "a"}}},
       "status": {"disruptionsAllowed": 1}}], None),
])
def test_a_pod_moves_only_when_opted_in_owned_by_a_controller_and_no_budget_forbids_it(obj, budgets, reason):
    got = movable_reason(obj, budgets)
    assert got == reason if reason is None else got.startswith(reason)


def test_the_example_plan_empties_the_node_with_the_fewest_movable_pods_and_leaves_protected_pods_alone(capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "ml/serve-70b: room on gpu-h100-c after 2 moves",
        "  1. move ml/notebook-a from gpu-h100-c to gpu-h100-a: frees 1 device on gpu-h100-c for ml/serve-70b",
        "  2. move ml/notebook-b from gpu-h100-c to gpu-h100-a: frees 1 device on gpu-h100-c for ml/serve-70b",
    ]
    assert main([*ARGS, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["unplanned"] == [] and [p["pod"] for p in plan["plans"]] == ["ml/serve-70b"]
    moved = {m["pod"] for p in plan["plans"] for m in p["moves"]}
    assert "ml/finetune-a" not in moved and "ml/train-d" not in moved  # a budget protects it; not opted in


def test_a_pod_that_no_move_helps_is_listed_with_the_reason(tmp_path, capsys):
    import yaml
    docs = list(yaml.safe_load_all((EXAMPLE / "pods.yaml").read_text()))
    waiting = next(d for d in docs if d["metadata"]["name"] == "serve-70b")
    waiting["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "9"  # more than a node has
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump_all(docs))
    assert main(["defrag", "--inventory-dir", str(EXAMPLE / "cluster"), "--pods", str(tmp_path / "pods.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ml/serve-70b: no plan: no node has room even with every movable pod moved off it: ")
    assert "gpu-h100-a: has 8 nvidia.com/gpu, 9 requested" in out


@pytest.mark.parametrize("args, message", [
    (["defrag", "--inventory-dir", str(EXAMPLE / "cluster")], "--inventory-dir needs --pods"),
    ([*ARGS, "--execute"], "--execute carries a plan out in a live cluster: it needs --kubeconfig"),
    ([*ARGS, "--max-moves", "0"], "--max-moves 0: must be at least 1"),
])
def test_wrong_options_are_refused_naming_the_option(args, message, capsys):
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_explain_of_a_waiting_pod_says_what_preemption_and_defragmentation_would_free():
    engine = Engine()
    cache, pods, budgets = static_cluster(str(EXAMPLE / "cluster"), str(EXAMPLE / "pods.yaml"), engine)
    waiting = next(p for p in pods if p["metadata"]["name"] == "serve-70b")
    room = what_would_free(engine, cache, pods, budgets, as_pod(waiting))
    # priority 1000 against pods of priority 0: preemption evicts the fewest pods; a move needs opted-in pods
    assert room["preemption"] == {"node": "gpu-h100-d", "victims": ["ml/train-d"]}  # one eviction, movable or not
    assert room["defragmentation"]["node"] == "gpu-h100-c" and len(room["defragmentation"]["moves"]) == 2
    plans = make_plans(engine, cache, pods, budgets)
    assert [p.node for _, p in plans.plans] == ["gpu-h100-c"]


class FakeCluster:
    """The example's pods as a live cluster would change them: an eviction deletes the pod and its
    ReplicaSet's replacement is bound where the plan said; kube-scheduler binds the waiting pod on
    its held node once the moved pods are gone (at the next wait). Time passes only in ``sleep``."""

    def __init__(self):
        import yaml
        self.docs = [d for d in yaml.safe_load_all((EXAMPLE / "pods.yaml").read_text()) if d]
        self.now = 0.0
        self.calls: list[tuple] = []
        self.nominated: dict[str, str | None] = {}
        self.evictions_at: list[float] = []

    def read(self, engine):
        import copy
        from scheduler_extender.cluster.cache import ClusterCache
        cache, _, budgets = static_cluster(str(EXAMPLE / "cluster"), str(EXAMPLE / "pods.yaml"), engine)
        pods = copy.deepcopy(self.docs)
        cache.replace_pods(pods)
        return cache, pods, budgets

    def sleep(self, seconds):
        self.now += seconds
        waiting = next(d for d in self.docs if d["metadata"]["name"] == "serve-70b")
        node = self.nominated.get(waiting["metadata"]["uid"])
        holders = [d for d in self.docs if d["spec"].get("nodeName") == node and d is not waiting]
        if node and not any(d["metadata"]["name"].startswith("notebook") and "-r" not in d["metadata"]["name"]
                            for d in holders):
            waiting["spec"]["nodeName"] = node

    def budgets(self):
        return []

    def nominate(self, namespace, name, uid, node):
        self.nominated[uid] = node
        return "nominated"

    def evict(self, namespace, name, uid):
        self.evictions_at.append(self.now)
        gone = next(d for d in self.docs if d["metadata"]["uid"] == uid)
        self.docs.remove(gone)
        replacement = json.loads(json.dumps(gone))
        replacement["metadata"].update(name=f"{name}-r", uid=f"{uid[:30]}-r")
        replacement["spec"]["nodeName"] = "gpu-h100-a"  # as the plan said; the static inventory does not pin GPUs
        self.docs.append(replacement)
        return "evicted"

    def event(self, *args):
        pass


def test_in_the_extender_a_pass_carries_the_first_plan_out_one_eviction_per_interval_and_counts_it():
    from prometheus_client import CollectorRegistry

    from scheduler_extender.cluster.defrag import Defragmenter
    from scheduler_extender.service.metrics import PreemptionMetrics
    fake = FakeCluster()
    metrics = PreemptionMetrics(CollectorRegistry())
    engine = Engine()
    d = Defragmenter(lambda: engine, fake.read, fake, metrics, 30.0, lambda line: None,
                     clock=lambda: fake.now, sleep=fake.sleep)
    assert d.once() is True
    assert len(fake.evictions_at) == 2 and fake.evictions_at[1] - fake.evictions_at[0] >= 30.0  # the rate limit
    assert metrics.defrag_moves_planned._value.get() == 2
    assert metrics.defrag_plans.labels("bound")._value.get() == 1
    assert metrics.evictions.labels("evicted")._value.get() == 2
