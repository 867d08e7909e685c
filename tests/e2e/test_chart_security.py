"""The chart's security, on the real API server: least-privilege RBAC, the agent's admission policy, TLS.

The chart is installed with ``helm install``; the real agent and the real extender then run under
TokenRequest tokens of the chart's own ServiceAccounts, and the same tokens make calls the chart
must not allow, which have to fail with 403. The agent's token is bound to a Pod object on a Node,
as the kubelet binds a DaemonSet Pod's projected token, so the API server names that node in the
token's user info (``authentication.kubernetes.io/node-name``), which the chart's
ValidatingAdmissionPolicy reads. No kubelet runs, so the Pod never starts: its spec is the
DaemonSet's template with ``nodeName`` set.

TLS needs the extender's ``--tls-*`` flags at run time (tested with a live HTTPS scheduler in
``test_security.py``); here the chart's rendering with TLS values is checked, and a server-side dry
run of it. Own control plane: a failing policy must not disturb other modules.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from tests.harness.controlplane import K8S_VERSION, create_node, skip_if_e2e_disabled, wait_for
from tests.harness.gpucluster import ROOT, node_allocatable, start_extender
from tests.harness.helm import Helm, helm_control_plane, sa_kubeconfig

pytestmark = pytest.mark.e2e

CHART = ROOT / "deploy" / "helm" / "gpuplace"
NS = "gpuplace-sec"
RELEASE = "gpuplace"
AGENT_SA, EXTENDER_SA = "gpuplace-agent", "gpuplace-extender"
OWN_NODE, OTHER_NODE = "sec-gpu-0", "sec-gpu-1"
INVENTORY = ROOT / "examples" / "cluster" / "gpu-4090-0.json"
KUBE_VERSION = K8S_VERSION.lstrip("v")


def _render(helm: Helm, *args: str) -> list[dict[str, Any]]:
    out = helm("template", RELEASE, str(CHART), "--namespace", NS, "--kube-version", KUBE_VERSION, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _by_kind_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _forbidden(call: Callable[[], Any], what: str = "") -> str:
    """Run an API call that must be refused; return the server's message."""
    try:
        call()
    except ApiException as e:
        assert e.status == 403, f"{what}: expected 403 Forbidden, got {e.status}: {e.body}"
        return str(json.loads(e.body).get("message", ""))
    raise AssertionError(f"{what}: the call succeeded; it must be refused with 403")


def _inventory_for(node: str, tmp: Path, gpus: int | None = None) -> Path:
    doc = json.loads(INVENTORY.read_text())
    doc["nodeName"] = node
    if gpus is not None:
        doc["gpus"] = doc["gpus"][:gpus]
    path = tmp / f"{node}-{gpus}.json"
    path.write_text(json.dumps(doc))
    return path


def _run_agent(kubeconfig: Path, inventory: Path, node: str, timeout_s: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node_agent.cli", "--probe", "fake", "--fake-inventory", str(inventory),
         "--node-name", node, "--once", "--kubeconfig", str(kubeconfig), "--metrics-port", "0",
         "--publish-timeout-seconds", str(timeout_s)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout_s + 60)


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The chart installed with default values; two GPU Nodes; kubeconfigs of its ServiceAccounts."""
    skip_if_e2e_disabled()
    work = tmp_path_factory.mktemp("chart-security")
    with helm_control_plane(work, NS) as (cp, api, helm):
        helm("install", RELEASE, str(CHART), "--namespace", NS)
        core = k8s.CoreV1Api(api)
        allocatable = node_allocatable(json.loads(INVENTORY.read_text()))
        for node in (OWN_NODE, OTHER_NODE):
            create_node(api, node, allocatable, labels={"team": "ml"}, annotations={"owner.example.com/contact": "ops"})
        # The agent Pod the DaemonSet would create on OWN_NODE (no kubelet runs it): its token is
        # bound to it, so the API server puts OWN_NODE into the token's user info.
        ds = k8s.AppsV1Api(api).read_namespaced_daemon_set(AGENT_SA, NS)
        pod_spec = api.sanitize_for_serialization(ds.spec.template.spec)
        pod = core.create_namespaced_pod(NS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"gpuplace-agent-{OWN_NODE}", "labels": ds.spec.template.metadata.labels},
            "spec": {**pod_spec, "nodeName": OWN_NODE}})
        agent_kc = sa_kubeconfig(cp, api, NS, AGENT_SA, work / "agent.kubeconfig", bound_pod=pod)
        unbound_kc = sa_kubeconfig(cp, api, NS, AGENT_SA, work / "agent-unbound.kubeconfig")
        extender_kc = sa_kubeconfig(cp, api, NS, EXTENDER_SA, work / "extender.kubeconfig")
        clients = [k8s_config.new_client_from_config(config_file=str(p)) for p in (agent_kc, unbound_kc, extender_kc)]
        yield {"cp": cp, "api": api, "helm": helm, "work": work, "agent_kc": agent_kc, "extender_kc": extender_kc,
               "agent": k8s.CoreV1Api(clients[0]), "agent_unbound": k8s.CoreV1Api(clients[1]),
               "extender": k8s.CoreV1Api(clients[2]), "extender_api": clients[2]}
        for c in clients:
            c.close()


# ---- the agent: its own Node, gpuplace.io/ keys only ----------------------------------------------

def test_the_agents_pod_bound_token_names_the_node_its_pod_runs_on(chart):
    review = k8s.AuthenticationV1Api(chart["agent"].api_client).create_self_subject_review(k8s.V1SelfSubjectReview())
    user = review.status.user_info
    assert user.username == f"system:serviceaccount:{NS}:{AGENT_SA}"
    assert user.extra["authentication.kubernetes.io/node-name"] == [OWN_NODE]


def test_the_real_agent_publishes_its_nodes_inventory_and_labels_under_its_own_token(chart, tmp_path):
    core = k8s.CoreV1Api(chart["api"])
    for gpus in (None, 1):  # a second publish changes gpuplace.io/ labels that the first one set
        proc = _run_agent(chart["agent_kc"], _inventory_for(OWN_NODE, tmp_path, gpus), OWN_NODE)
        assert proc.returncode == 0, proc.stderr[-2000:]
        node = core.read_node(OWN_NODE)
        published = json.loads(node.metadata.annotations["gpuplace.io/inventory"])
        want = len(json.loads(INVENTORY.read_text())["gpus"]) if gpus is None else gpus
        assert len(published["gpus"]) == want
        assert node.metadata.labels["gpuplace.io/gpu-count"] == str(want)
    # what was there before the agent is untouched
    assert node.metadata.labels["team"] == "ml"
    assert node.metadata.annotations["owner.example.com/contact"] == "ops"


def test_the_real_agent_cannot_publish_on_another_node(chart, tmp_path):
    proc = _run_agent(chart["agent_kc"], _inventory_for(OTHER_NODE, tmp_path), OTHER_NODE, timeout_s=3)
    assert proc.returncode == 1
    assert "HTTP 403" in proc.stderr and f"may patch only Node {OWN_NODE}, not {OTHER_NODE}" in proc.stderr
    node = k8s.CoreV1Api(chart["api"]).read_node(OTHER_NODE)
    assert "gpuplace.io/inventory" not in (node.metadata.annotations or {})


def _patch(api: k8s.CoreV1Api, node: str, body: Any) -> Any:
    return api.patch_node(node, body, _content_type="application/strategic-merge-patch+json")


def test_the_agent_may_set_and_remove_gpuplace_io_keys_on_its_own_node(chart):
    agent = chart["agent"]
    _patch(agent, OWN_NODE, {"metadata": {"labels": {"gpuplace.io/probe": "x"}, "annotations": {"gpuplace.io/note": "y"}}})
    node = _patch(agent, OWN_NODE, {"metadata": {"labels": {"gpuplace.io/probe": None}, "annotations": {"gpuplace.io/note": None}}})
    assert "gpuplace.io/probe" not in node.metadata.labels and "gpuplace.io/note" not in node.metadata.annotations


@pytest.mark.parametrize(("what", "body", "message"), [
    ("add a label", {"metadata": {"labels": {"team": "ml", "evil": "1"}}}, "changes evil"),
    ("change a label", {"metadata": {"labels": {"team": "other"}}}, "changes team"),
    ("remove a label", {"metadata": {"labels": {"team": None}}}, "changes team"),
    ("change a system label", {"metadata": {"labels": {"kubernetes.io/hostname": "x"}}}, "kubernetes.io/hostname"),
    ("a look-alike prefix", {"metadata": {"labels": {"gpuplace.io.evil.com/x": "1"}}}, "gpuplace.io.evil.com/x"),
    ("add an annotation", {"metadata": {"annotations": {"evil": "1"}}}, "annotations; this request changes evil"),
    ("remove an annotation", {"metadata": {"annotations": {"owner.example.com/contact": None}}},
     "changes owner.example.com/contact"),
    ("a gpuplace.io key with a foreign one", {"metadata": {"labels": {"gpuplace.io/gpu-count": "9", "evil": "1"}}},
     "changes evil"),
    ("add a taint", {"spec": {"taints": [{"key": "evil", "effect": "NoSchedule"}]}}, "may not change a Node's spec"),
    ("cordon", {"spec": {"unschedulable": True}}, "may not change a Node's spec"),
    ("add a finalizer", {"metadata": {"finalizers": ["example.com/hold"]}}, "finalizers"),
])
def test_the_agent_cannot_change_anything_of_its_own_node_outside_gpuplace_io(chart, what, body, message):
    before = k8s.CoreV1Api(chart["api"]).read_node(OWN_NODE)
    assert message in _forbidden(lambda: _patch(chart["agent"], OWN_NODE, body), what), what
    after = k8s.CoreV1Api(chart["api"]).read_node(OWN_NODE)
    assert after.metadata.resource_version == before.metadata.resource_version, f"{what}: the Node changed"


def test_the_agent_cannot_patch_another_node_even_its_gpuplace_io_keys(chart):
    msg = _forbidden(lambda: _patch(chart["agent"], OTHER_NODE, {"metadata": {"annotations": {"gpuplace.io/inventory": "{}"}}}))
    assert f"the gpuplace agent on node {OWN_NODE} may patch only Node {OWN_NODE}, not {OTHER_NODE}" in msg


def test_an_agent_token_bound_to_no_pod_cannot_patch_any_node(chart):
    for node in (OWN_NODE, OTHER_NODE):
        msg = _forbidden(lambda: _patch(chart["agent_unbound"], node, {"metadata": {"labels": {"gpuplace.io/x": "1"}}}))
        assert "this token names no node" in msg


def test_the_agent_token_is_refused_everything_else(chart):
    agent = chart["agent"]
    forbidden = {
        "list pods": lambda: agent.list_pod_for_all_namespaces(),
        "list secrets": lambda: agent.list_namespaced_secret(NS),
        "read a secret": lambda: agent.read_namespaced_secret("any", NS),
        "list nodes": lambda: agent.list_node(),
        "create a node": lambda: agent.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name="evil-node"))),
        "delete its node": lambda: agent.delete_node(OWN_NODE),
        "patch its node's status": lambda: agent.patch_node_status(OWN_NODE, {"status": {"capacity": {"nvidia.com/gpu": "99"}}}),
        "create a configmap": lambda: agent.create_namespaced_config_map(NS, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="x"))),
        "create a pod": lambda: agent.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                                                                 "spec": {"containers": [{"name": "x", "image": "x"}]}}),
        "read the policy": lambda: agent.read_namespaced_config_map("gpuplace-policy", NS),
    }
    for what, call in forbidden.items():
        _forbidden(call, what)
    assert agent.read_node(OWN_NODE).metadata.name == OWN_NODE  # get is granted (kubectl-style patch clients need it)


def test_without_the_admission_policy_the_same_token_could_patch_another_node(chart):
    """The policy, not RBAC, is what keeps the agent on its own Node: switched off, the patch passes."""
    helm, agent = chart["helm"], chart["agent"]
    body = {"metadata": {"labels": {"gpuplace.io/policy-off": "1"}}}
    helm("upgrade", RELEASE, str(CHART), "--namespace", NS, "--reuse-values", "--set", "agent.admissionPolicy.enabled=false")
    try:  # the API server stops enforcing once its policy informer sees the deletion
        node = wait_for(lambda: _patch(agent, OTHER_NODE, body), 30, interval=0.5,
                        message="the patch was still refused 30 s after the policy was removed")
        assert node.metadata.labels["gpuplace.io/policy-off"] == "1"
    finally:
        helm("upgrade", RELEASE, str(CHART), "--namespace", NS, "--reuse-values", "--set", "agent.admissionPolicy.enabled=true")

    def denied_again() -> bool:  # enforced once the API server's policy informer sees it again
        try:
            _patch(agent, OTHER_NODE, {"metadata": {"labels": {"gpuplace.io/policy-off": None}}})
        except ApiException as e:
            return e.status == 403
        return False

    wait_for(denied_again, 30, interval=0.5, message="the re-enabled admission policy was not enforced")


# ---- the extender: reads, and writes only its requeue mark on waiting pods -----------------------

def test_the_real_extender_runs_under_its_own_token_and_filters_nodes(chart, tmp_path):
    publish = _run_agent(chart["agent_kc"], _inventory_for(OWN_NODE, tmp_path), OWN_NODE)
    assert publish.returncode == 0, publish.stderr[-2000:]
    extender = start_extender(chart["extender_kc"], chart["cp"].logs, extra_args=[f"--policy-configmap={NS}/gpuplace-policy"])
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
               "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        req = urllib.request.Request(f"{extender.url}/filter", method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"Pod": pod, "NodeNames": [OWN_NODE, OTHER_NODE]}).encode())
        with urllib.request.urlopen(req, timeout=10) as r:
            result = json.load(r)
        assert result["NodeNames"] == [OWN_NODE], result  # OTHER_NODE has no inventory
        assert "forbidden" not in extender.log_path.read_text().lower()
    finally:
        extender.stop()


@pytest.fixture(scope="module")
def waiting_pod(chart) -> k8s.V1Pod:
    """A pod no scheduler serves: it stays unbound."""
    return k8s.CoreV1Api(chart["api"]).create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "waits", "labels": {"app": "x"}, "annotations": {"gpuplace.io/vram": "20Gi"}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})


def test_the_extender_token_may_set_its_requeue_mark_on_a_waiting_pod_and_nothing_else(chart, waiting_pod):
    from scheduler_extender.cluster.requeue import REQUEUE_ANNOTATION, pod_patcher

    patch = pod_patcher(chart["extender_api"])  # the extender's own code path, under its own token
    assert patch("default", "waits", waiting_pod.metadata.uid) == "requeued"
    pod = k8s.CoreV1Api(chart["api"]).read_namespaced_pod("waits", "default")
    assert REQUEUE_ANNOTATION in pod.metadata.annotations and pod.metadata.annotations["gpuplace.io/vram"] == "20Gi"
    assert patch("default", "waits", "not-its-uid") == "gone"  # a pod recreated under the same name is left alone

    ext = chart["extender"]
    refused = {
        "change a request annotation": ({"metadata": {"annotations": {"gpuplace.io/vram": "80Gi"}}},
                                        "only the annotations extender.gpuplace.io/requeued-at and "
                                        "extender.gpuplace.io/nominated-node; this request changes gpuplace.io/vram"),
        "add another annotation": ({"metadata": {"annotations": {"x": "1"}}}, "this request changes x"),
        "change a label": ({"metadata": {"labels": {"app": "y"}}}, "spec, labels, finalizers or owners"),
        "change the spec": ({"spec": {"activeDeadlineSeconds": 5}}, "spec, labels, finalizers or owners"),
    }
    for what, (body, message) in refused.items():
        assert message in _forbidden(lambda: ext.patch_namespaced_pod("waits", "default", body), what), what
    # a bound pod (the agent's, on OWN_NODE) is not requeued: its mark would mean nothing
    bound = f"gpuplace-agent-{OWN_NODE}"
    msg = _forbidden(lambda: ext.patch_namespaced_pod(bound, NS, {"metadata": {"annotations": {REQUEUE_ANNOTATION: "now"}}}),
                     "requeue a bound pod")
    assert "only pods waiting for a node" in msg
    assert patch(NS, bound, k8s.CoreV1Api(chart["api"]).read_namespaced_pod(bound, NS).metadata.uid) == "forbidden"


def test_the_extender_token_may_preempt_through_evictions_its_mark_and_its_lease_and_nothing_more(chart, waiting_pod):
    """Preemption (extender.preemption.enabled, on by default), under the extender's own token and its
    own code path: it lists PodDisruptionBudgets, marks a waiting pod with its nominated node and
    withdraws the mark, evicts a pod through the Eviction API and records an Event in the pod's
    namespace; it holds its own Lease, no other; it may not mark a bound pod, delete or exec."""
    from scheduler_extender.cluster.preemption import KubePreemptionApi

    admin, ext = k8s.CoreV1Api(chart["api"]), chart["extender"]
    api = KubePreemptionApi(chart["extender_api"])
    assert isinstance(api.budgets(), list)  # policy/v1 poddisruptionbudgets, every namespace
    uid = waiting_pod.metadata.uid
    assert api.nominate("default", "waits", uid, OTHER_NODE) == "nominated"
    annotations = admin.read_namespaced_pod("waits", "default").metadata.annotations
    assert annotations["extender.gpuplace.io/nominated-node"] == OTHER_NODE and annotations["gpuplace.io/vram"] == "20Gi"
    assert api.nominate("default", "waits", uid, None) == "nominated"  # withdrawn
    assert "extender.gpuplace.io/nominated-node" not in admin.read_namespaced_pod("waits", "default").metadata.annotations
    # a victim bound to a node (no kubelet runs it): the eviction is admitted, and the pod is being deleted
    victim = admin.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "victim"},
        "spec": {"nodeName": OTHER_NODE, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
    assert api.evict("default", "victim", victim.metadata.uid) == "evicted"
    assert admin.read_namespaced_pod("victim", "default").metadata.deletion_timestamp is not None
    api.event("default", "waits", uid, "Normal", "Preempting", "test")
    assert any(e.reason == "Preempting" for e in admin.list_namespaced_event(
        "default", field_selector="involvedObject.name=waits").items), "the Event was not recorded"

    bound = f"gpuplace-agent-{OWN_NODE}"
    assert api.nominate(NS, bound, admin.read_namespaced_pod(bound, NS).metadata.uid, OTHER_NODE) == "forbidden"
    msg = _forbidden(lambda: ext.patch_namespaced_pod(bound, NS, {"metadata": {"annotations": {
        "extender.gpuplace.io/nominated-node": OTHER_NODE}}}), "mark a bound pod")
    assert "only pods waiting for a node" in msg
    _forbidden(lambda: ext.delete_namespaced_pod(bound, NS), "delete a pod")  # eviction, never delete
    _forbidden(lambda: ext.connect_post_namespaced_pod_exec(bound, NS, command=["true"]), "exec into a pod")

    leases = k8s.CoordinationV1Api(chart["extender_api"])
    lease = leases.create_namespaced_lease(NS, k8s.V1Lease(
        metadata=k8s.V1ObjectMeta(name="gpuplace-extender-preemption"), spec=k8s.V1LeaseSpec(holder_identity="a")))
    lease.spec.holder_identity = "b"
    leases.replace_namespaced_lease("gpuplace-extender-preemption", NS, lease)
    assert leases.read_namespaced_lease("gpuplace-extender-preemption", NS).spec.holder_identity == "b"
    for what, call in {
        "read the scheduler's lease": lambda: leases.read_namespaced_lease("gpuplace-scheduler", NS),
        "list leases": lambda: leases.list_namespaced_lease(NS),
        "create a lease elsewhere": lambda: leases.create_namespaced_lease("default", k8s.V1Lease(metadata=k8s.V1ObjectMeta(name="x"))),
    }.items():
        _forbidden(call, what)


def test_the_extender_token_is_refused_writes_secrets_and_other_configmaps(chart):
    ext = chart["extender"]
    forbidden = {
        "patch a node": lambda: _patch(ext, OWN_NODE, {"metadata": {"labels": {"gpuplace.io/x": "1"}}}),
        "read a node": lambda: ext.read_node(OWN_NODE),  # list/watch only
        "list secrets": lambda: ext.list_namespaced_secret(NS),
        "list all secrets": lambda: ext.list_secret_for_all_namespaces(),
        "read a secret": lambda: ext.read_namespaced_secret("any", NS),
        "read the scheduler's configmap": lambda: ext.read_namespaced_config_map("gpuplace-scheduler-config", NS),
        "list configmaps": lambda: ext.list_namespaced_config_map(NS),
        "edit the policy": lambda: ext.patch_namespaced_config_map("gpuplace-policy", NS, {"data": {"policy.yaml": "x"}}),
        "create a pod": lambda: ext.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                                                               "spec": {"containers": [{"name": "x", "image": "x"}]}}),
        "bind a pod": lambda: ext.create_namespaced_pod_binding(f"gpuplace-agent-{OWN_NODE}", NS, k8s.V1Binding(
            metadata=k8s.V1ObjectMeta(name=f"gpuplace-agent-{OWN_NODE}"), target=k8s.V1ObjectReference(kind="Node", name=OWN_NODE))),
        "delete a pod": lambda: ext.delete_namespaced_pod(f"gpuplace-agent-{OWN_NODE}", NS),
        "list events": lambda: ext.list_namespaced_event(NS),
    }
    for what, call in forbidden.items():
        _forbidden(call, what)
    # what it needs works: its one policy ConfigMap, by name and by field selector
    assert ext.read_namespaced_config_map("gpuplace-policy", NS).data["policy.yaml"]
    assert len(ext.list_namespaced_config_map(NS, field_selector="metadata.name=gpuplace-policy").items) == 1


# ---- rendering: TLS, non-root, the policy switch -------------------------------------------------

def test_tls_from_a_secret_renders_an_https_scheduler_config_and_mounts_it_read_only(chart):
    docs = _by_kind_name(_render(chart["helm"], "--set", "extender.tls.enabled=true", "--set", "extender.tls.secretName=ext-tls",
                                 "--set", "extender.tls.clientAuth.enabled=false"))
    config = yaml.safe_load(docs[("ConfigMap", "gpuplace-scheduler-config")]["data"]["config.yaml"])
    ext = config["extenders"][0]
    assert ext["urlPrefix"] == f"https://gpuplace-extender.{NS}.svc:8888"
    assert ext["enableHTTPS"] is True
    assert ext["tlsConfig"] == {"insecure": False, "caFile": "/etc/kubernetes/gpuplace-scheduler/extender-ca/ca.crt"}

    sched = docs[("Deployment", "gpuplace-scheduler")]["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in sched["volumes"]}
    assert vols["extender-ca"]["secret"] == {"secretName": "ext-tls", "defaultMode": 0o444,
                                             "items": [{"key": "ca.crt", "path": "ca.crt"}]}  # never the key
    mount = next(m for m in sched["containers"][0]["volumeMounts"] if m["name"] == "extender-ca")
    assert mount == {"name": "extender-ca", "mountPath": "/etc/kubernetes/gpuplace-scheduler/extender-ca", "readOnly": True}

    pod = docs[("Deployment", "gpuplace-extender")]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert {"--tls-cert-file=/etc/gpuplace/tls/tls.crt", "--tls-key-file=/etc/gpuplace/tls/tls.key"} <= set(c["args"])
    assert not [a for a in c["args"] if a.startswith("--tls-client-ca-file")]
    assert {"name": "tls", "mountPath": "/etc/gpuplace/tls", "readOnly": True} in c["volumeMounts"]
    assert next(v for v in pod["volumes"] if v["name"] == "tls")["secret"]["secretName"] == "ext-tls"
    # Probes and Prometheus carry no client certificate and trust no private CA: the plain health port.
    assert "--health-port=8889" in c["args"] and {"name": "health", "containerPort": 8889, "protocol": "TCP"} in c["ports"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health", "scheme": "HTTP"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health", "scheme": "HTTP"}
    service_ports = {p["name"]: p["port"] for p in docs[("Service", "gpuplace-extender")]["spec"]["ports"]}
    assert service_ports == {"http": 8888, "health": 8889}


def test_a_ca_bundle_in_values_becomes_ca_data_and_client_auth_adds_the_client_certificate(chart):
    pem = "-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n"
    values = chart["work"] / "tls-values.yaml"
    values.write_text(yaml.safe_dump({"extender": {"tls": {
        "enabled": True, "secretName": "ext-tls", "caBundle": pem,
        "clientAuth": {"enabled": True, "secretName": "sched-client"}}}}))
    docs = _by_kind_name(_render(chart["helm"], "-f", str(values)))
    ext = yaml.safe_load(docs[("ConfigMap", "gpuplace-scheduler-config")]["data"]["config.yaml"])["extenders"][0]
    assert ext["tlsConfig"] == {"insecure": False, "caData": base64.b64encode(pem.encode()).decode(),
                                "certFile": "/etc/kubernetes/gpuplace-scheduler/extender-client/tls.crt",
                                "keyFile": "/etc/kubernetes/gpuplace-scheduler/extender-client/tls.key"}
    sched = docs[("Deployment", "gpuplace-scheduler")]["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in sched["volumes"]}
    assert "extender-ca" not in vols
    assert vols["extender-client"]["secret"]["secretName"] == "sched-client"
    pod = docs[("Deployment", "gpuplace-extender")]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert "--tls-client-ca-file=/etc/gpuplace/client-ca/ca.crt" in c["args"]
    assert next(v for v in pod["volumes"] if v["name"] == "client-ca")["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health", "scheme": "HTTP"}  # no client cert


def test_insecure_skip_verify_sends_no_ca_which_kube_scheduler_would_refuse_alongside_it(chart):
    docs = _by_kind_name(_render(chart["helm"], "--set", "extender.tls.enabled=true", "--set", "extender.tls.secretName=s",
                                 "--set", "extender.tls.insecureSkipVerify=true", "--set", "extender.tls.clientAuth.enabled=false"))
    ext = yaml.safe_load(docs[("ConfigMap", "gpuplace-scheduler-config")]["data"]["config.yaml"])["extenders"][0]
    assert ext["tlsConfig"] == {"insecure": True}
    sched = docs[("Deployment", "gpuplace-scheduler")]["spec"]["template"]["spec"]
    assert [v["name"] for v in sched["volumes"]] == ["config"]


def test_the_tls_scenario_passes_a_server_side_dry_run_apply(chart):
    rendered = chart["helm"]("template", "tls", str(CHART), "--namespace", NS, "--kube-version", KUBE_VERSION,
                             "-f", str(CHART / "ci" / "tls-values.yaml")).stdout
    assert "--tls-client-ca-file=/etc/gpuplace/client-ca/ca.crt" in rendered
    cp = chart["cp"]
    proc = subprocess.run([str(cp.binaries.kubectl), "--kubeconfig", str(cp.kubeconfig_path), "apply",
                           "--dry-run=server", "-f", "-"], input=rendered, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "deployment.apps/tls-gpuplace-extender created (server dry run)" in proc.stdout
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/tls-gpuplace-agent-node-patch created" in proc.stdout


def test_cert_manager_issues_a_certificate_naming_the_service_into_the_mounted_secret(chart):
    helm = chart["helm"]
    args = ("--set", "extender.tls.enabled=true", "--set", "extender.tls.certManager.enabled=true",
            "--set", "extender.tls.clientAuth.enabled=true")
    proc = helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert proc.returncode != 0 and "no cert-manager.io/v1 Certificate API; install cert-manager first" in proc.stderr
    docs = _by_kind_name(_render(helm, *args, "--api-versions", "cert-manager.io/v1/Certificate"))
    cert = docs[("Certificate", "gpuplace-extender-tls")]["spec"]
    assert f"gpuplace-extender.{NS}.svc" in cert["dnsNames"]
    assert cert["issuerRef"] == {"name": "gpuplace-extender-ca", "kind": "Issuer", "group": "cert-manager.io"}
    assert docs[("Issuer", "gpuplace-extender-ca")]["spec"] == {"ca": {"secretName": "gpuplace-extender-ca"}}
    assert docs[("Certificate", "gpuplace-extender-ca")]["spec"]["isCA"] is True
    client = docs[("Certificate", "gpuplace-scheduler-client-tls")]["spec"]
    assert "client auth" in client["usages"]
    ext_vols = {v["name"]: v["secret"]["secretName"] for v in
                docs[("Deployment", "gpuplace-extender")]["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    assert ext_vols == {"tls": cert["secretName"], "client-ca": client["secretName"]}
    # an issuer of the user's: no chart CA
    docs = _by_kind_name(_render(helm, *args, "--api-versions", "cert-manager.io/v1/Certificate",
                                 "--set", "extender.tls.certManager.issuerRef.name=corp-ca",
                                 "--set", "extender.tls.certManager.issuerRef.kind=ClusterIssuer"))
    assert docs[("Certificate", "gpuplace-extender-tls")]["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}
    assert ("Issuer", "gpuplace-extender-ca") not in docs


@pytest.mark.parametrize(("values", "message"), [
    (("extender.tls.enabled=false", "extender.tls.certManager.enabled=true"),
     "extender.tls.certManager.enabled needs extender.tls.enabled=true"),
    (("extender.tls.certManager.issuerRef.kind=Cluster",), "at '/extender/tls/certManager/issuerRef'"),
    (("scheduler.enabled=false",), "give your kube-scheduler in extender.networkPolicy.extraFrom"),
    (("extender.networkPolicy.healthFrom[0].namespace=monitoring",), "at '/extender/networkPolicy/healthFrom/0'"),
])
def test_incomplete_tls_values_fail_with_the_value_to_set(chart, values, message):
    args = [a for v in values for a in ("--set", v)]
    proc = chart["helm"]("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")


def _containers(doc: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
    return spec, [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize("pod_resources", [True, False])
def test_every_container_of_the_chart_is_locked_down(chart, pod_resources):
    """Read-only root filesystem, no privilege escalation, no capabilities, RuntimeDefault seccomp and a
    non-root user in every container (the `helm test` Pod's too); the one exception is the agent reading
    the kubelet's root-only PodResources socket (agent.podResources.enabled), which runs as UID 0 with
    nothing else. With the fake probe, so that its inventory mount is checked too."""
    docs = _render(chart["helm"], "--set", f"agent.podResources.enabled={str(pod_resources).lower()}",
                   "--set", "extender.tls.enabled=true", "--set", "extender.tls.secretName=s",
                   "-f", str(CHART / "tests" / "values" / "fake-probe.yaml"))
    workloads = [d for d in docs if d["kind"] in (*WORKLOADS, "Pod")]
    assert {(d["kind"], d["metadata"]["name"]) for d in workloads} == {
        ("Deployment", "gpuplace-extender"), ("Deployment", "gpuplace-scheduler"), ("DaemonSet", "gpuplace-agent"),
        ("Pod", "gpuplace-test-extender")}
    for doc in workloads:
        pod, containers = _containers(doc)
        for c in containers:
            where = f"{doc['kind']}/{doc['metadata']['name']} container {c['name']}"
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert (sc.get("seccompProfile") or pod["securityContext"]["seccompProfile"]) == {"type": "RuntimeDefault"}, where
            assert not sc.get("privileged"), where
            root = sc.get("runAsUser", pod.get("securityContext", {}).get("runAsUser")) == 0
            if doc["kind"] == "DaemonSet" and pod_resources:
                assert root and not sc.get("runAsNonRoot"), where  # documented: the kubelet socket is root-only
            else:
                assert not root and (sc.get("runAsNonRoot") or pod["securityContext"].get("runAsNonRoot")) is True, where
            for m in c.get("volumeMounts", []):
                vol = next(v for v in pod["volumes"] if v["name"] == m["name"])
                if "emptyDir" not in vol:
                    assert m.get("readOnly") is True, f"{where}: {m['name']} is writable"
        assert not pod.get("hostNetwork") and not pod.get("hostPID"), doc["metadata"]["name"]
    ds = next(d for d in workloads if d["kind"] == "DaemonSet")
    assert any(v["name"] == "pod-resources" for v in ds["spec"]["template"]["spec"]["volumes"]) is pod_resources
    assert any(v["name"] == "fake-inventory" for v in ds["spec"]["template"]["spec"]["volumes"])
    hook = next(d for d in workloads if d["kind"] == "Pod")
    assert hook["spec"]["automountServiceAccountToken"] is False  # no API token in the test Pod


def test_the_admission_policies_are_on_by_default_can_be_switched_off_and_need_kubernetes_1_30(chart):
    helm = chart["helm"]

    def bindings(*args: str) -> dict[str, dict[str, Any]]:
        docs = _render(helm, *args)
        policies = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
        found = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"}
        assert policies == set(found)
        return found

    assert bindings() == {
        "gpuplace-agent-node-patch": {"policyName": "gpuplace-agent-node-patch", "validationActions": ["Deny"]},
        "gpuplace-extender-pod-requeue": {"policyName": "gpuplace-extender-pod-requeue", "validationActions": ["Deny"]},
    }
    assert set(bindings("--set", "agent.admissionPolicy.enabled=false")) == {"gpuplace-extender-pod-requeue"}
    assert set(bindings("--set", "extender.requeue.admissionPolicy.enabled=false")) == {"gpuplace-agent-node-patch"}
    assert set(bindings("--set", "extender.requeue.enabled=false")) == {"gpuplace-agent-node-patch"}
    proc = helm("template", RELEASE, str(CHART), "--kube-version", "1.29.9", check=False)
    assert proc.returncode != 0 and "needs Kubernetes >= 1.30" in proc.stderr
    proc = helm("template", RELEASE, str(CHART), "--kube-version", "1.29.9",
                "--set", "agent.admissionPolicy.enabled=false", check=False)
    assert proc.returncode != 0 and "extender.requeue.admissionPolicy.enabled" in proc.stderr
    assert helm("template", RELEASE, str(CHART), "--kube-version", "1.29.9", "--set", "agent.admissionPolicy.enabled=false",
                "--set", "extender.requeue.admissionPolicy.enabled=false").returncode == 0


def test_without_requeue_the_extender_gets_no_patch_on_pods_and_runs_with_requeue_off(chart):
    docs = _by_kind_name(_render(chart["helm"], "--set", "extender.requeue.enabled=false"))
    rules = docs[("ClusterRole", "gpuplace-extender")]["rules"]
    assert not any("patch" in r["verbs"] for r in rules), rules
    args = docs[("Deployment", "gpuplace-extender")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-requeue-rejected-pods" in args
    default = _by_kind_name(_render(chart["helm"]))
    assert "--no-requeue-rejected-pods" not in default[("Deployment", "gpuplace-extender")]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_own_scheduler_mode_with_tls_prints_an_https_extenders_snippet_and_where_the_ca_is(chart):
    out = chart["helm"]("install", "own", str(CHART), "--namespace", NS, "--dry-run", "--set", "scheduler.enabled=false",
                        "--set", "extender.tls.enabled=true", "--set", "extender.tls.secretName=ext-tls",
                        "--set", "extender.networkPolicy.extraFrom[0].ipBlock.cidr=10.0.0.0/24").stdout
    notes = out.split("NOTES:", 1)[1]
    snippet = yaml.safe_load(notes.split("KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1):", 1)[1]
                             .split("tlsConfig.caFile above", 1)[0])
    ext = snippet["extenders"][0]
    assert ext["urlPrefix"] == f"https://own-gpuplace-extender.{NS}.svc:8888" and ext["enableHTTPS"] is True
    assert f"kubectl -n {NS} get secret ext-tls -o jsonpath='{{.data.ca\\.crt}}' | base64 -d" in notes
    # mutual TLS (the default): where the generated client certificate is, and how to put it in place
    assert ext["tlsConfig"]["certFile"] == "/etc/kubernetes/gpuplace-scheduler/extender-client/tls.crt"
    assert (f"kubectl -n {NS} get secret own-gpuplace-scheduler-generated-client-tls -o jsonpath='{{.data.tls\\.crt}}' "
            "| base64 -d > /etc/kubernetes/gpuplace-scheduler/extender-client/tls.crt") in notes
    manifest = yaml.safe_load_all(out.split("MANIFEST:", 1)[1].split("NOTES:", 1)[0])
    assert ("Secret", "own-gpuplace-scheduler-generated-client-tls") in {(d["kind"], d["metadata"]["name"]) for d in manifest if d}


def test_the_network_policy_selects_the_extender_pods_and_admits_the_scheduler_and_helm_test_pods_by_their_labels(chart):
    """Across templates: the policy's selectors match the labels the pods really carry, so that a
    relabelled pod template cannot silently lock kube-scheduler out (or let everyone in)."""
    docs = _by_kind_name(_render(chart["helm"]))
    policy = docs[("NetworkPolicy", "gpuplace-extender")]["spec"]

    def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
        return selector["matchLabels"].items() <= labels.items()

    ext_labels = docs[("Deployment", "gpuplace-extender")]["spec"]["template"]["metadata"]["labels"]
    sched_labels = docs[("Deployment", "gpuplace-scheduler")]["spec"]["template"]["metadata"]["labels"]
    test_labels = docs[("Pod", "gpuplace-test-extender")]["metadata"]["labels"]
    assert selects(policy["podSelector"], ext_labels) and policy["policyTypes"] == ["Ingress"]
    main, health = policy["ingress"]
    assert main["ports"] == [{"port": 8888, "protocol": "TCP"}]
    assert [p for p in main["from"] if selects(p["podSelector"], sched_labels)] == main["from"]  # the scheduler only
    assert not selects(main["from"][0]["podSelector"], ext_labels) and not selects(main["from"][0]["podSelector"], test_labels)
    assert health["ports"] == [{"port": 8889, "protocol": "TCP"}]
    assert {"namespaceSelector": {}} in health["from"] and any(selects(p.get("podSelector", {"matchLabels": {"x": "y"}}), test_labels)
                                                              for p in health["from"])
    # the test Pod (mutual TLS: it holds no client certificate) calls the health port only
    hook_urls = docs[("Pod", "gpuplace-test-extender")]["spec"]["containers"][0]["args"][1:]
    assert hook_urls == [f"http://gpuplace-extender.{NS}.svc:8889/readyz"]


def test_renamed_service_accounts_keep_their_rbac_and_admission_policies(chart, tmp_path):
    """serviceAccount.name: the bindings and both admission policies follow the new names on the real
    API server. A second release, in a namespace of its own, with the agent's and the extender's
    ServiceAccounts renamed: the agent's Pod-bound token publishes on its own Node and is refused
    another; the extender's token lists Nodes and may not change a pod beyond its requeue mark."""
    cp, api, helm = chart["cp"], chart["api"], chart["helm"]
    ns, release = "gpuplace-renamed", "renamed"
    core = k8s.CoreV1Api(api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
    helm("install", release, str(CHART), "--namespace", ns, "--set", "scheduler.enabled=false",
         "--set", "extender.networkPolicy.extraFrom[0].ipBlock.cidr=10.0.0.0/24",
         "--set", "agent.serviceAccount.name=node-agent", "--set", "extender.serviceAccount.name=gpu-extender")
    try:
        sas = {sa.metadata.name for sa in core.list_namespaced_service_account(ns).items}
        assert {"node-agent", "gpu-extender"} <= sas and not {"renamed-gpuplace-agent", "renamed-gpuplace-extender"} & sas
        ds = k8s.AppsV1Api(api).read_namespaced_daemon_set("renamed-gpuplace-agent", ns)
        assert ds.spec.template.spec.service_account_name == "node-agent"
        pod = core.create_namespaced_pod(ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"node-agent-{OWN_NODE}", "labels": ds.spec.template.metadata.labels},
            "spec": {**api.sanitize_for_serialization(ds.spec.template.spec), "nodeName": OWN_NODE}})
        agent_kc = sa_kubeconfig(cp, api, ns, "node-agent", tmp_path / "node-agent.kubeconfig", bound_pod=pod)
        proc = _run_agent(agent_kc, _inventory_for(OWN_NODE, tmp_path), OWN_NODE)
        assert proc.returncode == 0, proc.stderr[-2000:]  # RBAC: the ClusterRoleBinding names node-agent
        proc = _run_agent(agent_kc, _inventory_for(OTHER_NODE, tmp_path), OTHER_NODE, timeout_s=3)
        assert proc.returncode == 1 and "ValidatingAdmissionPolicy 'renamed-gpuplace-agent-node-patch'" in proc.stderr \
            and f"agent on node {OWN_NODE} may patch only Node" in proc.stderr, proc.stderr[-2000:]  # the policy matches node-agent

        ext_kc = sa_kubeconfig(cp, api, ns, "gpu-extender", tmp_path / "gpu-extender.kubeconfig")
        ext_client = k8s_config.new_client_from_config(config_file=str(ext_kc))
        try:
            ext = k8s.CoreV1Api(ext_client)
            assert {OWN_NODE, OTHER_NODE} <= {n.metadata.name for n in ext.list_node().items}
            core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waiting"},
                                            "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
            message = _forbidden(lambda: ext.patch_namespaced_pod("waiting", ns, {"metadata": {"labels": {"x": "y"}}}),
                                 "a label patch by the renamed extender")
            assert "ValidatingAdmissionPolicy 'renamed-gpuplace-extender-pod-requeue'" in message, message
            ext.patch_namespaced_pod("waiting", ns, {"metadata": {"annotations": {
                "extender.gpuplace.io/requeued-at": "2026-01-01T00:00:00Z"}}})  # its one allowed change
        finally:
            ext_client.close()
    finally:
        helm("uninstall", release, "--namespace", ns)
