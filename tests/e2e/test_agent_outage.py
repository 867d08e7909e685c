"""The node agent survives an API server outage and publishes what changed meanwhile.

A long-running ``gpuplace-agent --probe fake`` publishes a Node's inventory; the API server
is then stopped for 20 s, during which a GPU turns unhealthy. Once the server is back the
agent must still be running (it retries instead of exiting) and must publish the change.

The test has its own control plane (no scheduler) so that restarting the API server cannot
disturb the other e2e tests, which share the session's.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from node_agent.inventory import ANNOTATION
from tests.harness.controlplane import ControlPlane, create_node, skip_if_e2e_disabled, wait_for
from tests.harness.gpucluster import ROOT, node_allocatable

pytestmark = pytest.mark.e2e

NODE = "agent-outage-0"
DOWN_SECONDS = 20.0
CONVERGE_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def outage_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of our own (etcd + apiserver only), free to restart."""
    skip_if_e2e_disabled()
    with ControlPlane(tmp_path_factory.mktemp("outage-cp"), scheduler_configs=[]) as cp:
        yield cp


def _published(core: k8s.CoreV1Api) -> dict[str, Any] | None:
    annotations = core.read_node(NODE).metadata.annotations or {}
    raw = annotations.get(ANNOTATION)
    return json.loads(raw) if raw else None


def _observed_at(doc: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(doc["observedAt"].replace("Z", "+00:00"))


def test_agent_republishes_after_apiserver_outage(outage_cp: ControlPlane, tmp_path: Path) -> None:
    cp = outage_cp
    inventory = tmp_path / "inventory.json"
    shutil.copy(ROOT / "examples" / "cluster" / "gpu-4090-0.json", inventory)
    doc = json.loads(inventory.read_text())
    api = cp.api_client()
    core = k8s.CoreV1Api(api)
    create_node(api, NODE, node_allocatable(doc))

    cmd = [sys.executable, "-m", "node_agent.cli", "--probe", "fake", "--fake-inventory", str(inventory),
           "--node-name", NODE, "--kubeconfig", str(cp.kubeconfig_path), "--interval-seconds", "1",
           "--heartbeat-seconds", "2", "--metrics-port", "0"]  # fmt: skip
    log_path = cp.logs / "gpuplace-agent-outage.log"
    with log_path.open("ab") as log:
        agent = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        first = wait_for(lambda: _published(core), 30, message=f"agent never published on {NODE}")
        assert first["gpus"][2]["healthy"] is True

        def break_gpu2() -> None:
            changed = json.loads(inventory.read_text())
            changed["gpus"][2]["healthy"] = False
            changed["gpus"][2]["healthReasons"] = ["XID 79"]
            inventory.write_text(json.dumps(changed, indent=2))

        restart_wall = dt.datetime.now(dt.timezone.utc)
        outage = cp.restart_apiserver(down_seconds=DOWN_SECONDS, while_down=break_gpu2)
        back = time.monotonic()
        assert agent.poll() is None, f"agent exited during the outage ({agent.returncode}); see {log_path}"

        # A fresh client: the old one's pooled connections died with the server.
        api.close()
        api = cp.api_client()
        core = k8s.CoreV1Api(api)

        def converged() -> dict[str, Any] | None:
            cur = _published(core)
            if cur and cur["gpus"][2]["healthy"] is False and _observed_at(cur) >= restart_wall.replace(microsecond=0):
                return cur
            return None

        try:
            final = wait_for(converged, CONVERGE_TIMEOUT, interval=0.2, message="agent did not republish")
        except TimeoutError as exc:
            log_tail = log_path.read_text(errors="replace")[-3000:]
            raise AssertionError(f"{exc}; agent log tail:\n{log_tail}") from exc
        converge_s = time.monotonic() - back
        print(
            f"\nagent converged {converge_s:.1f}s after the API server came back "
            f"(API server unavailable {outage:.1f}s)",
            file=sys.stderr,
        )
        assert final["gpus"][2]["healthReasons"] == ["XID 79"]
        assert _observed_at(final) > _observed_at(first)
        assert agent.poll() is None, f"agent exited ({agent.returncode}); see {log_path}"
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(timeout=10)
        api.close()
