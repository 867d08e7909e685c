"""A real Kubernetes control plane on loopback, for end-to-end tests, ``make demo`` and benchmarks.

What it runs: etcd, kube-apiserver and one kube-scheduler per :class:`SchedulerSpec`, all
built from source by ``hack/build-control-plane.sh`` and cached by version outside the
repository. There is no kubelet and no
controller-manager: nodes are plain Node objects whose ``status.allocatable`` is set by
:func:`create_node`, and kube-scheduler's decision is visible as the pod's ``spec.nodeName``.
A test that needs a few controllers (ReplicaSets, PodDisruptionBudget status) starts a
kube-controller-manager running only those: :meth:`ControlPlane.start_controller_manager`.

Why it looks the way it does:

* Everything listens on ``127.0.0.1`` on free ports, so several control planes (e.g. parallel
  test sessions) can coexist on one machine.
* The apiserver gets its own CA and serving certificate (generated with ``cryptography``) so
  that clients verify TLS instead of skipping verification; the admin user authenticates
  with a static bearer token in group ``system:masters``. Authorization is ``Node,RBAC`` so
  that RBAC manifests (e.g. the extender's ClusterRole) can be tested for real.
* Two admission plugins are disabled because no controller-manager runs: ``ServiceAccount``
  (nobody creates the ``default`` ServiceAccount, so every pod would be rejected) and
  ``TaintNodesByCondition`` (it taints each new Node ``not-ready:NoSchedule``, and no
  node-lifecycle controller would ever lift the taint).
* Children are started in their own session (a Ctrl-C in the terminal reaches pytest, which
  then stops them in order) and, on Linux, with a parent-death signal so that they do not
  outlive a Python process that is killed outright.

Typical use::

    with ControlPlane(tmp_path, scheduler_configs=[SchedulerSpec("default-scheduler")]) as cp:
        api = cp.api_client()
        create_node(api, "gpu-node-1", {"nvidia.com/gpu": "8"})
"""

from __future__ import annotations

import atexit
import base64
import collections
import contextlib
import ctypes
import datetime as dt
import fcntl
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s
from kubernetes import config as k8s_config

__all__ = [
    "DEFAULT_MANAGED_RESOURCES",
    "MIG_PROFILES",
    "Binaries",
    "BinariesError",
    "ComponentError",
    "ControlPlane",
    "ExtenderSpec",
    "SchedulerSpec",
    "create_node",
    "ensure_binaries",
    "ensure_controller_manager",
    "ensure_helm",
    "free_port",
    "pod_events",
    "wait_for",
    "wait_pod_scheduled",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-control-plane.sh"

#: Versions the build script uses; the same environment variables override both.
K8S_VERSION = os.environ.get("K8S_VERSION", "v1.34.4")
ETCD_VERSION = os.environ.get("ETCD_VERSION", "v3.6.16")

#: ClusterIPs of Services (the "kubernetes" Service gets the first address, 10.0.0.1).
SERVICE_CIDR = "10.0.0.0/24"

#: Lines of a component's log quoted in start-failure exceptions.
LOG_TAIL_LINES = 40

#: MIG profiles an extender manages by default (A30, A100 40/80 GB, H100 80/94 GB, H200, ...).
MIG_PROFILES: tuple[str, ...] = (
    "1g.5gb", "1g.10gb", "1g.12gb", "1g.18gb", "1g.20gb", "1g.24gb", "1g.35gb",
    "2g.10gb", "2g.12gb", "2g.20gb", "2g.24gb", "2g.35gb",
    "3g.20gb", "3g.40gb", "3g.47gb", "3g.71gb",
    "4g.20gb", "4g.40gb", "4g.47gb", "4g.71gb", "4g.24gb",
    "7g.40gb", "7g.80gb", "7g.96gb", "7g.141gb",
)  # fmt: skip

#: Extended resources for which kube-scheduler consults the extender.
DEFAULT_MANAGED_RESOURCES: tuple[str, ...] = (
    "nvidia.com/gpu",
    "amd.com/gpu",
    *(f"nvidia.com/mig-{p}" for p in MIG_PROFILES),
)

T = TypeVar("T")


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


class BinariesError(RuntimeError):
    """``hack/build-control-plane.sh`` failed or did not produce the expected binaries."""


class ComponentError(RuntimeError):
    """A control-plane component exited or did not become healthy in time.

    The message carries the tail of the component's log, so a failing test shows why.
    """


# --------------------------------------------------------------------------------------
# Small utilities
# --------------------------------------------------------------------------------------


def skip_if_e2e_disabled() -> None:
    """Skip the calling test or fixture when ``GPUPLACE_SKIP_E2E=1``; otherwise a control plane
    that fails to build or start fails the test, on purpose."""
    if os.environ.get("GPUPLACE_SKIP_E2E") == "1":
        import pytest  # test-only dependency: imported where used
        pytest.skip("GPUPLACE_SKIP_E2E=1: end-to-end control-plane tests skipped")


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that is free right now.

    The kernel picks it (bind to port 0). There is an unavoidable window between this call
    and the component binding it; on loopback with ephemeral ports that race is rare, and a
    component that loses it fails fast with "address already in use" in its log.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.2,
    message: str = "condition not met",
    *,
    fatal: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    Exceptions raised by ``predicate`` count as "not yet" (a component that is still
    starting refuses connections), except instances of ``fatal``, which propagate at once;
    the last one is chained to the :class:`TimeoutError` raised after ``timeout`` seconds,
    whose text is ``message``.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = predicate()
        except fatal:
            raise
        except Exception as exc:  # noqa: BLE001 - "not ready yet" is any error here
            last_exc = exc
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc is not None else ""
            raise TimeoutError(f"{message} after {timeout:.1f}s{detail}") from last_exc
        time.sleep(interval)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        with path.open("r", errors="replace") as f:
            return "".join(collections.deque(f, maxlen=lines))
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"


def _set_pdeathsig() -> None:
    """In the child, before exec: ask Linux to SIGTERM us when the parent thread dies.

    This keeps etcd and kube-apiserver from leaking if the test process is SIGKILLed (atexit
    handlers do not run then). Caveat: the signal fires when the *thread* that forked exits,
    so start the control plane from a long-lived thread (normally the main one).
    """
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# --------------------------------------------------------------------------------------
# Binaries
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Binaries:
    """Paths of the control-plane executables produced by the build script."""

    kube_apiserver: Path
    kube_scheduler: Path
    kubectl: Path
    etcd: Path

    def all(self) -> tuple[Path, ...]:
        return (self.kube_apiserver, self.kube_scheduler, self.kubectl, self.etcd)


def _binaries_under(bin_root: Path) -> Binaries:
    k8s_dir = bin_root / f"k8s-{K8S_VERSION}"
    return Binaries(
        kube_apiserver=k8s_dir / "kube-apiserver",
        kube_scheduler=k8s_dir / "kube-scheduler",
        kubectl=k8s_dir / "kubectl",
        etcd=bin_root / f"etcd-{ETCD_VERSION}" / "etcd",
    )


def cache_root() -> Path:
    """Where builds are cached by version: ``$GPUPLACE_CACHE``, default ``~/.cache/gpuplace``."""
    return Path(os.environ.get("GPUPLACE_CACHE") or Path.home() / ".cache" / "gpuplace")


def run_build_script(script: Path, *args: str, echo: bool = True, lock: bool = True,
                     error: type[RuntimeError] = BinariesError) -> list[str]:
    """Run one of the ``hack/`` build scripts under the cache's build lock; return its stdout lines.

    The scripts build what is missing into the cache and print what they built on stdout; a file
    lock in the cache directory (``.build.lock``) serialises concurrent callers (parallel pytest
    workers, two sessions) so that nothing is built twice at once, nor a shared Go module rewritten
    under a running build. ``lock=False`` for a script that takes its locks itself
    (``hack/build-images.sh``). The script's progress (stderr) is echoed to our stderr when ``echo``
    is true. Raises ``error`` with the tail of its output if it cannot start or exits non-zero.
    """
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".build.lock").open("w") as lock_file:
        if lock:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            proc = subprocess.Popen(["bash", str(script), *args], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, errors="replace")
        except OSError as exc:
            raise error(f"cannot run {script}: {exc}") from exc
        assert proc.stdout is not None and proc.stderr is not None
        err_tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)

        def pump_stderr(stream: IO[str]) -> None:
            for line in stream:
                err_tail.append(line)
                if echo:
                    sys.stderr.write(line)
                    sys.stderr.flush()

        pump = threading.Thread(target=pump_stderr, args=(proc.stderr,), daemon=True)
        pump.start()
        stdout = proc.stdout.read()
        rc = proc.wait()
        pump.join(timeout=5)
    out_lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if rc != 0:
        raise error(f"{script} {' '.join(args)} failed with exit status {rc}; "
                    f"last output:\n{''.join(err_tail)}{stdout[-2000:]}")
    return out_lines


def bin_root(what: str, *, echo: bool = True) -> Path:
    """``hack/build-control-plane.sh WHAT`` (``all``, ``helm``, ``node``); return the bin root it prints."""
    lines = run_build_script(BUILD_SCRIPT, what, echo=echo)
    if not lines:
        raise BinariesError(f"{BUILD_SCRIPT} {what} printed no bin directory")
    return Path(lines[-1])


def ensure_binaries(*, echo: bool = True) -> Binaries:
    """Build (or find cached) etcd, kube-apiserver, kube-scheduler and kubectl.

    Runs ``hack/build-control-plane.sh all`` (:func:`run_build_script`), which builds what is
    missing from the Go module proxy (the first build takes many minutes).

    Raises :class:`BinariesError` with the tail of the script's output if it fails or if a
    binary is missing afterwards.
    """
    binaries = _binaries_under(bin_root("all", echo=echo))
    missing = [str(p) for p in binaries.all() if not os.access(p, os.X_OK)]
    if missing:
        raise BinariesError(
            f"build script succeeded but these binaries are missing: {', '.join(missing)}"
        )
    return binaries


def ensure_controller_manager(*, echo: bool = True) -> Path:
    """Build (or find cached) kube-controller-manager (``hack/build-control-plane.sh node``, which
    builds it with the real node's kubelet, kube-proxy and CoreDNS); return its path.

    For :meth:`ControlPlane.start_controller_manager` on a control plane with fake nodes.
    Raises :class:`BinariesError` if the build fails or the binary is missing.
    """
    kcm = bin_root("node", echo=echo) / f"k8s-{K8S_VERSION}" / "kube-controller-manager"
    if not os.access(kcm, os.X_OK):
        raise BinariesError(f"build script succeeded but {kcm} is missing")
    return kcm


HELM_VERSION = os.environ.get("HELM_VERSION", "v3.19.5")


def ensure_helm() -> Path:
    """Build (or find cached) Helm with ``hack/build-control-plane.sh helm``; return its path.

    Raises :class:`BinariesError` if the build fails or the binary is missing.
    """
    helm = bin_root("helm", echo=False) / f"helm-{HELM_VERSION}" / "helm"
    if not os.access(helm, os.X_OK):
        raise BinariesError(f"build script succeeded but {helm} is missing")
    return helm


# --------------------------------------------------------------------------------------
# Scheduler configuration
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtenderSpec:
    """How kube-scheduler calls a scheduler extender (one ``extenders:`` entry).

    ``ignorable=False`` makes an unreachable extender fail scheduling loudly, which is what
    tests want; ``node_cache_capable=True`` makes the scheduler send node names only.
    """

    url_prefix: str
    weight: int = 10
    node_cache_capable: bool = True
    http_timeout: str = "5s"
    filter_verb: str | None = "filter"
    prioritize_verb: str | None = "prioritize"
    preempt_verb: str | None = None
    bind_verb: str | None = None
    ignorable: bool = False
    enable_https: bool = False
    managed_resources: tuple[str, ...] = DEFAULT_MANAGED_RESOURCES
    #: kube-scheduler's ``tlsConfig`` (``insecure``, ``serverName``, ``caData``/``caFile``,
    #: ``certData``/``keyData`` for a client certificate; ``[]byte`` fields base64-encoded).
    tls_config: Mapping[str, Any] | None = None

    def to_config(self) -> dict[str, Any]:
        """The ``Extender`` object of ``kubescheduler.config.k8s.io/v1``."""
        cfg: dict[str, Any] = {
            "urlPrefix": self.url_prefix,
            "weight": self.weight,
            "nodeCacheCapable": self.node_cache_capable,
            "enableHTTPS": self.enable_https,
            "httpTimeout": self.http_timeout,
            "ignorable": self.ignorable,
            "managedResources": [
                {"name": r, "ignoredByScheduler": False} for r in self.managed_resources
            ],
        }
        if self.tls_config is not None:
            cfg["tlsConfig"] = dict(self.tls_config)
        for key, verb in (
            ("filterVerb", self.filter_verb),
            ("prioritizeVerb", self.prioritize_verb),
            ("preemptVerb", self.preempt_verb),
            ("bindVerb", self.bind_verb),
        ):
            if verb:
                cfg[key] = verb
        return cfg


@dataclass(frozen=True)
class SchedulerSpec:
    """One kube-scheduler process with a single profile named ``name``.

    Pods choose it with ``spec.schedulerName``; the name ``default-scheduler`` also takes
    pods that name no scheduler. ``qps``/``burst`` are the client's rate limits (the
    defaults are high so that benchmarks measure the scheduler, not client throttling).
    """

    name: str = "gpuplace-scheduler"
    extender: ExtenderSpec | None = None
    qps: float = 500
    burst: int = 1000
    extra_args: tuple[str, ...] = ()
    #: A complete KubeSchedulerConfiguration to run instead of the generated one (e.g. the one a
    #: Helm chart rendered); only ``clientConnection.kubeconfig`` is replaced by the control plane's.
    config: Mapping[str, Any] | None = None
    #: ``percentageOfNodesToScore``; None: kube-scheduler's adaptive default (50 % - nodes/125, at
    #: least 5 % and 100 nodes). kube-scheduler samples the nodes *before* it calls extenders.
    percentage_of_nodes_to_score: int | None = None

    def to_config(self, kubeconfig: Path) -> dict[str, Any]:
        """A complete ``KubeSchedulerConfiguration`` document."""
        if self.config is not None:
            given = json.loads(json.dumps(self.config))
            given.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
            return dict(given)
        cfg: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "leaderElection": {"leaderElect": False},
            "clientConnection": {
                "kubeconfig": str(kubeconfig),
                "qps": self.qps,
                "burst": self.burst,
            },
            "profiles": [{"schedulerName": self.name}],
        }
        if self.extender is not None:
            cfg["extenders"] = [self.extender.to_config()]
        if self.percentage_of_nodes_to_score is not None:
            cfg["percentageOfNodesToScore"] = self.percentage_of_nodes_to_score
        return cfg


# --------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------


class _Component:
    """One child process with its own log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, cwd: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"# {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_set_pdeathsig if sys.platform.startswith("linux") else None,
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise :class:`ComponentError` if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise self.failure(f"exited with status {self.proc.returncode}")

    def failure(self, what: str) -> ComponentError:
        return ComponentError(
            f"{self.name} {what}; last {LOG_TAIL_LINES} lines of {self.log_path}:\n"
            f"{_tail(self.log_path)}"
        )

    def wait_healthy(self, probe: Callable[[], bool], timeout: float) -> None:
        """Poll ``probe`` until true; fail early if the process dies, else after timeout."""

        def ready() -> bool:
            self.check_alive()
            return probe()

        try:
            wait_for(
                ready,
                timeout,
                interval=0.1,
                message=f"{self.name} not healthy",
                fatal=(ComponentError,),
            )
        except TimeoutError as exc:
            raise self.failure(f"did not become healthy within {timeout:.0f}s ({exc})") from exc

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL. Safe to call repeatedly."""
        if self.proc is not None:
            stop_process(self.proc, grace)


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM ``proc``, wait up to ``grace`` seconds, then SIGKILL it. Safe on an exited process."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=grace)


# --------------------------------------------------------------------------------------
# PKI
# --------------------------------------------------------------------------------------


def _write_private_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _generate_pki(pki: Path, address: str = "127.0.0.1", *, kubelet_client: bool = False) -> dict[str, Path]:
    """A CA, an apiserver serving certificate it signs, and a service-account key pair.

    The serving certificate covers 127.0.0.1, ``address``, localhost and the in-cluster names/IP
    of the ``kubernetes`` Service, so both the kubeconfig and in-cluster clients verify it. With
    ``kubelet_client``, also the client certificate kube-apiserver presents to kubelets
    (``O=system:masters``; a kubelet trusts the CA for x509 client authentication).
    """
    pki.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=365)

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuplace-test-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip

    srv_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sans: list[x509.GeneralName] = [
        *(x509.IPAddress(ipaddress.ip_address(a)) for a in dict.fromkeys(("127.0.0.1", address))),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
    ]
    srv_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(srv_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    paths = {
        "ca_crt": pki / "ca.crt",
        "ca_key": pki / "ca.key",
        "apiserver_crt": pki / "apiserver.crt",
        "apiserver_key": pki / "apiserver.key",
        "sa_key": pki / "sa.key",
        "sa_pub": pki / "sa.pub",
    }
    paths["ca_crt"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private_key(paths["ca_key"], ca_key)
    paths["apiserver_crt"].write_bytes(srv_cert.public_bytes(serialization.Encoding.PEM))
    _write_private_key(paths["apiserver_key"], srv_key)
    _write_private_key(paths["sa_key"], sa_key)
    paths["sa_pub"].write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    if kubelet_client:
        client_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        client_cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver-kubelet-client")]))
            .issuer_name(ca_name)
            .public_key(client_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        paths["kubelet_client_crt"] = pki / "kubelet-client.crt"
        paths["kubelet_client_key"] = pki / "kubelet-client.key"
        paths["kubelet_client_crt"].write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
        _write_private_key(paths["kubelet_client_key"], client_key)
    return paths


# --------------------------------------------------------------------------------------
# The control plane
# --------------------------------------------------------------------------------------


@dataclass
class _SchedulerProcess:
    spec: SchedulerSpec
    port: int
    component: _Component


@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-schedulers on 127.0.0.1, rooted at ``workdir``.

    ``start()`` blocks until every component is healthy (etcd ``/health``, apiserver
    ``/readyz``, each scheduler ``/healthz``) and the ``default`` namespace exists;
    ``stop()`` terminates them in reverse order. Both are idempotent, ``stop()`` is also
    registered with :mod:`atexit`, and the object is a context manager.

    ``timings`` records how long each phase of ``start()`` took (seconds).

    For a cluster with a real node (:mod:`tests.harness.realnode`), ``exec_prefix`` runs every
    component inside the node's network and mount namespaces and ``address`` is the node's
    address there (reachable from this process over a veth pair, and from pods); the ports are
    then fixed ones, since nothing else listens in that namespace, and the apiserver runs the
    ``ServiceAccount`` admission plugin and the ``kubernetes`` Service's endpoint reconciler
    (a kube-controller-manager creates the ServiceAccounts, and pods reach the apiserver at
    ``address`` through that Service).
    """

    workdir: Path
    scheduler_configs: list[SchedulerSpec] = field(
        default_factory=lambda: [SchedulerSpec(name="default-scheduler")]
    )
    log_dir: Path | None = None
    binaries: Binaries | None = None
    start_timeout: float = 120.0
    apiserver_extra_args: tuple[str, ...] = ()
    admin_token: str = field(default_factory=lambda: uuid.uuid4().hex)
    address: str = "127.0.0.1"
    exec_prefix: tuple[str, ...] = ()
    #: More lines of the apiserver's static token file (``token,user,uid,"group,..."``).
    extra_tokens: tuple[str, ...] = ()

    timings: dict[str, float] = field(default_factory=dict, init=False)
    #: Paths of the generated certificates and keys (``ca_crt``, ``ca_key``, ``sa_key``, ...), once started.
    pki: dict[str, Path] = field(default_factory=dict, init=False, repr=False)
    _etcd: _Component | None = field(default=None, init=False, repr=False)
    _apiserver: _Component | None = field(default=None, init=False, repr=False)
    _schedulers: dict[str, _SchedulerProcess] = field(default_factory=dict, init=False, repr=False)
    _controller_manager: _Component | None = field(default=None, init=False, repr=False)
    _api_port: int | None = field(default=None, init=False, repr=False)
    _ca_path: Path | None = field(default=None, init=False, repr=False)
    _etcd_url: str | None = field(default=None, init=False, repr=False)
    _started: bool = field(default=False, init=False, repr=False)
    _last_fixed_port: int = field(default=20000, init=False, repr=False)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        self.log_dir = Path(self.log_dir).resolve() if self.log_dir else self.workdir / "logs"
        names = [s.name for s in self.scheduler_configs]
        if len(names) != len(set(names)):
            raise ValueError(f"scheduler names must be unique: {names}")

    # -- public properties --------------------------------------------------------------

    @property
    def kubeconfig_path(self) -> Path:
        """Admin kubeconfig (token auth, CA-verified TLS) for clients and kubectl."""
        return self.workdir / "kubeconfig"

    @property
    def api_url(self) -> str:
        if self._api_port is None:
            raise RuntimeError("control plane not started")
        return f"https://{self.address}:{self._api_port}"

    @property
    def ca_path(self) -> Path:
        """The CA that signed the apiserver's serving certificate (and, with a real node, its kubelet client's)."""
        if self._ca_path is None:
            raise RuntimeError("control plane not started")
        return self._ca_path

    @property
    def in_namespace(self) -> bool:
        """Whether the components run in another network namespace (a real node's)."""
        return bool(self.exec_prefix)

    def _port(self) -> int:
        """A port for a new listener: a free one on loopback, or the next fixed one in a private namespace."""
        if not self.in_namespace:
            return free_port(self.address)
        self._last_fixed_port += 1
        return self._last_fixed_port

    @property
    def logs(self) -> Path:
        assert self.log_dir is not None
        return self.log_dir

    def api_client(self) -> k8s.ApiClient:
        """A new :class:`kubernetes.client.ApiClient` configured from :attr:`kubeconfig_path`."""
        return k8s_config.new_client_from_config(config_file=str(self.kubeconfig_path))

    def scheduler_port(self, name: str) -> int:
        """Secure (metrics/healthz) port of the scheduler named ``name``."""
        return self._schedulers[name].port

    def scheduler_metrics_url(self, name: str) -> str:
        """Prometheus endpoint of a scheduler (self-signed TLS; no token needed)."""
        return f"https://{self.address}:{self.scheduler_port(name)}/metrics"

    def scheduler_log(self, name: str) -> Path:
        return self._schedulers[name].component.log_path

    @property
    def scheduler_names(self) -> list[str]:
        return list(self._schedulers)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> ControlPlane:
        """Start etcd, the apiserver and the configured schedulers; wait for each to be healthy.

        On any failure everything started so far is stopped and the error (with the failing
        component's log tail) propagates.
        """
        if self._started:
            return self
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.binaries is None:
            self.binaries = ensure_binaries()
        self.timings["binaries"] = time.monotonic() - t0
        self._started = True
        atexit.register(self.stop)
        try:
            t = time.monotonic()
            pki = _generate_pki(self.workdir / "pki", self.address, kubelet_client=self.in_namespace)
            self.pki = pki
            self._ca_path = pki["ca_crt"]
            self.timings["pki"] = time.monotonic() - t

            t = time.monotonic()
            etcd_url = self._start_etcd()
            self._etcd_url = etcd_url
            self.timings["etcd"] = time.monotonic() - t

            t = time.monotonic()
            self._start_apiserver(etcd_url, pki)
            self.timings["apiserver"] = time.monotonic() - t

            t = time.monotonic()
            for spec in self.scheduler_configs:
                self.add_scheduler(spec)
            self.timings["schedulers"] = time.monotonic() - t
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Terminate schedulers, the apiserver and etcd (in that order). Idempotent."""
        for name in list(self._schedulers):
            self.stop_scheduler(name)
        self.stop_controller_manager()
        for comp in (self._apiserver, self._etcd):
            if comp is not None:
                comp.stop()
        self._apiserver = self._etcd = None
        if self._started:
            self._started = False
            atexit.unregister(self.stop)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def restart_apiserver(
        self, down_seconds: float, while_down: Callable[[], None] | None = None
    ) -> float:
        """Stop kube-apiserver, keep it down ``down_seconds``, start it again; return the outage.

        Why: clients (the node agent, the extender, kube-scheduler) must survive an API
        server that goes away and comes back, as it does during a control-plane upgrade.
        The same process arguments are reused, so port, certificates and token, and hence
        :attr:`kubeconfig_path`, keep working; etcd keeps running, so no state is lost.
        ``while_down`` (if given) runs once the server is stopped, before the wait, e.g.
        to change what an agent will report. Returns the seconds from the stop until
        ``/readyz`` answered 200 again.
        """
        if self._apiserver is None or self._ca_path is None:
            raise RuntimeError("start() the control plane before restarting the apiserver")
        t0 = time.monotonic()
        self._apiserver.stop()
        if while_down is not None:
            while_down()
        time.sleep(max(0.0, down_seconds - (time.monotonic() - t0)))
        self._apiserver.start()
        ctx = ssl.create_default_context(cafile=str(self._ca_path))
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        self._apiserver.wait_healthy(
            lambda: _http_ok(f"{self.api_url}/readyz", context=ctx, headers=headers),
            self.start_timeout,
        )
        return time.monotonic() - t0

    @property
    def etcd_url(self) -> str:
        """etcd's client URL (plain HTTP on loopback)."""
        if self._etcd_url is None:
            raise RuntimeError("control plane not started")
        return self._etcd_url

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision; return that revision.

        Why: a watch from a resourceVersion older than the compacted revision is answered
        ``410 Gone``, so a client must relist; this is how tests expire a client's
        resourceVersion for real. The apiserver does the same every 5 minutes
        (``--etcd-compaction-interval``). Uses etcd's v3 JSON gateway (``/v3/kv/...``).
        """
        def post(path: str, body: Mapping[str, Any]) -> dict[str, Any]:
            req = urllib.request.Request(f"{self.etcd_url}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback etcd
                return dict(json.loads(resp.read()))

        revision = int(post("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    # -- schedulers ---------------------------------------------------------------------

    def add_scheduler(self, spec: SchedulerSpec, timeout: float | None = None) -> int:
        """Start a kube-scheduler for ``spec`` and wait for its ``/healthz``; return its port.

        Can be called after :meth:`start`, e.g. to restart the scheduler with another
        extender URL (:meth:`stop_scheduler` first: names must be unique).
        """
        if self._apiserver is None or self.binaries is None:
            raise RuntimeError("start() the control plane before adding schedulers")
        if spec.name in self._schedulers:
            raise ValueError(f"a scheduler named {spec.name!r} is already running")
        cfg_dir = self.workdir / "schedulers"
        cfg_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = cfg_dir / f"{spec.name}.yaml"
        cfg_path.write_text(yaml.safe_dump(spec.to_config(self.kubeconfig_path), sort_keys=False))
        port = self._port()
        comp = _Component(
            f"kube-scheduler[{spec.name}]",
            [
                *self.exec_prefix,
                str(self.binaries.kube_scheduler),
                f"--config={cfg_path}",
                f"--secure-port={port}",
                f"--bind-address={self.address}",
                f"--cert-dir={cfg_dir / (spec.name + '-certs')}",
                # No delegated authn/authz (it needs the apiserver's client-CA and front-proxy
                # CA bundles, and logs errors without them); instead health and metrics are
                # open, so probes and benchmark/Prometheus scrapes on loopback need no token.
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--v=2",
                *spec.extra_args,
            ],
            self.logs / f"kube-scheduler-{spec.name}.log",
            self.workdir,
        )
        comp.start()
        self._schedulers[spec.name] = _SchedulerProcess(spec, port, comp)
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        try:
            comp.wait_healthy(
                lambda: _http_ok(f"https://{self.address}:{port}/healthz", context=insecure),
                timeout or self.start_timeout,
            )
        except BaseException:
            self.stop_scheduler(spec.name)
            raise
        return port

    def pids(self) -> dict[str, int]:
        """Process ids of the running components, by name (``etcd``, ``kube-apiserver``,
        ``kube-scheduler[NAME]``): for benchmarks that account CPU time per component."""
        out: dict[str, int] = {}
        for comp in (self._etcd, self._apiserver, *(p.component for p in self._schedulers.values()),
                     self._controller_manager):
            if comp is not None and comp.proc is not None and comp.proc.poll() is None:
                out[comp.name] = comp.proc.pid
        return out

    def stop_scheduler(self, name: str) -> None:
        """Stop the scheduler named ``name`` (no-op if it is not running)."""
        proc = self._schedulers.pop(name, None)
        if proc is not None:
            proc.component.stop()

    # -- controller-manager (optional) ---------------------------------------------------

    def start_controller_manager(self, controllers: Sequence[str] = ("replicaset", "disruption"), *,
                                 binary: Path | None = None, extra_args: Sequence[str] = (),
                                 timeout: float | None = None) -> Path:
        """Start a kube-controller-manager running only ``controllers`` against this control plane
        (fake nodes, no kubelet) and wait for its ``/healthz``; return its log path.

        Why: some features need what only controllers do, e.g. a ReplicaSet recreating an evicted
        pod (``replicaset``) and PodDisruptionBudget status, without which the Eviction API allows
        no eviction of a pod a budget selects (``disruption``), or the ResourceClaims of pods with
        ResourceClaimTemplates (``resourceclaim-controller``:
        :data:`tests.harness.dra_driver.DRA_CONTROLLERS`). The default set is deliberately
        small: no node-lifecycle controller (it would taint the kubelet-less nodes), no
        service-account or token controllers (the ``ServiceAccount`` admission plugin is off here),
        no garbage collector (delete a ReplicaSet's pods yourself). It uses the admin kubeconfig
        (``--use-service-account-credentials=false``), no leader election, and a free port on
        loopback. Stopped by :meth:`stop` (or :meth:`stop_controller_manager`).
        """
        if self._apiserver is None:
            raise RuntimeError("start() the control plane before the controller-manager")
        if self._controller_manager is not None and self._controller_manager.running:
            raise ValueError("a kube-controller-manager is already running")
        kcm = binary or ensure_controller_manager()
        port = self._port()
        cert_dir = self.workdir / "controller-manager-certs"
        comp = _Component(
            "kube-controller-manager",
            [
                *self.exec_prefix,
                str(kcm),
                f"--kubeconfig={self.kubeconfig_path}",
                f"--controllers={','.join(controllers)}",
                "--use-service-account-credentials=false",
                "--leader-elect=false",
                f"--secure-port={port}",
                f"--bind-address={self.address}",
                f"--cert-dir={cert_dir}",
                f"--root-ca-file={self.ca_path}",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--v=2",
                *extra_args,
            ],
            self.logs / "kube-controller-manager.log",
            self.workdir,
        )
        comp.start()
        self._controller_manager = comp
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        try:
            comp.wait_healthy(lambda: _http_ok(f"https://{self.address}:{port}/healthz", context=insecure),
                              timeout or self.start_timeout)
        except BaseException:
            self.stop_controller_manager()
            raise
        return comp.log_path

    def stop_controller_manager(self) -> None:
        """Stop the kube-controller-manager of :meth:`start_controller_manager` (no-op if none)."""
        comp, self._controller_manager = self._controller_manager, None
        if comp is not None:
            comp.stop()

    # -- internals ----------------------------------------------------------------------

    def _start_etcd(self) -> str:
        assert self.binaries is not None
        client_port, peer_port = self._port(), self._port()
        client_url = f"http://{self.address}:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._etcd = _Component(
            "etcd",
            [
                *self.exec_prefix,
                str(self.binaries.etcd),
                "--name=gpuplace",
                f"--data-dir={self.workdir / 'etcd-data'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=gpuplace={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            self.logs / "etcd.log",
            self.workdir,
        )
        self._etcd.start()
        self._etcd.wait_healthy(
            lambda: b'"health":"true"' in _http_get(f"{client_url}/health"), self.start_timeout
        )
        return client_url

    def _start_apiserver(self, etcd_url: str, pki: Mapping[str, Path]) -> None:
        assert self.binaries is not None
        self._api_port = port = self._port()
        tokens = self.workdir / "tokens.csv"
        # Static token file: token,user,uid,"group1,group2"
        tokens.write_text("".join(f"{line}\n" for line in (f'{self.admin_token},admin,admin,"system:masters"',
                                                          *self.extra_tokens)))
        tokens.chmod(0o600)
        if self.in_namespace:
            # A real node: kube-controller-manager creates the ServiceAccounts, pods reach the
            # apiserver through the "kubernetes" Service, and `kubectl logs` reaches the kubelet
            # at its InternalIP with a client certificate the kubelet trusts.
            node_args = [
                "--disable-admission-plugins=TaintNodesByCondition",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--kubelet-client-certificate={pki['kubelet_client_crt']}",
                f"--kubelet-client-key={pki['kubelet_client_key']}",
            ]
        else:
            node_args = [
                # ServiceAccount: nobody creates the "default" ServiceAccount.
                # TaintNodesByCondition: it taints every new Node not-ready:NoSchedule, and
                # without a node-lifecycle controller that taint would never be removed.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                # The "kubernetes" Service cannot have a loopback endpoint (validation rejects
                # 127.0.0.1 and the reconciler logs an error every 10s); nothing needs it.
                "--endpoint-reconciler-type=none",
            ]
        self._apiserver = _Component(
            "kube-apiserver",
            [
                *self.exec_prefix,
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={etcd_url}",
                f"--secure-port={port}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki['apiserver_crt']}",
                f"--tls-private-key-file={pki['apiserver_key']}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-key-file={pki['sa_pub']}",
                f"--service-account-signing-key-file={pki['sa_key']}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                *node_args,
                *self.apiserver_extra_args,
            ],
            self.logs / "kube-apiserver.log",
            self.workdir,
        )
        self._apiserver.start()
        self._write_kubeconfig(pki["ca_crt"])
        ctx = ssl.create_default_context(cafile=str(pki["ca_crt"]))
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        self._apiserver.wait_healthy(
            lambda: _http_ok(f"{self.api_url}/readyz", context=ctx, headers=headers),
            self.start_timeout,
        )
        # The system-namespaces controller creates "default" shortly after /readyz; tests
        # and the demo create objects there straight away.
        self._apiserver.wait_healthy(
            lambda: _http_ok(f"{self.api_url}/api/v1/namespaces/default", context=ctx,
                             headers=headers),
            self.start_timeout,
        )  # fmt: skip

    def _write_kubeconfig(self, ca_crt: Path) -> None:
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpuplace",
                    "cluster": {
                        "server": self.api_url,
                        "certificate-authority-data": base64.b64encode(
                            ca_crt.read_bytes()
                        ).decode(),
                    },
                }
            ],
            "users": [{"name": "admin", "user": {"token": self.admin_token}}],
            "contexts": [{"name": "gpuplace", "context": {"cluster": "gpuplace", "user": "admin"}}],
            "current-context": "gpuplace",
        }
        self.kubeconfig_path.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
        self.kubeconfig_path.chmod(0o600)


def _http_get(
    url: str,
    *,
    context: ssl.SSLContext | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 2.0,
) -> bytes:
    req = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:  # noqa: S310
        return bytes(resp.read())


def _http_ok(
    url: str,
    *,
    context: ssl.SSLContext | None = None,
    headers: Mapping[str, str] | None = None,
) -> bool:
    """True if ``url`` answers 200; False on any HTTP error status (still starting)."""
    try:
        _http_get(url, context=context, headers=headers)
    except urllib.error.HTTPError:
        return False
    return True


# --------------------------------------------------------------------------------------
# Object helpers
# --------------------------------------------------------------------------------------

#: Node status defaults merged under the GPU resources given to :func:`create_node`.
NODE_DEFAULT_RESOURCES: dict[str, str] = {"pods": "110", "cpu": "64", "memory": "512Gi"}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def create_node(
    api: k8s.ApiClient,
    name: str,
    allocatable: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> k8s.V1Node:
    """Create a schedulable Node without a kubelet and give it resources and a Ready condition.

    ``status`` is ignored on create, so it is set afterwards through the ``status``
    subresource: ``capacity`` = ``allocatable`` = :data:`NODE_DEFAULT_RESOURCES` merged
    with ``allocatable`` (which wins). No controller-manager runs, so nothing ever taints
    the node NotReady; any taint added by admission on create is removed. Returns the Node
    as patched.
    """
    core = k8s.CoreV1Api(api)
    created = core.create_node(
        k8s.V1Node(
            metadata=k8s.V1ObjectMeta(
                name=name,
                labels={"kubernetes.io/hostname": name, **(labels or {})},
                annotations=dict(annotations or {}),
            ),
            spec=k8s.V1NodeSpec(unschedulable=False),
        )
    )
    if created.spec.taints:
        # An apiserver with the TaintNodesByCondition admission plugin enabled adds
        # node.kubernetes.io/not-ready on create; nothing here would ever remove it.
        core.patch_node(name, [{"op": "remove", "path": "/spec/taints"}])
    resources = {**NODE_DEFAULT_RESOURCES, **allocatable}
    now = _now()
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "fake node managed by the gpuplace test harness",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "Hostname", "address": name}],
        }
    }
    return core.patch_node_status(name, status)


def wait_pod_scheduled(
    api: k8s.ApiClient, ns: str, name: str, timeout: float = 30.0
) -> str | None:
    """Wait until the pod has ``spec.nodeName``; return it, or None after ``timeout`` s."""
    core = k8s.CoreV1Api(api)
    try:
        node: str = wait_for(
            lambda: core.read_namespaced_pod(name, ns).spec.node_name,
            timeout,
            interval=0.1,
            message=f"pod {ns}/{name} not scheduled",
        )
    except TimeoutError:
        return None
    return node


def pod_events(api: k8s.ApiClient, ns: str, name: str) -> list[str]:
    """Messages of the Events about pod ``ns/name`` (e.g. FailedScheduling), oldest first."""
    core = k8s.CoreV1Api(api)
    events = core.list_namespaced_event(
        ns, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}"
    ).items

    def when(ev: k8s.CoreV1Event) -> dt.datetime:
        stamp = ev.last_timestamp or ev.event_time or ev.metadata.creation_timestamp
        return stamp or dt.datetime.min.replace(tzinfo=dt.timezone.utc)

    return [ev.message or "" for ev in sorted(events, key=when)]
