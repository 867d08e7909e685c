"""A small openb replay through the real kube-scheduler (``benchmarks.bench_replay``): the test
fixture's 24 openb nodes (a share of each model time-sliced) and its 74 pods in FGD's order, the
chart's scheduler configuration, two extender replicas, one of them killed halfway, the emulated
device plugin and agent. The full replay is a benchmark (``benchmarks/README.md``)."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_replay
from tests.factories import ROOT

pytestmark = pytest.mark.e2e

FIX = ROOT / "tests" / "fixtures" / "sim"


def test_a_small_replay_over_commits_nothing_loses_no_pod_and_lands_near_the_simulator(control_plane, tmp_path):
    out = tmp_path / "replay.json"
    bench_replay.main(["--pods", str(FIX / "openb_pod_list_gpuspec33.csv"), "--fleet", str(FIX / "openb_node_list_gpu_node.csv"),
                       "--rate", "40", "--seed", "0", "--shares", "0.5,1.0", "--settle-seconds", "4",
                       "--kill-replica-at", "0.5", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["time_sliced_nodes"] > 0 and report["pods"] > 60
    for row in report["by_share"]:
        print(f"\nshare {row['share']}: gpuplace {row['milli_allocation_ratio']:.2%}, simulator "
              f"{row['sim_milli_allocation_ratio']:.2%}, kube-scheduler alone {row['kube_scheduler_milli_allocation_ratio']:.2%}"
              f" ({row['kube_scheduler_vram_overcommitted_gpus']} GPUs over-committed)")
        assert row["vram_overcommitted_gpus"] == 0 and row["device_overcommits"] == 0
        # Ties are broken at random in both (kube-scheduler's order, the device plugin's choice): near, not equal.
        assert abs(row["milli_allocation_ratio"] - row["sim_milli_allocation_ratio"]) <= 0.05
    last = report["gpuplace"]["shares"][-1]
    assert last["bound"] + last["pending"] == report["pods"]  # every pod bound or Pending
    assert "not yet tried" not in last["pending_reasons"]  # each Pending pod says why
    killed = report["gpuplace"]["replica_killed"]
    assert killed is not None and killed["next_binding_after_s"] is not None
