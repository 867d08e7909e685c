"""Allocations from the kubelet PodResources API: wire format, mapping to GPUs, the gRPC client."""

from __future__ import annotations

import logging

import pytest

from node_agent.podresources import (
    LIST_METHOD,
    DeviceAllocation,
    PodResourcesClient,
    WireError,
    _encode_varint,
    _ld,
    apply_allocations,
    decode_list_response,
    encode_list_response,
)
from tests.node_agent.agent_fixtures import A100_MIG, A100_NVSWITCH, fake_from, fixture_data, probe_of

MIG0 = "MIG-0929581a-2be6-5dec-bf34-0954c6c529a6"
MIG1 = "MIG-3adbed3a-d03d-549f-a016-ba1fd7359f23"


def alloc(ns, pod, device, resource="nvidia.com/gpu", container="main"):
    return DeviceAllocation(ns, pod, container, resource, device)


def test_list_response_round_trips_through_the_wire_format():
    allocations = [
        alloc("ml", "train-0", "GPU-a", container="trainer"),
        alloc("ml", "train-0", "GPU-b", container="trainer"),
        alloc("infer", "llm-0", MIG0, resource="nvidia.com/mig-3g.40gb"),
        alloc("kube-system", "nic", "0000:3b:00.1", resource="intel.com/sriov"),
    ]
    assert decode_list_response(encode_list_response(allocations)) == allocations


def test_fields_of_newer_kubelets_are_skipped():
    device = _ld(1, b"nvidia.com/gpu") + _ld(2, b"GPU-a") + _ld(3, _ld(1, b"\x08\x00"))  # + topology
    container = _ld(1, b"main") + _ld(2, device) + _ld(3, b"\x01\x02\x03")  # + packed cpu_ids
    container += bytes([0x20]) + _encode_varint(7)  # an unknown varint field 4
    pod = _ld(1, b"p") + _ld(2, b"ns") + _ld(3, container)
    assert decode_list_response(_ld(1, pod)) == [alloc("ns", "p", "GPU-a")]


def test_truncated_bytes_are_a_wire_error():
    with pytest.raises(WireError):
        decode_list_response(encode_list_response([alloc("ns", "p", "GPU-a")])[:-3])


def test_allocations_name_the_pod_on_the_gpus_and_mig_devices_it_holds():
    nvswitch = probe_of(fake_from(fixture_data(A100_NVSWITCH))).probe()
    u = [g.uuid for g in nvswitch.gpus]
    got = apply_allocations(nvswitch, [
        alloc("ml", "train-0", u[0]),
        alloc("ml", "train-0", u[1]),
        alloc("ml", "shared-a", f"{u[2]}::0"),  # time-slicing replicas of one GPU
        alloc("ml", "shared-b", f"{u[2]}::1"),
        alloc("ml", "by-index", "5"),  # DEVICE_ID_STRATEGY=index
        alloc("net", "sriov", u[6], resource="intel.com/sriov"),  # not an NVIDIA resource
    ])
    assert [g.allocated_to for g in got.gpus] == [
        "ml/train-0", "ml/train-0", "ml/shared-a,ml/shared-b", "", "", "ml/by-index", "", ""]

    mig = probe_of(fake_from(fixture_data(A100_MIG))).probe()
    got = apply_allocations(mig, [alloc("infer", "llm-0", MIG1, resource="nvidia.com/mig-3g.40gb")])
    assert [m.allocated_to for m in got.gpus[0].mig_devices] == ["", "infer/llm-0"]
    assert got.gpus[0].allocated_to == ""


def test_allocations_that_ended_are_cleared():
    inv = probe_of(fake_from(fixture_data(A100_MIG))).probe()
    held = apply_allocations(inv, [alloc("infer", "llm-0", MIG0, resource="nvidia.com/mig-3g.40gb")])
    assert held.gpus[0].mig_devices[0].allocated_to == "infer/llm-0"
    assert apply_allocations(held, []).gpus[0].mig_devices[0].allocated_to == ""


def test_an_absent_socket_leaves_allocations_unknown_and_is_logged_once(tmp_path, caplog):
    client = PodResourcesClient(tmp_path / "kubelet.sock")
    with caplog.at_level(logging.INFO, logger="node_agent.podresources"):
        assert client.allocations() is None
        assert client.allocations() is None
    assert len([r for r in caplog.records if "PodResources socket" in r.getMessage()]) == 1


def test_the_client_lists_allocations_from_a_kubelet_on_a_unix_socket(tmp_path):
    grpc = pytest.importorskip("grpc", reason="grpcio is optional and not installed here")
    from concurrent import futures

    allocations = [alloc("infer", "llm-0", MIG0, resource="nvidia.com/mig-3g.40gb")]
    seen: list[bytes] = []

    def list_handler(request: bytes, context) -> bytes:
        seen.append(request)
        return encode_list_response(allocations)

    service, method = LIST_METHOD.strip("/").split("/")
    handler = grpc.method_handlers_generic_handler(service, {
        method: grpc.unary_unary_rpc_method_handler(list_handler, request_deserializer=None, response_serializer=None),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    sock = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        client = PodResourcesClient(sock, timeout_seconds=5)
        assert client.allocations() == allocations
        assert seen == [b""]
        client.close()
    finally:
        server.stop(None)
