"""MIG devices under the NVIDIA device plugin's resource names (``.me``, ``.gfx``, compute-instance
sub-profiles), and the MIG strategy read from the Node when the agent does not state it (issue 14)."""

from __future__ import annotations

import json

import pytest

from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.allocatable import node_mig_strategy
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.requirements import mig_profile_of, mig_resource_name
from tests.factories import gpu, inventory, pod

A100 = dict(name="NVIDIA A100-SXM4-80GB", memory_mib=81920, eccEnabled=True, computeCapability="8.0", migEnabled=True)


def mig_inventory(profiles, **top):
    migs = [{"uuid": f"MIG-{i:04d}", "profile": p, "memoryMiB": m} for i, (p, m) in enumerate(profiles)]
    return inventory("a100-0", [gpu(0, **A100, migDevices=migs)], **top)


def node_obj(inv, labels=None, allocatable=None):
    obj = {"metadata": {"name": "a100-0", "labels": labels or {}, "annotations": {"gpuplace.io/inventory": json.dumps(inv)}}}
    if allocatable is not None:
        obj["status"] = {"allocatable": allocatable}
    return obj


def decide(node, p):
    cache = ClusterCache(default_catalog())
    cache.replace_nodes([node])
    cache.replace_pods([])
    state = cache.state("a100-0")
    engine = Engine()
    return engine.filter(engine.job(p), [state], None)[0]


@pytest.mark.parametrize("profile, resource", [
    ("3g.40gb", "nvidia.com/mig-3g.40gb"),
    ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),
    ("1g.24gb+gfx", "nvidia.com/mig-1g.24gb.gfx"),
    ("1g.23gb-me", "nvidia.com/mig-1g.23gb-me"),
    ("1c.3g.40gb", "nvidia.com/mig-1c.3g.40gb"),
])
def test_mig_resource_names_are_the_device_plugins_and_map_back_to_the_profile(profile, resource):
    assert mig_resource_name(profile) == resource
    assert mig_profile_of(resource) == profile


@pytest.mark.parametrize("resource", ["nvidia.com/mig-3g", "nvidia.com/mig-3g.40gb+me", "nvidia.com/mig-x.40gb"])
def test_a_malformed_mig_resource_is_refused_naming_the_form(resource):
    engine = Engine()
    job = engine.job(pod({}, resource=resource))
    assert job.errors and "nvidia.com/mig-1g.10gb.me" in str(job.errors[0])


@pytest.mark.parametrize("profile, resource", [
    ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),
    ("1c.3g.40gb", "nvidia.com/mig-1c.3g.40gb"),
])
def test_a_pod_asking_for_a_device_plugin_mig_resource_gets_that_mig_device(profile, resource):
    inv = mig_inventory([(profile, 9856 if "1g" in profile else 40192)], migStrategy="mixed")
    assert decide(node_obj(inv), pod({}, resource=resource)).passed
    other = "nvidia.com/mig-1g.10gb" if "+me" in profile else "nvidia.com/mig-3g.40gb"
    assert not decide(node_obj(inv), pod({}, resource=other)).passed


@pytest.mark.parametrize("labels, allocatable, strategy", [
    ({"nvidia.com/mig.strategy": "mixed"}, None, "mixed"),
    ({"nvidia.com/mig.strategy": "single"}, {"nvidia.com/gpu": "2"}, "single"),
    ({}, {"nvidia.com/mig-3g.40gb": "2", "nvidia.com/gpu": "0"}, "mixed"),
    ({}, {"nvidia.com/gpu": "2"}, None),
    ({"nvidia.com/mig.strategy": "bogus"}, None, None),
])
def test_the_mig_strategy_is_read_from_the_gfd_label_else_from_allocatable(labels, allocatable, strategy):
    assert node_mig_strategy(node_obj(mig_inventory([]), labels, allocatable)) == strategy


def test_with_the_charts_defaults_a_mig_pod_is_placed_on_a_mixed_strategy_node():
    inv = mig_inventory([("3g.40gb", 40192), ("3g.40gb", 40192)])  # the agent states no strategy
    assert "migStrategy" not in inv
    node = node_obj(inv, allocatable={"nvidia.com/mig-3g.40gb": "2", "nvidia.com/gpu": "0"})
    assert decide(node, pod({}, resource="nvidia.com/mig-3g.40gb")).passed


def test_under_the_single_strategy_label_mig_devices_are_nvidia_com_gpu():
    inv = mig_inventory([("3g.40gb", 40192), ("3g.40gb", 40192)])
    node = node_obj(inv, labels={"nvidia.com/mig.strategy": "single"}, allocatable={"nvidia.com/gpu": "2"})
    result = decide(node, pod({"gpuplace.io/vram": "30Gi"}, gpus=2))
    assert result.passed, result.reason


def test_a_strategy_the_agent_states_wins_over_the_node():
    inv = mig_inventory([("3g.40gb", 40192)], migStrategy="none")
    node = node_obj(inv, labels={"nvidia.com/mig.strategy": "mixed"}, allocatable={"nvidia.com/mig-3g.40gb": "1"})
    assert not decide(node, pod({}, resource="nvidia.com/mig-3g.40gb")).passed


def test_a_label_change_re_reads_the_strategy():
    inv = mig_inventory([("3g.40gb", 40192)])
    cache = ClusterCache(default_catalog())
    cache.replace_nodes([node_obj(inv)])
    cache.replace_pods([])
    assert "nvidia.com/mig-3g.40gb" not in cache.state("a100-0").view.units_by_resource
    cache.apply_node_event("MODIFIED", node_obj(inv, labels={"nvidia.com/mig.strategy": "mixed"}))
    assert "nvidia.com/mig-3g.40gb" in cache.state("a100-0").view.units_by_resource
