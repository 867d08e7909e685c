"""Fixtures for end-to-end tests against a real etcd, kube-apiserver and kube-scheduler.

One control plane is started per test session (starting one takes seconds once the
binaries are cached, but the first build takes many minutes). Set ``GPUPLACE_SKIP_E2E=1``
to skip these tests; otherwise a failing build or start fails them, on purpose, so that a
broken control plane is never mistaken for a pass.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from tests.harness.controlplane import ControlPlane, SchedulerSpec, skip_if_e2e_disabled


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A running control plane with one plain ``default-scheduler`` (no extender)."""
    skip_if_e2e_disabled()
    workdir = tmp_path_factory.mktemp("controlplane")
    cp = ControlPlane(workdir, scheduler_configs=[SchedulerSpec(name="default-scheduler")])
    with cp:
        print(
            f"\ncontrol plane up at {cp.api_url} in {cp.timings['total']:.1f}s "
            f"(logs: {cp.logs}, timings: "
            + ", ".join(f"{k}={v:.2f}s" for k, v in cp.timings.items())
            + ")",
            file=sys.stderr,
        )
        yield cp


@pytest.fixture(scope="session")
def api(control_plane: ControlPlane) -> Iterator[k8s.ApiClient]:
    """An admin ApiClient for the session's control plane."""
    client = control_plane.api_client()
    try:
        yield client
    finally:
        client.close()
