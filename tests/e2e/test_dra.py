"""gpuplace with Dynamic Resource Allocation on a real node, as users install it.

The node runs the kubelet with a DRA kubelet plugin, ``hack/dra-test-driver`` (a TEST DOUBLE of
NVIDIA's DRA driver, ``gpu.nvidia.com``: :mod:`tests.harness.dra_driver`), and no device plugin:
its GPUs exist only as devices of its ResourceSlice, listed H100 first, then an L4, then an A100.
containerd is 1.7 built from the module proxy (:func:`tests.harness.realnode.ensure_containerd`),
since Debian's 1.6 starts a claim's pod without its CDI devices (``tests/e2e/test_dra_node.py``).
The chart is installed with ``extender.dra.enabled`` (and its default TLS): kube-apiserver calls
the extender's claim webhook for every claim kube-controller-manager creates from a pod's
ResourceClaimTemplate, and kube-scheduler (the chart's ``gpuplace-scheduler``) calls the extender
for the pod.

What is proven here, on the real control plane:
* a 13B inference pod with gpuplace's annotations and a generic GPU claim gets the cheapest device
  that holds it (the A100), not the first listed (the H100), and runs with it;
* the same claim without gpuplace's annotations gets the first listed: DRA's first fit;
* a pod that no device fits stays Pending, its claim refused with gpuplace's reason on the pod;
* the CEL gpuplace writes passes the API server's validation (the webhook's and ``gpuplace
  claim``'s, which is created with a server-side dry run);
* on nodes without a kubelet whose ResourceSlices are written directly (for scale), a burst of
  pods with written claims goes to the nodes with the cheaper free device: the extender scores
  nodes for pods with claims;
* a pod with only gpuplace's annotations, ``nvidia.com/gpu`` and the opt-in label
  ``gpuplace.io/dra: "true"`` is converted to name the template ``gpuplace-gpu-1``, which the
  extender creates (its writes narrowed by the chart's admission policy), and gets the A100;
* ``failurePolicy: Fail``: with no extender answering, a pod's claim is not created and the pod
  waits; once the extender is back, the claim is written and the pod placed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.harness.controlplane import REPO_ROOT, create_node, ensure_helm, pod_events, skip_if_e2e_disabled, wait_for
from tests.harness.dra_driver import create_gpu_device_classes, publish_slices_direct
from tests.harness.helm import Helm
from tests.harness.images import ensure_images
from tests.harness.realnode import RealCluster, ensure_containerd
from tests.harness.report import report

pytestmark = pytest.mark.e2e

CHART = REPO_ROOT / "deploy" / "helm" / "gpuplace"
NS = "gpuplace"
RELEASE = "gpuplace"
ALTERNATIVES = "claims.gpuplace.io/alternatives"

H100 = {"index": 0, "uuid": "GPU-0d7a9a52-53d1-4f0a-8c1e-000000000100", "vendor": "nvidia",
        "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "computeCapability": "9.0", "pciBusId": "00000000:18:00.0"}
L4 = {"index": 1, "uuid": "GPU-4c1d7e52-0b6a-4f0e-9a51-000000000004", "vendor": "nvidia",
      "name": "NVIDIA L4", "memoryMiB": 23034, "computeCapability": "8.9", "pciBusId": "00000000:82:00.0"}
A100 = {"index": 2, "uuid": "GPU-e81cedd9-6ec9-1701-a106-000000000080", "vendor": "nvidia",
        "name": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920, "computeCapability": "8.0", "pciBusId": "00000000:0E:00.0"}


def node_inventory() -> dict:
    """The node's GPUs, H100 first (NVML's order is the PCI bus order; a first-fit allocator takes it
    for any claim that fits it). Memories as NVML reports them (the catalog's sources)."""
    return {"apiVersion": "gpuplace.io/v1alpha1", "kind": "NodeGPUInventory", "nodeName": "gpuplace-node-0",
            "observedAt": "2026-11-28T00:00:00Z", "driverVersion": "570.133.20", "gpus": [H100, L4, A100]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    skip_if_e2e_disabled()
    t0 = time.monotonic()
    images = ensure_images()
    containerd = ensure_containerd()
    t_build = time.monotonic() - t0
    work = tmp_path_factory.mktemp("dra")
    inv = node_inventory()
    with RealCluster(work, inv, images=images.tarballs(), device_plugin=False, dra_inventory=inv,
                     containerd=containerd) as rc:
        report(f"DRA real node: images and containerd {t_build:.1f}s, node up in {rc.timings['total']:.1f}s")
        yield rc, images, work


@pytest.fixture(scope="module")
def api(cluster):
    client = cluster[0].api_client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def installed(cluster, api):
    rc, images, work = cluster
    create_gpu_device_classes(api)
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NS)))
    values = {
        "image": {"repository": images.gpuplace.repository, "tag": images.gpuplace.tag, "pullPolicy": "Never"},
        "scheduler": {"image": {"repository": images.scheduler.repository, "tag": images.scheduler.tag,
                                "pullPolicy": "Never"}},
        "agent": {"probe": "fake", "fakeInventory": node_inventory(), "intervalSeconds": 2},
        "extender": {"dra": {"enabled": True}},
    }
    path = work / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    helm = Helm(ensure_helm(), rc.kubeconfig_path, work / "helm-home")
    t0 = time.monotonic()
    helm("install", RELEASE, str(CHART), "--namespace", NS, "-f", str(path), "--wait", "--timeout", "5m")
    report(f"DRA real node: helm install --wait took {time.monotonic() - t0:.1f}s")
    wait_for(lambda: _extender_ready(api), 120, message="extender replicas not Ready")
    return helm


def _extender_ready(api) -> bool:
    dep = k8s.AppsV1Api(api).read_namespaced_deployment("gpuplace-extender", NS)
    return bool(dep.status.ready_replicas and dep.status.ready_replicas == dep.spec.replicas)


def template(name: str) -> dict:
    """A generic GPU claim: one device of NVIDIA's class ``gpu.nvidia.com``, no selector."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}


def claim_pod(name: str, annotations: dict[str, str], node_selector: dict[str, str] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                            "annotations": annotations},
            "spec": {"schedulerName": "gpuplace-scheduler", "terminationGracePeriodSeconds": 0,
                     **({"nodeSelector": node_selector} if node_selector else {}),
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"{name}-gpu"}],
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def create(api, name: str, annotations: dict[str, str], node_selector: dict[str, str] | None = None) -> None:
    k8s.ResourceV1Api(api).create_namespaced_resource_claim_template("default", template(f"{name}-gpu"))
    k8s.CoreV1Api(api).create_namespaced_pod("default", claim_pod(name, annotations, node_selector))


def unless_gone(delete_call) -> None:
    """Run a delete call; an object already gone (404) is as good."""
    try:
        delete_call()
    except ApiException as e:
        if e.status != 404:
            raise


def delete(api, name: str) -> None:
    core, res = k8s.CoreV1Api(api), k8s.ResourceV1Api(api)
    unless_gone(lambda: core.delete_namespaced_pod(name, "default", grace_period_seconds=0))
    unless_gone(lambda: res.delete_namespaced_resource_claim_template(f"{name}-gpu", "default"))

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, "default")
            return False
        except ApiException as e:
            return e.status == 404
    wait_for(gone, 60, message=f"pod {name} not deleted")
    # The claim goes with its pod (owner reference): wait, so that its device is free for the next test.
    wait_for(lambda: not [c for c in _claims(api) if _owner(c) == name], 60, message=f"claims of {name} not deleted")


def _claims(api) -> list[dict]:
    resp = k8s.ResourceV1Api(api).list_namespaced_resource_claim("default", _preload_content=False)
    return json.loads(resp.data)["items"]


def _owner(claim: dict) -> str | None:
    return next((o["name"] for o in claim["metadata"].get("ownerReferences", []) if o["kind"] == "Pod"), None)


def claim_of(api, pod: str, timeout: float = 60) -> dict:
    return wait_for(lambda: next((c for c in _claims(api) if _owner(c) == pod), None), timeout,
                    message=f"no claim created for pod {pod}")


def allocated_device(api, pod: str, timeout: float = 90) -> str:
    def device() -> str | None:
        c = next((c for c in _claims(api) if _owner(c) == pod), None)
        results = (((c or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        return results[0]["device"] if results else None
    return wait_for(device, timeout, message=f"the claim of pod {pod} is not allocated")


def running(api, name: str, timeout: float = 120) -> k8s.V1Pod:
    core = k8s.CoreV1Api(api)
    return wait_for(lambda: (p if (p := core.read_namespaced_pod(name, "default")).status.phase == "Running" else None),
                    timeout, message=f"pod {name} not Running")


LLM_13B = {"gpuplace.io/model-params": "13B", "gpuplace.io/workload": "inference"}


def test_a_13b_pod_with_a_generic_claim_gets_the_cheapest_device_that_fits_not_the_first_listed(cluster, api, installed):
    create(api, "llm-13b", LLM_13B)
    try:
        claim = claim_of(api, "llm-13b")
        # the webhook wrote it: the API server accepted its CEL (it compiles every selector on create)
        (req,) = claim["spec"]["devices"]["requests"]
        alternatives = [s["name"] for s in req["firstAvailable"]]
        assert alternatives[0] == "g0-a100-sxm4-80gb" and not any("l4" in a for a in alternatives), alternatives
        assert ALTERNATIVES in claim["metadata"]["annotations"]
        assert allocated_device(api, "llm-13b") == "gpu-2"  # the A100, not gpu-0 (the H100, listed first)
        pod = running(api, "llm-13b")
        assert pod.spec.node_name == cluster[0].node_name
        # gpuplace explain of the live pod reads its claim's alternatives and the node's slices
        live = cluster[0].kubectl("get", "pod", "llm-13b", "-o", "yaml").stdout
        out = subprocess.run([sys.executable, "-m", "scheduler_extender.gpuplace_cli", "explain", "-",
                              "--kubeconfig", str(cluster[0].kubeconfig_path)], input=live,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("claim: as written in the pod's claims")
        assert "inventory: ResourceSlices of gpu.nvidia.com" in out.stdout
    finally:
        delete(api, "llm-13b")


def test_without_gpuplaces_annotations_the_same_claim_gets_the_first_listed_device(api, installed):
    create(api, "plain", {})
    try:
        claim = claim_of(api, "plain")
        assert "exactly" in claim["spec"]["devices"]["requests"][0]  # left as the template wrote it
        assert allocated_device(api, "plain") == "gpu-0"  # DRA's first fit: the H100
    finally:
        delete(api, "plain")


def test_a_pod_no_device_fits_stays_pending_with_gpuplaces_reason(api, installed):
    create(api, "llm-405b", {"gpuplace.io/model-params": "405B", "gpuplace.io/workload": "inference"})
    try:
        def refused() -> str | None:
            # kube-controller-manager's FailedResourceClaimCreation: "PodResourceClaim gpu: admission
            # webhook "claims.gpuplace.io" denied the request: gpuplace: ..."
            return next((e for e in pod_events(api, "default", "llm-405b") if e.startswith("PodResourceClaim gpu")
                         and "gpuplace: pod default/llm-405b" in e), None)
        event = wait_for(refused, 60, message="no FailedResourceClaimCreation event from gpuplace on the pod")
        assert "no device type in the cluster fits" in event and "H100 80GB HBM3" in event and "L4" in event
        time.sleep(3)
        pod = k8s.CoreV1Api(api).read_namespaced_pod("llm-405b", "default")
        assert pod.status.phase == "Pending" and not pod.spec.node_name
        assert not [c for c in _claims(api) if _owner(c) == "llm-405b"]
    finally:
        delete(api, "llm-405b")


def test_gpuplace_claim_prints_a_template_the_api_server_accepts(cluster, api, installed, tmp_path):
    rc = cluster[0]
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump_all([template("llm-13b-gpu"), claim_pod("llm-13b", LLM_13B)]))
    out = subprocess.run([sys.executable, "-m", "scheduler_extender.gpuplace_cli", "claim", str(pod),
                          "--kubeconfig", str(rc.kubeconfig_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    written = yaml.safe_load(out.stdout)
    assert written["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["name"] == "g0-a100-sxm4-80gb"
    created = rc.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=out.stdout)
    assert json.loads(created.stdout)["kind"] == "ResourceClaimTemplate"


FAKE_POOL = {"gpuplace.io/test-pool": "dra-fake"}


def test_a_burst_of_pods_with_claims_goes_to_the_nodes_whose_free_device_is_cheaper(api, installed):
    """Three fake nodes with one H100 each and three with one A100 each (slices written directly);
    three 13B pods at once, kept off the real node by a node selector. DRA's plugin passes all six
    nodes for each (one device of the claim's alternatives free on each) and, in 1.34, scores none
    of them: gpuplace's score does. At random, all three would land on the A100 nodes 1 time in 20."""
    core = k8s.CoreV1Api(api)
    nodes = {f"fake-h100-{i}": H100 for i in range(3)} | {f"fake-a100-{i}": A100 for i in range(3)}
    for name, gpu in nodes.items():
        create_node(api, name, {}, labels=FAKE_POOL)
        publish_slices_direct(api, name, {**node_inventory(), "nodeName": name, "gpus": [{**gpu, "index": 0,
                                                                                         "uuid": f"{gpu['uuid'][:-3]}{name[-1]}{name[5]}0"}]})
    pods = [f"burst-{i}" for i in range(3)]
    try:
        for name in pods:
            create(api, name, LLM_13B, FAKE_POOL)

        def placed() -> dict[str, str] | None:
            where = {p: core.read_namespaced_pod(p, "default").spec.node_name for p in pods}
            return where if all(where.values()) else None
        where = wait_for(placed, 120, message="burst pods not all bound")
        assert sorted(where.values()) == [f"fake-a100-{i}" for i in range(3)], where
    finally:
        for name in pods:
            delete(api, name)
        for name in nodes:
            core.delete_node(name)


def test_a_burst_of_40_pods_on_24_fake_nodes_fills_the_a100s_then_the_h100s_and_never_shares_a_device(api, installed):
    """Scale, through the real kube-scheduler and the chart's two extender replicas: 24 nodes
    without a kubelet (8 with four A100s, 8 with four H100s, 8 with four L4s; slices written
    directly) and 40 13B pods created at once. gpuplace writes every claim A100 first, H100 last
    (the L4 holds no 13B); kube-scheduler's DRA plugin keeps in-flight allocations apart. So the
    32 A100s are taken, then 8 H100s, no L4, and no device twice."""
    core = k8s.CoreV1Api(api)
    kinds = {"a100": A100, "h100": H100, "l4": L4}
    nodes = [f"scale-{k}-{i}" for k in kinds for i in range(8)]
    for name in nodes:
        gpu = kinds[name.split("-")[1]]
        create_node(api, name, {}, labels=FAKE_POOL)
        publish_slices_direct(api, name, {**node_inventory(), "nodeName": name, "gpus": [
            {**gpu, "index": j, "uuid": f"GPU-{name}-{j}", "pciBusId": f"00000000:{16 + j:02X}:00.0"} for j in range(4)]})
    pods = [f"scale-{i}" for i in range(40)]
    t0 = time.monotonic()
    try:
        for name in pods:
            create(api, name, LLM_13B, FAKE_POOL)

        def allocated_all() -> list[tuple[str, str, str]] | None:
            claims = [c for c in _claims(api) if (_owner(c) or "").startswith("scale-")]
            results = [(r["pool"], r["device"], _owner(c)) for c in claims
                       for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []]
            return results if len(results) == len(pods) else None
        results = wait_for(allocated_all, 240, interval=1.0, message="not every burst pod's claim was allocated")
        elapsed = time.monotonic() - t0
        devices = [(pool, dev) for pool, dev, _ in results]
        assert len(set(devices)) == len(devices), "a device was allocated to two claims"
        by_kind = {k: sum(pool.startswith(f"scale-{k}-") for pool, _ in devices) for k in kinds}
        assert by_kind == {"a100": 32, "h100": 8, "l4": 0}, by_kind
        bound = {core.read_namespaced_pod(p, "default").spec.node_name for p in pods}
        assert None not in bound
        report(f"DRA burst: 40 pods with claims on 24 fake nodes allocated in {elapsed:.1f}s ({by_kind})")
    finally:
        for name in pods:
            delete(api, name)
        for name in nodes:
            core.delete_node(name)


def test_a_labelled_pod_with_only_annotations_gets_its_claim_from_a_template_the_extender_creates(cluster, api, installed):
    res = k8s.ResourceV1Api(api)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "converted", "namespace": "default", "labels": {"gpuplace.io/dra": "true"},
                        "annotations": LLM_13B},
           "spec": {"schedulerName": "gpuplace-scheduler", "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    k8s.CoreV1Api(api).create_namespaced_pod("default", pod)
    try:
        stored = k8s.CoreV1Api(api).read_namespaced_pod("converted", "default")
        assert [(c.name, c.resource_claim_template_name) for c in stored.spec.resource_claims] == [
            ("gpuplace-gpu", "gpuplace-gpu-1")]
        assert "nvidia.com/gpu" not in (stored.spec.containers[0].resources.limits or {})
        made = res.read_namespaced_resource_claim_template("gpuplace-gpu-1", "default")
        assert made.spec.spec.devices.requests[0].exactly.count == 1
        claim = claim_of(api, "converted")
        assert claim["spec"]["devices"]["requests"][0]["firstAvailable"][0]["name"] == "g0-a100-sxm4-80gb"
        assert allocated_device(api, "converted") == "gpu-2"
        running(api, "converted")
    finally:
        delete(api, "converted")
        unless_gone(lambda: res.delete_namespaced_resource_claim_template("gpuplace-gpu-1", "default"))


def test_the_extender_may_create_only_gpuplaces_claim_templates(cluster, api, installed, tmp_path):
    """The chart's admission policy narrows the extender's create on resourceclaimtemplates to
    gpuplace-gpu-<count> of the chart's DeviceClass, with one request: tried under a token of the
    extender's ServiceAccount."""
    from kubernetes import config as k8s_config

    from tests.harness.helm import sa_kubeconfig
    kubeconfig = sa_kubeconfig(cluster[0], api, NS, "gpuplace-extender", tmp_path / "extender.kubeconfig")
    with k8s_config.new_client_from_config(config_file=str(kubeconfig)) as as_extender:
        res = k8s.ResourceV1Api(as_extender)
        ok = template("gpuplace-gpu-3")
        ok["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 3
        res.create_namespaced_resource_claim_template("default", ok, dry_run="All")
        for name, change in (("not-gpuplaces", {}), ("gpuplace-gpu-4", {"deviceClassName": "mig.nvidia.com"})):
            other = template(name)
            other["spec"]["spec"]["devices"]["requests"][0]["exactly"].update(change)
            with pytest.raises(ApiException) as denied:
                res.create_namespaced_resource_claim_template("default", other, dry_run="All")
            assert denied.value.status == 403 and "gpuplace" in denied.value.body, name


def test_with_failure_policy_fail_a_claim_waits_for_the_extender_and_is_written_when_it_is_back(api, installed):
    apps = k8s.AppsV1Api(api)
    webhook = k8s.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(f"{RELEASE}-claims")
    assert webhook.webhooks[0].failure_policy == "Fail"
    replicas = apps.read_namespaced_deployment("gpuplace-extender", NS).spec.replicas
    apps.patch_namespaced_deployment_scale("gpuplace-extender", NS, {"spec": {"replicas": 0}})
    wait_for(lambda: not k8s.CoreV1Api(api).list_namespaced_pod(
        NS, label_selector="app.kubernetes.io/component=extender").items, 90, message="extender pods not gone")
    try:
        create(api, "waits", LLM_13B)
        event = wait_for(lambda: next((e for e in pod_events(api, "default", "waits")
                                       if e.startswith("PodResourceClaim gpu") and "claims.gpuplace.io" in e), None),
                         60, message="no event naming the webhook while the extender is down")
        assert "failed calling webhook" in event
        assert not [c for c in _claims(api) if _owner(c) == "waits"]
    finally:
        apps.patch_namespaced_deployment_scale("gpuplace-extender", NS, {"spec": {"replicas": replicas}})
    try:
        wait_for(lambda: _extender_ready(api), 120, message="extender not back")
        claim = claim_of(api, "waits", timeout=180)  # kube-controller-manager retries with backoff
        assert "firstAvailable" in claim["spec"]["devices"]["requests"][0]
        assert allocated_device(api, "waits", timeout=120) == "gpu-2"
    finally:
        delete(api, "waits")
