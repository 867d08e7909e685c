"""The served path (equivalence classes, job memo, remembered scores, the learned workload) decides
every pod of a simulation as the plain ``Engine.filter`` + ``Engine.score`` over every node would:
decision by decision, on the real openb fleet and pod list (Alibaba clusterdata, Weng et al.,
ATC'23) and on the generated LLM fleet. Speed work on the served layer must keep these passing."""

from __future__ import annotations

import random

import pytest

from scheduler_extender.core.engine import Engine
from scheduler_extender.served.grouped import GroupedEngine
from scheduler_extender.simulator import batch_fragmentation
from scheduler_extender.simulator.baselines import GpuplacePolicy
from scheduler_extender.simulator.model import simulation_catalog
from scheduler_extender.simulator.run import fgd_arrivals, run_fill
from scheduler_extender.simulator.traces import openb_nodes, openb_pods
from scheduler_extender.simulator.workload import llm_pods, mixed_fleet
from tests.factories import ROOT

CAT = simulation_catalog()
OPENB = ROOT / "benchmarks" / "data" / "alibaba-openb-v2023"


class CheckedPolicy(GpuplacePolicy):
    """gpuplace as the simulator runs it, with every scoring call checked against the plain path:
    ``Engine.filter`` and ``Engine.score`` on each node state of the request, with the same
    learned workload and the same supply (scarcity)."""

    def __init__(self, engine: GroupedEngine) -> None:
        super().__init__(engine)
        self.compared = 0
        served = self.decider.score
        reference = Engine(engine.policy, engine.catalog)  # the plain path: no memo of the served layer

        def checked(job, grouped, supply=None, workload=None):
            out = served(job, grouped, supply, workload)
            profile = workload if workload is not None else self.decider.workload_profile()
            plain = reference.filter(job, grouped.node_states, None)
            plain_scores = reference.score(job, grouped.node_states, plain, profile, supply)
            for i, (state, direct) in enumerate(zip(grouped.node_states, plain)):
                verdict = grouped.results[grouped.group_of[i]]
                where = f"pod {job.req.name or '?'} on {state.name}"
                assert (verdict.passed, verdict.reason) == (direct.passed, direct.reason), where
                got, want = out.scores[out.score_of[i]], plain_scores.get(state.name)
                assert (got is None) == (want is None), where
                if want is not None:
                    assert (got.score, dict(got.components), got.best_rank, got.cost_per_hour) == (
                        want.score, dict(want.components), want.best_rank, want.cost_per_hour), where
            self.compared += 1
            return out

        self.decider.score = checked  # type: ignore[method-assign]


def _run(nodes, pods) -> CheckedPolicy:
    engine = GroupedEngine(catalog=CAT)
    policy = CheckedPolicy(engine)
    run_fill(nodes, pods, policy, engine, [1.0], seed=0)
    return policy


def test_on_the_openb_fleet_every_gpuplace_decision_equals_the_plain_engine_on_every_node(monkeypatch):
    # Every 12th node of the openb fleet (101 nodes of every GPU model), the default pod list's
    # arrivals tuned to fill them, CPU-only pods included: sharing pods, whole-GPU pods, model
    # constraints, the learned workload and scarcity all take part. Every scoring call takes the
    # simulator's numpy batch of fragmentation increases, however few its candidates.
    monkeypatch.setattr(batch_fragmentation, "BATCH_FROM", 0)
    nodes = openb_nodes(OPENB / "openb_node_list_gpu_node.csv", CAT)[::12]
    pods, _ = openb_pods(OPENB / "openb_pod_list_default.csv", CAT, cpu_only=True)
    capacity = sum(len(n.inventory.gpus) for n in nodes) * 1000
    arrivals = fgd_arrivals(pods, 0, 1.0, capacity)
    policy = _run(nodes, arrivals)
    assert policy.compared > 300


@pytest.mark.parametrize("seed", [0, 1])
def test_on_the_generated_llm_fleet_every_gpuplace_decision_equals_the_plain_engine(seed):
    nodes = mixed_fleet(CAT)
    stream = llm_pods(seed)
    pods = [next(stream) for _ in range(250)]
    random.Random(seed).shuffle(pods)
    policy = _run(nodes, pods)
    assert policy.compared > 150
