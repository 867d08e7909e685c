"""GPUs as Dynamic Resource Allocation devices (``resource.k8s.io/v1``) on the real node and on a fake one.

The real node (:mod:`tests.harness.realnode`: kubelet v1.34.4) runs ``hack/dra-test-driver``, the
test double of NVIDIA's DRA driver (:mod:`tests.harness.dra_driver`), instead of the device plugin:
its ResourceSlice holds an A100-SXM4-80GB (``gpu-0``) and an L4 (``gpu-1``) named and described as
NVIDIA's driver describes them, and the DeviceClasses of NVIDIA's chart select them. The default
kube-scheduler (no extender; DRA is GA and on by default in 1.34, ``firstAvailable`` is beta and on)
allocates the claims, kube-controller-manager's resourceclaim-controller creates them from the pods'
ResourceClaimTemplates, and the kubelet asks the double to prepare them. A fake node (a Node object,
no kubelet) gets its slice from :func:`~tests.harness.dra_driver.publish_slices_direct`.

Which containerd. With Debian bookworm's containerd 1.6 (1.6.20) a pod with a claim runs, but
without its devices: the kubelet prepares the claim (the double writes the CDI spec file and answers
with the CDI device ``k8s.gpu.nvidia.com/claim=<claim UID>-gpu-0``; at ``--v=5`` the kubelet logs
``"Determined CDI devices for pod" pod="default/big" cdiDevices=[{"Name":"k8s.gpu.nvidia.com/claim=
...-gpu-0"}]``) and passes the id in the CRI field ``ContainerConfig.CDIDevices`` only (cri-api
1.28+; the kubelet no longer writes ``cdi.k8s.io/`` annotations). containerd 1.6 knows neither that
field (its CRI plugin decodes the request with an older cri-api and drops it) nor CDI at all, so it
creates the container with none of the spec's edits (no ``NVIDIA_VISIBLE_DEVICES`` in its OCI spec)
and logs nothing about it: on a GPU node, a pod Running without its GPU.
:func:`test_on_debians_containerd_1_6_a_claim_pod_runs_but_without_its_cdi_devices` pins that down.
CDI came with containerd 1.7 (``enable_cdi``), the ``CDIDevices`` field with 1.7.2; the rest of the
module runs the node on containerd 1.7.29 built from the Go module proxy
(:func:`~tests.harness.realnode.ensure_containerd`, CDI on, Debian's runc), which logs
``CDI devices from CRI Config.CDIDevices: [k8s.gpu.nvidia.com/claim=<claim UID>-gpu-0]`` and puts
the spec's ``NVIDIA_VISIBLE_DEVICES=<the A100's UUID>`` into the container. A fair workaround: the
same CRI plugin a GPU node needs anyway (NVIDIA's driver requires CDI), nothing faked.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.harness.controlplane import REPO_ROOT, create_node, pod_events, skip_if_e2e_disabled, wait_for
from tests.harness.dra_driver import (
    DRIVER,
    GROUP,
    VERSION,
    create_gpu_device_classes,
    ensure_dra_driver,
    publish_slices_direct,
    resource_slices,
    slice_of,
)
from tests.harness.images import ensure_images
from tests.harness.realnode import PAUSE_IMAGE, NodeNamespace, RealCluster, ensure_containerd
from tests.harness.report import report

pytestmark = pytest.mark.e2e

NS = "default"
A100 = "NVIDIA A100-SXM4-80GB"
L4 = "NVIDIA L4"


def node_inventory() -> dict:
    """One whole A100-SXM4-80GB listed first (from ``examples/cluster/gpu-a100-80g-0.json``), one L4
    second (``scheduler_extender/data/catalog.yaml``: ``NVIDIA L4``, 23034 MiB, compute capability 8.9)."""
    inv = json.loads((REPO_ROOT / "examples" / "cluster" / "gpu-a100-80g-0.json").read_text())
    a100 = inv["gpus"][0]
    l4 = {"index": 1, "uuid": "GPU-4c1d7e52-0b6a-4f0e-9a51-2f0b5d6e7a11", "vendor": "nvidia", "name": L4,
          "memoryMiB": 23034, "pciBusId": "00000000:82:00.0", "architecture": "ada", "computeCapability": "8.9",
          "multiprocessors": 58, "eccEnabled": True, "powerLimitW": 72, "numaNode": 1, "healthy": True,
          "migEnabled": False, "nvlinks": [], "allocatedTo": ""}
    inv["gpus"] = [a100, l4]
    return inv


#: Set while the module's node runs: one real node at a time on a machine (docs/testing.md).
_MODULE_NODE_UP = False


def dra_node(workdir, containerd=None) -> RealCluster:
    """The node of this module: the inventory's GPUs only as DRA devices (no device plugin)."""
    inv = node_inventory()
    return RealCluster(workdir, inv, images=ensure_images(["pause"]).tarballs(), device_plugin=False,
                       dra_inventory=inv, containerd=containerd)


def up(rc: RealCluster, what: str) -> None:
    report(f"{what}: up in {rc.timings['total']:.1f}s ("
           + ", ".join(f"{k} {v:.1f}s" for k, v in rc.timings.items() if k != "total") + ")")
    api = rc.api_client()
    create_gpu_device_classes(api)
    api.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[RealCluster]:
    """The node on containerd 1.7 (CDI on), so that a pod's container gets its claim's devices."""
    global _MODULE_NODE_UP
    skip_if_e2e_disabled()
    containerd = ensure_containerd()
    with dra_node(tmp_path_factory.mktemp("dranode"), containerd) as rc:
        up(rc, "DRA node (containerd 1.7)")
        _MODULE_NODE_UP = True
        try:
            yield rc
        finally:
            _MODULE_NODE_UP = False


@pytest.fixture(scope="module")
def api(cluster) -> Iterator[k8s.ApiClient]:
    client = cluster.api_client()
    yield client
    client.close()


def exactly(name: str, *cel: str, device_class: str = "gpu.nvidia.com") -> dict:
    return {"name": name, "exactly": {"deviceClassName": device_class,
                                      "selectors": [{"cel": {"expression": e}} for e in cel]}}


def memory_at_least(q: str) -> str:
    return f"device.capacity['{DRIVER}'].memory.compareTo(quantity('{q}')) >= 0"


def product(name: str) -> str:
    return f"device.attributes['{DRIVER}'].productName == '{name}'"


class ClaimPods:
    """Pods that each hold one claim from a ResourceClaimTemplate of their own; all deleted at the
    end of the test, with their claims (which must be gone before the next test counts on free GPUs)."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api, self.core, self.objs = api, k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
        self.names: list[str] = []

    def create(self, name: str, requests: list[dict], node_selector: dict[str, str] | None = None) -> None:
        self.objs.create_namespaced_custom_object(GROUP, VERSION, NS, "resourceclaimtemplates", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": requests}}}})
        self.names.append(name)
        self.core.create_namespaced_pod(NS, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
                     "nodeSelector": node_selector or {},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": PAUSE_IMAGE, "imagePullPolicy": "Never",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}})

    def claim(self, pod: str) -> dict:
        """The pod's claim (created by the resourceclaim-controller), once allocated."""
        def allocated() -> dict | None:
            statuses = self.core.read_namespaced_pod(pod, NS).status.resource_claim_statuses or []
            names = [s.resource_claim_name for s in statuses if s.resource_claim_name]
            if not names:
                return None
            claim = self.objs.get_namespaced_custom_object(GROUP, VERSION, NS, "resourceclaims", names[0])
            return claim if claim.get("status", {}).get("allocation") else None
        return wait_for(allocated, 60, interval=0.3, message=f"the claim of pod {pod} was not allocated")

    def results(self, pod: str) -> list[tuple[str, str, str, str]]:
        """(driver, pool, device, request) of each device allocated to the pod's claim."""
        return [(r["driver"], r["pool"], r["device"], r["request"])
                for r in self.claim(pod)["status"]["allocation"]["devices"]["results"]]

    def node_of(self, pod: str) -> str:
        return wait_for(lambda: self.core.read_namespaced_pod(pod, NS).spec.node_name, 60, interval=0.3,
                        message=f"pod {pod} was not bound")

    def running(self, pod: str) -> k8s.V1Pod:
        def run() -> k8s.V1Pod | None:
            p = self.core.read_namespaced_pod(pod, NS)
            return p if p.status.phase == "Running" else None
        return wait_for(run, 90, interval=0.3, message=f"pod {pod} not Running")

    def cleanup(self) -> None:
        for name in self.names:
            for delete in (lambda: self.core.delete_namespaced_pod(name, NS, grace_period_seconds=0),
                           lambda: self.objs.delete_namespaced_custom_object(GROUP, VERSION, NS,
                                                                            "resourceclaimtemplates", name)):
                try:
                    delete()
                except ApiException as exc:
                    if exc.status != 404:
                        raise

        def gone() -> bool:
            pods = {p.metadata.name for p in self.core.list_namespaced_pod(NS).items}
            claims = self.objs.list_namespaced_custom_object(GROUP, VERSION, NS, "resourceclaims")["items"]
            return not pods & set(self.names) and not claims
        wait_for(gone, 90, interval=0.5, message=f"pods {self.names} or their claims were not deleted")


CTR = ("ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io")


def container_env(ns: NodeNamespace, pod: str, container: str = "main") -> list[str]:
    """The environment in the OCI spec containerd created the pod's container with."""
    for cid in ns.run(*CTR, "containers", "ls", "-q").stdout.split():
        info = json.loads(ns.run(*CTR, "containers", "info", cid).stdout)
        labels = info.get("Labels", {})
        if labels.get("io.kubernetes.pod.name") == pod and labels.get("io.kubernetes.container.name") == container:
            return list(info["Spec"]["process"]["env"])
    raise AssertionError(f"no container {container} of pod {pod} in containerd")


def cdi_spec(rc: RealCluster, claim_uid: str) -> dict:
    """The CDI spec file the double wrote for a claim, in the node's /var/run/cdi."""
    assert rc.ns is not None
    return json.loads(rc.ns.run("cat", f"/var/run/cdi/k8s.{DRIVER}-claim_{claim_uid}.json").stdout)


def prepared(rc: RealCluster, claim_name: str) -> list[str]:
    """The double's log lines saying it prepared the claim."""
    ref = f'claim="{NS}/{claim_name}"'
    return [line for line in (rc.logs / "dra-test-driver.log").read_text().splitlines()
            if '"prepared"' in line and ref in line]


A100_UUID = node_inventory()["gpus"][0]["uuid"]


def test_on_debians_containerd_1_6_a_claim_pod_runs_but_without_its_cdi_devices(tmp_path_factory):
    """A node of its own, on Debian's containerd 1.6, before the module's node starts: the claim is
    allocated and prepared (the CDI spec, with the A100's UUID, is in /var/run/cdi), the pod runs,
    and its container has none of the spec's edits; containerd says nothing (module docstring)."""
    skip_if_e2e_disabled()
    if _MODULE_NODE_UP:
        pytest.skip("one real node at a time: this test runs before the module's node starts")
    with dra_node(tmp_path_factory.mktemp("dranode16")) as rc:
        up(rc, "DRA node (Debian's containerd 1.6)")
        api = rc.api_client()
        try:
            pods = ClaimPods(api)
            pods.create("cdi", [exactly("gpu", memory_at_least("30Gi"))])
            assert pods.running("cdi").spec.node_name == rc.node_name
            claim = pods.claim("cdi")
            assert pods.results("cdi") == [(DRIVER, rc.node_name, "gpu-0", "gpu")]
            assert prepared(rc, claim["metadata"]["name"]), "the double did not prepare the claim"
            uid = claim["metadata"]["uid"]
            spec = cdi_spec(rc, uid)
            assert spec["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={A100_UUID}"]
            assert rc.ns is not None
            version = rc.ns.run(*CTR, "version").stdout
            assert "Version:  1.6." in version, f"not containerd 1.6; this test pins down 1.6's gap:\n{version}"
            env = container_env(rc.ns, "cdi")
            report(f"DRA node (containerd 1.6): the claim's container runs with env {env}")
            assert not [e for e in env if e.startswith(("NVIDIA_VISIBLE_DEVICES=", "DRA_DEVICE_"))], env
            assert "CDI" not in (rc.logs / "containerd.log").read_text()
        finally:
            api.close()


@pytest.fixture
def pods(api) -> Iterator[ClaimPods]:
    p = ClaimPods(api)
    yield p
    p.cleanup()


def test_the_double_publishes_one_pool_named_after_the_node_with_nvidias_device_names_and_attributes(cluster, api):
    slices = resource_slices(api, cluster.node_name)
    assert len(slices) == 1
    published = slices[0]
    shown = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceSlice",
             "metadata": {k: published["metadata"][k] for k in ("name", "generateName", "ownerReferences")},
             "spec": published["spec"]}
    report("DRA node: the ResourceSlice the double published:\n" + yaml.safe_dump(shown, sort_keys=False))
    # The kubelet plugin helper names the slice after node and driver and makes the Node its owner.
    assert published["metadata"]["generateName"] == f"{cluster.node_name}-{DRIVER}-"
    assert [(o["kind"], o["name"]) for o in published["metadata"]["ownerReferences"]] == [("Node", cluster.node_name)]
    assert published["spec"] == slice_of(node_inventory(), cluster.node_name)["spec"]
    a100, l4 = published["spec"]["devices"]
    assert a100["name"] == "gpu-0" and a100["attributes"] == {
        "type": {"string": "gpu"}, "uuid": {"string": node_inventory()["gpus"][0]["uuid"]},
        "productName": {"string": A100}, "brand": {"string": "Nvidia"}, "architecture": {"string": "Ampere"},
        "cudaComputeCapability": {"version": "8.0.0"}, "driverVersion": {"version": "570.133.20"},
        "cudaDriverVersion": {"version": "12.8.0"}, "pcieBusID": {"string": "0000:0e:00.0"}}
    assert a100["capacity"] == {"memory": {"value": "80Gi"}}
    assert l4["name"] == "gpu-1" and l4["attributes"]["architecture"] == {"string": "Ada Lovelace"}
    assert l4["capacity"] == {"memory": {"value": "23034Mi"}}


def test_the_go_double_and_slice_of_describe_mig_devices_and_skip_unhealthy_and_amd_gpus_alike(tmp_path):
    """``dra-test-driver --print-slice`` (the devices main.go publishes) equals :func:`slice_of` for
    MIG layouts, GeForce cards, unhealthy GPUs and MIG devices, AMD GPUs, odd driver versions."""
    skip_if_e2e_disabled()
    binary = ensure_dra_driver()
    examples = sorted((REPO_ROOT / "examples" / "cluster").glob("*.json"))
    odd = json.loads((REPO_ROOT / "examples" / "cluster" / "gpu-a100-mig-0.json").read_text())
    odd["driverVersion"] = "535.104.05"
    odd.pop("cudaDriverVersion")
    odd["gpus"][0]["migDevices"] = [
        {"uuid": "MIG-a", "profile": "1g.10gb", "memoryMiB": 9728},
        {"uuid": "MIG-b", "profile": "2g.20gb", "memoryMiB": 19968, "healthy": False},
        {"uuid": "MIG-c", "profile": "1g.20gb", "memoryMiB": 19968, "multiprocessors": 16},
        {"uuid": "MIG-d", "profile": "1g.10gb+me", "memoryMiB": 9728}]
    odd["gpus"][1]["healthy"] = False
    inventories = [json.loads(p.read_text()) for p in examples] + [odd]
    seen = set()
    for i, inv in enumerate(inventories):
        path = tmp_path / f"{i}.json"
        path.write_text(json.dumps(inv))
        out = subprocess.run([str(binary), f"--inventory={path}", "--node-name=n0", "--print-slice"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
        assert json.loads(out) == slice_of(inv, "n0")["spec"], inv["nodeName"]
        seen |= {d["name"] for d in json.loads(out)["devices"]}
    # Two 3g.40gb on an A100-80GB sit at memory slices 0 and 4, as NVIDIA's driver names them.
    assert {"gpu-0-mig-9-0-4", "gpu-0-mig-9-4-4"} <= seen
    # An unhealthy MIG device still takes its memory slices: the 1g.20gb goes after it.
    assert {"gpu-0-mig-19-0-1", "gpu-0-mig-15-4-2", "gpu-0-mig-20-1-1"} <= seen
    assert "gpu-0-mig-14-2-2" not in seen  # the unhealthy 2g.20gb


def test_a_claim_for_at_least_30gi_is_allocated_the_a100_and_its_container_gets_the_gpu_through_cdi(
        cluster, api, pods):
    """The claim is allocated the A100 (the only device with 30Gi or more), the double prepares it,
    containerd 1.7 applies the CDI device the kubelet passes on, and the container runs with the
    A100's UUID in ``NVIDIA_VISIBLE_DEVICES``, as it would on a GPU node with NVIDIA's driver."""
    pods.create("big", [exactly("gpu", memory_at_least("30Gi"))])
    assert pods.results("big") == [(DRIVER, cluster.node_name, "gpu-0", "gpu")]
    assert pods.running("big").spec.node_name == cluster.node_name
    claim = pods.claim("big")
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["big"]
    assert prepared(cluster, claim["metadata"]["name"]), "the double did not prepare the claim"
    uid = claim["metadata"]["uid"]
    spec = cdi_spec(cluster, uid)
    assert spec["kind"] == f"k8s.{DRIVER}/claim" and [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-0"]
    cdi_line = f"CDI devices from CRI Config.CDIDevices: [k8s.{DRIVER}/claim={uid}-gpu-0]"
    assert cdi_line in (cluster.logs / "containerd.log").read_text()
    assert cluster.ns is not None
    env = container_env(cluster.ns, "big")
    assert f"NVIDIA_VISIBLE_DEVICES={A100_UUID}" in env and f"DRA_DEVICE_GPU_0={A100_UUID}" in env
    # The pod gone, the kubelet unprepares the claim and the double removes its CDI spec.
    k8s.CoreV1Api(api).delete_namespaced_pod("big", NS, grace_period_seconds=0)
    path = f"/var/run/cdi/k8s.{DRIVER}-claim_{uid}.json"
    wait_for(lambda: cluster.ns.run("test", "-e", path, check=False).returncode == 1, 60,  # type: ignore[union-attr]
             interval=0.5, message=f"{path} outlived the pod")


def test_first_available_gives_the_l4_before_the_a100_while_both_are_free(cluster, api, pods):
    """The first subrequest that can be satisfied wins, even though the A100 is listed first in the
    slice and also fits: kube-scheduler follows the order of ``firstAvailable``."""
    pods.create("first-available", [{"name": "gpu", "firstAvailable": [
        {"name": "l4", "deviceClassName": "gpu.nvidia.com",
         "selectors": [{"cel": {"expression": product(L4)}}]},
        {"name": "a100", "deviceClassName": "gpu.nvidia.com"}]}])
    assert pods.results("first-available") == [(DRIVER, cluster.node_name, "gpu-1", "gpu/l4")]
    assert pods.node_of("first-available") == cluster.node_name


def test_a_claim_that_no_device_matches_leaves_its_pod_pending(cluster, api, pods):
    pods.create("no-h100", [exactly("gpu", product("NVIDIA H100 80GB HBM3"))])

    def unschedulable() -> str | None:
        return next((m for m in pod_events(api, NS, "no-h100") if "cannot allocate all claims" in m), None)

    message = wait_for(unschedulable, 60, interval=0.5, message="no FailedScheduling event for pod no-h100")
    report(f"DRA node: a claim no device matches: {message}")
    pod = k8s.CoreV1Api(api).read_namespaced_pod("no-h100", NS)
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    claims = k8s.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, NS, "resourceclaims")["items"]
    assert [c for c in claims if not c.get("status", {}).get("allocation")], "the claim exists, unallocated"


def test_a_fake_nodes_direct_slice_serves_a_claim_and_the_pod_is_bound_there(cluster, api, pods):
    """A node without a kubelet: :func:`publish_slices_direct` writes the slice the double would
    publish; kube-scheduler allocates a device of it and binds the pod there (it never runs)."""
    inv = json.loads((REPO_ROOT / "examples" / "cluster" / "gpu-4090-0.json").read_text())
    node = "gpu-4090-dra-0"
    create_node(api, node, {}, labels={"gpuplace.io/fake-node": "true"})
    try:
        stored = publish_slices_direct(api, node, inv)
        assert stored["spec"]["devices"] == slice_of(inv, node)["spec"]["devices"]
        # Publishing again is a new generation of the same pool, as a driver republishing.
        assert publish_slices_direct(api, node, inv)["spec"]["pool"]["generation"] == 2
        pods.create("geforce", [exactly("gpu", product("NVIDIA GeForce RTX 4090"),
                                        f"device.attributes['{DRIVER}'].brand == 'GeForce'")])
        assert pods.node_of("geforce") == node
        assert pods.results("geforce") == [(DRIVER, node, "gpu-0", "gpu")]
    finally:
        k8s.CoreV1Api(api).delete_node(node)
    # The Node owns its slice: the garbage collector deletes it with the node.
    wait_for(lambda: not resource_slices(api, node), 60, message=f"the slice of {node} outlived it")
