"""Nodes without gpuplace-agent, decided on NVIDIA GPU feature discovery's labels when the policy
says so (``inventory.onMissing: gfd-labels``), marked as such in every reason (issue 14, item 5)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from scheduler_extender.cluster.cache import ClusterCache
from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.gfd import gfd_labels, inventory_from_labels
from scheduler_extender.core.policy import parse_policy
from scheduler_extender.cluster.sources import _AnnotationFallback as NodeObjectStates
from tests.factories import example_inventory, pod

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = yaml.safe_load((ROOT / "scheduler_extender" / "data" / "default-policy.yaml").read_text())
# The labels GFD writes on an 8x A100-SXM4-80GB node (NVIDIA/k8s-device-plugin, gpu-feature-discovery
# README "Generated Labels": product with spaces as '-', memory in MiB, count, compute capability).
A100_LABELS = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
               "nvidia.com/gpu.count": "8", "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "0",
               "nvidia.com/gpu.present": "true", "nvidia.com/mig.strategy": "single"}


def labels_policy():
    doc = copy.deepcopy(DEFAULT)
    doc["inventory"]["onMissing"] = "gfd-labels"
    return parse_policy(doc)


def node(labels, annotations=None, allocatable=None):
    obj = {"metadata": {"name": "gfd-0", "labels": dict(labels), "annotations": dict(annotations or {})}}
    if allocatable is not None:
        obj["status"] = {"allocatable": allocatable}
    return obj


def decide(policy, obj, p):
    cache = ClusterCache(default_catalog())
    cache.replace_nodes([obj])
    cache.replace_pods([])
    engine = Engine(policy)
    return engine.filter(engine.job(p), [cache.state("gfd-0")], None)[0]


def test_with_gfd_labels_accepted_a_node_without_the_agent_takes_a_pod_that_fits():
    result = decide(labels_policy(), node(A100_LABELS), pod({"gpuplace.io/model-params": "70B",
                                                             "gpuplace.io/workload": "inference"}, gpus=2))
    assert result.passed, result.reason
    unit = result.chosen[0]
    assert unit.entry is not None and unit.entry.id.startswith("a100") and unit.memory_bytes == 81920 * 2**20
    assert unit.ecc_enabled is None and unit.compute_capability == (8, 0)  # unknown stays None


def test_every_reason_for_a_label_node_says_where_its_inventory_came_from():
    result = decide(labels_policy(), node(A100_LABELS), pod({"gpuplace.io/vram": "200Gi"}))
    assert not result.passed and "GPU feature discovery labels" in result.reason
    nvlink = decide(labels_policy(), node(A100_LABELS), pod({"gpuplace.io/require": "nvlink"}, gpus=2))
    assert not nvlink.passed and "NVLink and health unknown" in nvlink.reason


def test_the_default_policy_does_not_use_labels_and_says_how_to():
    result = decide(parse_policy(DEFAULT), node(A100_LABELS), pod({}))
    assert not result.passed and "inventory.onMissing" in result.reason and "gfd-labels" in result.reason


def test_an_agent_inventory_wins_over_labels():
    inv = example_inventory("gpu-4090-0")
    inv["nodeName"] = "gfd-0"
    obj = node(A100_LABELS, {"gpuplace.io/inventory": json.dumps(inv)})
    result = decide(labels_policy(), obj, pod({}))
    assert result.passed and "4090" in result.chosen[0].name


def test_labels_claiming_more_gpus_than_allocatable_are_rejected():
    obj = node(A100_LABELS, allocatable={"nvidia.com/gpu": "2"})
    result = decide(labels_policy(), obj, pod({}))
    assert not result.passed and "GPU feature discovery labels" in result.reason


@pytest.mark.parametrize("change", [
    {"nvidia.com/gpu.count": "1000000"},
    {"nvidia.com/gpu.count": "0"},
    {"nvidia.com/gpu.memory": "lots"},
    {"nvidia.com/gpu.product": "A" * 500},
    {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"},
    {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-3g.40gb.count": "2"},
])
def test_labels_that_do_not_describe_whole_gpus_give_no_inventory(change):
    labels = {**A100_LABELS, **change}
    assert inventory_from_labels("gfd-0", gfd_labels(node(labels))) is None


def test_a_pod_asking_for_the_model_by_family_name_matches_the_gfd_product():
    result = decide(labels_policy(), node(A100_LABELS), pod({"gpuplace.io/gpu-models": "A100-80GB",
                                                             "gpuplace.io/model-params": "13B"}))
    assert result.passed, result.reason


def test_nodes_sent_in_the_request_are_derived_from_labels_too():
    states = NodeObjectStates(default_catalog())
    state = states.state("gfd-0", node(A100_LABELS))
    assert state.view is not None and state.view.provenance
    assert states.state("bare", {"metadata": {"name": "bare"}}).view is None
