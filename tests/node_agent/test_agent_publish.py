"""Publishing on the Node: patch body, labels, change detection, heartbeat, backoff."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from node_agent.inventory import ANNOTATION, NodeGPUInventory, parse_inventory
from node_agent.metrics import AgentMetrics
from node_agent.publish import (
    PATCH_CONTENT_TYPE,
    Backoff,
    NodePublisher,
    PublishError,
    node_labels,
    sanitize_label_value,
)
from tests.node_agent.agent_fixtures import A100_MIG, A100_NVSWITCH, H100_NVSWITCH, RTX4090, fake_from, fixture_data, probe_of


def inventory(path=A100_NVSWITCH, **kwargs: Any) -> NodeGPUInventory:
    return probe_of(fake_from(fixture_data(path)), **kwargs).probe()


class FakeCoreV1:
    """Stands in for CoreV1Api: records patches, fails while ``failures`` has entries."""

    def __init__(self, failures: list[Exception] | None = None) -> None:
        self.failures = list(failures or [])
        self.patches: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        self.attempts = 0

    def patch_node(self, name: str, body: Any, **kwargs: Any) -> Any:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        self.patches.append((name, body, kwargs))
        return {"metadata": {"name": name}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def publisher(api: FakeCoreV1, clock: Clock, **kwargs: Any) -> NodePublisher:
    kwargs.setdefault("rng", lambda: 0.0)
    return NodePublisher(api, "gpu-a100-0", clock=clock, wall_clock=lambda: 1_700_000_000.0, sleep=clock.sleep, **kwargs)


def later(inv: NodeGPUInventory, seconds: float) -> NodeGPUInventory:
    return inv.model_copy(update={"observed_at": inv.observed_at + dt.timedelta(seconds=seconds)})


def test_patch_sets_the_compact_json_annotation_and_the_labels_with_a_strategic_merge_patch():
    api, clock = FakeCoreV1(), Clock()
    inv = inventory()
    pub = publisher(api, clock)
    pub.offer(inv)
    assert pub.step()
    name, body, kwargs = api.patches[0]
    assert name == "gpu-a100-0"
    assert kwargs["_content_type"] == PATCH_CONTENT_TYPE == "application/strategic-merge-patch+json"
    assert set(body) == {"metadata"} and set(body["metadata"]) == {"annotations", "labels"}
    annotation = body["metadata"]["annotations"][ANNOTATION]
    assert annotation == inv.to_json() and "\n" not in annotation and ": " not in annotation
    assert parse_inventory(annotation) == inv
    assert body["metadata"]["labels"]["gpuplace.io/gpu-count"] == "8"


@pytest.mark.parametrize(
    "path, model, count, gib, mig, nvlink, ecc",
    [
        (A100_NVSWITCH, "NVIDIA-A100-SXM4-80GB", "8", "80", "false", "true", "true"),
        (H100_NVSWITCH, "NVIDIA-H100-80GB-HBM3", "8", "80", "false", "true", "true"),
        (A100_MIG, "NVIDIA-A100-80GB-PCIe", "1", "80", "true", "false", "true"),
        (RTX4090, "NVIDIA-GeForce-RTX-4090", "1", "24", "false", "false", "false"),
    ],
)
def test_labels_describe_the_node_for_node_selectors(path, model, count, gib, mig, nvlink, ecc):
    assert node_labels(inventory(path)) == {
        "gpuplace.io/gpu-model": model,
        "gpuplace.io/gpu-count": count,
        "gpuplace.io/gpu-memory-gib": gib,
        "gpuplace.io/mig": mig,
        "gpuplace.io/nvlink": nvlink,
        "gpuplace.io/ecc": ecc,
    }


def test_a_node_without_gpus_removes_the_model_and_memory_labels():
    inv = inventory(RTX4090).model_copy(update={"gpus": []})
    labels = node_labels(inv)
    assert labels["gpuplace.io/gpu-model"] is None and labels["gpuplace.io/gpu-memory-gib"] is None
    assert (labels["gpuplace.io/gpu-count"], labels["gpuplace.io/ecc"]) == ("0", "false")


def test_the_model_label_is_the_most_common_gpu():
    inv = inventory()
    odd = inv.gpus[0].model_copy(update={"name": "NVIDIA H100 80GB HBM3"})
    assert node_labels(inv.model_copy(update={"gpus": [odd, *inv.gpus[1:]]}))["gpuplace.io/gpu-model"] == "NVIDIA-A100-SXM4-80GB"


def test_ecc_label_is_true_only_when_every_gpu_has_ecc_on():
    inv = inventory()
    off = inv.gpus[0].model_copy(update={"ecc_enabled": None})
    assert node_labels(inv.model_copy(update={"gpus": [off, *inv.gpus[1:]]}))["gpuplace.io/ecc"] == "false"


@pytest.mark.parametrize(
    "name, value",
    [
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("  NVIDIA GeForce RTX 4090 (rev a1) ", "NVIDIA-GeForce-RTX-4090-rev-a1"),
        ("AMD Instinct MI300X/OAM", "AMD-Instinct-MI300X-OAM"),
        ("X" * 70 + " tail", "X" * 63),
        ("_-weird-_", "weird"),
    ],
)
def test_label_values_are_safe_and_at_most_63_characters(name, value):
    got = sanitize_label_value(name)
    assert got == value and len(got) <= 63


def test_only_a_change_other_than_observed_at_is_published_before_the_heartbeat():
    api, clock = FakeCoreV1(), Clock()
    inv = inventory()
    pub = publisher(api, clock, heartbeat_seconds=60)
    pub.offer(inv)
    assert pub.step()
    clock.now += 30
    pub.offer(later(inv, 30))
    assert not pub.step() and len(api.patches) == 1
    assert pub.seconds_until_due() == pytest.approx(30)
    unhealthy = inv.gpus[0].model_copy(update={"healthy": False, "health_reasons": ["row remapping pending"]})
    pub.offer(later(inv, 31).model_copy(update={"gpus": [unhealthy, *inv.gpus[1:]]}))
    assert pub.seconds_until_due() == 0
    assert pub.step() and len(api.patches) == 2


def test_a_new_temperature_alone_waits_for_the_heartbeat_which_carries_the_latest():
    api, clock = FakeCoreV1(), Clock()
    inv = inventory()
    assert inv.gpus[0].temperature_c == 28

    def warmer(seconds: float, by: int) -> NodeGPUInventory:
        gpus = [g.model_copy(update={"temperature_c": g.temperature_c + by}) for g in inv.gpus]
        return later(inv, seconds).model_copy(update={"gpus": gpus})

    pub = publisher(api, clock, heartbeat_seconds=60)
    pub.offer(inv)
    assert pub.step()
    clock.now += 30
    pub.offer(warmer(30, 5))
    assert not pub.changed() and not pub.step() and len(api.patches) == 1
    clock.now += 30
    pub.offer(warmer(60, 9))
    assert pub.step() and len(api.patches) == 2
    sent = parse_inventory(api.patches[-1][1]["metadata"]["annotations"][ANNOTATION])
    assert [g.temperature_c for g in sent.gpus] == [g.temperature_c + 9 for g in inv.gpus]


def test_an_unchanged_inventory_is_republished_every_heartbeat_with_the_new_observed_at():
    api, clock = FakeCoreV1(), Clock()
    inv = inventory()
    pub = publisher(api, clock, heartbeat_seconds=60)
    pub.offer(inv)
    pub.step()
    clock.now += 60
    pub.offer(later(inv, 60))
    assert pub.step()
    sent = parse_inventory(api.patches[-1][1]["metadata"]["annotations"][ANNOTATION])
    assert sent.observed_at == inv.observed_at + dt.timedelta(seconds=60)


def test_backoff_doubles_with_jitter_and_is_capped():
    b = Backoff(initial_s=1, max_s=60, multiplier=2, jitter=0.5)
    assert [b.delay(n, 0.0) for n in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert [b.delay(n, 1.0) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_while_the_api_server_is_away_it_retries_with_backoff_and_publishes_the_latest_inventory():
    away = [ApiException(status=503, reason="Service Unavailable"), ConnectionRefusedError("connection refused"),
            ApiException(status=503, reason="Service Unavailable")]
    api, clock = FakeCoreV1(away), Clock()
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry)
    pub = publisher(api, clock, metrics=metrics)
    first = inventory()
    pub.offer(first)
    assert not pub.step()  # fails; retry in 0.5 s
    assert not pub.step() and api.attempts == 1, "no attempt during the backoff"
    clock.now += 0.5
    assert not pub.step() and api.attempts == 2  # fails; retry in 1 s
    newest = later(first, 1).model_copy(update={"gpus": first.gpus[:7]})  # a GPU vanished meanwhile
    pub.offer(newest)
    clock.now += 1
    assert not pub.step() and api.attempts == 3  # fails; retry in 2 s
    clock.now += 2
    assert pub.step() and api.attempts == 4
    sent = parse_inventory(api.patches[0][1]["metadata"]["annotations"][ANNOTATION])
    assert sent == newest, "the newest inventory is what reaches the Node"
    assert registry.get_sample_value("gpuplace_agent_publish_errors_total") == 3
    assert registry.get_sample_value("gpuplace_agent_last_publish_timestamp_seconds") == 1_700_000_000.0


def test_publish_until_retries_until_it_succeeds():
    api, clock = FakeCoreV1([ConnectionRefusedError("refused")] * 3), Clock()
    pub = publisher(api, clock)
    pub.offer(inventory())
    pub.publish_until(30)
    assert api.attempts == 4 and clock.slept == [0.5, 1, 2]


def test_publish_until_gives_up_at_the_deadline_with_the_last_error():
    api, clock = FakeCoreV1([ApiException(status=503, reason="Service Unavailable")] * 100), Clock()
    pub = publisher(api, clock)
    pub.offer(inventory())
    with pytest.raises(PublishError, match=r"within 10 s .* HTTP 503 Service Unavailable"):
        pub.publish_until(10)
    assert sum(clock.slept) <= 10


def test_publish_until_stops_at_once_when_the_api_server_rejects_the_patch_itself():
    body = json.dumps({"kind": "Status", "message": "metadata.annotations: Too long: must have at most 262144 bytes"})
    api, clock = FakeCoreV1([ApiException(status=422, reason="Unprocessable Entity")]), Clock()
    api.failures[0].body = body
    pub = publisher(api, clock)
    pub.offer(inventory())
    with pytest.raises(PublishError, match="rejected the patch.*422.*Too long"):
        pub.publish_until(30)
    assert api.attempts == 1


@pytest.mark.parametrize(
    "status, hint",
    [(404, "check --node-name"), (403, "get/patch on nodes"), (401, "get/patch on nodes")],
)
def test_failures_say_what_to_check(status, hint, caplog):
    api, clock = FakeCoreV1([ApiException(status=status, reason="x")]), Clock()
    pub = publisher(api, clock)
    pub.offer(inventory())
    pub.step()
    assert hint in pub.last_error and pub.last_error_retryable
    assert hint in caplog.text


def test_nothing_is_published_before_an_inventory_is_offered():
    api, clock = FakeCoreV1(), Clock()
    pub = publisher(api, clock)
    assert pub.seconds_until_due() is None and not pub.step()
    with pytest.raises(PublishError):
        pub.publish_until(1)
