"""The Helm chart on the real control plane: lint, server-side dry run, a real ``helm install``, and
the example pods placed by the scheduler configuration the chart installed, through an extender that
runs with the chart's ServiceAccount (so its RBAC is exercised) and reads the chart's policy
ConfigMap. There is no kubelet, so the chart's Deployments never run pods; their configuration is
read back from the API and run here: the real kube-scheduler binary with the rendered
KubeSchedulerConfiguration and the extender with the Deployment's arguments. Both use the
certificates the chart generated at install (its default: HTTPS with mutual TLS), read from its
Secrets; off-cluster only the kubeconfig, the extender's address and the certificate files' paths
differ (kube-scheduler still checks the certificate's name, through ``tlsConfig.serverName``). Then a real Prometheus scrapes the extender
and an agent, and promtool checks their metrics and the chart's alert rules."""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from scheduler_extender.core.policy import parse_policy
from tests.e2e.test_placement import EXPECTED
from tests.harness.controlplane import K8S_VERSION, SchedulerSpec, free_port, skip_if_e2e_disabled, wait_for
from tests.harness.gpucluster import (
    ROOT, create_gpu_nodes, create_pods, load_pod_manifests, start_extender, wait_placements,
)
from tests.harness.helm import Helm, helm_control_plane, sa_kubeconfig
from tests.harness.tls import generate_extender_pki

pytestmark = pytest.mark.e2e

CHART = ROOT / "deploy" / "helm" / "gpuplace"
NS = "gpuplace"
RELEASE = "gpuplace"
POLICY_CM = "gpuplace-policy"
RTX_4090_NODES = {"gpu-4090-0", "gpu-4090-1"}


def metric_value(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


@pytest.fixture(scope="module")
def helm_cp(tmp_path_factory):
    skip_if_e2e_disabled()
    work = tmp_path_factory.mktemp("helm")
    with helm_control_plane(work, NS) as (cp, api, helm):
        yield cp, api, helm, work


@pytest.fixture(scope="module")
def installed(helm_cp):
    cp, api, helm, work = helm_cp
    # No --set: the kube-scheduler tag comes from the API server's version (the build stamps it).
    out = helm("install", RELEASE, str(CHART), "--namespace", NS)
    return out.stdout


@pytest.fixture(scope="module")
def chart_scheduler(helm_cp, installed):
    """Nodes, the extender (as the chart's ServiceAccount) and kube-scheduler with the chart's config."""
    cp, api, helm, work = helm_cp
    core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
    create_gpu_nodes(cp, ROOT / "examples" / "cluster", publish="direct")
    ext_deploy = apps.read_namespaced_deployment("gpuplace-extender", NS)
    ext_args = ext_deploy.spec.template.spec.containers[0].args
    # The Secrets the chart generated, as the pods would mount them (each volume's items by path).
    files = work / "chart-secrets"
    mounts = {"/etc/gpuplace/tls": "gpuplace-extender-generated-tls",
              "/etc/gpuplace/client-ca": "gpuplace-scheduler-generated-client-tls",
              "/etc/kubernetes/gpuplace-scheduler/extender-ca": "gpuplace-extender-generated-tls",
              "/etc/kubernetes/gpuplace-scheduler/extender-client": "gpuplace-scheduler-generated-client-tls"}
    for mount, secret in mounts.items():
        data = core.read_namespaced_secret(secret, NS).data
        for key, value in data.items():
            (files / mount.lstrip("/")).mkdir(parents=True, exist_ok=True)
            (files / mount.lstrip("/") / key).write_bytes(base64.b64decode(value))

    def local(arg: str) -> str:
        for mount in mounts:
            arg = arg.replace(mount + "/", str(files / mount.lstrip("/")) + "/")
        return arg

    health = free_port()
    # The chart's extender flags that decide or secure (the rest are ports, probes and log level,
    # which the harness sets itself).
    local_args = [local(a) for a in ext_args
                  if a.startswith(("--policy-configmap=", "--tls-"))
                  or a in ("--no-requeue-rejected-pods", "--filter-returns-best")]
    client_dir = files / "etc/kubernetes/gpuplace-scheduler/extender-client"
    # The harness's own probes: the chart's CA and client certificate; the name is checked by
    # kube-scheduler below (tlsConfig.serverName), the harness calls 127.0.0.1.
    ctx = ssl.create_default_context(cafile=str(files / "etc/kubernetes/gpuplace-scheduler/extender-ca/ca.crt"))
    ctx.check_hostname = False
    ctx.load_cert_chain(client_dir / "tls.crt", client_dir / "tls.key")
    kubeconfig = sa_kubeconfig(cp, api, NS, ext_deploy.spec.template.spec.service_account_name, work / "extender.kubeconfig")
    extender = start_extender(kubeconfig, cp.logs, ssl_context=ctx,
                              extra_args=[*local_args, f"--health-port={health}"])

    sched_cm = core.read_namespaced_config_map("gpuplace-scheduler-config", NS)
    config = yaml.safe_load(sched_cm.data["config.yaml"])
    ext = config["extenders"][0]
    in_cluster_url = ext["urlPrefix"]
    in_cluster_tls = dict(ext["tlsConfig"])
    ext["urlPrefix"] = extender.url
    ext["tlsConfig"] = {**{k: local(v) if isinstance(v, str) else v for k, v in ext["tlsConfig"].items()},
                        "serverName": f"gpuplace-extender.{NS}.svc"}
    sched_deploy = apps.read_namespaced_deployment("gpuplace-scheduler", NS)
    container = sched_deploy.spec.template.spec.containers[0]
    flags = tuple(a for a in container.args if not a.startswith("--config="))
    cp.add_scheduler(SchedulerSpec(name="gpuplace-scheduler", config=config, extra_args=flags))
    yield {"extender": extender, "config": config, "in_cluster_url": in_cluster_url, "image": container.image,
           "flags": flags, "extender_args": ext_args, "in_cluster_tls": in_cluster_tls, "health_port": health,
           "health_url": f"http://127.0.0.1:{health}", "files": files}
    cp.stop_scheduler("gpuplace-scheduler")
    extender.stop()


def test_helm_lint_passes(helm_cp):
    _, _, helm, _ = helm_cp
    out = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out.stdout
    for scenario in sorted((CHART / "ci").glob("*-values.yaml")):  # as chart-testing runs them
        out = helm("lint", "--strict", str(CHART), "-f", str(scenario))
        assert "0 chart(s) failed" in out.stdout, scenario.name
        cm = yaml.safe_load(helm("template", RELEASE, str(CHART), "-f", str(scenario), "--kube-version",
                                 K8S_VERSION.lstrip("v"), "--show-only", "templates/policy-configmap.yaml").stdout)
        parse_policy(cm["data"]["policy.yaml"], source=scenario.name)  # what the extender will load


def test_rendered_chart_passes_a_server_side_dry_run_apply(helm_cp):
    """The default render, NetworkPolicy and generated Secrets included, as the API server validates it
    (a release name of its own: the install of this module is not in the way)."""
    cp, _, helm, _ = helm_cp
    rendered = helm("template", "dry", str(CHART), "--namespace", NS,
                    "--kube-version", K8S_VERSION.lstrip("v")).stdout
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered) if d}
    assert {"Deployment", "DaemonSet", "ConfigMap", "ClusterRole", "Role", "Service", "NetworkPolicy", "Secret"} <= kinds
    proc = subprocess.run([str(cp.binaries.kubectl), "--kubeconfig", str(cp.kubeconfig_path), "apply",
                           "--dry-run=server", "-f", "-"], input=rendered, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for created in ("deployment.apps/dry-gpuplace-extender", "networkpolicy.networking.k8s.io/dry-gpuplace-extender",
                    "secret/dry-gpuplace-extender-generated-tls", "secret/dry-gpuplace-scheduler-generated-client-tls"):
        assert f"{created} created (server dry run)" in proc.stdout, proc.stdout


def test_the_generated_certificates_name_the_service_chain_to_their_own_cas_and_survive_an_upgrade(helm_cp, installed):
    """The serving certificate verifies against its Secret's ca.crt for the Service's DNS names; the
    client certificate against the other CA only (the serving one cannot pass as a client); and
    ``helm upgrade`` keeps both Secrets as they are (lookup), so the running pods keep agreeing."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    cp, api, helm, _ = helm_cp
    core = k8s.CoreV1Api(api)

    def secret(name: str) -> dict[str, bytes]:
        return {k: base64.b64decode(v) for k, v in core.read_namespaced_secret(name, NS).data.items()}

    serving, client = secret("gpuplace-extender-generated-tls"), secret("gpuplace-scheduler-generated-client-tls")
    cert = x509.load_pem_x509_certificate(serving["tls.crt"])
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert names == ["gpuplace-extender", f"gpuplace-extender.{NS}", f"gpuplace-extender.{NS}.svc",
                     f"gpuplace-extender.{NS}.svc.cluster.local"]
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert 700 <= days <= 731, days  # about 2 years, as values.yaml says

    def verifies(leaf: bytes, ca: bytes) -> bool:
        issuer = x509.load_pem_x509_certificate(ca)
        try:
            x509.load_pem_x509_certificate(leaf).verify_directly_issued_by(issuer)
            return True
        except (ValueError, InvalidSignature):  # another issuer's name, or its key did not sign it
            return False

    assert verifies(serving["tls.crt"], serving["ca.crt"]) and verifies(client["tls.crt"], client["ca.crt"])
    assert not verifies(serving["tls.crt"], client["ca.crt"]) and serving["ca.crt"] != client["ca.crt"]
    helm("upgrade", RELEASE, str(CHART), "--namespace", NS, "--reuse-values")
    assert secret("gpuplace-extender-generated-tls") == serving
    assert secret("gpuplace-scheduler-generated-client-tls") == client


def test_a_values_typo_fails_install_with_a_schema_message(helm_cp, tmp_path):
    _, api, helm, _ = helm_cp
    values = tmp_path / "my-values.yaml"
    values.write_text("extender:\n  replicas: two\n")
    for cmd in (("template", "typo", str(CHART)), ("install", "typo", str(CHART), "--namespace", NS)):
        proc = helm(*cmd, "-f", str(values), check=False)
        assert proc.returncode != 0
        assert "at '/extender/replicas': got string, want integer" in proc.stderr
    assert not [d for d in k8s.AppsV1Api(api).list_namespaced_deployment(NS).items if d.metadata.name.startswith("typo")]


def test_scheduler_image_follows_the_cluster_version(helm_cp):
    _, _, helm, _ = helm_cp
    for version, tag in (("1.34.4", "v1.34.4"), ("1.31.2-eks-7f9249a", "v1.31.2")):
        rendered = helm("template", RELEASE, str(CHART), "--kube-version", version,
                        "--show-only", "templates/scheduler.yaml").stdout
        assert f"image: registry.k8s.io/kube-scheduler:{tag}\n" in rendered
    proc = helm("template", RELEASE, str(CHART), "--kube-version", "1.25.9", check=False)
    assert proc.returncode != 0 and "chart requires kubeVersion: >=1.26.0-0" in proc.stderr


def test_the_charts_scheduler_examines_every_node_unless_told_otherwise(helm_cp, chart_scheduler):
    # kube-scheduler samples nodes before it calls extenders: the chart's profile asks for all of
    # them (and the real kube-scheduler of chart_scheduler runs with that configuration).
    _, _, helm, _ = helm_cp
    assert chart_scheduler["config"]["profiles"][0]["percentageOfNodesToScore"] == 100

    def profile(*sets):
        rendered = helm("template", RELEASE, str(CHART), "--show-only", "templates/scheduler.yaml", *sets).stdout
        cm = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ConfigMap")
        return yaml.safe_load(cm["data"]["config.yaml"])["profiles"][0]

    assert "percentageOfNodesToScore" not in profile("--set", "scheduler.percentageOfNodesToScore=0")
    assert profile("--set", "scheduler.percentageOfNodesToScore=50")["percentageOfNodesToScore"] == 50
    proc = helm("template", RELEASE, str(CHART), "--set", "scheduler.percentageOfNodesToScore=101", check=False)
    assert proc.returncode != 0 and "percentageOfNodesToScore" in proc.stderr


def test_own_scheduler_mode_leaves_the_scheduler_out_and_prints_the_extenders_snippet(helm_cp):
    _, _, helm, _ = helm_cp
    out = helm("install", "own", str(CHART), "--namespace", NS, "--dry-run", "--set", "scheduler.enabled=false",
               "--set", "extender.tls.enabled=false", "--set", "extender.networkPolicy.enabled=false").stdout
    manifest, notes = out.split("NOTES:", 1)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(manifest.split("MANIFEST:", 1)[1]) if d}
    assert ("Deployment", "own-gpuplace-extender") in kinds
    assert not [k for k in kinds if "scheduler" in k[1]]
    snippet = yaml.safe_load(notes.split("KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1):", 1)[1]
                             .split("Edit the policy", 1)[0])
    assert snippet["extenders"][0]["urlPrefix"] == f"http://own-gpuplace-extender.{NS}.svc:8888"
    assert {"name": "nvidia.com/gpu", "ignoredByScheduler": False} in snippet["extenders"][0]["managedResources"]
    assert "percentageOfNodesToScore: 100" in notes


def test_agent_runs_on_gpu_nodes_with_the_runtime_class_and_tolerations_from_values(helm_cp):
    _, _, helm, _ = helm_cp
    rendered = helm("template", RELEASE, str(CHART), "--kube-version", K8S_VERSION.lstrip("v"),
                    "--show-only", "templates/agent.yaml", "--set", "agent.runtimeClassName=nvidia",
                    "--set", "agent.nodeSelector.gpu=yes").stdout
    ds = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "gpu": "yes"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    rules = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ClusterRole")["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]


def test_service_and_pod_monitors_select_the_extender_service_and_the_agent_pods(helm_cp):
    _, _, helm, _ = helm_cp
    docs = [d for d in yaml.safe_load_all(helm(
        "template", RELEASE, str(CHART), "--kube-version", K8S_VERSION.lstrip("v"),
        "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true").stdout) if d]
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    sm = by_kind[("ServiceMonitor", "gpuplace-extender")]
    svc = by_kind[("Service", "gpuplace-extender")]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    pm = by_kind[("PodMonitor", "gpuplace-agent")]
    pod_tpl = by_kind[("DaemonSet", "gpuplace-agent")]["spec"]["template"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_tpl["metadata"]["labels"].items()
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in pod_tpl["spec"]["containers"][0]["ports"]}


def test_install_creates_the_components_with_the_clusters_scheduler_image(helm_cp, installed, chart_scheduler):
    assert "schedulerName: gpuplace-scheduler" in installed  # NOTES.txt
    assert chart_scheduler["image"] == f"registry.k8s.io/kube-scheduler:{K8S_VERSION}"
    assert chart_scheduler["in_cluster_url"] == f"https://gpuplace-extender.{NS}.svc:8888"
    assert chart_scheduler["in_cluster_tls"] == {
        "insecure": False, "caFile": "/etc/kubernetes/gpuplace-scheduler/extender-ca/ca.crt",
        "certFile": "/etc/kubernetes/gpuplace-scheduler/extender-client/tls.crt",
        "keyFile": "/etc/kubernetes/gpuplace-scheduler/extender-client/tls.key"}
    cfg = chart_scheduler["config"]
    ext = cfg["extenders"][0]
    # extender.filterReturnsBest (the default): one round trip per pod, /filter passes gpuplace's best nodes
    assert (ext["filterVerb"], ext.get("prioritizeVerb"), ext["nodeCacheCapable"], ext["httpTimeout"]) == \
        ("filter", None, True, "5s")
    assert "--filter-returns-best" in chart_scheduler["extender_args"]
    assert "managedResources" not in ext  # scheduler.extender.cpuOnlyPods: every pod of this scheduler
    assert cfg["leaderElection"]["leaderElect"] is True
    assert "--pod-max-in-unschedulable-pods-duration=60s" in chart_scheduler["flags"]
    _, api, _, _ = helm_cp
    ds = k8s.AppsV1Api(api).read_namespaced_daemon_set("gpuplace-agent", NS)
    mounts = {m.mount_path: m.read_only for m in ds.spec.template.spec.containers[0].volume_mounts}
    assert mounts["/var/lib/kubelet/pod-resources"] is True


def test_example_pods_land_where_the_criteria_say_through_the_charts_configuration(helm_cp, chart_scheduler):
    cp, api, _, _ = helm_cp
    names = create_pods(api, load_pod_manifests(ROOT / "examples" / "pods"))
    placed = wait_placements(api, names, timeout=90, settle_pending=8)
    wrong = {n: node for n, node in placed.items() if node not in EXPECTED[n]}
    assert not wrong, f"misplaced: {wrong}; all: {placed}"
    # leader election is on, with the chart's lease
    lease = k8s.CoordinationV1Api(api).read_namespaced_lease("gpuplace-scheduler", NS)
    assert lease.spec.holder_identity


def _hook(helm: Helm, *sets: str) -> tuple[list[str], dict[str, str]]:
    """The `helm test` Pod's command line and environment, as rendered."""
    pod = yaml.safe_load(helm("template", RELEASE, str(CHART), "--namespace", NS, "--kube-version",
                              K8S_VERSION.lstrip("v"), "--show-only", "templates/tests/test-extender.yaml", *sets).stdout)
    container = pod["spec"]["containers"][0]
    return [*container["command"], *container["args"]], {e["name"]: e["value"] for e in container.get("env", [])}


def _run_hook(cmd: list[str], env: dict[str, str], hosts: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the hook's script here (no kubelet), each in-cluster host:port of ``hosts`` rewritten."""
    argv = [sys.executable if a == "python3" else a for a in cmd]
    for in_cluster, local in hosts.items():
        argv = [a.replace(in_cluster, local) for a in argv]
    return subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)


def test_the_helm_test_pod_finds_the_extender_ready(helm_cp, chart_scheduler):
    """By default (mutual TLS) it holds no client certificate: it asks the plain health port only."""
    _, _, helm, _ = helm_cp
    port = chart_scheduler["health_port"]
    cmd, env = _hook(helm)
    proc = _run_hook(cmd, env, {f"gpuplace-extender.{NS}.svc:8889": f"127.0.0.1:{port}"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [f"http://127.0.0.1:{port}/readyz 200 ok"], proc.stdout


def test_the_helm_test_pod_verifies_the_extenders_certificate_with_tls(helm_cp, chart_scheduler, tmp_path):
    """With TLS: the plain health port, then the HTTPS port against the CA the scheduler trusts;
    a certificate from another CA fails the test."""
    cp, _, helm, work = helm_cp
    pki, other = generate_extender_pki(tmp_path / "pki"), generate_extender_pki(tmp_path / "other-pki")
    health = free_port()
    policy_arg = next(a for a in chart_scheduler["extender_args"] if a.startswith("--policy-configmap="))
    ext = start_extender(work / "extender.kubeconfig", cp.logs, ssl_context=ssl.create_default_context(cafile=str(pki.ca_crt)),
                         extra_args=[*pki.extender_args(require_client_cert=False), "--health-port", str(health), policy_arg])
    try:
        cmd, env = _hook(helm, "--set", "extender.tls.enabled=true", "--set", "extender.tls.secretName=gpuplace-extender-tls",
                         "--set", "extender.tls.clientAuth.enabled=false")
        assert env == {"CA_FILE": "/etc/gpuplace/extender-ca/ca.crt"}  # the Secret's ca.crt, mounted alone
        hosts = {f"gpuplace-extender.{NS}.svc:8888": f"localhost:{ext.port}",
                 f"gpuplace-extender.{NS}.svc:8889": f"localhost:{health}"}
        proc = _run_hook(cmd, {"CA_FILE": str(pki.ca_crt)}, hosts)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.splitlines() == [f"http://localhost:{health}/readyz 200 ok",
                                            f"https://localhost:{ext.port}/readyz 200 ok"], proc.stdout
        proc = _run_hook(cmd, {"CA_FILE": str(other.ca_crt), "READYZ_TIMEOUT_SECONDS": "1"}, hosts)
        assert proc.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in proc.stderr, proc.stdout + proc.stderr
    finally:
        ext.stop()


def _lora(name: str) -> dict:
    m = next(m for m in load_pod_manifests(ROOT / "examples" / "pods") if m["metadata"]["name"] == "llm-7b-lora")
    return {**m, "metadata": {**m["metadata"], "name": name}}


def _policy_text(api: k8s.ApiClient) -> str:
    return k8s.CoreV1Api(api).read_namespaced_config_map(POLICY_CM, NS).data["policy.yaml"]


def _set_policy(api: k8s.ApiClient, text: str) -> None:
    k8s.CoreV1Api(api).patch_namespaced_config_map(POLICY_CM, NS, {"data": {"policy.yaml": text}})


def test_editing_the_policy_configmap_changes_placement_without_a_restart(helm_cp, chart_scheduler):
    _, api, _, _ = helm_cp
    extender = chart_scheduler["extender"]
    create_pods(api, [_lora("lora-before-edit")])
    assert wait_placements(api, ["lora-before-edit"], timeout=60)["lora-before-edit"] in RTX_4090_NODES

    policy = yaml.safe_load(_policy_text(api))
    for c in policy["classes"]:  # the LoRA pod is class small; keep RTX 4090s from it
        if c["name"] in ("small", "medium"):
            c["deniedModels"] = [*c.get("deniedModels", []), "rtx-4090"]
    t0 = time.monotonic()
    _set_policy(api, yaml.safe_dump(policy, sort_keys=False))
    wait_for(lambda: metric_value(extender.get("/metrics")[1], "gpuplace_extender_policy_generation") == 2.0,
             60, interval=0.2, message="the edited policy was not applied within a minute")
    print(f"\npolicy edit applied {time.monotonic() - t0:.2f}s after the ConfigMap patch", file=sys.stderr)
    create_pods(api, [_lora("lora-after-edit")])
    node = wait_placements(api, ["lora-after-edit"], timeout=60)["lora-after-edit"]
    assert node is not None and node not in RTX_4090_NODES
    assert extender.proc.poll() is None  # same process: no restart


def test_a_broken_policy_edit_changes_nothing_and_shows_in_events_and_metrics(helm_cp, chart_scheduler):
    _, api, _, _ = helm_cp
    extender = chart_scheduler["extender"]
    generation = metric_value(extender.get("/metrics")[1], "gpuplace_extender_policy_generation")
    policy = yaml.safe_load(_policy_text(api))
    policy["scoring"]["cost"] = "lots"
    _set_policy(api, yaml.safe_dump(policy, sort_keys=False))

    def rejected_event() -> str | None:
        events = k8s.CoreV1Api(api).list_namespaced_event(
            NS, field_selector=f"involvedObject.kind=ConfigMap,involvedObject.name={POLICY_CM},reason=PolicyRejected").items
        return events[-1].message if events else None

    message = wait_for(rejected_event, 60, interval=0.5, message="no PolicyRejected Event on the policy ConfigMap")
    assert "scoring.cost" in message
    text = extender.get("/metrics")[1]
    assert metric_value(text, 'gpuplace_extender_policy_reloads_total{result="rejected"}') == 1.0
    assert metric_value(text, "gpuplace_extender_policy_generation") == generation
    create_pods(api, [_lora("lora-after-broken-edit")])
    node = wait_placements(api, ["lora-after-broken-edit"], timeout=60)["lora-after-broken-edit"]
    assert node is not None and node not in RTX_4090_NODES, "the last valid policy must stay in force"
    assert "policy change rejected" in extender.log_path.read_text()


# ---- Prometheus and promtool ------------------------------------------------------------------

def _promtool_dir() -> Path:
    found = shutil.which("promtool")
    if found:
        return Path(found).parent
    out = subprocess.run(["bash", str(ROOT / "hack" / "install-promtool.sh")], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def _prom_query(url: str, expr: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.fixture(scope="module")
def prometheus(helm_cp, chart_scheduler):
    cp, _, _, work = helm_cp
    bindir = _promtool_dir()
    agent_port, prom_port = free_port(), free_port()
    agent_log = open(cp.logs / "agent-metrics.log", "wb")
    agent = subprocess.Popen([sys.executable, "-m", "node_agent.cli", "--probe", "fake", "--fake-inventory",
                              str(ROOT / "examples" / "cluster" / "gpu-h100-0.json"), "--node-name", "gpu-h100-0",
                              "--no-publish", "--metrics-port", str(agent_port), "--interval-seconds", "1"],
                             cwd=ROOT, stdout=agent_log, stderr=subprocess.STDOUT)
    ext_port = chart_scheduler["health_port"]  # with TLS, Prometheus scrapes the plain health port
    cfg = work / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "gpuplace-extender", "static_configs": [{"targets": [f"127.0.0.1:{ext_port}"]}]},
            {"job_name": "gpuplace-agent", "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}]},
        ]}))
    prom_log = open(cp.logs / "prometheus.log", "wb")
    prom = subprocess.Popen([str(bindir / "prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={work / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=prom_log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{prom_port}"
    try:
        wait_for(lambda: len(_prom_query(url, "up == 1")) == 2, 60, interval=0.5, message="Prometheus did not scrape both targets")
        # traffic while Prometheus watches: placements, a rejection, and a pod left pending
        api = helm_cp[1]
        impossible = next(m for m in load_pod_manifests(ROOT / "examples" / "pods")
                          if m["metadata"]["name"] == "impossible-200gi")
        create_pods(api, [_lora("lora-scraped-1"), _lora("lora-scraped-2"),
                          {**impossible, "metadata": {**impossible["metadata"], "name": "impossible-scraped"}}])
        wait_placements(api, ["lora-scraped-1", "lora-scraped-2"], timeout=60)
        yield {"url": url, "bindir": bindir, "agent_url": f"http://127.0.0.1:{agent_port}", "prom": prom}
    finally:
        for p in (prom, agent):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_prometheus_scrapes_both_and_placements_by_model_have_the_expected_series(
        prometheus, chart_scheduler, helm_cp):
    url = prometheus["url"]
    expected = {"a100-sxm4-80gb", "rtx-4090", "h100-sxm5-80gb", "radeon-vii"}
    seen: list[set[str]] = [set()]

    def models() -> set[str] | None:
        seen[0] = {r["metric"].get("model") for r in _prom_query(url, "sum by (model) (gpuplace_extender_placements_total)")}
        return seen[0] if expected <= seen[0] else None

    try:
        got = wait_for(models, 60, interval=1, message="placements by model incomplete in Prometheus")
    except TimeoutError as e:
        own = [ln for ln in chart_scheduler["extender"].get("/metrics")[1].splitlines() if "placements" in ln]
        raise AssertionError(f"Prometheus has {seen[0]}, want {expected}; the extender serves {own}") from e
    assert "unknown" not in got
    h100 = _prom_query(url, 'gpuplace_gpu_info{job="gpuplace-agent"}')
    assert {r["metric"]["node"] for r in h100} == {"gpu-h100-0"} and len(h100) == 4
    gpus = {(r["metric"]["model"], r["metric"]["state"]): float(r["value"][1])
            for r in _prom_query(url, "max by (model, state) (gpuplace_cluster_gpus)")}
    assert gpus[("h100-sxm5-80gb", "allocated")] >= 4  # the NVLink pod holds all four H100s


def test_every_dashboard_query_is_valid_promql_and_the_key_panels_have_data(prometheus, helm_cp):
    url = prometheus["url"]
    dash = json.loads((CHART / "files" / "dashboard.json").read_text())
    must_have = {"GPUs by model and state", "MIG devices by profile and state", "Placements by GPU model",
                 "Node rejections by criterion", "Filter / prioritize latency p50, p99", "Inventory age per node",
                 "Mean VRAM per GPU of placed pods: estimated vs granted", "Pending GPU pods", "Policy generation"}
    missing: list[set[str]] = [set()]

    def key_panels_have_data() -> bool:
        empty = set()
        for p in dash["panels"]:
            for t in p.get("targets", []):
                if not _prom_query(url, t["expr"].replace("$__rate_interval", "1m")):  # asserts valid PromQL
                    empty.add(p["title"])
        missing[0] = must_have & empty
        return not missing[0]

    try:  # rates need two scrapes after the traffic the fixture made
        wait_for(key_panels_have_data, 60, interval=2, message="dashboard panels without data")
    except TimeoutError as e:
        raise AssertionError(f"panels without data: {sorted(missing[0])}") from e
    out = os.environ.get("GPUPLACE_DASHBOARD_PNG")
    if out:  # render once for the docs: GPUPLACE_DASHBOARD_PNG=docs/dashboard.png pytest -k dashboard
        _traffic_waves(helm_cp[1], waves=int(os.environ.get("GPUPLACE_DASHBOARD_WAVES", "10")))
        subprocess.run([sys.executable, str(ROOT / "hack" / "render-dashboard.py"), "--prometheus", url,
                        "--out", out, "--window-seconds", "120", "--rate-interval", "15s"], check=True)


def _traffic_waves(api: k8s.ApiClient, waves: int, period: float = 10.0) -> None:
    """Something to look at: every ``period`` s a wave of pods arrives and the previous one leaves."""
    core = k8s.CoreV1Api(api)
    manifests = {m["metadata"]["name"]: m for m in load_pod_manifests(ROOT / "examples" / "pods")}
    previous: list[str] = []
    for i in range(waves):
        wave = []
        for base in ("llm-7b-lora", "llm-3b-inference", "llm-13b-inference", "impossible-200gi")[: 2 + i % 3]:
            m = manifests[base]
            wave.append({**m, "metadata": {**m["metadata"], "name": f"wave{i}-{base}"}})
        names = create_pods(api, wave)
        for n in previous:
            core.delete_namespaced_pod(n, "default", grace_period_seconds=0)
        previous = names
        time.sleep(period)


def test_promtool_accepts_the_extender_and_agent_metrics(prometheus, chart_scheduler, tmp_path):
    promtool = prometheus["bindir"] / "promtool"
    for name, base in (("extender", chart_scheduler["health_url"]), ("agent", prometheus["agent_url"])):
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            text = r.read().decode()
        proc = subprocess.run([str(promtool), "check", "metrics"], input=text, capture_output=True, text=True)
        assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), \
            f"{name}: {proc.stdout}{proc.stderr}"


def _chart_rules(helm: Helm, path: Path) -> dict:
    rendered = helm("template", RELEASE, str(CHART), "--namespace", NS, "--kube-version", K8S_VERSION.lstrip("v"),
                    "--set", "prometheusRule.enabled=true", "--show-only", "templates/monitoring.yaml").stdout
    rule = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "PrometheusRule")
    path.write_text(yaml.safe_dump(rule["spec"]))
    return rule


def test_promtool_accepts_the_charts_alert_rules(prometheus, helm_cp, tmp_path):
    _, _, helm, _ = helm_cp
    rules_file = tmp_path / "rules.yaml"
    rule = _chart_rules(helm, rules_file)
    proc = subprocess.run([str(prometheus["bindir"] / "promtool"), "check", "rules", str(rules_file)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"GpuplaceExtenderErrors", "GpuplaceFilterLatencyNearTimeout", "GpuplaceInventoryStale",
            "GpuplaceGPUUnhealthy", "GpuplaceExtenderCacheNotSynced"} <= alerts


def test_alerts_fire_on_stale_inventories_slow_filters_server_errors_and_refused_requeues(prometheus, helm_cp, tmp_path):
    """``promtool test rules`` on synthetic series: each alert fires when, and only when, it should."""
    _, _, helm, _ = helm_cp
    _chart_rules(helm, tmp_path / "rules.yaml")
    bucket = "gpuplace_extender_request_duration_seconds_bucket"
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                # gpu-a's agent stopped: its inventory ages 60 s a minute; gpu-b stays fresh
                {"series": 'gpuplace_extender_inventory_age_seconds{node="gpu-a"}', "values": "0+60x30"},
                {"series": 'gpuplace_extender_inventory_age_seconds{node="gpu-b"}', "values": "30x30"},
                # every filter call takes 4.5 s (bucket le=5 only), 10 calls a minute
                {"series": f'{bucket}{{verb="filter",le="2.5"}}', "values": "0x30"},
                {"series": f'{bucket}{{verb="filter",le="5.0"}}', "values": "0+10x30"},
                {"series": f'{bucket}{{verb="filter",le="+Inf"}}', "values": "0+10x30"},
                # 5 % of calls answer 500
                {"series": 'gpuplace_extender_requests_total{verb="filter",code="200"}', "values": "0+95x30"},
                {"series": 'gpuplace_extender_requests_total{verb="filter",code="500"}', "values": "0+5x30"},
                # requeue marks refused from minute 20 on (RBAC without patch on pods)
                {"series": 'gpuplace_extender_requeued_pods_total{result="forbidden"}', "values": "0x20 1+1x10"},
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "GpuplaceInventoryStale", "exp_alerts": []},
                {"eval_time": "15m", "alertname": "GpuplaceInventoryStale", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "node": "gpu-a"},
                    "exp_annotations": {
                        "summary": "A node's GPU inventory is older than 300s.",
                        "description": "The agent on gpu-a has not published for 15m 0s; "
                                       "the policy may reject the node for GPU pods."}}]},
                {"eval_time": "15m", "alertname": "GpuplaceFilterLatencyNearTimeout", "exp_alerts": [{
                    "exp_labels": {"severity": "warning"},
                    "exp_annotations": {
                        "summary": "Filter p99 latency is close to kube-scheduler's 5s extender timeout.",
                        "description": "p99 of /filter is 4.975s; a filter call that times out fails the pod's "
                                       "scheduling cycle."}}]},
                {"eval_time": "15m", "alertname": "GpuplaceRequeueForbidden", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "GpuplaceRequeueForbidden", "exp_alerts": [{
                    "exp_labels": {"severity": "warning"},
                    "exp_annotations": {
                        "summary": "The extender may not requeue waiting pods.",
                        "description": "The API server refused 5 requeue marks in 15 minutes (RBAC patch on pods, "
                                       "or an admission policy); waiting pods are retried only by kube-scheduler's "
                                       "periodic flush."}}]},
                {"eval_time": "15m", "alertname": "GpuplaceExtenderErrors", "exp_alerts": [{
                    "exp_labels": {"severity": "critical"},
                    "exp_annotations": {
                        "summary": "More than 1 % of extender calls fail with HTTP 5xx.",
                        "description": "5% of /filter and /prioritize calls failed in the last 5 minutes; "
                                       "GPU pods may not be scheduled. Check the extender logs."}}]},
            ],
        }],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run([str(prometheus["bindir"] / "promtool"), "test", "rules", "tests.yaml"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_extender_whose_policy_configmap_is_missing_or_invalid_at_start_exits_with_the_reason(helm_cp, installed):
    cp, api, _, _ = helm_cp
    core = k8s.CoreV1Api(api)
    core.create_namespaced_config_map(NS, k8s.V1ConfigMap(
        metadata=k8s.V1ObjectMeta(name="broken-policy"), data={"policy.yaml": "kind: PlacementPolicy\nscoring: {cost: lots}\n"}))
    for ref, reason in ((f"{NS}/no-such-policy", "ConfigMap not found"), (f"{NS}/broken-policy", "scoring.cost")):
        proc = subprocess.run([sys.executable, "-m", "scheduler_extender.cli", "--kubeconfig", str(cp.kubeconfig_path),
                               "--port", str(free_port()), "--policy-configmap", ref],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and reason in proc.stderr, proc.stderr[-2000:]
