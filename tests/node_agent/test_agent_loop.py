"""The agent loop: probe errors keep the last inventory, allocations are added, changes are published."""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry

from node_agent.agent import Agent
from node_agent.metrics import InventorySnapshot, build_registry
from node_agent.podresources import DeviceAllocation
from node_agent.publish import NodePublisher
from tests.node_agent.agent_fixtures import A100_MIG, fake_from, fixture_data, probe_of
from tests.node_agent.test_agent_publish import FakeCoreV1

MIG1 = "MIG-3adbed3a-d03d-549f-a016-ba1fd7359f23"


class ScriptedProbe:
    """Returns the given inventories (or raises the given exceptions) in turn, then repeats the last."""

    def __init__(self, *results):
        self.results = list(results)
        self.calls = 0

    def probe(self):
        self.calls += 1
        result = self.results[min(self.calls, len(self.results)) - 1]
        if isinstance(result, Exception):
            raise result
        return result


class FixedAllocations:
    def __init__(self, allocations):
        self._allocations = allocations

    def allocations(self):
        return self._allocations


def agent_with(probe, **kwargs):
    snapshot = InventorySnapshot()
    registry, metrics = build_registry(snapshot, CollectorRegistry())
    return Agent(probe, snapshot=snapshot, metrics=metrics, **kwargs), snapshot, registry


def mig_inventory():
    return probe_of(fake_from(fixture_data(A100_MIG))).probe()


def test_a_failing_probe_is_counted_and_the_last_inventory_stays():
    good = mig_inventory()
    agent, snapshot, registry = agent_with(ScriptedProbe(good, RuntimeError("NVML hiccup")))
    assert agent.probe_once() == good
    assert agent.probe_once() is None
    assert snapshot.get() == good
    assert registry.get_sample_value("gpuplace_agent_probe_errors_total") == 1
    assert registry.get_sample_value("gpuplace_agent_probe_duration_seconds_count") == 2


def test_allocations_from_the_kubelet_are_added_to_the_inventory():
    alloc = DeviceAllocation("infer", "llm-0", "server", "nvidia.com/mig-3g.40gb", MIG1)
    agent, snapshot, _ = agent_with(ScriptedProbe(mig_inventory()), pod_resources=FixedAllocations([alloc]))
    inv = agent.probe_once()
    assert [m.allocated_to for m in inv.gpus[0].mig_devices] == ["", "infer/llm-0"]
    assert snapshot.get() == inv


def test_unreachable_kubelet_leaves_allocations_as_the_probe_reported_them():
    agent, _, _ = agent_with(ScriptedProbe(mig_inventory()), pod_resources=FixedAllocations(None))
    assert all(m.allocated_to == "" for m in agent.probe_once().gpus[0].mig_devices)


def test_the_loop_probes_every_interval_and_publishes_only_changes():
    first = mig_inventory()
    changed = first.model_copy(update={"gpus": []})
    probe = ScriptedProbe(first, first, first, changed)
    api = FakeCoreV1()
    publisher = NodePublisher(api, "gpu-a100-mig-0", heartbeat_seconds=3600)
    agent, _, _ = agent_with(probe, publisher=publisher, interval_seconds=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    deadline = time.monotonic() + 5
    while (probe.calls < 5 or len(api.patches) < 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert probe.calls >= 5
    assert len(api.patches) == 2, "the first inventory, then the change; unchanged probes are not published"
