"""HTTPS between kube-scheduler and the extender, and no credential in any log.

kube-scheduler calls the extender over HTTPS (``enableHTTPS: true``, ``tlsConfig.caData`` from a
CA generated here, and a client certificate the extender requires with
``--tls-client-ca-file``). The extender and the node agent run with DEBUG logging against the
real API server; their logs must not contain the kubeconfig's bearer token.

Own control plane: the nodes created here must not change where the shared session's example
pods land.
"""

from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.harness.controlplane import (
    skip_if_e2e_disabled,
    ControlPlane, ExtenderSpec, SchedulerSpec, create_node, free_port, pod_events, wait_for,
)
from tests.harness.gpucluster import (
    ROOT, create_pods, gpu_pod_manifest, node_allocatable, start_extender, wait_placements,
)
from tests.harness.tls import ExtenderPKI, generate_extender_pki, renew_server_certificate

pytestmark = pytest.mark.e2e

NODE = "sec-4090-0"
SCHEDULER = "gpuplace-https"


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    skip_if_e2e_disabled()
    with ControlPlane(tmp_path_factory.mktemp("security-cp"), scheduler_configs=[]) as plane:
        yield plane


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ExtenderPKI:
    return generate_extender_pki(tmp_path_factory.mktemp("extender-pki"))


@pytest.fixture(scope="module")
def agent_log(cp: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Publish the node's inventory with ``gpuplace-agent --once --log-level debug``; its output."""
    src = ROOT / "examples" / "cluster" / "gpu-4090-0.json"
    inventory = tmp_path_factory.mktemp("sec-inventory") / f"{NODE}.json"
    inventory.write_text(src.read_text().replace('"gpu-4090-0"', f'"{NODE}"'))
    create_node(cp.api_client(), NODE, node_allocatable(json.loads(inventory.read_text())))
    proc = subprocess.run(
        [sys.executable, "-m", "node_agent.cli", "--probe", "fake", "--fake-inventory", str(inventory),
         "--node-name", NODE, "--once", "--kubeconfig", str(cp.kubeconfig_path), "--metrics-port", "0",
         "--log-level", "debug"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout + proc.stderr


def _client_context(pki: ExtenderPKI, *, with_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
    if with_cert:
        ctx.load_cert_chain(str(pki.client_crt), str(pki.client_key))
    return ctx


def test_kube_scheduler_places_and_rejects_through_the_extender_over_mutual_tls(cp, pki, agent_log):
    health_port = free_port()
    ext = start_extender(cp.kubeconfig_path, cp.logs, ssl_context=_client_context(pki, with_cert=True),
                         extra_args=[*pki.extender_args(require_client_cert=True), "--log-level", "debug",
                                     "--health-port", str(health_port), "--tls-reload-seconds", "0.2"])
    try:
        assert ext.url.startswith("https://")
        cp.add_scheduler(SchedulerSpec(name=SCHEDULER, extender=ExtenderSpec(
            url_prefix=ext.url, enable_https=True, tls_config=pki.scheduler_tls_config(client_cert=True))))
        create_pods(cp.api_client(), [
            gpu_pod_manifest("tls-lora", 1, scheduler=SCHEDULER,
                             annotations={"gpuplace.io/model-params": "7B", "gpuplace.io/workload": "finetune-lora"}),
            gpu_pod_manifest("tls-200gi", 1, scheduler=SCHEDULER, annotations={"gpuplace.io/vram": "200Gi"}),
        ])
        placed = wait_placements(cp.api_client(), ["tls-lora", "tls-200gi"], timeout=60, settle_pending=5)
        assert placed == {"tls-lora": NODE, "tls-200gi": None}
        # The reason can only come from the extender: kube-scheduler reached it over HTTPS.
        msg = wait_for(lambda: next((m for m in pod_events(cp.api_client(), "default", "tls-200gi")
                                     if "200 GiB needed" in m), None), 30, interval=0.5,
                       message="no FailedScheduling event with the extender's VRAM reason")
        assert "gpuplace.io/vram" in msg
        status, metrics = ext.get("/metrics")
        assert status == 200 and 'gpuplace_extender_requests_total{code="200",verb="filter"}' in metrics

        # Without a client certificate, or over plain HTTP, the extender does not answer.
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(ext.url + "/healthz", timeout=5,
                                   context=_client_context(pki, with_cert=False)).read()
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{ext.port}/healthz", timeout=5).read()

        # Probes and Prometheus, which carry no client certificate, use the plain health port:
        # readiness and metrics only, never the verbs.
        health = f"http://127.0.0.1:{health_port}"
        assert urllib.request.urlopen(health + "/readyz", timeout=5).read() == b"ok"
        assert b'verb="filter"' in urllib.request.urlopen(health + "/metrics", timeout=5).read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(health + "/filter", data=b"{}", method="POST"), timeout=5)
        assert refused.value.code == 404

        # cert-manager renews the serving certificate into the Secret: served without a restart,
        # and kube-scheduler, which trusts the same CA, keeps placing pods through the extender
        first = _served_certificate(ext.port)
        renew_server_certificate(pki)
        wait_for(lambda: _served_certificate(ext.port) == ssl.PEM_cert_to_DER_cert(pki.server_crt.read_text()), 20,
                 interval=0.2, message="the renewed certificate was not served")
        assert first != _served_certificate(ext.port)
        assert 'gpuplace_extender_tls_certificate_reloads_total{result="applied"} 1.0' in ext.get("/metrics")[1]
        create_pods(cp.api_client(), [gpu_pod_manifest("tls-after-renewal", 1, scheduler=SCHEDULER)])
        assert wait_placements(cp.api_client(), ["tls-after-renewal"], timeout=60) == {"tls-after-renewal": NODE}
    finally:
        cp.stop_scheduler(SCHEDULER)
        ext.stop()
    # uvicorn re-raises the SIGTERM it handled once its servers are down (-15); -9 would mean that
    # the health server kept the process alive until the harness killed it.
    assert ext.proc.returncode == -signal.SIGTERM, "SIGTERM must stop both servers (main and health port)"

    extender_log = ext.log_path.read_text(errors="replace")
    assert "DEBUG" in extender_log, "the extender did not log at DEBUG; the check below would prove nothing"
    assert cp.admin_token not in extender_log, f"bearer token in {ext.log_path}"


def _served_certificate(port: int) -> bytes:
    """DER of the certificate the extender presents to a new connection (not verified: compared)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True)


def test_the_agent_logs_no_token_at_debug_level(cp, agent_log):
    assert "DEBUG" in agent_log, "the agent did not log at DEBUG; the check below would prove nothing"
    assert cp.admin_token not in agent_log
