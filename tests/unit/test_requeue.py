"""Pods the extender passed no node for are requeued when its view changes in their favour (requeue.py)."""

from __future__ import annotations

import datetime as dt
import json

from prometheus_client import CollectorRegistry

from scheduler_extender.core.pod import as_pod
from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.policy import parse_policy
from scheduler_extender.service.metrics import ExtenderMetrics
from scheduler_extender.cluster.requeue import PENDING_GRACE_SECONDS, REQUEUE_ANNOTATION, Requeuer, requeue_patch
from scheduler_extender.cluster.sources import ClusterSource
from scheduler_extender.service.decisions import ExtenderService
from scheduler_extender.service.wire import parse_extender_args
from tests.factories import example_inventory, pod

NODES = ["gpu-4090-0", "gpu-4090-1"]
MINIMAL = {"classes": [{"name": "any"}], "rules": [{"class": "any"}], "defaultClass": "any"}
DENY_4090 = {**MINIMAL, "defaultTenant": {"deniedModels": ["RTX-4090"]}}


def node(name: str, gpus_allocatable: int = 4) -> dict:
    inv = {**example_inventory("gpu-4090-0"), "nodeName": name,
           "observedAt": dt.datetime.now(dt.timezone.utc).isoformat()}  # fresh: cluster mode checks staleness
    return {"metadata": {"name": name, "annotations": {"gpuplace.io/inventory": json.dumps(inv)}},
            "status": {"allocatable": {"cpu": "64", "pods": "110", "nvidia.com/gpu": str(gpus_allocatable)}}}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Setup:
    """A cluster cache with two 4-GPU RTX 4090 nodes whose allocatable says 2 (so both are
    rejected), the service, and a requeuer whose patches are recorded."""

    def __init__(self, engine: Engine | None = None, allocatable: int = 2, **requeuer_args) -> None:
        self.cache = ClusterCache(default_catalog())
        self.cache.replace_nodes([node(n, allocatable) for n in NODES])
        self.cache.replace_pods([])
        self.metrics = ExtenderMetrics(CollectorRegistry())
        self.service = ExtenderService(engine or Engine(), ClusterSource(self.cache, default_catalog()), self.metrics)
        self.clock = Clock()
        self.waiting: dict[str, bool] = {}
        self.patched: list[tuple[str, str, str]] = []
        self.requeuer = Requeuer(self.service, self.patch, lambda uid: self.waiting.get(uid), self.metrics.requeue,
                                 clock=self.clock, **requeuer_args)
        self.service.requeue = self.requeuer

    def patch(self, namespace: str, name: str, uid: str) -> str:
        self.patched.append((namespace, name, uid))
        return "requeued"

    def filter(self, p: dict, names: list[str] = NODES) -> dict:
        """kube-scheduler's filter call, with the nodes its own plugins passed."""
        self.waiting[p["metadata"]["uid"]] = True
        return self.service.filter(parse_extender_args(json.dumps({"Pod": p, "NodeNames": names}).encode()))

    def agree(self, name: str) -> None:
        """The device plugin now advertises all 4 GPUs of ``name``."""
        self.cache.apply_node_event("MODIFIED", node(name, 4))

    def due_names(self) -> list[str]:
        return [r.name for r in self.requeuer.due()]


def test_a_pod_refused_for_a_contradicted_inventory_is_due_once_allocatable_agrees():
    s = Setup()
    answer = s.filter(pod(name="waits"))
    assert not answer.get("NodeNames") and len(s.requeuer) == 1
    assert s.due_names() == []  # nothing changed since the answer
    s.agree("gpu-4090-1")
    assert s.due_names() == ["waits"]
    assert s.due_names() == [] and len(s.requeuer) == 0  # requeued once, then forgotten


def test_a_change_that_lets_no_node_pass_requeues_nothing_and_is_not_decided_again():
    s = Setup()
    s.filter(pod(name="waits"))
    s.cache.apply_node_event("MODIFIED", node("gpu-4090-0", 3))  # still fewer than the inventory's 4
    assert s.due_names() == []
    (r,) = s.requeuer._pods.values()
    assert r.generation == s.cache.generation  # decided at the current view: not re-decided until it changes
    s.agree("gpu-4090-0")
    assert s.due_names() == ["waits"]


def test_a_pod_answered_after_the_change_is_not_requeued_for_it():
    s = Setup()
    s.filter(pod(name="waits"))
    s.cache.apply_node_event("MODIFIED", node("gpu-4090-0", 3))
    s.filter(pod(name="waits"))  # kube-scheduler retried after the extender saw the change
    assert s.due_names() == []


def test_a_policy_reload_that_admits_the_pod_requeues_it_though_no_node_changed():
    s = Setup(engine=Engine(parse_policy(DENY_4090)), allocatable=4)
    answer = s.filter(pod(name="denied"))
    assert "RTX-4090" in json.dumps(answer["FailedNodes"] or answer["FailedAndUnresolvableNodes"])
    assert s.due_names() == []
    s.service.engine = Engine(parse_policy(MINIMAL))
    assert s.due_names() == ["denied"]


def test_a_policy_reload_that_still_denies_requeues_nothing():
    deny = parse_policy(DENY_4090)
    s = Setup(engine=Engine(deny), allocatable=4)
    s.filter(pod(name="denied"))
    s.service.engine = Engine(deny)
    assert s.due_names() == []


def test_pods_that_passed_a_node_ask_for_no_gpu_or_have_invalid_annotations_are_not_remembered():
    s = Setup(allocatable=4)
    s.filter(pod(name="fits"))
    s.filter(pod(name="cpu-only", gpus=None))
    s.filter(pod({"gpuplace.io/vram": "lots"}, name="typo"))
    assert len(s.requeuer) == 0


def test_a_remembered_pod_that_then_passes_a_node_is_forgotten():
    s = Setup()
    s.filter(pod(name="waits"))
    s.agree("gpu-4090-0")
    s.filter(pod(name="waits"))  # kube-scheduler's own retry found the node
    assert len(s.requeuer) == 0 and s.due_names() == []


def test_a_pod_no_longer_pending_is_not_requeued_and_forgotten_after_the_grace_unknown_is_kept():
    s = Setup()
    s.filter(pod(name="gone"))
    s.filter(pod(name="unknown"))
    s.waiting["uid-default-gone"] = False  # bound or deleted; or not delivered yet by the pending-pods watch
    del s.waiting["uid-default-unknown"]  # the pending-pods list has not arrived yet
    s.agree("gpu-4090-0")
    assert s.due_names() == ["unknown"]
    assert [r.name for r in s.requeuer._pods.values()] == ["gone"]  # kept: its watch may lag
    s.clock.t += PENDING_GRACE_SECONDS + 1
    assert s.due_names() == [] and len(s.requeuer) == 0


def test_a_pod_the_pending_watch_delivers_late_is_still_requeued():
    s = Setup()
    s.filter(pod(name="new"))
    s.waiting["uid-default-new"] = False  # not delivered yet
    s.agree("gpu-4090-0")
    assert s.due_names() == []
    s.clock.t += 1
    s.waiting["uid-default-new"] = True  # delivered
    assert s.due_names() == ["new"]


def test_a_requeued_pod_waits_a_doubling_backoff_before_its_next_requeue():
    s = Setup()
    gaps = []
    for i in range(4):
        s.filter(pod(name="flaps"))  # refused again (say, by a taint kube-scheduler checks)
        s.cache.apply_node_event("MODIFIED", node("gpu-4090-0", 2))
        s.cache.apply_node_event("MODIFIED", node("gpu-4090-0", 4))
        start = s.clock.t
        while not s.due_names():
            s.clock.t += 0.25
        gaps.append(s.clock.t - start)
        s.cache.apply_node_event("MODIFIED", node("gpu-4090-0", 2))
    assert gaps == [0.0, 1.0, 2.0, 4.0]


def test_remembered_pods_are_bounded_in_number_and_in_age():
    s = Setup(max_pods=3, max_age_seconds=300)
    for i in range(5):
        s.filter(pod(name=f"p{i}"))
    assert [r.name for r in s.requeuer._pods.values()] == ["p2", "p3", "p4"]
    s.clock.t += 301
    s.agree("gpu-4090-0")
    assert s.due_names() == [] and len(s.requeuer) == 0


def test_requeue_counts_each_result_and_a_raising_patch_is_an_error_not_a_crash():
    s = Setup()
    s.filter(pod(name="a"))
    s.filter(pod(name="b"))
    s.agree("gpu-4090-0")
    due = s.requeuer.due()
    results = iter(["forbidden"])

    def flaky(namespace, name, uid):
        try:
            return next(results)
        except StopIteration:
            raise ConnectionError("API server unreachable") from None

    s.requeuer._patch = flaky
    assert [s.requeuer.requeue(r) for r in due] == ["forbidden", "error"]
    counter = s.metrics.requeue.requeued
    assert counter.labels("forbidden")._value.get() == 1 and counter.labels("error")._value.get() == 1


def test_the_patch_sets_only_the_requeue_annotation_with_the_uid_as_precondition():
    body = requeue_patch(dt.datetime(2026, 11, 21, 15, 0, tzinfo=dt.timezone.utc), "uid-1")
    assert body == {"metadata": {"uid": "uid-1", "annotations": {REQUEUE_ANNOTATION: "2026-11-21T15:00:00.000000Z"}}}
    assert not REQUEUE_ANNOTATION.startswith("gpuplace.io/")  # never read as a request of the pod


def test_the_requeue_annotation_does_not_change_what_the_pod_asks_for():
    s = Setup(allocatable=4)
    plain = s.filter(pod(name="p"))
    marked = pod(name="p")
    marked["metadata"]["annotations"][REQUEUE_ANNOTATION] = "2026-11-21T15:00:00Z"
    assert s.filter(marked) == plain


def test_pods_of_one_spec_are_decided_once_per_check():
    s = Setup()
    for i in range(5):
        s.filter(pod(name=f"replica-{i}"))
    calls = []
    passing_nodes = s.service.passing_nodes
    s.service.passing_nodes = lambda *a: calls.append(a) or passing_nodes(*a)
    s.agree("gpu-4090-0")
    assert sorted(s.due_names()) == [f"replica-{i}" for i in range(5)]
    assert len(calls) == 1


def test_a_requeued_pod_shares_the_decision_of_its_unmarked_siblings():
    s = Setup(allocatable=4)
    marked = pod(name="b")
    marked["metadata"]["annotations"][REQUEUE_ANNOTATION] = "2026-11-21T15:00:00Z"
    engine = s.service.engine
    from scheduler_extender.served.grouped import decision_job
    assert decision_job(s.service.job_for(engine, as_pod(pod(name="a")))) is decision_job(s.service.job_for(engine, as_pod(marked)))


def test_the_loop_patches_due_pods_off_the_event_loop_and_keeps_going_after_a_failed_check():
    import asyncio
    import threading

    s = Setup()
    s.filter(pod(name="waits"))
    s.agree("gpu-4090-0")
    threads = []
    s.requeuer._patch = lambda ns, name, uid: threads.append(threading.current_thread()) or "requeued"
    real_due, failures = s.requeuer.due, iter([RuntimeError("boom")])

    def due_failing_once():
        for e in failures:
            raise e
        return real_due()

    s.requeuer.due = due_failing_once

    async def main():
        task = asyncio.create_task(s.requeuer.run(0.01))
        while not threads:
            await asyncio.sleep(0.01)
        task.cancel()
        return threading.current_thread()

    loop_thread = asyncio.run(asyncio.wait_for(main(), 10))
    assert threads and threads[0] is not loop_thread
    assert s.metrics.requeue.requeued.labels("requeued")._value.get() == 1


def test_a_node_kube_scheduler_leaves_out_requeues_a_pod_once_until_it_is_sent_again():
    s = Setup()
    s.filter(pod(name="tainted-elsewhere"), names=["gpu-4090-0"])  # kube-scheduler refuses gpu-4090-1 itself
    s.agree("gpu-4090-1")
    assert s.due_names() == ["tainted-elsewhere"]  # the extender cannot know kube-scheduler refuses it
    s.filter(pod(name="tainted-elsewhere"), names=["gpu-4090-0"])  # the retry: gpu-4090-1 left out again
    for _ in range(3):  # the agent's reports change the node again and again
        s.clock.t += 61
        s.cache.apply_node_event("MODIFIED", node("gpu-4090-1", 4))
        assert s.due_names() == []
    s.filter(pod(name="tainted-elsewhere"), names=NODES)  # the taint is gone; the extender refuses both now
    s.cache.apply_node_event("MODIFIED", node("gpu-4090-1", 2))
    s.filter(pod(name="tainted-elsewhere"), names=NODES)
    s.agree("gpu-4090-1")
    assert s.due_names() == ["tainted-elsewhere"]


def test_a_policy_reload_landing_during_the_decision_is_still_a_change_for_that_pod():
    s = Setup(engine=Engine(parse_policy(DENY_4090)), allocatable=4)
    decide = s.service._decide_grouped

    def decide_then_reload(args):
        out = decide(args)
        s.service.engine = Engine(parse_policy(MINIMAL))  # the ConfigMap watcher swaps it meanwhile
        return out

    s.service._decide_grouped = decide_then_reload
    s.filter(pod(name="denied"))
    assert s.due_names() == ["denied"]


def test_a_pod_whose_check_raises_is_kept_and_the_others_are_still_requeued():
    s = Setup()
    s.filter(pod(name="a"))
    s.filter(pod(name="b"))
    job_for = s.service.job_for

    def failing_for_a(engine, p):
        if p.name == "a":
            raise ValueError("broken pod")
        return job_for(engine, p)

    s.service.job_for = failing_for_a
    s.agree("gpu-4090-0")
    assert s.due_names() == ["b"]
    assert [r.name for r in s.requeuer._pods.values()] == ["a"]
    s.service.job_for = job_for
    assert s.due_names() == []  # not re-checked until the view changes again
    s.agree("gpu-4090-1")
    assert s.due_names() == ["a"]


def test_a_patch_that_fails_is_retried_after_the_backoff_a_refused_one_is_not():
    s = Setup()
    s.filter(pod(name="api-down"))
    s.filter(pod(name="no-rbac"))
    s.agree("gpu-4090-0")
    outcome = {"api-down": "error", "no-rbac": "forbidden"}
    s.requeuer._patch = lambda ns, name, uid: outcome[name]
    assert sorted(s.requeuer.requeue(r) for r in s.requeuer.due()) == ["error", "forbidden"]
    assert [r.name for r in s.requeuer._pods.values()] == ["api-down"]
    assert s.due_names() == []  # backoff: 1 s
    s.clock.t += 1
    assert s.due_names() == ["api-down"]


def test_pods_of_one_spec_decided_together_count_only_the_changes_after_their_own_answer():
    s = Setup()
    s.filter(pod(name="early"))  # refused on both nodes
    s.agree("gpu-4090-1")  # gpu-4090-1 passes from now on
    s.filter(pod(name="late"), names=["gpu-4090-0"])  # kube-scheduler left gpu-4090-1 out for this one
    s.cache.apply_node_event("MODIFIED", node("gpu-4090-0", 3))  # a later change that admits nothing
    assert s.due_names() == ["early"]  # gpu-4090-1 changed after "early" was answered, not after "late"


def test_a_failed_pod_patch_reads_as_gone_forbidden_or_error_by_its_status():
    from scheduler_extender.cluster.requeue import patch_failure
    assert [patch_failure(s) for s in (404, 409, 422)] == ["gone"] * 3  # deleted, or recreated under a new uid
    assert patch_failure(403) == "forbidden"
    assert [patch_failure(s) for s in (400, 429, 500, 503, None)] == ["error"] * 5
