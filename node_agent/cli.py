"""``gpuplace-agent``: read this node's GPUs and publish them on its Node."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

from node_agent.agent import Agent, Probe
from node_agent.inventory import InventoryError, NodeGPUInventory
from node_agent.metrics import InventorySnapshot, build_registry
from node_agent.podresources import DEFAULT_SOCKET, PodResourcesClient
from node_agent.version import add_version_argument

if TYPE_CHECKING:
    from node_agent.probing import MigStrategy  # noqa: F401  (the casts' type)

log = logging.getLogger("gpuplace-agent")

EXIT_OK = 0
EXIT_PUBLISH_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_DRIVER = 3

EPILOG = f"""\
examples:
  # print what the GPUs of this node are (NVIDIA through NVML, else AMD through AMD SMI), touch nothing
  gpuplace-agent --once --print
  # replay an inventory file, no cluster needed
  gpuplace-agent --probe fake --fake-inventory examples/cluster/gpu-a100-0.json --once --print
  # publish it once on the Node, then exit
  gpuplace-agent --probe fake --fake-inventory node.json --once --kubeconfig ~/.kube/config
  # the DaemonSet: probe every 30 s, publish on change and every 60 s, /metrics on :9400
  gpuplace-agent

exit codes:
  {EXIT_OK}  success
  {EXIT_PUBLISH_FAILED}  publishing failed (--once: not patched within --publish-timeout-seconds)
  {EXIT_USAGE}  bad arguments, unreadable or invalid inventory/fixture file, no cluster config,
     --probe fake-nvml / fake-amdsmi without the gpuplace-testing package
  {EXIT_NO_DRIVER}  no usable GPU driver, neither NVIDIA (NVML) nor AMD (AMD SMI) (see --keep-running-without-driver)
"""


class UsageError(Exception):
    """An expected, user-fixable error: printed as one line, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuplace-agent",
        description="Read what each GPU of this node really is (model, VRAM, MIG devices, NVLink peers, "
        "ECC, bandwidth, health) and publish it on the Node as the gpuplace.io/inventory annotation "
        "and gpuplace.io/* labels, for the gpuplace scheduler extender.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version_argument(p)
    src = p.add_argument_group("what to read")
    src.add_argument("--probe", choices=["auto", "nvml", "amd", "fake", "fake-nvml", "fake-amdsmi"], default="auto",
                     help="auto: NVIDIA GPUs through NVML if the NVIDIA driver is there and sees GPUs, else AMD GPUs "
                     "through AMD SMI (default); nvml: the NVIDIA driver only; amd: AMD SMI only (the amdsmi package, "
                     "pip install 'gpuplace[amd]', and ROCm's libamd_smi.so); fake: replay --fake-inventory; "
                     "fake-nvml / fake-amdsmi: run the NVML / AMD SMI code against a recorded --nvml-fixture / "
                     "--amdsmi-fixture (test doubles: they need the gpuplace-testing package, "
                     "pip install 'gpuplace[testing]')")
    src.add_argument("--fake-inventory", metavar="FILE", help="NodeGPUInventory file (JSON or YAML) for --probe fake")
    src.add_argument("--nvml-fixture", metavar="FILE", help="NVML scenario (YAML, tests/fixtures/nvml/) for --probe fake-nvml: the real pynvml over the stand-in libnvidia-ml")
    src.add_argument("--amdsmi-fixture", metavar="FILE",
                     help="fake AMD SMI fixture (YAML, tests/fixtures/amdsmi/) for --probe fake-amdsmi")
    src.add_argument("--node-name", default=None,
                     help="the Node to publish on (default: $NODE_NAME, else the host name; "
                     "with --probe fake, else the file's nodeName)")
    src.add_argument("--mig-strategy", choices=["none", "single", "mixed"], default=None,
                     help="how the NVIDIA device plugin exposes MIG devices, recorded in the inventory "
                     "(default: left out, and the extender reads it from the Node: the GPU feature "
                     "discovery label nvidia.com/mig.strategy, else the MIG resources it advertises; "
                     "with --probe fake, the file's)")
    src.add_argument("--ignore-xids", metavar="LIST", type=_ignored_xids, default=None,
                     help="NVIDIA only: XIDs that leave a GPU healthy: '' = the device plugin's application XIDs "
                     "13,31,43,45,68,109 (default); '48,79' adds to them; '=13,31' exactly these; "
                     "'all' turns XID health off")
    src.add_argument("--xid-recovery-seconds", type=float, default=0.0, metavar="S",
                     help="a GPU or MIG device with no critical XID for S seconds is healthy again as far as XIDs "
                     "go (default 0: until the driver is reloaded or the agent restarts)")
    src.add_argument("--keep-running-without-driver", action="store_true",
                     help="when no GPU driver is usable, report zero GPUs instead of exiting")
    src.add_argument("--pod-resources-socket", metavar="PATH", default=DEFAULT_SOCKET,
                     help=f"kubelet PodResources socket for allocatedTo (default {DEFAULT_SOCKET}; "
                     "skipped when absent or grpcio is not installed)")
    run = p.add_argument_group("how to run")
    run.add_argument("--once", action="store_true", help="probe (and publish) once, then exit")
    run.add_argument("--print", action="store_true", dest="print_inventory",
                     help="print the inventory as indented JSON on stdout after each probe")
    run.add_argument("--interval-seconds", type=_positive, default=30.0, help="probe interval (default 30)")
    run.add_argument("--metrics-port", type=int, default=9400, help="port of /metrics (default 9400; 0 disables)")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default info")
    pub = p.add_argument_group("where to publish")
    pub.add_argument("--kubeconfig", metavar="FILE",
                     help="kubeconfig to reach the API server (default: in-cluster config). "
                     "--once --print without --kubeconfig does not publish")
    pub.add_argument("--no-publish", action="store_true", help="never patch the Node (probe, print and serve /metrics only)")
    pub.add_argument("--heartbeat-seconds", type=_positive, default=60.0,
                     help="republish an unchanged inventory this often, so the extender (staleness limit "
                     "300 s by default) knows the agent is alive (default 60)")
    pub.add_argument("--publish-timeout-seconds", type=_positive, default=30.0,
                     help="with --once: give up publishing after this long, exit 1 (default 30)")
    return p


def _ignored_xids(text: str) -> frozenset[int] | str:
    from node_agent.nvml import parse_ignored_xids

    try:
        found = parse_ignored_xids(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--ignore-xids: ")) from e
    return "all" if found is None else found


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def resolve_node_name(args: argparse.Namespace) -> str | None:
    """--node-name, else $NODE_NAME, else (not for the fake probe, whose file may name it) the host name."""
    name = args.node_name or os.environ.get("NODE_NAME") or None
    if name is None and args.probe != "fake":
        name = socket.gethostname()
    return name


def build_probe(args: argparse.Namespace, node_name: str | None) -> Probe:
    if args.probe == "fake":
        if not args.fake_inventory:
            raise UsageError("--probe fake needs --fake-inventory FILE")
        from node_agent.fake import FakeProbe

        return FakeProbe(args.fake_inventory, node_name=node_name, mig_strategy=args.mig_strategy)
    assert node_name is not None
    if args.probe in ("fake-nvml", "fake-amdsmi"):
        nvml = args.probe == "fake-nvml"
        path, flag = (args.nvml_fixture, "--nvml-fixture") if nvml else (args.amdsmi_fixture, "--amdsmi-fixture")
        load_fixture = _test_probe_loader(args.probe)
        if not path:
            raise UsageError(f"--probe {args.probe} needs {flag} FILE")
        try:
            standin = load_fixture(path)
        except ValueError as e:  # gpuplace_testing's FixtureError: the file and the field named
            raise UsageError(str(e)) from e
        make = _nvml_probe if nvml else _amd_probe
        return make(args, node_name, library=standin, numa_lookup=standin.numa_affinity)
    if args.probe == "nvml":
        return _nvml_probe(args, node_name)
    if args.probe == "amd":
        return _amd_probe(args, node_name)
    from node_agent.auto import AutoProbe

    return AutoProbe(nvml=lambda: _nvml_probe(args, node_name), amd=lambda: _amd_probe(args, node_name))


TEST_PROBES_GROUP = "gpuplace.agent_probes"
"""Entry point group of the probes that run over test doubles (``--probe fake-nvml``,
``fake-amdsmi``): each name's object turns a scenario file into the stand-in library the NVML or
AMD SMI probe runs over, raising ``ValueError`` naming the file and field for a bad one. The
``gpuplace-testing`` distribution (the repository's ``testing/``, ``gpuplace_testing.fake_nvml``
and ``gpuplace_testing.fake_amdsmi``) declares them; the product never imports it."""


def _test_probe_loader(probe: str) -> Callable[[str], Any]:
    """The scenario loader of ``--probe fake-nvml`` / ``fake-amdsmi``, from the entry point group
    ``TEST_PROBES_GROUP``; a ``UsageError`` naming the fix when gpuplace-testing is not installed."""
    from importlib.metadata import entry_points

    found = entry_points(group=TEST_PROBES_GROUP, name=probe)
    if not found:
        raise UsageError(f"--probe {probe} needs the gpuplace-testing package: pip install 'gpuplace[testing]'")
    entry = sorted(found, key=lambda e: e.value)[0]
    try:
        loaded = entry.load()
    except Exception as e:  # a broken install: say which, without a traceback
        raise UsageError(f"--probe {probe}: the gpuplace-testing package is installed but its {entry.value} "
                         f"cannot be loaded ({type(e).__name__}: {e}); reinstall it: pip install 'gpuplace[testing]'") from e
    if not callable(loaded):
        raise UsageError(f"--probe {probe}: entry point {entry.value} of group {TEST_PROBES_GROUP} is not callable")
    return cast("Callable[[str], Any]", loaded)


def _nvml_probe(args: argparse.Namespace, node_name: str, **kwargs: Any) -> Probe:
    from node_agent.nvml import NVMLProbe

    return NVMLProbe(node_name=node_name, mig_strategy=cast("MigStrategy | None", args.mig_strategy),
                     **_xid_options(args), **kwargs)


def _amd_probe(args: argparse.Namespace, node_name: str, **kwargs: Any) -> Probe:
    from node_agent.amd import AMDProbe

    return AMDProbe(node_name=node_name, mig_strategy=cast("MigStrategy | None", args.mig_strategy), **kwargs)


def _xid_options(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"xid_recovery_seconds": max(0.0, args.xid_recovery_seconds)}
    if args.ignore_xids is not None:
        out["ignored_xids"] = None if args.ignore_xids == "all" else args.ignore_xids
    return out


class _DriverlessProbe:
    """--keep-running-without-driver: zero GPUs while the driver is unusable; retries it each probe,
    so a driver installed later is picked up without a restart."""

    def __init__(self, inner: Probe, node_name: str, mig_strategy: Any) -> None:
        self.inner = inner
        self.node_name = node_name
        self.mig_strategy = mig_strategy
        self._warned = False

    def probe(self) -> NodeGPUInventory:
        from node_agent.probing import DriverUnavailable, unavailable_inventory

        try:
            return self.inner.probe()
        except DriverUnavailable as e:
            if not self._warned:
                log.warning("%s; reporting zero GPUs (--keep-running-without-driver)", e)
                self._warned = True
            return unavailable_inventory(self.node_name, self.mig_strategy)


def build_core_v1(kubeconfig: str | None) -> Any:
    """A CoreV1Api from --kubeconfig, else from the in-cluster ServiceAccount."""
    import yaml
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        if kubeconfig:
            return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.CoreV1Api(client.ApiClient(configuration))
    except (ConfigException, OSError, ValueError, TypeError, yaml.YAMLError) as e:  # YAMLError: not YAML at all
        if kubeconfig:
            raise UsageError(f"cannot use kubeconfig {kubeconfig}: {e}") from e
        raise UsageError(
            "not running in a cluster (no in-cluster ServiceAccount config) and no --kubeconfig given: "
            "pass --kubeconfig FILE, or --no-publish / --once --print to only read the GPUs"
        ) from e


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _run(args)
    except UsageError as e:
        print(f"gpuplace-agent: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from node_agent.probing import DriverUnavailable

    node_name = resolve_node_name(args)
    probe = build_probe(args, node_name)
    if args.keep_running_without_driver and args.probe != "fake":
        probe = _DriverlessProbe(probe, node_name or "", args.mig_strategy)

    publish = not args.no_publish and not (args.once and args.print_inventory and not args.kubeconfig)
    snapshot = InventorySnapshot()
    registry, metrics = build_registry(snapshot)

    def show(inventory: NodeGPUInventory) -> None:
        if args.print_inventory:
            print(json.dumps(inventory.to_dict(), indent=2), flush=True)

    # The first probe runs before anything else, so a bad file or a missing driver is reported at
    # once with a clear message instead of as a failure inside the loop.
    try:
        first = probe.probe()
    except InventoryError as e:
        raise UsageError(str(e)) from e
    except DriverUnavailable as e:
        print(f"gpuplace-agent: {e}. Use --keep-running-without-driver to report zero GPUs instead.", file=sys.stderr)
        return EXIT_NO_DRIVER

    publisher = None
    if publish:
        from node_agent.publish import NodePublisher

        name = node_name or first.node_name
        publisher = NodePublisher(build_core_v1(args.kubeconfig), name,
                                  heartbeat_seconds=args.heartbeat_seconds, metrics=metrics)
    pod_resources = PodResourcesClient(args.pod_resources_socket) if args.pod_resources_socket else None
    agent = Agent(_Replay(first, probe), snapshot=snapshot, metrics=metrics, publisher=publisher,
                  pod_resources=pod_resources, interval_seconds=args.interval_seconds, on_inventory=show)

    if args.once:
        inventory = agent.probe_once()
        if inventory is None:
            return EXIT_USAGE
        if publisher is not None:
            from node_agent.publish import PublishError

            try:
                publisher.publish_until(args.publish_timeout_seconds)
            except PublishError as e:
                print(f"gpuplace-agent: {e}", file=sys.stderr)
                return EXIT_PUBLISH_FAILED
            log.info("published the inventory of node %s (%d GPUs)", publisher.node_name, len(inventory.gpus))
        return EXIT_OK

    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, registry=registry)
        log.info("serving /metrics on :%d", args.metrics_port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("probing every %g s with the %s probe%s", args.interval_seconds, args.probe,
             f", publishing on node {publisher.node_name}" if publisher else " (not publishing)")
    agent.run(stop)
    return EXIT_OK


class _Replay:
    """Hands out an already taken first probe once, then probes for real (no double probe at start)."""

    def __init__(self, first: NodeGPUInventory, probe: Probe) -> None:
        self._first: NodeGPUInventory | None = first
        self._probe = probe

    def probe(self) -> NodeGPUInventory:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return self._probe.probe()


if __name__ == "__main__":
    raise SystemExit(main())
