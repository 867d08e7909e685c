"""Dynamic Resource Allocation (DRA, ``resource.k8s.io/v1``) for the end-to-end tests: GPUs as devices.

A TEST DOUBLE for NVIDIA's DRA driver for GPUs (github.com/NVIDIA/k8s-dra-driver-gpu, its
``gpu-kubelet-plugin``), in two forms that describe the same devices:

* on the real node (:class:`tests.harness.realnode.RealCluster` with ``dra_inventory``), the Go
  program ``hack/dra-test-driver`` (built by :func:`ensure_dra_driver`): a real kubelet plugin that
  registers with the kubelet, publishes the node's ResourceSlice and answers
  ``NodePrepareResources`` with CDI devices;
* on a node without a kubelet (:func:`tests.harness.controlplane.create_node`),
  :func:`publish_slices_direct`, which writes the ResourceSlice :func:`slice_of` computes.

Devices are named and described as NVIDIA's driver does (v25.8, ``cmd/gpu-kubelet-plugin/deviceinfo.go``):
a GPU without MIG is ``gpu-<index>`` with ``type: gpu``, a MIG device ``gpu-<index>-mig-<giProfileId>-
<start>-<size>`` with ``type: mig``; attributes ``uuid``, ``productName``, ``brand``, ``architecture``,
``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion``, ``pcieBusID`` (and ``parentUUID``,
``profile`` for MIG), capacity ``memory`` in bytes. So the DeviceClasses of NVIDIA's chart
(:func:`create_gpu_device_classes`) and claims written for that driver select them unchanged.
The inventory is a ``NodeGPUInventory`` (what :mod:`tests.harness.fake_device_plugin` and the node
agent read); unhealthy GPUs and MIG devices, and AMD GPUs, are not published.

:func:`slice_of` and ``hack/dra-test-driver/main.go`` must agree device for device; the end-to-end
tests compare them (``dra-test-driver --print-slice`` and the slice the double publishes).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.harness.controlplane import K8S_VERSION, BinariesError, bin_root

__all__ = [
    "DEFAULT_CUDA_DRIVER_VERSION",
    "DEFAULT_DRIVER_VERSION",
    "DRA_CONTROLLERS",
    "DRIVER",
    "create_gpu_device_classes",
    "ensure_dra_driver",
    "publish_slices_direct",
    "resource_slices",
    "slice_of",
]

#: The driver name of NVIDIA's DRA driver for GPUs.
DRIVER = "gpu.nvidia.com"
GROUP, VERSION = "resource.k8s.io", "v1"
#: What the double publishes when the inventory does not say (a driver of NVIDIA's R550 branch).
DEFAULT_DRIVER_VERSION = "550.54.15"
DEFAULT_CUDA_DRIVER_VERSION = "12.4"
#: kube-controller-manager's controller that creates a pod's ResourceClaims from its
#: ResourceClaimTemplates (k8s.io/kubernetes cmd/kube-controller-manager/names: "resourceclaim-controller",
#: alias "resource-claim-controller"); ``ControlPlane.start_controller_manager(DRA_CONTROLLERS)``
#: on a control plane with fake nodes. A claim created directly needs no controller.
DRA_CONTROLLERS: tuple[str, ...] = ("resourceclaim-controller",)

#: The DeviceClasses of NVIDIA's chart (deployments/helm/dra-driver-nvidia-gpu/templates/
#: deviceclass-gpu.yaml and deviceclass-mig.yaml), selectors verbatim. The chart also sets
#: ``extendedResourceName: nvidia.com/gpu`` on the GPU class (DRAExtendedResource, alpha and off in
#: 1.34, the field dropped then): left out, so that ``nvidia.com/gpu`` stays the device plugin's.
DEVICE_CLASSES: dict[str, str] = {
    "gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "mig.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
}


def ensure_dra_driver() -> Path:
    """Build (or find cached) ``hack/dra-test-driver`` with ``hack/build-control-plane.sh dra``; return its path.

    Raises :class:`~tests.harness.controlplane.BinariesError` if the build fails or the binary is missing.
    """
    path = bin_root("dra") / f"dra-test-driver-{K8S_VERSION}" / "dra-test-driver"
    if not os.access(path, os.X_OK):
        raise BinariesError(f"build script succeeded but {path} is missing")
    return path


# ---- the devices, as main.go computes them ------------------------------------------------------


def architecture(compute_capability: str | None) -> str | None:
    """NVML's architecture name (go-nvlib ``GetArchitectureAsString``) for a compute capability."""
    if not compute_capability or "." not in compute_capability:
        return None
    major, minor = compute_capability.split(".", 1)
    if major == "7":
        return "Turing" if minor == "5" else "Volta"
    if major == "8":
        return "Ada Lovelace" if minor == "9" else "Ampere"
    return {"3": "Kepler", "5": "Maxwell", "6": "Pascal", "9": "Hopper",
            "10": "Blackwell", "11": "Blackwell", "12": "Blackwell"}.get(major)


def brand(product_name: str) -> str:
    """NVML's brand (go-nvlib ``GetBrandAsString``): GeForce cards say so, recent data-center GPUs "Nvidia"."""
    return "GeForce" if "GeForce" in product_name else "Nvidia"


def semver(version: str | None) -> str | None:
    """``"8.0"`` -> ``"8.0.0"``, ``"535.104.05"`` -> ``"535.104.5"`` (strict semver, as the API wants)."""
    parts = (version or "").strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(re.fullmatch(r"\d+", p) for p in parts):
        return None
    parts += ["0"] * (3 - len(parts))
    return ".".join(str(int(p)) for p in parts)


def pcie_bus_id(bus_id: str) -> str:
    """NVML's bus id as go-nvlib ``GetPCIBusID`` returns it: ``00000000:3D:00.0`` -> ``0000:3d:00.0``."""
    bus_id = bus_id.lower()
    return bus_id if bus_id == "0000" else bus_id.removeprefix("0000")


def binary_si(n: int) -> str:
    """A byte count as Kubernetes writes a BinarySI quantity: the largest exact suffix (``80Gi``, ``40192Mi``)."""
    for suffix, power in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n and n % (1 << power) == 0:
            return f"{n >> power}{suffix}"
    return str(n)


#: nvidia-smi mig -lgip's GPU instance profile ids on the 8-memory-slice GPUs (A100, H100, H200),
#: by (compute slices, memory slices); the "+me" 1g profiles are 20.
GI_PROFILE_IDS = {(1, 1): 19, (1, 2): 15, (2, 2): 14, (3, 4): 9, (4, 4): 5, (7, 8): 0}


def mig_placements(parent_mib: int, migs: Sequence[Mapping[str, Any]]) -> list[tuple[int, int, int]]:
    """(GPU instance profile id, start, size) of each MIG device: first fit on the 8 memory slices,
    each start a multiple of the size, in inventory order (``migPlacements`` in main.go)."""
    out: list[tuple[int, int, int]] = []
    used = [False] * 64
    nxt = 8
    for i, m in enumerate(migs):
        g = re.match(r"^(\d+)g\.(\d+)gb(\+me)?", str(m.get("profile", "")))
        if g is None or parent_mib <= 0:
            out.append((100 + i, nxt, 1))
            nxt += 1
            continue
        compute, gb = int(g[1]), int(g[2])
        x = gb * 8 / (parent_mib / 1024)
        size = 1
        for s in (1, 2, 4, 8):
            if abs(x - s) < abs(x - size):
                size = s
        pid = GI_PROFILE_IDS.get((compute, size))
        if g[3] and compute == 1:
            pid = 20
        if pid is None:
            pid = 100 + i
        start = next((s for s in range(0, 8 - size + 1, size) if not any(used[s:s + size])), None)
        if start is None:
            start, nxt = nxt, nxt + size
        for k in range(start, min(start + size, len(used))):
            used[k] = True
        out.append((pid, start, size))
    return out


def _healthy(d: Mapping[str, Any]) -> bool:
    return d.get("healthy", True) is not False


def devices_of(inventory: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ResourceSlice devices of an inventory, in the order the double publishes them."""
    driver_version = semver(inventory.get("driverVersion")) or semver(DEFAULT_DRIVER_VERSION)
    cuda_version = semver(inventory.get("cudaDriverVersion")) or semver(DEFAULT_CUDA_DRIVER_VERSION)
    out: list[dict[str, Any]] = []
    for gpu in inventory.get("gpus", []):
        if gpu.get("vendor", "nvidia") not in ("", "nvidia") or not _healthy(gpu):
            continue
        name = gpu.get("name", "")
        common: dict[str, dict[str, str]] = {
            "productName": {"string": name},
            "brand": {"string": brand(name)},
            "driverVersion": {"version": driver_version},
            "cudaDriverVersion": {"version": cuda_version},
        }
        if arch := architecture(gpu.get("computeCapability")):
            common["architecture"] = {"string": arch}
        if cc := semver(gpu.get("computeCapability")):
            common["cudaComputeCapability"] = {"version": cc}
        if gpu.get("pciBusId"):
            common["pcieBusID"] = {"string": pcie_bus_id(gpu["pciBusId"])}
        if not gpu.get("migEnabled"):
            out.append({
                "name": f"gpu-{gpu['index']}",
                "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu["uuid"]}, **common},
                "capacity": {"memory": {"value": binary_si(int(gpu["memoryMiB"]) << 20)}},
            })
            continue
        migs = gpu.get("migDevices", [])
        for mig, (pid, start, size) in zip(migs, mig_placements(int(gpu.get("memoryMiB", 0)), migs)):
            if not _healthy(mig):
                continue
            capacity = {"memory": {"value": binary_si(int(mig["memoryMiB"]) << 20)}}
            if mig.get("multiprocessors") is not None:
                capacity["multiprocessors"] = {"value": binary_si(int(mig["multiprocessors"]))}
            out.append({
                "name": f"gpu-{gpu['index']}-mig-{pid}-{start}-{size}",
                "attributes": {"type": {"string": "mig"}, "uuid": {"string": mig["uuid"]},
                               "parentUUID": {"string": gpu["uuid"]}, "profile": {"string": mig["profile"]},
                               **common},
                "capacity": capacity,
            })
    return out


def slice_of(inventory: Mapping[str, Any], node: str, driver: str = DRIVER) -> dict[str, Any]:
    """The ResourceSlice (``resource.k8s.io/v1``) of a node's GPUs: one pool named after the node,
    one slice, the devices the Go double publishes for the same inventory."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": devices_of(inventory),
        },
    }


# ---- objects in the API ----------------------------------------------------------------------


def resource_slices(api: k8s.ApiClient, node: str | None = None, driver: str = DRIVER) -> list[dict[str, Any]]:
    """The ResourceSlices of ``driver`` (on ``node`` if given), as dicts, by name."""
    selector = ",".join([f"spec.driver={driver}", *([f"spec.nodeName={node}"] if node else [])])
    items = k8s.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, "resourceslices",
                                                                 field_selector=selector)["items"]
    return sorted(items, key=lambda s: s["metadata"]["name"])


def publish_slices_direct(api: k8s.ApiClient, node: str, inventory: Mapping[str, Any],
                          driver: str = DRIVER) -> dict[str, Any]:
    """Create or replace the ResourceSlice of a node without a kubelet (what the Go double would
    publish there); return it as stored. Owned by the Node, so that deleting the Node deletes it."""
    body = slice_of(inventory, node, driver)
    uid = k8s.CoreV1Api(api).read_node(node).metadata.uid
    body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid,
                                            "controller": True}]
    objs = k8s.CustomObjectsApi(api)
    name = body["metadata"]["name"]
    try:
        current = objs.get_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return objs.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)
    # A new generation of the pool supersedes the old one, as a driver republishing would.
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    body["spec"]["pool"]["generation"] = current["spec"]["pool"]["generation"] + 1
    return objs.replace_cluster_custom_object(GROUP, VERSION, "resourceslices", name, body)


def create_gpu_device_classes(api: k8s.ApiClient) -> list[str]:
    """Create the DeviceClasses NVIDIA's chart creates (:data:`DEVICE_CLASSES`); existing ones are
    left as they are. Returns their names."""
    objs = k8s.CustomObjectsApi(api)
    for name, expression in DEVICE_CLASSES.items():
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}
        try:
            objs.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
        except ApiException as exc:
            if exc.status != 409:
                raise
    return list(DEVICE_CLASSES)
