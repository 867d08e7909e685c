"""``gpuplace simulate --sharing device-plugin``: the cluster's sharing model (time-sliced nodes,
the cluster's rules for who shares, the device plugin's choice of GPU), and the replay's pieces
that need no control plane."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter

import pytest

from benchmarks.bench_replay import Fleet, pod_body, share_bounds, stand_in_rows
from scheduler_extender.core.catalog import CatalogFileError, catalog_with_file, default_catalog
from scheduler_extender.served.grouped import GroupedEngine
from scheduler_extender.simulator import device_plugin
from scheduler_extender.simulator.baselines import GpuplacePolicy, KubeBaseline
from scheduler_extender.simulator.cluster import Cluster
from scheduler_extender.simulator.fgd import FgdPolicy
from scheduler_extender.simulator.model import SimNode, SimPod, make_inventory, simulation_catalog
from scheduler_extender.simulator.run import run_fill
from tests.factories import ROOT

CAT = simulation_catalog()
ENGINE = GroupedEngine(catalog=CAT)
FIX = ROOT / "tests" / "fixtures" / "sim"


def node(name, model_id, count):
    return SimNode(name, make_inventory(name, CAT.entries[model_id], count), 64000, 262144, f"{model_id}x{count}")


def share(name, milli):
    return device_plugin.cluster_pod(SimPod(name, 1, cpu_milli=100, memory_mib=128, gpu_milli=milli), "small")


def test_each_models_share_of_nodes_is_time_sliced_spread_over_the_list():
    nodes = [node(f"t4-{i}", "t4", 2) for i in range(10)] + [node(f"v-{i}", "v100-pcie-16gb", 4) for i in range(3)]
    picked = device_plugin.time_sliced(nodes, 0.3)
    assert [i for i, p in enumerate(picked) if p] == [0, 3, 6, 10]  # 3 of 10 T4 nodes, ceil(0.9) = 1 V100 node
    assert device_plugin.time_sliced(nodes, 0.3) == picked  # deterministic
    assert not any(device_plugin.time_sliced(nodes, 0.0)) and all(device_plugin.time_sliced(nodes, 1.0))
    with pytest.raises(ValueError, match="between 0 and 1"):
        device_plugin.time_sliced(nodes, 1.5)


def test_the_plugin_gives_a_gpu_with_the_fewest_replicas_in_use_ties_at_random():
    rng = random.Random(1)
    assert device_plugin.plugin_choice([2, 1, 3, 1], 4, rng) in (1, 3)
    assert Counter(device_plugin.plugin_choice([0, 0], 4, rng) for _ in range(200)).keys() == {0, 1}
    assert device_plugin.plugin_choice([4, 4], 4, rng) is None
    assert device_plugin.plugin_choice([4, 3], 4, rng) == 1


def test_sharing_pods_carry_their_share_and_class_and_whole_gpu_pods_are_unchanged():
    p = share("s", 250)
    assert p.annotations == {"gpuplace.io/gpu-fraction": "0.25", "gpuplace.io/class": "small"}
    whole = SimPod("w", 2)
    assert device_plugin.cluster_pod(whole, "small") is whole
    assert device_plugin.sharing_class(ENGINE.policy) == "small"
    assert device_plugin.sharing_share([SimPod("a", 1, gpu_milli=500), SimPod("b", 1), SimPod("c", 0)]) == 500 / 1500


def mixed_cluster(replicas=4):
    nodes = device_plugin.cluster_fleet([node("a", "t4", 2), node("b", "t4", 2)], 0.5, replicas)
    assert [n.sharing is not None for n in nodes] == [True, False]
    return Cluster(nodes, CAT, ENGINE.policy)


def test_sharing_pods_go_only_to_time_sliced_nodes_whole_gpu_pods_never_cpu_only_pods_anywhere():
    c = mixed_cluster()
    assert c.fits_resources(share("s", 300)).tolist() == [True, False]
    assert c.fits_resources(SimPod("w", 1)).tolist() == [False, True]
    assert c.fits_resources(SimPod("cpu", 0, cpu_milli=10)).tolist() == [True, True]
    for pol in (GpuplacePolicy(ENGINE), KubeBaseline("spread", CAT), FgdPolicy([share("t", 300)])):
        assert pol.feasible(share("s", 300), c).tolist() == [True, False], pol.name
        assert pol.feasible(SimPod("w", 1), c).tolist() == [False, True], pol.name


def test_kube_scheduler_counts_replicas_and_the_plugins_choice_over_commits_vram_gpuplace_never_does():
    """Three 600-milli shares on one time-sliced node of two GPUs: the plugin puts the third on a
    GPU that already holds 600 (1200 > 1000). gpuplace's filter sees it coming; spread does not."""
    pods = [share(f"s{k}", 600) for k in range(3)]
    for pol, placed, over, safe in ((KubeBaseline("spread", CAT), 3, (1, 2, 1200), 0.3),
                                    (GpuplacePolicy(ENGINE), 2, (0, 0, 0), 0.6)):
        nodes = device_plugin.cluster_fleet([node("a", "t4", 2)], 1.0, 4)
        snap = run_fill(nodes, pods, pol, ENGINE, [1.0], seed=0)[1.0]
        assert snap.placed == placed, pol.name
        assert (snap.overcommitted_gpus, snap.overcommitted_pods, snap.overcommitted_milli) == over, pol.name
        assert snap.safe_allocation_ratio == pytest.approx(safe), pol.name  # of 2,000 milli-GPUs


def test_replicas_bound_a_time_sliced_gpu_even_when_its_memory_is_not_used_up():
    nodes = device_plugin.cluster_fleet([node("a", "t4", 1)], 1.0, 2)
    snaps = run_fill(nodes, [share(f"s{k}", 100) for k in range(3)], GpuplacePolicy(ENGINE), ENGINE, [1.0], seed=0)
    assert (snaps[1.0].placed, snaps[1.0].unplaced) == (2, 1)


def test_the_simulate_command_runs_the_device_plugin_mode_and_refuses_its_options_without_it(tmp_path):
    base = [sys.executable, "-m", "scheduler_extender.gpuplace_cli", "simulate", "--trace", "openb",
            "--pods", str(FIX / "openb_pod_list_gpuspec33.csv"), "--load", "1.0", "--repeats", "1", "--baselines", "spread"]
    out = subprocess.run([*base, "--sharing", "device-plugin", "--replicas", "4", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "over-committed GPUs" in out.stdout
    bad = subprocess.run([*base, "--replicas", "4"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--sharing device-plugin only" in bad.stderr
    bad = subprocess.run([*base, "--sharing", "device-plugin", "--time-sliced-share", "lots"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "between 0 and 1, or auto" in bad.stderr


def test_replay_share_bounds_are_where_the_simulator_takes_its_snapshots():
    pods = [SimPod(f"p{k}", 1, gpu_milli=500) for k in range(6)]  # 3000 milli in all
    assert share_bounds(pods, 2000, [0.5, 1.0, 2.0]) == [2, 4, 6]


def test_replay_pods_select_time_sliced_nodes_by_label_and_tolerate_their_taint():
    nodes = device_plugin.cluster_fleet([node("a", "t4", 2), node("b", "v100-pcie-16gb", 2)], 0.5, 4)
    fleet = Fleet(nodes, 0.5, 4, {"t4": {"Tesla-T4"}, "v100-pcie-16gb": {"Tesla-V100-PCIE-16GB"}})
    body = pod_body(share("openb-pod-0001", 300), fleet, "gpuplace-scheduler")
    assert body["spec"]["nodeSelector"] == {"nvidia.com/gpu.sharing-strategy": "time-slicing"}
    assert body["spec"]["tolerations"][0]["key"] == device_plugin.TAINT["key"]
    assert body["metadata"]["annotations"]["gpuplace.io/gpu-fraction"] == "0.3"
    whole = pod_body(SimPod("w", 2, allowed_models=frozenset({"t4"})), fleet, "default-scheduler")
    assert "tolerations" not in whole["spec"] and whole["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    term = whole["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0]["values"] == ["Tesla-T4"]
    cpu_only = pod_body(SimPod("c", 0, cpu_milli=500), fleet, "gpuplace-scheduler")
    assert "nvidia.com/gpu" not in cpu_only["spec"]["containers"][0]["resources"]["limits"]
    assert node_labels_of(nodes[0]) == {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}
    alloc, _, taints, _ = fleet.node_object(nodes[0])
    assert alloc["nvidia.com/gpu"] == "8" and taints == [device_plugin.TAINT]


def node_labels_of(n):
    return device_plugin.node_labels(n.sharing)


def test_the_stand_in_rows_extend_the_shipped_catalog_as_the_extender_reads_them(tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text(stand_in_rows())
    cat = catalog_with_file(str(path), default_catalog())
    assert cat.resolve_driver_name("G2 (stand-in)").id == "openb-g2"
    with pytest.raises(CatalogFileError, match="appears twice"):
        catalog_with_file(str(path), cat)
    path.write_text("- {id: x}\n")
    with pytest.raises(CatalogFileError, match=str(path)):
        catalog_with_file(str(path), default_catalog())
    with pytest.raises(CatalogFileError, match="cannot read"):
        catalog_with_file(str(tmp_path / "missing.yaml"), default_catalog())
