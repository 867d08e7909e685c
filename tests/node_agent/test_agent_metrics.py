"""The agent's /metrics: inventory gauges read at scrape time, plus the agent's own counters."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from node_agent.metrics import InventorySnapshot, build_registry
from tests.node_agent.agent_fixtures import A100_MIG, A100_NVSWITCH, RTX4090, fake_from, fixture_data, probe_of

MIB = 1024 * 1024


def inventory(path, node="gpu-node-0"):
    return probe_of(fake_from(fixture_data(path)), node_name=node).probe()


@pytest.fixture
def scrape():
    snapshot = InventorySnapshot()
    registry, metrics = build_registry(snapshot, CollectorRegistry())
    return snapshot, registry, metrics


def test_each_gpu_has_info_memory_nvlink_health_and_ecc_series(scrape):
    snapshot, registry, _ = scrape
    inv = inventory(A100_NVSWITCH)
    snapshot.set(inv)
    g = inv.gpus[0]
    gpu = {"node": "gpu-node-0", "gpu_uuid": g.uuid}
    assert registry.get_sample_value("gpuplace_gpu_info", {**gpu, "model": "NVIDIA A100-SXM4-80GB", "mig_mode": "disabled"}) == 1
    assert registry.get_sample_value("gpuplace_gpu_memory_bytes", gpu) == 81920 * MIB
    assert registry.get_sample_value("gpuplace_gpu_nvlink_links", gpu) == 7 * 12
    assert registry.get_sample_value("gpuplace_gpu_healthy", gpu) == 1
    assert registry.get_sample_value("gpuplace_gpu_ecc_enabled", gpu) == 1
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert len(families["gpuplace_gpu_info"].samples) == 8


def test_mig_devices_are_counted_by_profile(scrape):
    snapshot, registry, _ = scrape
    inv = inventory(A100_MIG)
    snapshot.set(inv)
    labels = {"node": "gpu-node-0", "gpu_uuid": inv.gpus[0].uuid, "profile": "3g.40gb"}
    assert registry.get_sample_value("gpuplace_gpu_mig_devices", labels) == 2
    assert registry.get_sample_value("gpuplace_gpu_info", {"node": "gpu-node-0", "gpu_uuid": inv.gpus[0].uuid,
                                                           "model": "NVIDIA A100 80GB PCIe", "mig_mode": "enabled"}) == 1


def test_series_of_a_gpu_that_vanished_disappear_at_the_next_scrape(scrape):
    snapshot, registry, _ = scrape
    inv = inventory(A100_NVSWITCH)
    snapshot.set(inv)
    gone = {"node": "gpu-node-0", "gpu_uuid": inv.gpus[7].uuid}
    assert registry.get_sample_value("gpuplace_gpu_healthy", gone) == 1
    snapshot.set(inv.model_copy(update={"gpus": inv.gpus[:7]}))
    assert registry.get_sample_value("gpuplace_gpu_healthy", gone) is None
    assert registry.get_sample_value("gpuplace_gpu_memory_bytes", gone) is None


def test_unhealthy_gpu_reads_0_and_unknown_ecc_has_no_series(scrape):
    snapshot, registry, _ = scrape
    inv = inventory(RTX4090)
    bad = inv.gpus[0].model_copy(update={"healthy": False, "health_reasons": ["x"], "ecc_enabled": None})
    snapshot.set(inv.model_copy(update={"gpus": [bad]}))
    gpu = {"node": "gpu-node-0", "gpu_uuid": bad.uuid}
    assert registry.get_sample_value("gpuplace_gpu_healthy", gpu) == 0
    assert registry.get_sample_value("gpuplace_gpu_ecc_enabled", gpu) is None


def test_an_empty_snapshot_exposes_only_the_agent_metrics(scrape):
    _, registry, metrics = scrape
    metrics.probe_errors.inc()
    metrics.probe_duration.observe(0.2)
    text = generate_latest(registry).decode()
    assert "gpuplace_gpu_info{" not in text
    assert registry.get_sample_value("gpuplace_agent_probe_errors_total") == 1
    assert registry.get_sample_value("gpuplace_agent_probe_duration_seconds_count") == 1
    assert registry.get_sample_value("gpuplace_agent_publish_errors_total") == 0


def test_metric_names_follow_the_prometheus_naming_guide(scrape):
    snapshot, registry, _ = scrape
    snapshot.set(inventory(A100_MIG))
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    names = {f.name: f.type for f in families}
    assert {
        "gpuplace_gpu_info", "gpuplace_gpu_memory_bytes", "gpuplace_gpu_mig_devices", "gpuplace_gpu_nvlink_links",
        "gpuplace_gpu_healthy", "gpuplace_gpu_ecc_enabled", "gpuplace_agent_probe_duration_seconds",
        "gpuplace_agent_probe_errors", "gpuplace_agent_publish_errors", "gpuplace_agent_last_publish_timestamp_seconds",
    } <= set(names)
    for f in families:
        assert f.name.startswith("gpuplace_")
        assert f.documentation
        for s in f.samples:
            assert s.name.endswith("_total") == (f.type == "counter" and s.name == f.name + "_total"), s.name
            assert "pod" not in s.labels, "labels must stay bounded: never pod names"


def test_the_exposition_passes_promtool_check_metrics(scrape, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not on PATH (Debian package 'prometheus' provides it)")
    snapshot, registry, metrics = scrape
    snapshot.set(inventory(A100_MIG))
    metrics.probe_duration.observe(0.1)
    result = subprocess.run([promtool, "check", "metrics"], input=generate_latest(registry), capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
