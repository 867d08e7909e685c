"""A real Kubernetes node for end-to-end tests: kubelet, containerd, kube-proxy and CoreDNS.

:class:`RealCluster` starts, on this machine, a cluster whose node runs pods for real:

* **the node's namespaces** (:class:`NodeNamespace`): a network namespace the harness creates
  (``ip netns add``) joined to this process's namespace by a veth pair, and a private mount
  namespace in which tmpfs file systems cover the node's state directories (``/var/lib/kubelet``,
  ``/var/lib/containerd``, ``/run/containerd``, ``/var/log/pods``, ``/var/lib/cni``, ``/run/netns``).
  Every component below runs inside both (``nsenter``), so the CNI bridge, pod IPs, kube-proxy's
  iptables rules and every mount a kubelet or containerd makes stay in there and vanish with them;
  this process reaches the apiserver at the node's address over the veth pair. The default paths
  stay default, so the chart's ``agent.podResourcesDir`` needs no change.
* **the control plane** (:class:`~tests.harness.controlplane.ControlPlane` in those namespaces, with
  the default kube-scheduler) and
  **kube-controller-manager** (Deployments, DaemonSets, ServiceAccounts, EndpointSlices; no
  node-lifecycle controller, so fake nodes without a kubelet can join the same cluster);
* **the node**: containerd and runc and the CNI plugins from Debian, kubelet (``cgroupfs``, under a
  cgroup root of its own), kube-proxy (iptables), CoreDNS as the cluster DNS, and
  :mod:`tests.harness.fake_device_plugin` advertising ``nvidia.com/gpu`` and MIG devices, or (and)
  ``hack/dra-test-driver`` publishing GPUs as DRA devices (``resource.k8s.io/v1`` ResourceSlices;
  :mod:`tests.harness.dra_driver`);
* **images** imported into containerd from docker-archive tarballs (nothing is pulled).

Each setting the development machine needs is commented where it is set.
:meth:`RealCluster.stop` stops every process it started (and every container and shim they
started), removes the namespace, the veth pair, the cgroups and the directories it created, and
restores the host sysctls the kubelet rewrites; it runs also when a test fails, and at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from tests.harness.controlplane import (
    K8S_VERSION,
    REPO_ROOT,
    BinariesError,
    ControlPlane,
    SchedulerSpec,
    _Component,
    _http_ok,
    _set_pdeathsig,
    bin_root,
    wait_for,
)
from tests.harness.dra_driver import DRIVER, devices_of, ensure_dra_driver, resource_slices
from tests.harness.fake_device_plugin import resources_of

__all__ = ["NodeBinaries", "NodeNamespace", "RealCluster", "ensure_containerd", "ensure_node_binaries"]

COREDNS_VERSION = os.environ.get("COREDNS_VERSION", "v1.15.0")
CONTAINERD_VERSION = os.environ.get("CONTAINERD_VERSION", "v1.7.29")
POD_CIDR = "10.244.0.0/24"
#: containerd's sandbox image; tests.harness.images builds it from the kubelet's pause.c.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
#: The node's state directories, each covered by a tmpfs inside the node's mount namespace.
#: /var/run/cdi: the CDI spec files a DRA driver writes there (hack/dra-test-driver).
NODE_DIRS = ("/var/lib/kubelet", "/var/lib/containerd", "/run/containerd", "/var/log/pods",
             "/var/log/containers", "/var/lib/cni", "/run/netns", "/var/run/cdi")
#: Host sysctls the kubelet rewrites (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables)
#: or kube-proxy may touch; saved before the node starts and restored after.
HOST_SYSCTLS = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory", "vm/panic_on_oom",
                "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/netfilter/nf_conntrack_max")


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    kube_proxy: Path
    kube_controller_manager: Path
    coredns: Path


def ensure_node_binaries() -> NodeBinaries:
    """Build (or find cached) the node's binaries with ``hack/build-control-plane.sh node``.

    Raises :class:`~tests.harness.controlplane.BinariesError` if the build fails.
    """
    root = bin_root("node")
    k8s_dir = root / f"k8s-{K8S_VERSION}"
    out = NodeBinaries(k8s_dir / "kubelet", k8s_dir / "kube-proxy", k8s_dir / "kube-controller-manager",
                       root / f"coredns-{COREDNS_VERSION}" / "coredns")
    missing = [str(p) for p in vars(out).values() if not os.access(p, os.X_OK)]
    if missing:
        raise BinariesError(f"build script succeeded but these binaries are missing: {', '.join(missing)}")
    return out


def ensure_containerd() -> Path:
    """Build (or find cached) containerd 1.7 and its runc shim (``hack/build-control-plane.sh
    containerd``); return the path of ``containerd`` (``containerd-shim-runc-v2`` lies next to it).

    For :class:`RealCluster` ``containerd=``: a node whose pods get their DRA devices through CDI.
    Debian bookworm's containerd 1.6 has no CDI, and drops the CRI field ``CDIDevices`` through which
    the kubelet passes a prepared claim's devices (``tests/e2e/test_dra_node.py``); containerd 1.7.2
    and later apply the CDI specs those ids name. Raises BinariesError if the build fails.
    """
    out = bin_root("containerd") / f"containerd-{CONTAINERD_VERSION}"
    missing = [str(out / b) for b in ("containerd", "containerd-shim-runc-v2") if not os.access(out / b, os.X_OK)]
    if missing:
        raise BinariesError(f"build script succeeded but these binaries are missing: {', '.join(missing)}")
    return out / "containerd"


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _modprobe(module: str) -> None:
    """Load a kernel module if the machine has modprobe (a kernel with it built in needs nothing)."""
    if shutil.which("modprobe"):
        _run("modprobe", module, check=False)


def _is_mountpoint(path: str) -> bool:
    return any(line.split()[4] == path for line in Path("/proc/self/mountinfo").read_text().splitlines())


class NodeNamespace:
    """A network namespace and a private mount namespace for one node, and the way back out.

    ``create()`` records every host change it makes as an undo step; ``destroy()`` runs them in
    reverse, each even if an earlier one failed, and raises at the end if any did.
    """

    def __init__(self, workdir: Path) -> None:
        suffix = secrets.token_hex(3)
        self.workdir = workdir
        self.name = f"gpuplace-{suffix}"
        self.host_link = f"gph{suffix}"
        # A /30 of our own between this process and the node; the third octet varies so that
        # two runs on one machine do not collide.
        octet = int(suffix[:2], 16)
        self.host_address, self.address = f"10.213.{octet}.1", f"10.213.{octet}.2"
        self.cgroup_root = f"/{self.name}"
        self._undo: list[tuple[str, Any]] = []
        self._holder: subprocess.Popen[str] | None = None

    @property
    def exec_prefix(self) -> tuple[str, ...]:
        """argv prefix that runs a command inside the node's network and mount namespaces."""
        assert self._holder is not None, "create() first"
        # --wd=.: keep the working directory Popen gave (entering a mount namespace resets it to /).
        return ("nsenter", f"--target={self._holder.pid}", "--mount", "--net", "--wd=.", "--")

    def run(self, *argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a command inside the node's namespaces; with ``check``, a failure raises RuntimeError."""
        return _run(*self.exec_prefix, *argv, check=check, timeout=timeout)

    def create(self) -> None:
        if os.geteuid() != 0:
            raise PermissionError("a real node needs root (network namespace, mounts, cgroups)")
        # Pods on the CNI bridge reach Services through iptables only with bridge netfilter, and
        # containerd's snapshots are overlay mounts. Built into some kernels; a module elsewhere.
        if not Path("/proc/sys/net/bridge").exists():
            _modprobe("br_netfilter")
        if "\toverlay\n" not in Path("/proc/filesystems").read_text():
            _modprobe("overlay")
        if not Path("/proc/sys/net/bridge").exists():
            raise RuntimeError("bridge netfilter is missing: `modprobe br_netfilter` failed (kernel module not available)")
        for tool in ("ip", "nsenter", "unshare", "containerd", "runc", "ctr", "iptables", "conntrack"):
            if shutil.which(tool) is None:
                raise FileNotFoundError(f"{tool} is not installed (Debian: containerd runc containernetworking-plugins "
                                        "iptables conntrack iproute2 util-linux)")
        saved = {k: Path("/proc/sys", k).read_text() for k in HOST_SYSCTLS if Path("/proc/sys", k).exists()}
        self._undo.append(("restore host sysctls", lambda: [Path("/proc/sys", k).write_text(v) for k, v in saved.items()]))

        # `ip netns add` makes /run/netns a mount point the first time; undo that too.
        if not Path("/run/netns").exists():
            self._undo.append(("remove /run/netns", self._remove_run_netns))
        _run("ip", "netns", "add", self.name)
        self._undo.append((f"delete network namespace {self.name}", lambda: _run("ip", "netns", "del", self.name)))
        _run("ip", "link", "add", self.host_link, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        self._undo.append((f"delete veth {self.host_link}",
                           lambda: _run("ip", "link", "del", self.host_link, check=False)))
        _run("ip", "addr", "add", f"{self.host_address}/30", "dev", self.host_link)
        _run("ip", "link", "set", self.host_link, "up")
        for argv in (("addr", "add", f"{self.address}/30", "dev", "eth0"), ("link", "set", "eth0", "up"),
                     ("link", "set", "lo", "up"), ("route", "add", "default", "via", self.host_address)):
            _run("ip", "-n", self.name, *argv)

        for d in NODE_DIRS:
            path = Path(d)
            if not path.exists():
                # Parents may be missing too (/var/log/pods on a minimal host): remember the topmost new one.
                top = path
                while not top.parent.exists():
                    top = top.parent
                path.mkdir(parents=True)
                self._undo.append((f"remove {top}", lambda top=top: shutil.rmtree(top)))

        hierarchies = self._cgroup_hierarchies()
        self._undo.append(("remove the node's cgroups", lambda: self._remove_cgroups(hierarchies)))
        for h in hierarchies:
            (h / self.name).mkdir(exist_ok=True)

        # The holder keeps the private mount namespace alive; its tmpfs mounts and every mount the
        # kubelet and containerd make under them exist only there. rshared inside, so that the
        # kubelet's volume mounts propagate into containers as on a real node.
        mounts = " && ".join(f"mount -t tmpfs -o mode=0755 gpuplace-node {d}" for d in NODE_DIRS)
        script = f"{mounts} && mount --make-rshared / && echo ready && exec sleep infinity"
        self._holder = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.name}", "unshare", "--mount", "--propagation", "private",
             "sh", "-c", script],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True, preexec_fn=_set_pdeathsig)  # gone with a test process killed outright
        self._undo.append(("stop every process of the node", self._kill_node_processes))
        assert self._holder.stdout is not None
        if self._holder.stdout.readline().strip() != "ready":
            err = self._holder.stderr.read() if self._holder.stderr else ""
            raise RuntimeError(f"the node's mount namespace did not start: {err.strip()}")
        # Forwarding and bridge netfilter are per network namespace: set inside only.
        self.run("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward && echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables")

    @staticmethod
    def _cgroup_hierarchies() -> list[Path]:
        out = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            parts = line.split()
            fstype = parts[parts.index("-") + 1]
            if fstype in ("cgroup", "cgroup2") and parts[4].startswith("/sys/fs/cgroup"):
                out.append(Path(parts[4]))
        return out

    def _node_pids(self) -> list[int]:
        """Processes of the node: in its mount namespace (components, containerd, shims) or its cgroups (containers)."""
        if self._holder is None:
            return []
        try:
            mnt = os.readlink(f"/proc/{self._holder.pid}/ns/mnt")
        except OSError:
            mnt = None
        me = os.getpid()
        out = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                if mnt is not None and os.readlink(f"/proc/{entry.name}/ns/mnt") == mnt:
                    out.append(int(entry.name))
                elif f"{self.cgroup_root}/" in Path(f"/proc/{entry.name}/cgroup").read_text():
                    out.append(int(entry.name))
            except OSError:
                continue
        return out

    def _kill_node_processes(self) -> None:
        deadline = time.monotonic() + 30
        while pids := self._node_pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"node processes still alive after SIGKILL: {pids}")
            time.sleep(0.2)
        if self._holder is not None:
            self._holder.wait(timeout=10)
            self._holder = None

    def _remove_cgroups(self, hierarchies: list[Path]) -> None:
        for h in hierarchies:
            root = h / self.name
            if not root.exists():
                continue
            # Deepest first; an emptied cgroup may take a moment to be removable.
            dirs = sorted((Path(d) for d, _, _ in os.walk(root)), key=lambda p: len(p.parts), reverse=True)
            for d in dirs:
                wait_for(lambda d=d: self._rmdir(d), 10, message=f"cannot remove cgroup {d}")

    @staticmethod
    def _rmdir(d: Path) -> bool:
        with contextlib.suppress(FileNotFoundError):
            d.rmdir()  # EBUSY while the kernel still counts a process in it: wait_for retries
        return True

    @staticmethod
    def _remove_run_netns() -> None:
        while _is_mountpoint("/run/netns"):
            _run("umount", "/run/netns")
        with contextlib.suppress(FileNotFoundError, OSError):
            Path("/run/netns").rmdir()

    def destroy(self) -> None:
        errors = []
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception as exc:  # noqa: BLE001 - go on undoing, report all at the end
                errors.append(f"{what}: {exc}")
        if errors:
            raise RuntimeError("the real node left changes behind: " + "; ".join(errors))


@dataclass
class RealCluster:
    """A control plane, kube-controller-manager and one real node with fake GPUs, rooted at ``workdir``.

    ``inventory`` is the node's ``NodeGPUInventory`` (its ``nodeName`` is replaced by
    :attr:`node_name`): the fake device plugin advertises its GPUs and MIG devices (unless
    ``device_plugin`` is false), and the node agent of the chart is meant to publish it
    (``agent.probe: fake``). ``images`` are docker-archive tarballs imported into containerd before
    any pod starts; one must be :data:`PAUSE_IMAGE`.

    ``dra_inventory``: an inventory whose GPUs ``hack/dra-test-driver`` (the DRA test double of
    NVIDIA's driver, :mod:`tests.harness.dra_driver`) publishes as the node's ResourceSlice of driver
    ``dra_driver``, besides or instead of the device plugin (pass the same inventory with
    ``device_plugin=False`` for a node whose GPUs are only DRA devices, as with NVIDIA's DRA driver).
    The double runs in the node's namespaces with the admin kubeconfig (a test double: the real
    driver's ServiceAccount may write ResourceSlices and read ResourceClaims, which is all it uses);
    ``start()`` returns once the kubelet has registered it and its slice is in the API.

    ``containerd``: a containerd binary to run instead of Debian's (:func:`ensure_containerd`:
    1.7, its ``containerd-shim-runc-v2`` next to it), with CDI injection on (``enable_cdi``, specs
    from the node's ``/var/run/cdi`` only), so that a DRA pod's container gets the edits of the CDI
    devices its claim was prepared with. Debian's containerd 1.6 starts such a pod without them.

    ``timings`` records how long each phase of ``start()`` took (seconds).
    """

    workdir: Path
    inventory: dict[str, Any]
    images: Sequence[Path] = ()
    node_name: str = "gpuplace-node-0"
    node_labels: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    device_plugin: bool = True
    dra_inventory: dict[str, Any] | None = None
    dra_driver: str = DRIVER
    containerd: Path | None = None

    timings: dict[str, float] = field(default_factory=dict, init=False)
    ns: NodeNamespace | None = field(default=None, init=False)
    cp: ControlPlane | None = field(default=None, init=False)
    _components: list[_Component] = field(default_factory=list, init=False, repr=False)

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def kubeconfig_path(self) -> Path:
        assert self.cp is not None
        return self.cp.kubeconfig_path

    def api_client(self) -> k8s.ApiClient:
        assert self.cp is not None
        return self.cp.api_client()

    def __enter__(self) -> RealCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> RealCluster:
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        binaries = ensure_node_binaries()
        self.timings["binaries"] = time.monotonic() - t0
        atexit.register(self.stop)
        try:
            self._start(binaries)
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def _phase(self, name: str, t: float) -> float:
        now = time.monotonic()
        self.timings[name] = now - t
        return now

    def _start(self, binaries: NodeBinaries) -> None:
        t = time.monotonic()
        self.ns = ns = NodeNamespace(self.workdir)
        ns.create()
        t = self._phase("namespace", t)

        node_token = secrets.token_hex(16)
        self.cp = cp = ControlPlane(
            # The default scheduler places the chart's own pods; GPU pods name the chart's scheduler.
            self.workdir / "cp", scheduler_configs=[SchedulerSpec("default-scheduler")], log_dir=self.logs,
            address=ns.address,
            exec_prefix=ns.exec_prefix,
            extra_tokens=(f'{node_token},system:node:{self.node_name},node-{self.node_name},"system:nodes"',))
        cp.start()
        t = self._phase("control plane", t)

        self._start_component("kube-controller-manager", [
            str(binaries.kube_controller_manager),
            f"--kubeconfig={cp.kubeconfig_path}",
            # No node-lifecycle controller: it would taint and evict the fake nodes (no kubelet)
            # that tests add next to the real one. No IPAM: the CNI config has the pod range.
            "--controllers=*,-node-lifecycle-controller,-node-ipam-controller",
            f"--service-account-private-key-file={cp.pki['sa_key']}",
            f"--root-ca-file={cp.pki['ca_crt']}",
            f"--bind-address={ns.address}",
            "--leader-elect=false",
            "--v=1",
        ])
        api = cp.api_client()
        core = k8s.CoreV1Api(api)
        wait_for(lambda: core.read_namespaced_service_account("default", "default"), 60,
                 message="kube-controller-manager created no default ServiceAccount")
        t = self._phase("controller-manager", t)

        self._start_containerd()
        for image in self.images:
            ns.run("ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images", "import",
                   str(image), timeout=300)
        t = self._phase("containerd + images", t)

        self._start_coredns(binaries)
        self._start_kubelet(binaries, node_token)
        wait_for(lambda: self._node_ready(core), 120, interval=0.5, message=f"node {self.node_name} not Ready")
        t = self._phase("kubelet", t)

        self._start_kube_proxy(binaries)
        if self.device_plugin:
            self._start_device_plugin()
            expected = {name: len(ids) for name, ids in resources_of(self.inventory).items()}

            def advertised() -> bool:
                alloc = core.read_node(self.node_name).status.allocatable or {}
                return all(alloc.get(k) == str(v) for k, v in expected.items())

            wait_for(advertised, 60, interval=0.5, message=f"node {self.node_name} does not advertise {expected}")
        t = self._phase("kube-proxy + device plugin", t)
        if self.dra_inventory is not None:
            self._start_dra_driver(api)
            self._phase("DRA driver", t)
        api.close()

    def _start_component(self, name: str, argv: list[str], cwd: Path | None = None) -> _Component:
        assert self.ns is not None
        comp = _Component(name, [*self.ns.exec_prefix, *argv], self.logs / f"{name}.log", cwd or self.workdir)
        comp.start()
        self._components.append(comp)
        return comp

    def _start_containerd(self) -> None:
        assert self.ns is not None
        cni = self.workdir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-gpuplace.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "gpuplace",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }, indent=2))
        # A containerd of our own build: its own shim (else the first containerd-shim-runc-v2 in
        # PATH, Debian's, would run the containers), and CDI, which Debian's 1.6 lacks.
        cdi = runtime_path = ""
        if self.containerd is not None:
            cdi = '  enable_cdi = true\n  cdi_spec_dirs = ["/var/run/cdi"]\n'
            runtime_path = f'      runtime_path = "{self.containerd.parent / "containerd-shim-runc-v2"}"\n'
        config = self.workdir / "containerd.toml"
        config.write_text(f"""version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # root lacks CAP_SYS_RESOURCE here: without this every sandbox fails with
  # "runc create failed: ... can't get final child's PID from pipe: EOF" (real-node.md).
  restrict_oom_score_adj = true
{cdi}  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
{runtime_path}      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false   # no systemd: cgroupfs, as the kubelet
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
""")
        comp = self._start_component("containerd", [str(self.containerd or "containerd"), f"--config={config}",
                                                    "--log-level=info"])
        comp.wait_healthy(lambda: self.ns.run("ctr", "--address", "/run/containerd/containerd.sock", "version",  # type: ignore[union-attr]
                                              check=False).returncode == 0, 30)

    def _start_coredns(self, binaries: NodeBinaries) -> None:
        assert self.ns is not None and self.cp is not None
        corefile = self.workdir / "Corefile"
        corefile.write_text(f""".:53 {{
    errors
    health {self.ns.address}:8080
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {self.cp.kubeconfig_path}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
""")
        comp = self._start_component("coredns", [str(binaries.coredns), "-conf", str(corefile)])
        comp.wait_healthy(lambda: _http_ok(f"http://{self.ns.address}:8080/health"), 30)  # type: ignore[union-attr]

    def _start_kubelet(self, binaries: NodeBinaries, node_token: str) -> None:
        assert self.ns is not None and self.cp is not None
        admin = yaml.safe_load(self.cp.kubeconfig_path.read_text())
        admin["users"] = [{"name": "node", "user": {"token": node_token}}]
        admin["contexts"] = [{"name": "node", "context": {"cluster": admin["clusters"][0]["name"], "user": "node"}}]
        admin["current-context"] = "node"
        kubeconfig = self.workdir / "kubelet.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(admin))
        kubeconfig.chmod(0o600)
        resolv = self.workdir / "resolv.conf"
        resolv.write_text("")  # no host search domains in pods' resolv.conf
        config = self.workdir / "kubelet.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ns.address,
            "readOnlyPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cp.ca_path)}},
            "authorization": {"mode": "Webhook"},
            # No systemd here; cgroup v1 is what this machine mounts (real-node.md).
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.ns.cgroup_root,
            "failSwapOn": False,
            "failCgroupV1": False,
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "clusterDNS": [self.ns.address],
            "clusterDomain": "cluster.local",
            "resolvConf": str(resolv),
            # The machine's disk and memory are shared with the test run: evict only when nearly full.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "syncFrequency": "10s",
        }))
        labels = ",".join(f"{k}={v}" for k, v in self.node_labels.items())
        self._start_component("kubelet", [
            str(binaries.kubelet), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={self.node_name}", f"--node-ip={self.ns.address}",
            f"--node-labels={labels}", "--v=2",
        ])

    def _start_kube_proxy(self, binaries: NodeBinaries) -> None:
        assert self.ns is not None and self.cp is not None
        config = self.workdir / "kube-proxy.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.cp.kubeconfig_path)},
            "hostnameOverride": self.node_name,
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            # 0: leave the host's conntrack table size and timeouts alone (they are not per namespace).
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            # No route_localnet sysctl; masquerade service traffic, so that a pod reaching a Service
            # backed by a pod on the same bridge gets its replies through the same path.
            "iptables": {"localhostNodePorts": False, "masqueradeAll": True},
            "healthzBindAddress": f"{self.ns.address}:10256",
            "metricsBindAddress": "127.0.0.1:10249",
        }))
        comp = self._start_component("kube-proxy", [str(binaries.kube_proxy), f"--config={config}", "--v=1"])
        comp.wait_healthy(lambda: _http_ok(f"http://{self.ns.address}:10256/healthz"), 60)  # type: ignore[union-attr]

    def _start_device_plugin(self) -> None:
        inventory = {**self.inventory, "nodeName": self.node_name}
        path = self.workdir / "inventory.json"
        path.write_text(json.dumps(inventory, indent=2))
        self._start_component("fake-device-plugin", [
            sys.executable, "-m", "tests.harness.fake_device_plugin", "--inventory", str(path),
            "--plugin-dir", "/var/lib/kubelet/device-plugins",
        ], cwd=REPO_ROOT)

    def _start_dra_driver(self, api: k8s.ApiClient) -> None:
        """Run ``hack/dra-test-driver`` in the node's namespaces; wait until the kubelet registered
        it (its log says so: the kubelet answered ``NotifyRegistrationStatus``) and the node's
        ResourceSlice holds every device of the inventory."""
        assert self.cp is not None and self.dra_inventory is not None
        binary = ensure_dra_driver()
        inventory = {**self.dra_inventory, "nodeName": self.node_name}
        path = self.workdir / "dra-inventory.json"
        path.write_text(json.dumps(inventory, indent=2))
        comp = self._start_component("dra-test-driver", [
            str(binary), f"--inventory={path}", f"--node-name={self.node_name}",
            f"--driver-name={self.dra_driver}", f"--kubeconfig={self.cp.kubeconfig_path}",
            "--cdi-dir=/var/run/cdi", "--v=2",
        ])
        want = sorted(d["name"] for d in devices_of(inventory))

        def published() -> bool:
            got = sorted(d["name"] for s in resource_slices(api, self.node_name, self.dra_driver)
                         for d in s["spec"].get("devices", []))
            return got == want and "registered with the kubelet" in comp.log_path.read_text(errors="replace")

        comp.wait_healthy(published, 60)

    def _node_ready(self, core: k8s.CoreV1Api) -> bool:
        node = core.read_node(self.node_name)
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """``kubectl ARGS`` against this cluster (run from this process's namespace, over the veth)."""
        assert self.cp is not None and self.cp.binaries is not None
        proc = subprocess.run([str(self.cp.binaries.kubectl), "--kubeconfig", str(self.cp.kubeconfig_path), *args],
                              capture_output=True, text=True, timeout=120, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def stop(self) -> None:
        """Stop everything and undo every host change; idempotent. Raises if something was left behind."""
        for comp in reversed(self._components):
            if comp.name != "containerd":
                comp.stop(grace=5)
        if self.cp is not None:
            self.cp.stop()
        for comp in self._components:
            comp.stop(grace=5)
        self._components.clear()
        ns, self.ns = self.ns, None
        atexit.unregister(self.stop)
        if ns is not None:
            ns.destroy()
