"""``gpuplace-extender``: the kube-scheduler extender HTTP server."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import ssl
import sys
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from node_agent.version import add_version_argument
from scheduler_extender.service.connections import DEFAULT_HEADER_TIMEOUT_SECONDS, DEFAULT_MAX_CONNECTIONS, bounded_http_protocol
from scheduler_extender.core.catalog import CatalogFileError, catalog_with_file, default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.policy import PolicyError, load_policy
from scheduler_extender.service.metrics import ExtenderMetrics
from scheduler_extender.service.server import (DEFAULT_DECISION_THREADS, MAX_BODY_BYTES, MAX_INFLIGHT_BODY_BYTES,
                                       ExtenderService, create_app, create_health_app)
from scheduler_extender.service.tls import RELOAD_INTERVAL_SECONDS, CertificateReloader
from scheduler_extender.cluster.reservations import DEFAULT_TTL_SECONDS
from scheduler_extender.cluster.watch import WATCH_TIMEOUT_SECONDS

log = logging.getLogger("gpuplace.extender")

DESCRIPTION = """\
gpuplace scheduler extender: kube-scheduler calls POST /filter and /prioritize for every GPU pod;
this server rejects nodes that cannot run the pod (with a reason `kubectl describe pod` shows)
and scores the rest (cheapest GPU that fits, MIG slices for jobs that fit one, NVLink, ECC).

Modes:
  static   --inventory-dir DIR: one NodeGPUInventory file per node; no cluster needed.
  cluster  --kubeconfig FILE, or in-cluster config: watches Nodes (inventory annotation, allocatable),
           Pods, and Namespaces (labels, for policy tenants).

Also serves GET /healthz, /readyz (ready after the first full sync), /metrics, and with
--debug-endpoints the read-only GET /debug/allocations (per node: GPUs free and held, and by which pods).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuplace-extender", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version_argument(p)
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    p.add_argument("--port", type=int, default=8888, help="port to listen on (default: 8888)")
    p.add_argument("--health-port", type=int, default=0, metavar="PORT",
                   help="also serve GET /healthz, /readyz and /metrics (only those) over plain HTTP on PORT, for "
                        "kubelet probes and Prometheus when --tls-client-ca-file makes --port require client "
                        "certificates (default: 0, off)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--inventory-dir", metavar="DIR",
                      help="static mode: read one NodeGPUInventory (.json/.yaml) per node from DIR")
    mode.add_argument("--kubeconfig", metavar="FILE",
                      help="cluster mode with this kubeconfig (default: in-cluster config, else $KUBECONFIG)")
    p.add_argument("--policy", metavar="FILE",
                   help="placement policy YAML (default: the shipped policy); reloaded when the file changes, "
                        "an invalid change is rejected and the running policy kept")
    p.add_argument("--namespace-labels", metavar="FILE",
                   help="static mode: labels of namespaces, for policy tenants with a namespaceSelector "
                        "(YAML namespace: {label: value}, or `kubectl get namespaces -o yaml`); without it, "
                        "labels are unknown and such tenants deny rather than guess. Cluster mode watches Namespaces.")
    p.add_argument("--policy-poll-seconds", type=float, default=5.0,
                   help="how often to check --policy for changes (default: 5)")
    p.add_argument("--policy-configmap", metavar="NAMESPACE/NAME",
                   help="cluster mode: read the policy from this ConfigMap through the API and watch it; a valid "
                        "edit applies at once, an invalid one is rejected (log line, metric, Event "
                        "PolicyRejected on the ConfigMap) and the running policy kept. Needs get/list/watch on "
                        "that ConfigMap and create on events. Excludes --policy")
    p.add_argument("--policy-configmap-key", default="policy.yaml", metavar="KEY",
                   help="data key of --policy-configmap holding the policy YAML (default: policy.yaml)")
    tls = p.add_argument_group(
        "HTTPS", "serve the extender over TLS; kube-scheduler then needs enableHTTPS: true and a tlsConfig "
                 "whose caData/caFile verifies this certificate (see docs/operator-guide.md#https-between-kube-scheduler-and-the-extender)")
    tls.add_argument("--tls-cert-file", metavar="FILE",
                     help="PEM server certificate (chain); requires --tls-key-file")
    tls.add_argument("--tls-key-file", metavar="FILE", help="PEM private key of --tls-cert-file")
    tls.add_argument("--tls-client-ca-file", metavar="FILE",
                     help="PEM CA bundle: require clients (kube-scheduler's tlsConfig certData/keyData) to present "
                          "a certificate it signed; without it any client may connect")
    tls.add_argument("--tls-reload-seconds", type=float, default=RELOAD_INTERVAL_SECONDS, metavar="SECONDS",
                     help="how often to check --tls-cert-file and --tls-key-file for a renewed certificate (a "
                          "Secret volume updated by cert-manager); a changed pair is served to new connections, "
                          "one that does not load is rejected and logged and the previous one kept. 0: read at "
                          f"start only. The client CA is read at start only (default: {RELOAD_INTERVAL_SECONDS:g})")
    p.add_argument("--requeue-rejected-pods", action=argparse.BooleanOptionalAction, default=True,
                   help="cluster mode: when a node now passes for a pending pod this extender passed no node for "
                        "(its view caught up with a change kube-scheduler had already retried the pod on, or a "
                        "policy reload), patch the pod's annotation extender.gpuplace.io/requeued-at so that "
                        "kube-scheduler retries it at once instead of after podMaxInUnschedulablePodsDuration. "
                        "Needs patch on pods (the chart grants it, limited to that annotation on unbound pods by "
                        "an admission policy) (default: on)")
    p.add_argument("--preemption", action=argparse.BooleanOptionalAction, default=False,
                   help="cluster mode: GPU-aware preemption. For a pending pod this extender passed no node for, "
                        "where only evictions can make room (the right GPUs busy, no free NVLink group, a shared "
                        "GPU's VRAM taken), choose the fewest lower-priority victims after whose eviction the "
                        "filter passes it on a node, hold the pod there (annotation "
                        "extender.gpuplace.io/nominated-node) and evict them through the Eviction API, which "
                        "honours PodDisruptionBudgets; one replica acts, elected on --preemption-lease. Needs "
                        "--requeue-rejected-pods, create on pods/eviction, list on poddisruptionbudgets and the "
                        "Lease (the chart grants them) (default: off; the chart turns it on)")
    p.add_argument("--defrag-interval-seconds", type=float, default=0.0, metavar="SECONDS",
                   help="cluster mode, with --preemption: every SECONDS, on the replica holding --preemption-lease, "
                        "plan the fewest moves of movable pods (label gpuplace.io/movable=true, owned by a "
                        "controller, no PodDisruptionBudget forbidding) that make room for a waiting GPU pod and "
                        "carry the first plan out as gpuplace defrag --execute does, at most one eviction per "
                        "SECONDS; lists every Node, Pod and PodDisruptionBudget at each pass (default: 0, off)")
    p.add_argument("--preemption-lease", default=None, metavar="NAMESPACE/NAME",
                   help="the coordination.k8s.io Lease the replicas elect the preempting one on (default: "
                        "$POD_NAMESPACE/gpuplace-extender-preemption, namespace default without POD_NAMESPACE)")
    dra = p.add_argument_group(
        "Dynamic Resource Allocation", "pods whose GPUs come from ResourceClaims (docs/dra.md)")
    dra.add_argument("--dra", action=argparse.BooleanOptionalAction, default=False,
                     help="cluster mode: also list and watch ResourceSlices and ResourceClaims (resource.k8s.io/v1) "
                          "and decide the pods whose claims gpuplace wrote on the devices still free in their "
                          "nodes' slices; needs get/list/watch on both (default: off)")
    dra.add_argument("--dra-drivers", metavar="FILE",
                     help="YAML of DRA driver attribute mappings to add to the shipped ones (gpu.nvidia.com, "
                          "test-driver.cdi.k8s.io; form as the package's data/dra-drivers.yaml)")
    dra.add_argument("--dra-device-class", default="gpu.nvidia.com", metavar="NAME",
                     help="with --claim-webhook-port: the DeviceClass of the claim templates gpuplace-gpu-<count> the "
                          "extender creates for pods labelled gpuplace.io/dra=true (POST /mutate/pods); needs get and "
                          "create on resourceclaimtemplates (default: gpu.nvidia.com, NVIDIA's DRA driver's)")
    dra.add_argument("--claim-webhook-port", type=int, default=0, metavar="PORT",
                     help="with --dra: serve the claim webhook, POST /mutate/resourceclaims (AdmissionReview v1), "
                          "over HTTPS with --tls-cert-file on PORT without asking for a client certificate "
                          "(kube-apiserver presents none); writes each GPU request of a pod's claim as "
                          "firstAvailable alternatives in gpuplace's order (default: 0, off)")
    p.add_argument("--watch-timeout-seconds", type=int, default=WATCH_TIMEOUT_SECONDS,
                   help=f"cluster mode: server-side length of each watch request before it is renewed from the last "
                        f"resourceVersion (default: {WATCH_TIMEOUT_SECONDS})")
    p.add_argument("--header-timeout-seconds", type=float, default=DEFAULT_HEADER_TIMEOUT_SECONDS, metavar="SECONDS",
                   help="close a connection whose request line and headers have not all arrived this long after it "
                        "opened, or after the first byte of a later request on it (slowloris) "
                        f"(default: {DEFAULT_HEADER_TIMEOUT_SECONDS:g})")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                   help="close at once a connection beyond N open ones, per port, so that clients cannot use up "
                        f"the process's file descriptors (default: {DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("--filter-returns-best", action="store_true",
                   help="/filter also scores and passes only the best-scored node (ties broken by the score's "
                        "other components, then by the request's order; the others are listed as failed with "
                        "their score), so kube-scheduler can run without a prioritizeVerb: one round trip per "
                        "pod, and in cluster mode the pod is reserved on exactly the node it will be bound to. "
                        "Another extender sees only that node")
    p.add_argument("--catalog-file", metavar="FILE",
                   help="YAML list of GPU models to add to the shipped catalog, for GPUs it does not know yet "
                        "(rows as in the package's data/catalog.yaml, schema CatalogEntry; ids and driver names "
                        "must be new)")
    p.add_argument("--reservation-seconds", type=float, default=DEFAULT_TTL_SECONDS, metavar="SECONDS",
                   help="cluster mode: how long a pod the extender sent to a node is held there in its books (its "
                        "GPUs, a shared GPU's replica and VRAM, CPU and memory) while the watch does not show it "
                        "bound; a binding, the pod's deletion or its next scheduling attempt ends it sooner "
                        f"(default: {DEFAULT_TTL_SECONDS:g})")
    p.add_argument("--decision-threads", type=int, default=DEFAULT_DECISION_THREADS, metavar="N",
                   help="worker threads that parse and decide /filter, /prioritize and /explain requests, so "
                        "that a large request never holds up /healthz, /readyz, /metrics or the others; requests "
                        f"beyond N wait for a thread (default: {DEFAULT_DECISION_THREADS})")
    p.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, metavar="BYTES",
                   help="answer 413 to a request body over BYTES, as soon as its Content-Length or the part sent "
                        "so far exceeds it; enough for nodeCacheCapable: true at any cluster size, and for full "
                        "NodeLists up to ~5,000 nodes (~2.7 kB per node) (default: "
                        f"{MAX_BODY_BYTES} = {MAX_BODY_BYTES // 2**20} MiB)")
    p.add_argument("--max-inflight-body-bytes", type=int, default=MAX_INFLIGHT_BODY_BYTES, metavar="BYTES",
                   help="bound on the request bodies held at once over all connections (being read, or waiting "
                        "for or in a decision); a body that would exceed it is answered 503 with Retry-After, "
                        "and kube-scheduler retries the pod; at least --max-body-bytes (default: "
                        f"{MAX_INFLIGHT_BODY_BYTES} = {MAX_INFLIGHT_BODY_BYTES // 2**20} MiB)")
    p.add_argument("--debug-endpoints", action=argparse.BooleanOptionalAction, default=False,
                   help="serve GET /debug/allocations on --port: per node, the GPUs the extender believes free "
                        "and held and by which pods (namespace/name of every tenant's GPU pods, to any client "
                        "that can reach the port) (default: off)")
    p.add_argument("--log-level", default=os.environ.get("GPUPLACE_LOG_LEVEL", "info"),
                   choices=["debug", "info", "warning", "error"], help="log level (default: info)")
    return p


class PolicyWatcher:
    """Reloads ``--policy`` when its content changes; a bad file keeps the running policy.

    Polls the file's content rather than mtime: a Kubernetes ConfigMap volume updates by swapping
    a symlink, which mtime-based watchers miss.
    """

    def __init__(self, path: str, service: ExtenderService, metrics: ExtenderMetrics, interval: float) -> None:
        self.path, self.service, self.metrics, self.interval = path, service, metrics, interval
        self._last = self._read()
        self._stop = threading.Event()

    def _read(self) -> str | None:
        try:
            return Path(self.path).read_text(encoding="utf-8")
        except OSError:
            return None

    def check_once(self) -> bool | None:
        """Apply a changed policy. True: applied, False: rejected, None: unchanged."""
        text = self._read()
        if text is None or text == self._last:
            return None
        self._last = text
        try:
            policy = load_policy(self.path)
        except PolicyError as e:
            log.error("policy change rejected, keeping the running policy: %s", e)
            self.metrics.policy.record("rejected")
            return False
        self.service.engine = Engine(policy, self.service.engine.catalog)
        self.metrics.policy.record("applied")
        log.info("policy reloaded from %s", self.path)
        return True

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check_once()

    def start(self) -> None:
        threading.Thread(target=self.run, name="policy-watch", daemon=True).start()


def _start_pending_watch(cluster_watch: Any, metrics: ExtenderMetrics, service: ExtenderService) -> Any:
    """Watch unbound GPU pods for the pending-pods gauges and the learned workload (a third
    watcher beside nodes and pods): each such pod counts once in ``service``'s workload, from the
    API server's view, not from requests."""
    from kubernetes import client

    from scheduler_extender.cluster.pending import PENDING_FIELD_SELECTOR, PendingGpuPods
    from scheduler_extender.cluster.watch import ResourceWatcher
    cache = getattr(service.source, "cache", None)
    pending = PendingGpuPods(on_new=service.observe_pod, on_deleted=cache.pod_gone if cache is not None else None,
                             on_nominated=service.observe_nomination)
    service.learn_from_requests = False
    pods = client.CoreV1Api(client.ApiClient()).list_pod_for_all_namespaces
    w = ResourceWatcher("pending-pods", pods, pending, cluster_watch.stop_event,  # type: ignore[arg-type]
                        field_selector=PENDING_FIELD_SELECTOR, on_relist=lambda kind: metrics.relists.labels(kind).inc())
    threading.Thread(target=w.run, name="watch-pending-pods", daemon=True).start()
    return pending


def _register_cluster_collector(metrics: ExtenderMetrics, source: Any, pending: Any) -> None:
    from scheduler_extender.cluster.cluster_metrics import ClusterStateCollector
    metrics.registry.register(ClusterStateCollector(source, pending))


def _policy_configmap_watcher(args: argparse.Namespace, metrics: ExtenderMetrics, catalog: Any) -> Any:
    """The ConfigMap watcher with its first policy loaded, or None (after printing why)."""
    from kubernetes import client

    from scheduler_extender.cluster.policy_configmap import PolicyConfigMapError, PolicyConfigMapWatcher, parse_ref
    try:
        ns, name = parse_ref(args.policy_configmap)
        w = PolicyConfigMapWatcher(client.ApiClient(), ns, name, args.policy_configmap_key, metrics, catalog)
        w.load_initial()
    except (ValueError, PolicyConfigMapError) as e:
        print(f"gpuplace-extender: invalid policy: {e}", file=sys.stderr)
        return None
    return w


def tls_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's ssl_* keyword arguments for the --tls-* options; {} for plain HTTP.

    Raises:
        UsageError: a key without a certificate (or the reverse), a client CA without a
            certificate, or a file that cannot be read (each message names the option).
    """
    if not (args.tls_cert_file or args.tls_key_file or args.tls_client_ca_file):
        return {}
    if not args.tls_cert_file or not args.tls_key_file:
        raise UsageError("--tls-cert-file and --tls-key-file go together (and --tls-client-ca-file needs both)")
    for option, path in (("--tls-cert-file", args.tls_cert_file), ("--tls-key-file", args.tls_key_file),
                         ("--tls-client-ca-file", args.tls_client_ca_file)):
        if path is not None and not os.access(path, os.R_OK):
            raise UsageError(f"{option} {path}: not a readable file")
    opts: dict[str, Any] = {"ssl_certfile": args.tls_cert_file, "ssl_keyfile": args.tls_key_file}
    if args.tls_client_ca_file:
        opts.update(ssl_ca_certs=args.tls_client_ca_file, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return opts


class UsageError(Exception):
    """A command-line option is wrong; the message says which and how."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.policy_configmap and (args.policy or args.inventory_dir):
        parser.error("--policy-configmap reads the policy from the cluster: it excludes --policy and --inventory-dir")
    try:
        ssl_options = _checked_options(args)
        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        engine, catalog = _engine(args)
        metrics = ExtenderMetrics()
        service, background = _service(args, engine, catalog, metrics)
    except UsageError as e:
        if str(e):
            print(f"gpuplace-extender: {e}", file=sys.stderr)
        return 2
    _serve_http(args, service, metrics, ssl_options, background)
    return 0


def _checked_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's TLS options (``tls_options``), once every numeric option is checked.

    Raises:
        UsageError: an option out of its range, naming it and the range.
    """
    ssl_options = tls_options(args)
    if not args.header_timeout_seconds > 0:
        raise UsageError(f"--header-timeout-seconds {args.header_timeout_seconds:g}: must be more than 0")
    if args.max_connections < 1:
        raise UsageError(f"--max-connections {args.max_connections}: must be at least 1")
    if args.max_body_bytes < 1:
        raise UsageError(f"--max-body-bytes {args.max_body_bytes}: must be at least 1")
    if args.max_inflight_body_bytes < args.max_body_bytes:
        raise UsageError(f"--max-inflight-body-bytes {args.max_inflight_body_bytes}: must be at least "
                         f"--max-body-bytes ({args.max_body_bytes})")
    if args.decision_threads < 1:
        raise UsageError(f"--decision-threads {args.decision_threads}: must be at least 1")
    if args.health_port and (args.health_port == args.port or not 0 < args.health_port < 65536):
        raise UsageError(f"--health-port {args.health_port}: must be a free port other than --port {args.port}")
    if args.watch_timeout_seconds < 1:
        raise UsageError(f"--watch-timeout-seconds {args.watch_timeout_seconds}: must be at least 1")
    if not (0 < args.reservation_seconds <= 3600):  # also NaN
        raise UsageError(f"--reservation-seconds {args.reservation_seconds:g}: must be more than 0 and at most 3600")
    if args.tls_reload_seconds < 0:
        raise UsageError(f"--tls-reload-seconds {args.tls_reload_seconds:g}: must be 0 (off) or more")
    if args.preemption and args.inventory_dir:
        raise UsageError("--preemption is for cluster mode: static mode (--inventory-dir) sees no pods to evict")
    if args.defrag_interval_seconds and not (args.preemption and 10 <= args.defrag_interval_seconds <= 86400):
        raise UsageError(f"--defrag-interval-seconds {args.defrag_interval_seconds:g}: 0 (off), or from 10 to 86400 "
                         "with --preemption (its Lease elects the replica that moves pods)")
    if args.preemption and not args.requeue_rejected_pods:
        raise UsageError("--preemption needs --requeue-rejected-pods: it preempts for the pods the requeue remembers")
    if args.preemption_lease is not None:
        from scheduler_extender.cluster.preemption import parse_lease
        try:
            parse_lease(args.preemption_lease)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if args.namespace_labels and not args.inventory_dir:
        raise UsageError("--namespace-labels is for static mode (--inventory-dir); "
                         "cluster mode reads namespace labels from the API server")
    if (args.dra or args.dra_drivers) and args.inventory_dir:
        raise UsageError("--dra and --dra-drivers are for cluster mode; gpuplace explain --resource-slices reads "
                         "slices from a file")
    if args.dra_drivers and not args.dra:
        raise UsageError("--dra-drivers needs --dra")
    if args.claim_webhook_port:
        if not args.dra:
            raise UsageError("--claim-webhook-port needs --dra (the webhook reads the cluster's ResourceSlices)")
        if not args.tls_cert_file:
            raise UsageError("--claim-webhook-port needs --tls-cert-file and --tls-key-file: kube-apiserver calls "
                             "webhooks over HTTPS only")
        if args.claim_webhook_port in (args.port, args.health_port) or not 0 < args.claim_webhook_port < 65536:
            raise UsageError(f"--claim-webhook-port {args.claim_webhook_port}: must be a free port other than --port "
                             "and --health-port")
    return ssl_options


def _engine(args: argparse.Namespace) -> tuple[Engine, Any]:
    """The engine of ``--policy`` (or the default policy) over the catalog (``--catalog-file`` added).

    Raises:
        UsageError: the policy or the catalog file is invalid.
    """
    try:
        policy = load_policy(args.policy)
    except PolicyError as e:
        raise UsageError(f"invalid policy: {e}") from None
    catalog = default_catalog()
    if args.catalog_file:
        try:
            catalog = catalog_with_file(args.catalog_file, catalog)
        except CatalogFileError as e:
            raise UsageError(f"--catalog-file {e}") from None
    return Engine(policy, catalog), catalog


def _service(args: argparse.Namespace, engine: Engine, catalog: Any, metrics: ExtenderMetrics
             ) -> tuple[ExtenderService, list[Callable[[], Awaitable[None]]]]:
    """The service over static files (``--inventory-dir``) or the cluster, with its background
    tasks (requeue) and watchers (policy file or ConfigMap) started.

    Raises:
        UsageError: the files or the cluster configuration cannot be read (empty message: the
            cause was printed already).
    """
    background: list[Callable[[], Awaitable[None]]] = []
    if args.inventory_dir:
        service = ExtenderService(engine, _static_source(args, catalog, metrics), metrics)
        service.filter_returns_best = args.filter_returns_best
        _register_cluster_collector(metrics, service.source, None)
    else:
        service, policy_watcher = _cluster_service(args, engine, catalog, metrics, background)
        if policy_watcher is not None:
            from scheduler_extender.cluster.policy_configmap import engine_swapper
            policy_watcher.start(engine_swapper(service))
    if args.policy:
        PolicyWatcher(args.policy, service, metrics, args.policy_poll_seconds).start()
    return service, background


def _static_source(args: argparse.Namespace, catalog: Any, metrics: ExtenderMetrics) -> Any:
    """``StaticSource`` over ``--inventory-dir`` (with ``--namespace-labels``).

    Raises:
        UsageError: a file is missing or unreadable.
    """
    from scheduler_extender.cluster.sources import NamespaceLabelsError, StaticSource, load_namespace_labels
    try:
        labels = load_namespace_labels(args.namespace_labels) if args.namespace_labels else None
        source = StaticSource(args.inventory_dir, catalog, labels)
    except (FileNotFoundError, NamespaceLabelsError) as e:
        raise UsageError(str(e)) from None
    metrics.inventory_errors.set(len(source.errors))
    return source


def _cluster_service(args: argparse.Namespace, engine: Engine, catalog: Any, metrics: ExtenderMetrics,
                     background: list[Callable[[], Awaitable[None]]]) -> tuple[ExtenderService, Any]:
    """The service over the watched cluster (its watches started), and the policy ConfigMap's
    watcher when ``--policy-configmap`` is given (to start once the service exists).

    Raises:
        UsageError: no cluster configuration, or the ConfigMap's policy is invalid.
    """
    from kubernetes import client

    from scheduler_extender.cluster.cache import ClusterCache
    from scheduler_extender.cluster.sources import ClusterSource
    from scheduler_extender.cluster.watch import ClusterWatch, namespace_reader
    _load_kube_config(args)
    policy_watcher = None
    if args.policy_configmap:
        # Before any watch thread starts: a process that exits for a bad policy has nothing to stop.
        policy_watcher = _policy_configmap_watcher(args, metrics, catalog)
        if policy_watcher is None:
            raise UsageError("")  # printed by _policy_configmap_watcher
        engine = Engine(policy_watcher.policy, catalog)
    services: list[ExtenderService] = []  # the engine a bound pod's VRAM need is estimated with: the current one

    def pod_vram(pod: Any, memory_bytes: int) -> int | None:
        return (services[0].engine if services else engine).vram_need_bytes(pod, memory_bytes)

    cache = ClusterCache(catalog, pod_vram, reservation_seconds=args.reservation_seconds)
    source = ClusterSource(cache, catalog, namespace_reader(client.ApiClient()))
    watch = ClusterWatch(client.ApiClient(), cache, on_relist=lambda kind: metrics.relists.labels(kind).inc(),
                         watch_timeout_seconds=args.watch_timeout_seconds)
    watch.start()
    service = ExtenderService(engine, source, metrics)
    service.filter_returns_best = args.filter_returns_best
    services.append(service)
    pending = _start_pending_watch(watch, metrics, service)
    _register_cluster_collector(metrics, source, pending)
    if args.requeue_rejected_pods:
        from scheduler_extender.cluster.requeue import Requeuer, pod_patcher
        service.requeue = Requeuer(service, pod_patcher(client.ApiClient()), pending.waits, metrics.requeue)
        background.append(service.requeue.run)
    if args.preemption:
        background.append(_preemption(args, service, metrics))
    if args.dra:
        _start_dra(args, service, catalog, metrics, watch.stop_event)
    return service, policy_watcher


def _start_dra(args: argparse.Namespace, service: ExtenderService, catalog: Any, metrics: ExtenderMetrics,
               stop: threading.Event) -> None:
    """The ResourceSlice and ResourceClaim watches into ``service.dra`` (``cluster.dra``).

    Raises:
        UsageError: --dra-drivers cannot be read.
    """
    from kubernetes import client

    from scheduler_extender.cluster.dra import DraFleet, watchers
    api = client.ResourceV1Api(client.ApiClient())
    # A claim the watch has not shown yet is read while kube-scheduler waits for /filter: at most
    # 1 s to connect and 1.5 s to answer, well inside the chart's 5 s httpTimeoutSeconds.
    fleet = DraFleet(catalog, dra_drivers(args.dra_drivers),
                     _object_reader(api.read_namespaced_resource_claim, CLAIM_READ_TIMEOUT_SECONDS))
    for w in watchers(fleet, api.list_resource_slice, api.list_resource_claim_for_all_namespaces, stop,
                      on_relist=lambda kind: metrics.relists.labels(kind).inc(),
                      watch_timeout_seconds=args.watch_timeout_seconds):
        threading.Thread(target=w.run, name=f"watch-{w.kind}", daemon=True).start()
    service.dra = fleet


def dra_drivers(path: str | None) -> Any:
    """The shipped DRA driver mappings with those of ``path`` added (``core.dra_slices.drivers_with_file``).

    Raises:
        UsageError: the file cannot be read or is not a driver table (the field named).
    """
    from scheduler_extender.core.dra_slices import DriverTableError, drivers_with_file
    try:
        return drivers_with_file(path)
    except DriverTableError as e:
        raise UsageError(f"--dra-drivers {e}") from None


def _template_creator(device_class: str) -> Callable[[str, int], None]:
    """``ensure(namespace, count)``: create the claim template ``gpuplace-gpu-<count>`` of
    ``device_class`` in the namespace unless it exists (``core.dra_claims.claim_template``); an
    API error other than "exists" raises (the webhook then refuses the pod, with the cause)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from scheduler_extender.core.dra_claims import claim_template, template_name
    api = client.ResourceV1Api(client.ApiClient())
    read = _object_reader(api.read_namespaced_resource_claim_template)

    def ensure(namespace: str, count: int) -> None:
        if read(namespace, template_name(count)) is not None:
            return
        try:
            api.create_namespaced_resource_claim_template(namespace, claim_template(namespace, count, device_class),
                                                          _request_timeout=OBJECT_READ_TIMEOUT_SECONDS)
        except ApiException as e:
            if e.status != 409:  # created meanwhile by another replica: as good
                raise
    return ensure


OBJECT_READ_TIMEOUT_SECONDS = (2, 5)
"""(connect, read) seconds of the webhooks' single reads: the API server's webhook timeout is longer."""

CLAIM_READ_TIMEOUT_SECONDS = (1, 1.5)
"""(connect, read) seconds of the filter's read of a claim the watch has not shown
(``cluster.dra.DraFleet.claim``): kube-scheduler waits ``httpTimeoutSeconds`` (the chart: 5) for
the whole answer."""


def _object_reader(read_namespaced: Callable[..., Any],
                   timeout_seconds: tuple[float, float] = OBJECT_READ_TIMEOUT_SECONDS) -> Callable[[str, str], Any]:
    """``read(namespace, name)`` over a client's ``read_namespaced_*``: the object as decoded JSON,
    None when it does not exist; raises on any other API error (the claim webhook then refuses,
    and the controller retries). At most ``timeout_seconds`` (connect, read)."""
    from kubernetes.client.rest import ApiException

    def read(namespace: str, name: str) -> Any:
        try:
            resp = read_namespaced(name, namespace, _preload_content=False, _request_timeout=timeout_seconds)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return json.loads(resp.data)
    return read


def _preemption(args: argparse.Namespace, service: ExtenderService, metrics: ExtenderMetrics
                ) -> Callable[[], Awaitable[None]]:
    """The preemption controller's loop (``cluster.preemption``), its leader election started."""
    from kubernetes import client

    from scheduler_extender.cluster.preemption import KubePreemptionApi, LeaderGate, Preemptor, parse_lease
    from scheduler_extender.cluster.requeue import pod_patcher
    requeue = service.requeue
    assert requeue is not None  # _checked_options: --preemption needs --requeue-rejected-pods
    lease = args.preemption_lease or f"{os.environ.get('POD_NAMESPACE') or 'default'}/gpuplace-extender-preemption"
    gate = LeaderGate(*parse_lease(lease), serving=service.serving)
    gate.start()
    api = KubePreemptionApi(client.ApiClient())
    preemptor = Preemptor(service, requeue.rejected, api, metrics.preemption, requeue=pod_patcher(client.ApiClient()))
    if args.defrag_interval_seconds:
        from scheduler_extender.cluster.defrag import ClusterReader, Defragmenter
        defrag = Defragmenter(lambda: service.engine, lambda engine: ClusterReader(client.ApiClient(), engine).read(),
                              api, metrics.preemption, args.defrag_interval_seconds,
                              lambda line: logging.getLogger("gpuplace.defrag").info("%s", line))
        threading.Thread(target=defrag.run, args=(gate.leading,), name="defrag", daemon=True).start()
    return lambda: preemptor.run(gate.leading)


def _load_kube_config(args: argparse.Namespace) -> None:
    """``--kubeconfig``, else the in-cluster configuration, else the default kubeconfig.

    Raises:
        UsageError: none of them can be loaded.
    """
    from kubernetes import config
    try:
        if args.kubeconfig:
            config.load_kube_config(config_file=args.kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
    except Exception as e:  # noqa: BLE001 - report any config problem the same way
        raise UsageError(f"no cluster configuration ({type(e).__name__}: {e}); pass --kubeconfig FILE, run in a "
                         "pod, or use --inventory-dir DIR for static mode") from None


def _serve_http(args: argparse.Namespace, service: ExtenderService, metrics: ExtenderMetrics,
                ssl_options: dict[str, Any], background: list[Callable[[], Awaitable[None]]]) -> None:
    """Serve the verbs (and, with ``--health-port``, health and metrics apart) until stopped."""
    import uvicorn
    log.info("gpuplace-extender listening on %s://%s:%d (%s mode)", "https" if ssl_options else "http",
             args.host, args.port, "static" if args.inventory_dir else "cluster")
    http = bounded_http_protocol(args.header_timeout_seconds, args.max_connections)
    main_config = uvicorn.Config(create_app(service, debug_endpoints=args.debug_endpoints,
                                            decision_threads=args.decision_threads,
                                            max_body_bytes=args.max_body_bytes,
                                            max_inflight_body_bytes=args.max_inflight_body_bytes), host=args.host,
                                 port=args.port, http=http,
                                 log_level="warning", access_log=False, **ssl_options)
    if ssl_options and args.tls_reload_seconds > 0:
        main_config.load()  # builds the SSLContext the server will use (Server.serve skips a loaded config)
        reloader = CertificateReloader(args.tls_cert_file, args.tls_key_file, main_config.ssl, metrics.tls_reloads)
        background.append(lambda: reloader.run(args.tls_reload_seconds))
    servers = [uvicorn.Server(main_config)]
    if args.claim_webhook_port and service.dra is not None:
        from scheduler_extender.service.claim_webhook import ClaimWebhook
        from scheduler_extender.service.server import create_webhook_app
        from kubernetes import client
        read_pod = _object_reader(client.CoreV1Api(client.ApiClient()).read_namespaced_pod)
        webhook = ClaimWebhook(service.dra, lambda: service.engine, read_pod, service.namespace_labels_of_name,
                               metrics.claims_written, _template_creator(args.dra_device_class))
        webhook_options = {k: v for k, v in ssl_options.items() if k in ("ssl_certfile", "ssl_keyfile")}
        webhook_config = uvicorn.Config(create_webhook_app(webhook, max_body_bytes=args.max_body_bytes),
                                        host=args.host, port=args.claim_webhook_port, http=http,
                                        log_level="warning", access_log=False, **webhook_options)
        if args.tls_reload_seconds > 0:
            webhook_config.load()
            webhook_reloader = CertificateReloader(args.tls_cert_file, args.tls_key_file, webhook_config.ssl,
                                                   metrics.tls_reloads)
            background.append(lambda: webhook_reloader.run(args.tls_reload_seconds))
        log.info("claim webhook on https://%s:%d/mutate/resourceclaims", args.host, args.claim_webhook_port)
        servers.append(uvicorn.Server(webhook_config))
    if args.health_port:
        log.info("health and metrics also on http://%s:%d (/healthz, /readyz, /metrics)", args.host, args.health_port)
        servers.append(uvicorn.Server(uvicorn.Config(create_health_app(service), host=args.host, http=http,
                                                     port=args.health_port, log_level="warning", access_log=False)))
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(servers, background))


def _loop_factory() -> Any:
    """uvloop's event loop where it is installed (a dependency on CPython outside Windows), as
    ``uvicorn.run`` picks it; asyncio's own otherwise. Our servers run under one loop of our own
    (two ports), so the choice uvicorn would make for one server is made here."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve(servers: list[Any], background: Sequence[Callable[[], Awaitable[None]]] = ()) -> None:
    """Run uvicorn servers until one stops (a signal reaches only the last one to install its
    handlers), then stop the others; ``background`` coroutine functions run on the same loop
    meanwhile and are cancelled at the end."""
    helpers = [asyncio.create_task(run()) for run in background]
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for s in servers:
        s.should_exit = True
    await asyncio.gather(*pending)
    for h in helpers:
        h.cancel()
    await asyncio.gather(*helpers, return_exceptions=True)


if __name__ == "__main__":
    sys.exit(main())
