"""The ResourceSlice the DRA test double publishes (tests/harness/dra_driver.py slice_of), without a
cluster or Go: NVIDIA's driver's device names, attributes and quantities for the example inventories.
tests/e2e/test_dra_node.py checks that hack/dra-test-driver publishes the same."""

import json

import pytest

from tests.harness.controlplane import REPO_ROOT
from tests.harness.dra_driver import DEVICE_CLASSES, architecture, binary_si, pcie_bus_id, semver, slice_of

EXAMPLES = REPO_ROOT / "examples" / "cluster"


def example(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.json").read_text())


def devices(inv: dict) -> dict[str, dict]:
    return {d["name"]: d for d in slice_of(inv, "n0")["spec"]["devices"]}


def test_one_pool_named_after_the_node_holds_every_healthy_nvidia_gpu():
    s = slice_of(example("gpu-a100-80g-0"), "gpu-a100-80g-0")
    assert s["apiVersion"] == "resource.k8s.io/v1" and s["kind"] == "ResourceSlice"
    assert s["spec"]["driver"] == "gpu.nvidia.com" and s["spec"]["nodeName"] == "gpu-a100-80g-0"
    assert s["spec"]["pool"] == {"name": "gpu-a100-80g-0", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in s["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]


def test_a_whole_gpu_has_the_attributes_and_memory_nvidias_driver_publishes():
    inv = example("gpu-a100-80g-0")
    gpu0 = devices(inv)["gpu-0"]
    assert gpu0["attributes"] == {
        "type": {"string": "gpu"}, "uuid": {"string": inv["gpus"][0]["uuid"]},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"}, "brand": {"string": "Nvidia"},
        "architecture": {"string": "Ampere"}, "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "570.133.20"}, "cudaDriverVersion": {"version": "12.8.0"},
        "pcieBusID": {"string": pcie_bus_id(inv["gpus"][0]["pciBusId"])}}
    assert gpu0["capacity"] == {"memory": {"value": "80Gi"}}
    rtx = devices(example("gpu-4090-0"))["gpu-0"]
    assert rtx["attributes"]["brand"] == {"string": "GeForce"}
    assert rtx["attributes"]["architecture"] == {"string": "Ada Lovelace"}
    assert rtx["capacity"] == {"memory": {"value": "24564Mi"}}


def test_mig_devices_are_named_by_profile_id_and_placement_with_their_parents_attributes():
    inv = example("gpu-a100-mig-0")
    devs = devices(inv)
    assert sorted(devs) == ["gpu-0-mig-9-0-4", "gpu-0-mig-9-4-4", "gpu-1-mig-9-0-4", "gpu-1-mig-9-4-4"]
    mig = devs["gpu-0-mig-9-4-4"]
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["uuid"] == {"string": inv["gpus"][0]["migDevices"][1]["uuid"]}
    assert mig["attributes"]["parentUUID"] == {"string": inv["gpus"][0]["uuid"]}
    assert mig["attributes"]["profile"] == {"string": "3g.40gb"}
    assert mig["attributes"]["productName"] == {"string": "NVIDIA A100-SXM4-80GB"}
    assert mig["capacity"] == {"memory": {"value": "40192Mi"}, "multiprocessors": {"value": "42"}}
    # Seven 1g.10gb on one A100-80GB: GPU instance profile 19 at memory slices 0..6.
    assert sorted(devices(example("gpu-a100-mig-1"))) == [f"gpu-0-mig-19-{i}-1" for i in range(7)]


def test_unhealthy_gpus_and_mig_devices_and_amd_gpus_are_not_published():
    inv = example("gpu-a100-mig-0")
    inv["gpus"][1]["healthy"] = False
    inv["gpus"][0]["migDevices"][0]["healthy"] = False
    # The unhealthy MIG device still holds its memory slices: the other keeps its name.
    assert sorted(devices(inv)) == ["gpu-0-mig-9-4-4"]
    assert devices(example("gpu-amd-0")) == {}


def test_versions_default_when_the_inventory_has_none_and_are_strict_semver():
    inv = example("gpu-4090-0")
    inv.pop("driverVersion")
    inv.pop("cudaDriverVersion")
    attrs = devices(inv)["gpu-0"]["attributes"]
    assert attrs["driverVersion"] == {"version": "550.54.15"}
    assert attrs["cudaDriverVersion"] == {"version": "12.4.0"}


@pytest.mark.parametrize("given,want", [("8.0", "8.0.0"), ("12.8", "12.8.0"), ("535.104.05", "535.104.5"),
                                        ("570.133.20", "570.133.20"), ("", None), ("r550", None),
                                        ("1.2.3.4", None)])
def test_semver(given, want):
    assert semver(given) == want


@pytest.mark.parametrize("cc,want", [("7.0", "Volta"), ("7.5", "Turing"), ("8.0", "Ampere"), ("8.6", "Ampere"),
                                     ("8.9", "Ada Lovelace"), ("9.0", "Hopper"), ("10.0", "Blackwell"),
                                     ("12.0", "Blackwell"), ("13.0", None), (None, None)])
def test_architecture_from_compute_capability(cc, want):
    assert architecture(cc) == want


def test_quantities_and_bus_ids_are_written_as_kubernetes_and_nvml_write_them():
    assert binary_si(81920 << 20) == "80Gi"
    assert binary_si(40192 << 20) == "40192Mi"
    assert binary_si(1024) == "1Ki" and binary_si(42) == "42" and binary_si(0) == "0"
    assert pcie_bus_id("00000000:3D:00.0") == "0000:3d:00.0"


def test_device_classes_are_the_ones_nvidias_chart_creates():
    assert DEVICE_CLASSES == {
        "gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        "mig.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    }
