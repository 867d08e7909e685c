"""The real node leaves nothing behind: no process, mount, network namespace, veth, cgroup,
directory or changed sysctl, whether the test using it passes or fails."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.harness.controlplane import REPO_ROOT, skip_if_e2e_disabled
from tests.harness.realnode import HOST_SYSCTLS, NODE_DIRS, RealCluster

pytestmark = pytest.mark.e2e


def host_state() -> dict[str, object]:
    """What a node could change on this machine, read from /proc and /sys."""
    procs = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                procs.add(Path(f"/proc/{entry.name}/comm").read_text().strip())
            except OSError:
                continue
    return {
        "mounts": sorted(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()),
        "netns": sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else None,
        "links": sorted(os.listdir("/sys/class/net")),
        "cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/gpuplace-*")),
        "dirs": {d: os.path.exists(d) for d in NODE_DIRS},
        "sysctls": {k: Path("/proc/sys", k).read_text() for k in HOST_SYSCTLS if Path("/proc/sys", k).exists()},
        "node processes": sorted(procs & {"containerd", "containerd-shim", "kubelet", "kube-proxy", "coredns",
                                          "kube-controller", "kube-apiserver", "etcd", "pause"}),
    }


def test_a_failing_test_on_the_real_node_leaves_the_host_as_it_was(tmp_path):
    skip_if_e2e_disabled()
    before = host_state()
    inventory = json.loads((REPO_ROOT / "examples" / "cluster" / "gpu-a100-mig-0.json").read_text())
    with pytest.raises(AssertionError, match="a test failing on the node"):
        with RealCluster(tmp_path, inventory) as rc:
            assert rc.ns is not None
            # The kubelet has run and rewritten its sysctls; the namespace, veth and cgroups exist.
            assert host_state() != before
            raise AssertionError("a test failing on the node")
    after = host_state()
    # A kernel module kube-proxy's rules load (nf_conntrack) brings its sysctls with it: a new key,
    # not a changed value. Kernel modules stay loaded (docs/known-limits.md).
    after["sysctls"] = {k: v for k, v in after["sysctls"].items() if k in before["sysctls"]}  # type: ignore[attr-defined]
    assert after == before
