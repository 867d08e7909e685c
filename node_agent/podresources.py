"""Which pod holds which GPU: the kubelet PodResources API, read over its unix socket.

The kubelet serves ``v1.PodResourcesLister/List`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``
(kubernetes ``staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``). Each container's
devices are listed by resource name and device id; with the NVIDIA device plugin the ids of
``nvidia.com/gpu`` are GPU UUIDs (``GPU-...``; ``GPU-...::N`` with time-slicing, or the index with
``DEVICE_ID_STRATEGY=index``) and those of ``nvidia.com/mig-*`` MIG UUIDs. The agent copies
``namespace/pod`` into ``allocatedTo`` of the matching GPU or MIG device, so the extender knows
which GPUs are free, not only how many.

This is optional: without ``grpcio`` or without the socket mounted, allocations stay empty and
that is logged once. The messages are encoded by hand (a few lines of protobuf wire format), so
there is no code generation step and no protobuf dependency; unknown fields (``cpu_ids``,
``memory``, ``topology``, ``dynamic_resources`` of newer kubelets) are skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from node_agent.inventory import GPU, NodeGPUInventory

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
NVIDIA_RESOURCE_PREFIX = "nvidia.com/"


@dataclass(frozen=True)
class DeviceAllocation:
    """One device id held by one container."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_id: str

    @property
    def holder(self) -> str:
        return f"{self.namespace}/{self.pod}"


# ---- protobuf wire format (https://protobuf.dev/programming-guides/encoding/) -----------------


class WireError(ValueError):
    """Bytes that are not the expected protobuf message."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def _fields(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of each field; length-delimited values as bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise WireError("truncated length-delimited field")
            yield number, wire, data[pos : pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire}")


def _str(value: bytes | int) -> str:
    if not isinstance(value, bytes):
        raise WireError("expected a string")
    return value.decode("utf-8")


def decode_list_response(data: bytes) -> list[DeviceAllocation]:
    """Every device id of a ``ListPodResourcesResponse``."""
    out: list[DeviceAllocation] = []
    for number, _, pod_bytes in _fields(data):
        if number != 1 or not isinstance(pod_bytes, bytes):  # pod_resources = 1
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for n, _, v in _fields(pod_bytes):
            if n == 1:
                name = _str(v)
            elif n == 2:
                namespace = _str(v)
            elif n == 3 and isinstance(v, bytes):
                containers.append(v)
        for c in containers:
            cname = ""
            devices: list[bytes] = []
            for n, _, v in _fields(c):
                if n == 1:
                    cname = _str(v)
                elif n == 2 and isinstance(v, bytes):
                    devices.append(v)
            for d in devices:
                resource = ""
                ids: list[str] = []
                for n, _, v in _fields(d):
                    if n == 1:
                        resource = _str(v)
                    elif n == 2:
                        ids.append(_str(v))
                out.extend(DeviceAllocation(namespace, name, cname, resource, i) for i in ids)
    return out


def _key(number: int, wire: int) -> bytes:
    return _encode_varint(number << 3 | wire)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _ld(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _encode_varint(len(payload)) + payload


def encode_list_response(allocations: list[DeviceAllocation]) -> bytes:
    """A ``ListPodResourcesResponse`` holding these allocations (for fake kubelets in tests)."""
    pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
    for a in allocations:
        pods.setdefault((a.namespace, a.pod), {}).setdefault(a.container, {}).setdefault(a.resource_name, []).append(a.device_id)
    out = b""
    for (namespace, pod), containers in pods.items():
        body = _ld(1, pod.encode()) + _ld(2, namespace.encode())
        for cname, resources in containers.items():
            cbody = _ld(1, cname.encode())
            for resource, ids in resources.items():
                cbody += _ld(2, _ld(1, resource.encode()) + b"".join(_ld(2, i.encode()) for i in ids))
            body += _ld(3, cbody)
        out += _ld(1, body)
    return out


# ---- client -----------------------------------------------------------------------------------


class PodResourcesClient:
    """Lists device allocations from the kubelet; ``None`` when the API is not reachable."""

    def __init__(self, socket_path: str | Path = DEFAULT_SOCKET, *, timeout_seconds: float = 5.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout_seconds = timeout_seconds
        self._logged: set[str] = set()
        self._channel: Any = None
        self._list: Any = None

    def _once(self, key: str, level: int, message: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, message, *args)

    def allocations(self) -> list[DeviceAllocation] | None:
        if not self.socket_path.exists():
            self._once("socket", logging.INFO, "no kubelet PodResources socket at %s: GPU allocations are not reported",
                       self.socket_path)
            return None
        try:
            import grpc
        except ImportError:
            self._once("grpc", logging.INFO, "grpcio is not installed: GPU allocations (allocatedTo) are not reported")
            return None
        if self._list is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
            self._list = self._channel.unary_unary(
                LIST_METHOD,
                request_serializer=lambda request: request,  # ListPodResourcesRequest is empty: b""
                response_deserializer=lambda raw: raw,
            )
        try:
            raw = self._list(b"", timeout=self.timeout_seconds)
            result = decode_list_response(raw)
        except grpc.RpcError as e:
            self._once(f"rpc:{e.code()}", logging.WARNING, "kubelet PodResources List failed: %s (logged once per code)", e)
            return None
        except (WireError, UnicodeDecodeError) as e:
            self._once("wire", logging.WARNING, "kubelet PodResources answer not understood: %s", e)
            return None
        self._logged.discard("socket")
        return result

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
            self._list = None


def apply_allocations(inventory: NodeGPUInventory, allocations: list[DeviceAllocation]) -> NodeGPUInventory:
    """The inventory with ``allocatedTo`` set from the kubelet's allocations (replacing any old
    values). A GPU shared by several pods (time-slicing) lists them, comma-separated."""
    holders: dict[str, set[str]] = {}
    by_index = {str(g.index): g.uuid for g in inventory.gpus}
    for a in allocations:
        if not a.resource_name.startswith(NVIDIA_RESOURCE_PREFIX):
            continue
        device = a.device_id.split("::", 1)[0]  # time-slicing replicas: GPU-uuid::3
        device = by_index.get(device, device)  # DEVICE_ID_STRATEGY=index
        holders.setdefault(device, set()).add(a.holder)

    def holder_of(uuid: str) -> str:
        return ",".join(sorted(holders.get(uuid, ())))

    gpus: list[GPU] = []
    for gpu in inventory.gpus:
        migs = [m.model_copy(update={"allocated_to": holder_of(m.uuid)}) for m in gpu.mig_devices]
        gpus.append(gpu.model_copy(update={"allocated_to": holder_of(gpu.uuid), "mig_devices": migs}))
    return inventory.model_copy(update={"gpus": gpus})
