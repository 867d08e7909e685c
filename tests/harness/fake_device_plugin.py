"""A fake GPU device plugin: TEST DOUBLE for the NVIDIA device plugin on a node without GPUs.

It speaks the kubelet's device-plugin API (``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1``,
``api.proto``) for real: it registers each resource with the kubelet over
``<plugin dir>/kubelet.sock`` and serves ``ListAndWatch``/``Allocate`` on a socket of its own in
the same directory. The devices it advertises are the ones a ``NodeGPUInventory`` file describes,
named as the NVIDIA device plugin names them with its ``mixed`` MIG strategy:

* a GPU without MIG -> one ``nvidia.com/gpu`` device whose id is the GPU UUID;
* each MIG device -> one ``nvidia.com/mig-<profile>`` device whose id is the MIG UUID.

So the kubelet admits GPU pods by those counts, writes ``status.allocatable``, and its
PodResources API reports which device id each container holds, which is what the node agent
turns into ``allocatedTo``. ``Allocate`` answers like the NVIDIA plugin's envvar strategy
(``NVIDIA_VISIBLE_DEVICES=<ids>``); no device node is mounted, since there is none.

Run it inside the node's mount namespace::

    python -m tests.harness.fake_device_plugin --inventory inv.json --plugin-dir /var/lib/kubelet/device-plugins

It re-registers when the kubelet restarts (the kubelet removes every socket in the directory
at start and creates ``kubelet.sock`` anew), and exits on SIGTERM.

Messages are protobuf encoded by hand with the helpers of :mod:`node_agent.podresources` (the
same wire format), so no generated code is needed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import signal
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from node_agent.podresources import _fields, _ld, _str

log = logging.getLogger("fake-device-plugin")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"


def resources_of(inventory: dict[str, Any]) -> dict[str, list[str]]:
    """Resource name -> device ids, as the NVIDIA device plugin's ``mixed`` MIG strategy names them."""
    out: dict[str, list[str]] = {}
    for gpu in inventory.get("gpus", []):
        if gpu.get("vendor", "nvidia") != "nvidia" or not gpu.get("healthy", True):
            continue
        if gpu.get("migEnabled"):
            for mig in gpu.get("migDevices", []):
                profile = str(mig["profile"]).replace("+", ".")
                out.setdefault(f"nvidia.com/mig-{profile}", []).append(mig["uuid"])
        else:
            out.setdefault("nvidia.com/gpu", []).append(gpu["uuid"])
    return out


# ---- messages of api.proto ---------------------------------------------------------------------


def encode_register_request(endpoint: str, resource_name: str) -> bytes:
    """``RegisterRequest{version, endpoint, resource_name, options{}}``."""
    return _ld(1, API_VERSION.encode()) + _ld(2, endpoint.encode()) + _ld(3, resource_name.encode()) + _ld(4, b"")


def encode_list_and_watch_response(device_ids: list[str]) -> bytes:
    """``ListAndWatchResponse{devices: [Device{ID, health}]}``."""
    return b"".join(_ld(1, _ld(1, d.encode()) + _ld(2, HEALTHY.encode())) for d in device_ids)


def decode_allocate_request(data: bytes) -> list[list[str]]:
    """``AllocateRequest`` -> the device ids of each ``ContainerAllocateRequest``."""
    return [[_str(v) for n, _, v in _fields(c) if n == 1]
            for number, _, c in _fields(data) if number == 1 and isinstance(c, bytes)]


def encode_allocate_response(containers: list[list[str]]) -> bytes:
    """``AllocateResponse``: per container, ``envs{NVIDIA_VISIBLE_DEVICES: ids}`` (map entry = key 1, value 2)."""
    out = b""
    for ids in containers:
        entry = _ld(1, b"NVIDIA_VISIBLE_DEVICES") + _ld(2, ",".join(ids).encode())
        out += _ld(1, _ld(1, entry))
    return out


def _identity(b: bytes) -> bytes:
    return b


# ---- one resource ------------------------------------------------------------------------------


class ResourcePlugin:
    """The ``DevicePlugin`` service for one resource name, on ``<plugin dir>/<endpoint>``."""

    def __init__(self, plugin_dir: Path, resource_name: str, device_ids: list[str]) -> None:
        self.plugin_dir, self.resource_name, self.device_ids = plugin_dir, resource_name, device_ids
        self.endpoint = "gpuplace-fake-" + resource_name.replace("/", "_").replace(".", "-") + ".sock"
        self.server: grpc.Server | None = None
        self._stop = threading.Event()
        self.allocations: queue.SimpleQueue[list[list[str]]] = queue.SimpleQueue()

    def _options(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return b""  # DevicePluginOptions{}: no PreStartContainer, no preferred allocation

    def _list_and_watch(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        yield encode_list_and_watch_response(self.device_ids)
        while not self._stop.wait(1.0) and context.is_active():
            pass  # the devices never change; the stream stays open as the kubelet expects

    def _allocate(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        containers = decode_allocate_request(request)
        unknown = sorted({i for ids in containers for i in ids} - set(self.device_ids))
        if unknown:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown {self.resource_name} devices: {unknown}")
        log.info("allocate %s: %s", self.resource_name, containers)
        return encode_allocate_response(containers)

    def _pre_start(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return b""

    def serve(self) -> None:
        self._stop.clear()  # served again after a kubelet restart
        sock = self.plugin_dir / self.endpoint
        sock.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(self._options, _identity, _identity),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(self._list_and_watch, _identity, _identity),
            "Allocate": grpc.unary_unary_rpc_method_handler(self._allocate, _identity, _identity),
            "PreStartContainer": grpc.unary_unary_rpc_method_handler(self._pre_start, _identity, _identity),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(f"{API_VERSION}.DevicePlugin", handlers),))
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        self.server = server

    def register(self) -> None:
        with grpc.insecure_channel(f"unix://{self.plugin_dir / KUBELET_SOCKET}") as channel:
            call = channel.unary_unary(f"/{API_VERSION}.Registration/Register", _identity, _identity)
            call(encode_register_request(self.endpoint, self.resource_name), timeout=10)
        log.info("registered %s (%d devices) at %s", self.resource_name, len(self.device_ids), self.endpoint)

    def stop(self) -> None:
        self._stop.set()
        if self.server is not None:
            self.server.stop(grace=1).wait()
            self.server = None


def _kubelet_socket_id(plugin_dir: Path) -> tuple[int, float] | None:
    try:
        st = (plugin_dir / KUBELET_SOCKET).stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime


def run(inventory_path: Path, plugin_dir: Path, stop: threading.Event) -> None:
    """Serve and register every resource of the inventory until ``stop``; re-register after a kubelet restart."""
    inventory = json.loads(inventory_path.read_text())
    plugins = [ResourcePlugin(plugin_dir, name, ids) for name, ids in sorted(resources_of(inventory).items())]
    registered_with: tuple[int, float] | None = None
    try:
        while not stop.is_set():
            kubelet = _kubelet_socket_id(plugin_dir)
            if kubelet is not None and kubelet != registered_with:
                try:
                    for p in plugins:
                        p.stop()
                        p.serve()
                        p.register()
                    registered_with = kubelet
                except grpc.RpcError as exc:
                    log.warning("registration failed, retrying: %s", exc)
            stop.wait(0.5)
    finally:
        for p in plugins:
            p.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fake_device_plugin", description=__doc__.split("\n\n")[0])
    parser.add_argument("--inventory", type=Path, required=True, help="NodeGPUInventory JSON file")
    parser.add_argument("--plugin-dir", type=Path, default=Path("/var/lib/kubelet/device-plugins"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("pid %d, inventory %s, plugin dir %s", os.getpid(), args.inventory, args.plugin_dir)
    run(args.inventory, args.plugin_dir, stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
