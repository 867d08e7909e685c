"""The chart as users install it, running as pods on a real node.

``helm install`` of ``deploy/helm/gpuplace`` with the images built from the wheel
(``hack/build-images.sh``), on a cluster whose node is real (:mod:`tests.harness.realnode`:
kubelet, containerd, kube-proxy, CoreDNS, kube-controller-manager) and advertises GPUs through the
kubelet's device-plugin API (:mod:`tests.harness.fake_device_plugin`). Nothing here runs from the
source tree: the extender Deployment, the ``gpuplace-scheduler`` Deployment (a kube-scheduler image
built from the same binary as the control plane's) and the agent DaemonSet run as pods, and the
example pods are placed by that scheduler through that extender over the Service, then run on the
node. The agent publishes the node's inventory (``agent.probe: fake``, the GPUs from a values
ConfigMap) with ``allocatedTo`` read from the kubelet's PodResources socket. The chart runs with its
defaults otherwise: HTTPS with mutual TLS between kube-scheduler and the extender, on certificates
the chart generated at install, and the extender's NetworkPolicy.
"""

from __future__ import annotations

import base64
import json
import time

import pytest
import yaml
from kubernetes import client as k8s

from tests.harness.controlplane import (
    REPO_ROOT, create_node, ensure_helm, skip_if_e2e_disabled, wait_for, wait_pod_scheduled,
)
from tests.harness.gpucluster import node_allocatable, publish_inventory_direct
from tests.harness.helm import Helm
from tests.harness.images import ensure_images
from tests.harness.realnode import RealCluster
from tests.harness.report import report
from tests.harness.tls import generate_extender_pki

pytestmark = pytest.mark.e2e

CHART = REPO_ROOT / "deploy" / "helm" / "gpuplace"
NS = "gpuplace"
RELEASE = "gpuplace"
EXAMPLE_PODS = REPO_ROOT / "examples" / "pods"
INVENTORY_ANNOTATION = "gpuplace.io/inventory"


def node_inventory() -> dict:
    """The real node's GPUs: one whole A100-SXM4-80GB (``nvidia.com/gpu``) and one split into two
    3g.40gb MIG devices (``nvidia.com/mig-3g.40gb``, the NVIDIA device plugin's ``mixed`` strategy),
    from ``examples/cluster/gpu-a100-mig-0.json``. The default policy keeps a whole A100-80GB for
    class ``large``: a 13B inference pod gets a slice, a 30B one the whole GPU. The inventory
    states no MIG strategy, as the agent publishes it with the chart's defaults: the extender
    reads ``mixed`` from the node's allocatable, where the device plugin advertises
    ``nvidia.com/mig-3g.40gb``."""
    inv = json.loads((REPO_ROOT / "examples" / "cluster" / "gpu-a100-mig-0.json").read_text())
    inv.pop("migStrategy", None)
    whole = inv["gpus"][0]
    whole["migEnabled"] = False
    whole.pop("migDevices")
    return inv


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    skip_if_e2e_disabled()
    t0 = time.monotonic()
    images = ensure_images()
    t_images = time.monotonic() - t0
    work = tmp_path_factory.mktemp("realnode")
    with RealCluster(work, node_inventory(), images=images.tarballs()) as rc:
        report(f"real node: images {t_images:.1f}s, node up in {rc.timings['total']:.1f}s ("
               + ", ".join(f"{k} {v:.1f}s" for k, v in rc.timings.items() if k != "total") + ")")
        yield rc, images, work


@pytest.fixture(scope="module")
def helm(cluster):
    rc, _, work = cluster
    return Helm(ensure_helm(), rc.kubeconfig_path, work / "helm-home")


@pytest.fixture(scope="module")
def api(cluster):
    rc, _, _ = cluster
    client = rc.api_client()
    yield client
    client.close()


def values(images, **extra) -> dict:
    """Chart values pointing at the locally imported images, with the agent's fake probe."""
    gpuplace, scheduler = images.gpuplace, images.scheduler
    out = {
        "image": {"repository": gpuplace.repository, "tag": gpuplace.tag, "pullPolicy": "Never"},
        "scheduler": {"image": {"repository": scheduler.repository, "tag": scheduler.tag, "pullPolicy": "Never"}},
        "agent": {"probe": "fake", "fakeInventory": node_inventory(), "intervalSeconds": 2},
    }
    for key, value in extra.items():
        out.setdefault(key, {}).update(value)
    return out


@pytest.fixture(scope="module")
def installed(cluster, helm, api):
    rc, images, work = cluster
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NS)))
    vals = work / "values.yaml"
    vals.write_text(yaml.safe_dump(values(images)))
    t0 = time.monotonic()
    helm("install", RELEASE, str(CHART), "--namespace", NS, "-f", str(vals), "--wait", "--timeout", "5m")
    report(f"real node: helm install --wait took {time.monotonic() - t0:.1f}s")
    return vals


def create_example(rc: RealCluster, name: str, **overrides) -> dict:
    """``kubectl create`` of ``examples/pods/*-NAME.yaml``, with ``metadata``/``spec`` keys replaced."""
    path = next(EXAMPLE_PODS.glob(f"*-{name}.yaml"))
    pod = yaml.safe_load(path.read_text())
    pod["metadata"].update(overrides.pop("metadata", {}))
    pod["spec"].update(overrides.pop("spec", {}))
    rc.kubectl("create", "-f", "-", input=yaml.safe_dump(pod))
    return pod


#: Example 03 (13B inference, bf16) asking for a MIG slice by name, as pods do under the mixed strategy.
MIG_POD = {"spec": {"containers": [{"name": "server", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"limits": {"nvidia.com/mig-3g.40gb": 1}}}]}}


def whole_gpu_pod(name: str) -> dict:
    """Example 03 as a 30B inference server: about 68 GiB of VRAM, class large, a whole A100-80GB."""
    return {"metadata": {"name": name, "annotations": {"gpuplace.io/model-params": "30B",
                                                       "gpuplace.io/workload": "inference",
                                                       "gpuplace.io/precision": "bf16"}}}


def wait_running(api, name: str, ns: str = "default", timeout: float = 120) -> k8s.V1Pod:
    core = k8s.CoreV1Api(api)

    def running():
        pod = core.read_namespaced_pod(name, ns)
        return pod if pod.status.phase == "Running" else None

    return wait_for(running, timeout, interval=0.5, message=f"pod {ns}/{name} not Running")


def published_inventory(api, node: str) -> dict | None:
    raw = (k8s.CoreV1Api(api).read_node(node).metadata.annotations or {}).get(INVENTORY_ANNOTATION)
    return json.loads(raw) if raw else None


def holders(inventory: dict) -> dict[str, str]:
    """UUID (GPU or MIG device) -> allocatedTo, for every unit held by a pod."""
    out = {}
    for gpu in inventory["gpus"]:
        for unit in [gpu, *gpu.get("migDevices", [])]:
            if unit.get("allocatedTo"):
                out[unit["uuid"]] = unit["allocatedTo"]
    return out


def test_chart_pods_run_and_are_ready_on_the_real_node(cluster, installed, api):
    rc, _, _ = cluster
    apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)

    def ready(kind: str, name: str) -> bool:
        if kind == "DaemonSet":
            ds = apps.read_namespaced_daemon_set(name, NS)
            return bool(ds.status.desired_number_scheduled == ds.status.number_ready == 1)
        dep = apps.read_namespaced_deployment(name, NS)
        return bool(dep.status.ready_replicas == dep.spec.replicas == 2)

    # helm --wait accepts a DaemonSet with maxUnavailable (1) pods not ready: wait for each here.
    for kind, name in (("Deployment", "gpuplace-extender"), ("Deployment", "gpuplace-scheduler"),
                       ("DaemonSet", "gpuplace-agent")):
        wait_for(lambda: ready(kind, name), 60, message=f"{kind} {name} not Ready on the node")
    pods = core.list_namespaced_pod(NS).items
    assert pods and {p.spec.node_name for p in pods} == {rc.node_name}
    # One gpuplace-scheduler replica leads (leader election through a Lease in the release namespace).
    lease = wait_for(lambda: k8s.CoordinationV1Api(api).read_namespaced_lease("gpuplace-scheduler", NS), 60,
                     message="no gpuplace-scheduler Lease")
    assert lease.spec.holder_identity


def test_with_its_defaults_the_chart_generates_the_certificates_and_kube_scheduler_calls_the_extender_over_mutual_tls(
        cluster, installed, api):
    core = k8s.CoreV1Api(api)
    config = yaml.safe_load(core.read_namespaced_config_map("gpuplace-scheduler-config", NS).data["config.yaml"])
    ext = config["extenders"][0]
    assert ext["urlPrefix"] == f"https://gpuplace-extender.{NS}.svc:8888" and ext["enableHTTPS"] is True
    assert {"caFile", "certFile", "keyFile"} <= set(ext["tlsConfig"]) and ext["tlsConfig"]["insecure"] is False
    for name in ("gpuplace-extender-generated-tls", "gpuplace-scheduler-generated-client-tls"):
        secret = core.read_namespaced_secret(name, NS)
        assert secret.type == "kubernetes.io/tls" and {"tls.crt", "tls.key", "ca.crt"} <= set(secret.data), name
    args = k8s.AppsV1Api(api).read_namespaced_deployment("gpuplace-extender", NS).spec.template.spec.containers[0].args
    assert "--tls-client-ca-file=/etc/gpuplace/client-ca/ca.crt" in args and "--debug-endpoints" not in args
    assert k8s.NetworkingV1Api(api).read_namespaced_network_policy("gpuplace-extender", NS).spec.policy_types == ["Ingress"]


#: Run in a pod of another namespace: GET /healthz on the plain health port, then POST /filter to the
#: HTTPS port with no client certificate, trusting the CA of the extender's serving certificate (so
#: a failure is the client certificate it lacks, not one it distrusts), and, as the control, the same
#: request presenting kube-scheduler's client certificate. Prints one JSON line.
OUTSIDER_SCRIPT = r"""
import json, os, ssl, sys, time, urllib.request
host = sys.argv[1]
out = {}
deadline = time.monotonic() + 60
while True:  # the Service's DNS name and endpoints may take a moment
    try:
        with urllib.request.urlopen(f"http://{host}:8889/healthz", timeout=5) as r:
            out["healthz"] = {"status": r.status, "body": r.read(100).decode()}
        break
    except Exception as e:
        if time.monotonic() > deadline:
            out["healthz"] = {"status": None, "error": f"{type(e).__name__}: {e}"}
            break
        time.sleep(2)
ctx = ssl.create_default_context(cadata=os.environ["CA_PEM"])
body = json.dumps({"Pod": {"metadata": {"name": "p", "namespace": "outsider"}, "spec": {"containers": []}},
                   "NodeNames": ["n"]}).encode()
def post(key, ctx):
    req = urllib.request.Request(f"https://{host}:8888/filter", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            out[key] = {"status": r.status, "body": r.read(300).decode()}
    except Exception as e:
        reason = getattr(e, "reason", e)
        out[key] = {"status": getattr(e, "code", None), "error": f"{type(reason).__name__}: {e}"}
post("filter", ctx)
with open("/tmp/client.crt", "w") as f:
    f.write(os.environ["CLIENT_CRT"])
with open("/tmp/client.key", "w") as f:
    f.write(os.environ["CLIENT_KEY"])
with_cert = ssl.create_default_context(cadata=os.environ["CA_PEM"])
with_cert.load_cert_chain("/tmp/client.crt", "/tmp/client.key")
post("filter_with_client_cert", with_cert)
print(json.dumps(out), flush=True)
"""


def test_with_the_chart_defaults_a_pod_in_another_namespace_cannot_call_filter(cluster, installed, api):
    """A pod in another namespace, holding the serving CA but no client certificate, gets no answer
    from ``/filter``: the extender aborts the TLS connection, while ``/healthz`` on the plain health port answers it (the
    Service is reachable from there) and the same call with kube-scheduler's client certificate is
    answered: the refusal is mutual TLS, not routing.

    The node's CNI (Debian's ``bridge`` plugin) does not enforce NetworkPolicy, so this proves the
    TLS layer only; the chart's NetworkPolicy is checked by rendering (helm-unittest) and by a
    server-side dry run (``test_helm.py``). On a CNI that enforces it, this pod would not even reach
    the port."""
    rc, images, _ = cluster
    core = k8s.CoreV1Api(api)
    ca_pem = base64.b64decode(core.read_namespaced_secret("gpuplace-extender-generated-tls", NS).data["ca.crt"]).decode()
    client = {k: base64.b64decode(v).decode()
              for k, v in core.read_namespaced_secret("gpuplace-scheduler-generated-client-tls", NS).data.items()}
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="outsider")))
    core.create_namespaced_pod("outsider", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "caller"},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [{
            "name": "caller", "image": f"{images.gpuplace.repository}:{images.gpuplace.tag}",
            "imagePullPolicy": "Never", "command": ["python3", "-c", OUTSIDER_SCRIPT, f"gpuplace-extender.{NS}.svc"],
            "env": [{"name": "CA_PEM", "value": ca_pem}, {"name": "CLIENT_CRT", "value": client["tls.crt"]},
                    {"name": "CLIENT_KEY", "value": client["tls.key"]}]}]}})

    def finished():
        pod = core.read_namespaced_pod("caller", "outsider")
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod = wait_for(finished, 180, interval=1, message="the caller pod in namespace outsider did not finish")
    log = core.read_namespaced_pod_log("caller", "outsider")
    assert pod.status.phase == "Succeeded", log
    result = json.loads(log.strip().splitlines()[-1])
    assert result["healthz"]["status"] == 200, result  # reachable: routing and DNS work from there
    assert result["filter"]["status"] is None, result  # no HTTP answer at all, not even 4xx
    # Under TLS 1.3 the client finishes its handshake before the server checks the client
    # certificate; the server then aborts the connection, which the client sees as an SSL error or
    # a connection closed before any HTTP answer, depending on timing.
    assert result["filter"]["error"].split(":")[0] in (
        "SSLError", "SSLEOFError", "SSLZeroReturnError", "RemoteDisconnected", "ConnectionResetError"), result
    # the control: the same call from the same pod, with kube-scheduler's client certificate, is answered
    assert result["filter_with_client_cert"]["status"] == 200, result


def test_the_agent_pod_publishes_the_node_inventory(cluster, installed, api):
    rc, _, _ = cluster
    inv = wait_for(lambda: published_inventory(api, rc.node_name), 60, message="no inventory published")
    assert inv["nodeName"] == rc.node_name
    assert [g["uuid"] for g in inv["gpus"]] == [g["uuid"] for g in node_inventory()["gpus"]]


def test_describe_of_an_impossible_pod_shows_the_extenders_reason(cluster, installed, api):
    rc, _, _ = cluster
    # First, while the node's nvidia.com/gpu is free: kube-scheduler's own fit passes and asks the extender.
    create_example(rc, "impossible-200gi")

    def described():
        out = rc.kubectl("describe", "pod", "impossible-200gi").stdout
        return out if "FailedScheduling" in out else None

    out = wait_for(described, 60, interval=1, message="no FailedScheduling event")
    assert "200 GiB" in out and "gpuplace.io/vram" in out, out[-2000:]


def test_an_annotated_pod_is_placed_through_the_chart_and_runs_holding_a_gpu(cluster, installed, api):
    rc, _, _ = cluster
    create_example(rc, "llm-13b-inference", **whole_gpu_pod("llm-30b-inference"))
    pod = wait_running(api, "llm-30b-inference")
    assert pod.spec.node_name == rc.node_name
    events = k8s.CoreV1Api(api).list_namespaced_event(
        "default", field_selector="involvedObject.name=llm-30b-inference,reason=Scheduled").items
    assert any((e.reporting_component or (e.source.component if e.source else "")) == "gpuplace-scheduler"
               for e in events), [(e.reporting_component, e.source) for e in events]
    # The kubelet gave it the whole A100 (the only nvidia.com/gpu device); the agent read that
    # from the PodResources API and published it.
    whole_gpu = node_inventory()["gpus"][0]["uuid"]
    wait_for(lambda: holders(published_inventory(api, rc.node_name)).get(whole_gpu) == "default/llm-30b-inference",
             60, message="allocatedTo never named the pod")


def test_a_mig_pod_runs_on_a_mig_device_and_shows_in_allocated_to(cluster, installed, api):
    rc, _, _ = cluster
    create_example(rc, "llm-13b-inference", **MIG_POD)
    wait_running(api, "llm-13b-inference")
    mig_uuids = {m["uuid"] for m in node_inventory()["gpus"][1]["migDevices"]}
    held = wait_for(lambda: {u for u, who in holders(published_inventory(api, rc.node_name)).items()
                             if who == "default/llm-13b-inference"}, 60, message="allocatedTo never named the MIG pod")
    assert held <= mig_uuids and len(held) == 1


def test_a_killed_extender_pod_is_replaced_and_placement_goes_on(cluster, installed, api):
    rc, _, _ = cluster
    core = k8s.CoreV1Api(api)
    victims = core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/component=extender").items
    assert len(victims) == 2
    core.delete_namespaced_pod(victims[0].metadata.name, NS, grace_period_seconds=0)
    core.delete_namespaced_pod("llm-30b-inference", "default", grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod("default", field_selector="metadata.name=llm-30b-inference").items,
             60, message="the inference pod was not deleted")
    create_example(rc, "llm-13b-inference", **whole_gpu_pod("after-kill"))
    wait_running(api, "after-kill")

    def replaced():
        pods = core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/component=extender").items
        ready = [p for p in pods if p.metadata.name != victims[0].metadata.name
                 and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        return len(ready) == 2

    wait_for(replaced, 120, interval=1, message="the extender Deployment did not replace the killed pod")


def test_helm_test_checks_that_the_extender_answers(cluster, installed, helm):
    out = helm("test", RELEASE, "--namespace", NS, "--timeout", "3m")
    assert "Phase:          Succeeded" in out.stdout, out.stdout


def test_over_https_from_a_secret_of_the_users_pods_are_still_placed(cluster, installed, helm, api):
    """tls.secretName: the serving certificate from the user's Secret; mutual TLS stays on (the
    default), with the client certificate the chart generated at install, kept by the upgrade."""
    rc, images, work = cluster
    core = k8s.CoreV1Api(api)
    pki = generate_extender_pki(work / "extender-pki", dns_names=(f"gpuplace-extender.{NS}.svc",))
    core.create_namespaced_secret(NS, k8s.V1Secret(
        metadata=k8s.V1ObjectMeta(name="gpuplace-extender-tls"), type="kubernetes.io/tls",
        string_data={"tls.crt": pki.server_crt.read_text(), "tls.key": pki.server_key.read_text(),
                     "ca.crt": pki.ca_crt.read_text()}))
    vals = work / "tls-values.yaml"
    vals.write_text(yaml.safe_dump(values(images, extender={"tls": {"enabled": True,
                                                                    "secretName": "gpuplace-extender-tls"}})))
    helm("upgrade", RELEASE, str(CHART), "--namespace", NS, "-f", str(vals), "--wait", "--timeout", "5m")
    config = yaml.safe_load(core.read_namespaced_config_map("gpuplace-scheduler-config", NS).data["config.yaml"])
    assert config["extenders"][0]["urlPrefix"].startswith("https://")
    assert config["extenders"][0]["tlsConfig"]["certFile"]
    ext_pod = k8s.AppsV1Api(api).read_namespaced_deployment("gpuplace-extender", NS).spec.template.spec
    assert {v.name: v.secret.secret_name for v in ext_pod.volumes if v.secret} == {
        "tls": "gpuplace-extender-tls", "client-ca": "gpuplace-scheduler-generated-client-tls"}
    core.delete_namespaced_pod("after-kill", "default", grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod("default", field_selector="metadata.name=after-kill").items,
             60, message="the pod was not deleted")
    create_example(rc, "llm-13b-inference", **whole_gpu_pod("over-https"))
    pod = wait_running(api, "over-https")
    assert pod.spec.node_name == rc.node_name



def test_fake_nodes_join_next_to_the_real_one_and_the_extender_chooses_among_them(cluster, installed, api):
    """Fake GPU nodes (a Node object and a published inventory, no kubelet; what the load tests use
    by the hundred) in the same cluster: a 7B LoRA pod goes to the RTX 4090 node, the cheapest GPU
    that fits, and is bound there (it never runs: nothing runs pods on a fake node)."""
    inv = json.loads((REPO_ROOT / "examples" / "cluster" / "gpu-4090-0.json").read_text())
    create_node(api, "gpu-4090-0", node_allocatable(inv))
    publish_inventory_direct(api, "gpu-4090-0", inv)
    rc, _, _ = cluster
    create_example(rc, "llm-7b-lora")
    assert wait_pod_scheduled(api, "default", "llm-7b-lora", timeout=60) == "gpu-4090-0"
