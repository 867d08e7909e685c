"""The scheduler-throughput benchmark runs on the real control plane (smoke: tiny sizes, no timing
asserted; ``make bench`` reports the numbers)."""

import json

import pytest

from benchmarks import bench_scheduler

pytestmark = pytest.mark.e2e


def test_scheduler_benchmark_binds_pods_with_and_without_the_extender_and_through_the_floor(control_plane, tmp_path):
    out = tmp_path / "scheduler.json"
    bench_scheduler.main(["--sizes", "20", "--pods", "12", "--settle", "5", "--floor", "--out", str(out)])
    size = json.loads(out.read_text())["sizes"][0]
    assert size["without_extender"]["bound"] == 12
    assert size["with_extender"]["bound"] >= 10
    assert size["with_floor_extender"]["bound"] == 12  # the floor passes every node
    # where the time went: CPU per component, kube-scheduler's attempts, the extender's own handler time
    assert size["with_extender"]["cpu_ms_per_pod"]["extender"] > 0
    assert set(size["with_extender"]["cpu_ms_per_pod"]) >= {"etcd", "kube-apiserver", "kube-scheduler"}
    assert size["with_extender"]["attempts"]["scheduled"]["count"] == size["with_extender"]["bound"]
    assert size["with_extender"]["extender_handler_ms"]["filter"] > 0
