"""``gpuplace-extender``: the kube-scheduler extender HTTP server."""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys
import threading
from pathlib import Path
from typing import Any

from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.engine import Engine
from scheduler_extender.core.policy import PolicyError, load_policy
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.server import ExtenderService, create_app
from scheduler_extender.watch import WATCH_TIMEOUT_SECONDS

log = logging.getLogger("gpuplace.extender")

DESCRIPTION = """\
gpuplace scheduler extender: kube-scheduler calls POST /filter and /prioritize for every GPU pod;
this server rejects nodes that cannot run the pod (with a reason `kubectl describe pod` shows)
and scores the rest (cheapest GPU that fits, MIG slices for jobs that fit one, NVLink, ECC).

Modes:
  static   --inventory-dir DIR: one NodeGPUInventory file per node; no cluster needed.
  cluster  --kubeconfig FILE, or in-cluster config: watches Nodes (inventory annotation) and Pods.

Also serves GET /healthz, /readyz (ready after the first full sync), /metrics, and the read-only
GET /debug/allocations (per node: GPUs free and held, and by which pods).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuplace-extender", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    p.add_argument("--port", type=int, default=8888, help="port to listen on (default: 8888)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--inventory-dir", metavar="DIR",
                      help="static mode: read one NodeGPUInventory (.json/.yaml) per node from DIR")
    mode.add_argument("--kubeconfig", metavar="FILE",
                      help="cluster mode with this kubeconfig (default: in-cluster config, else $KUBECONFIG)")
    p.add_argument("--policy", metavar="FILE",
                   help="placement policy YAML (default: the shipped policy); reloaded when the file changes, "
                        "an invalid change is rejected and the running policy kept")
    p.add_argument("--policy-poll-seconds", type=float, default=5.0,
                   help="how often to check --policy for changes (default: 5)")
    tls = p.add_argument_group(
        "HTTPS", "serve the extender over TLS; kube-scheduler then needs enableHTTPS: true and a tlsConfig "
                 "whose caData/caFile verifies this certificate (see README, 'HTTPS')")
    tls.add_argument("--tls-cert-file", metavar="FILE",
                     help="PEM server certificate (chain); requires --tls-key-file")
    tls.add_argument("--tls-key-file", metavar="FILE", help="PEM private key of --tls-cert-file")
    tls.add_argument("--tls-client-ca-file", metavar="FILE",
                     help="PEM CA bundle: require clients (kube-scheduler's tlsConfig certData/keyData) to present "
                          "a certificate it signed; without it any client may connect")
    p.add_argument("--watch-timeout-seconds", type=int, default=WATCH_TIMEOUT_SECONDS,
                   help=f"cluster mode: server-side length of each watch request before it is renewed from the last "
                        f"resourceVersion (default: {WATCH_TIMEOUT_SECONDS})")
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
            self.metrics.policy_reloads.labels("rejected").inc()
            return False
        self.service.engine = Engine(policy, self.service.engine.catalog)
        self.metrics.policy_reloads.labels("applied").inc()
        log.info("policy reloaded from %s", self.path)
        return True

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check_once()

    def start(self) -> None:
        threading.Thread(target=self.run, name="policy-watch", daemon=True).start()


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
    args = build_parser().parse_args(argv)
    try:
        ssl_options = tls_options(args)
        if args.watch_timeout_seconds < 1:
            raise UsageError(f"--watch-timeout-seconds {args.watch_timeout_seconds}: must be at least 1")
    except UsageError as e:
        print(f"gpuplace-extender: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        policy = load_policy(args.policy)
    except PolicyError as e:
        print(f"gpuplace-extender: invalid policy: {e}", file=sys.stderr)
        return 2
    catalog = default_catalog()
    engine = Engine(policy, catalog)
    metrics = ExtenderMetrics()

    if args.inventory_dir:
        from scheduler_extender.sources import StaticSource
        try:
            source = StaticSource(args.inventory_dir, catalog)
        except FileNotFoundError as e:
            print(f"gpuplace-extender: {e}", file=sys.stderr)
            return 2
        metrics.inventory_errors.set(len(source.errors))
    else:
        from kubernetes import client, config

        from scheduler_extender.cache import ClusterCache
        from scheduler_extender.sources import ClusterSource
        from scheduler_extender.watch import ClusterWatch
        try:
            if args.kubeconfig:
                config.load_kube_config(config_file=args.kubeconfig)
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
        except Exception as e:  # noqa: BLE001 - report any config problem the same way
            print(f"gpuplace-extender: no cluster configuration ({type(e).__name__}: {e}); "
                  "pass --kubeconfig FILE, run in a pod, or use --inventory-dir DIR for static mode",
                  file=sys.stderr)
            return 2
        cache = ClusterCache(catalog)
        source = ClusterSource(cache, catalog)
        watch = ClusterWatch(client.ApiClient(), cache, on_relist=lambda kind: metrics.relists.labels(kind).inc(),
                             watch_timeout_seconds=args.watch_timeout_seconds)
        watch.start()

    service = ExtenderService(engine, source, metrics)
    if args.policy:
        PolicyWatcher(args.policy, service, metrics, args.policy_poll_seconds).start()

    import uvicorn
    log.info("gpuplace-extender listening on %s://%s:%d (%s mode)", "https" if ssl_options else "http",
             args.host, args.port, "static" if args.inventory_dir else "cluster")
    uvicorn.run(create_app(service), host=args.host, port=args.port, log_level="warning", access_log=False,
                **ssl_options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
