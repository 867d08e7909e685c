"""A pod's requests are Kubernetes' own: containers and sidecars summed, the max with each regular
init container (beside the sidecars before it), pod-level CPU and memory, plus overhead.

The first table is taken from the cases of ``TestPodResourceRequests`` and
``TestPodLevelResourceRequests`` in ``k8s.io/component-helpers/resource/helpers_test.go`` (v0.34.4,
the module kube-scheduler v1.34.4 is built with), with the options kube-scheduler uses (overhead
included, status resources not read, pod-level resources on). CPU is in millicores, memory in bytes.
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_extender.core.engine import Engine
from scheduler_extender.core.pod import as_pod
from scheduler_extender.core.pod_requests import pod_requests
from tests.factories import pod

MI = 2**20


def _c(cpu: str | None = None, memory: str | None = None, *, sidecar: bool = False, limits: bool = False,
       **other: str) -> dict[str, Any]:
    values = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    values.update({k.replace("_", "/").replace("nvidia/com", "nvidia.com"): v for k, v in other.items()})
    c: dict[str, Any] = {"name": "c", "resources": {"limits" if limits else "requests": values}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def _pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] = (), pod_level: dict[str, Any] | None = None,
         overhead: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers), "initContainers": list(init)}
    if pod_level is not None:
        spec["resources"] = pod_level
    if overhead is not None:
        spec["overhead"] = overhead
    return {"metadata": {"name": "p", "namespace": "default"}, "spec": spec}


KUBERNETES_CASES = [
    # TestPodResourceRequests
    ("nil options, larger init container", _pod([_c("1")], [_c("4")]), (4000, None)),
    ("nil options, larger containers", _pod([_c("2"), _c("3")], [_c("2")]), (5000, None)),
    ("pod overhead included", _pod([_c("2"), _c("3")], [_c("2")], overhead={"cpu": "1", "memory": "1Gi"}),
     (6000, 1024 * MI)),
    ("restartable init container", _pod([_c("1")], [_c("1", sidecar=True)]), (2000, None)),
    ("multiple restartable init containers",
     _pod([_c("1")], [_c("5"), _c("1", sidecar=True), _c("2", sidecar=True), _c("3", sidecar=True)]), (7000, None)),
    ("multiple restartable and regular init containers",
     _pod([_c("1")], [_c("5"), _c("1", sidecar=True), _c("2", sidecar=True), _c("5"), _c("3", sidecar=True)]),
     (8000, None)),
    ("restartable-init, init and regular", _pod([_c("100")], [_c("10", sidecar=True), _c("200")]), (210000, None)),
    # TestPodLevelResourceRequests
    ("nil", _pod([]), (None, None)),
    ("pod level memory resource", _pod([], pod_level={"requests": {"memory": "2Mi"}}), (None, 2 * MI)),
    ("pod level memory and container level cpu resources",
     _pod([_c("2m")], pod_level={"requests": {"memory": "2Mi"}}), (2, 2 * MI)),
    ("pod level unsupported resources set at pod-level",
     _pod([_c(memory="3Mi")], pod_level={"requests": {"storage": "2Mi"}}), (None, 3 * MI)),
    ("both container-level and pod-level resources set",
     _pod([_c("2m", "3Mi")], pod_level={"requests": {"memory": "6Mi", "cpu": "8m"}}), (8, 6 * MI)),
    ("container-level resources and init container set",
     _pod([_c("2m", "3Mi")], [_c("4m", "5Mi")]), (4, 5 * MI)),
    ("container-level resources and sidecar container set",
     _pod([_c("2m", "3Mi")], [_c("4m", "5Mi", sidecar=True)]), (6, 8 * MI)),
    ("container-level resources, init and sidecar container set",
     _pod([_c("2m", "3Mi")], [_c("4m", "5Mi", sidecar=True), _c("8m", "6Mi")]), (12, 11 * MI)),
    ("pod-level resources, container-level resources, init and sidecar container set",
     _pod([_c("2m", "3Mi")], [_c("4m", "5Mi", sidecar=True), _c("8m", "6Mi")],
          pod_level={"requests": {"memory": "15Mi", "cpu": "18m"}}), (18, 15 * MI)),
]


@pytest.mark.parametrize("case, p, expected", KUBERNETES_CASES, ids=[c[0] for c in KUBERNETES_CASES])
def test_host_requests_equal_kubernetes_pod_requests(case, p, expected):
    r = pod_requests(p)
    assert (r.cpu_milli, r.memory_bytes) == expected
    assert r.errors == ()


def test_a_gpu_sidecar_adds_its_gpu_to_the_app_containers():
    r = pod_requests(_pod([_c(nvidia_com_gpu="1", limits=True)], [_c(nvidia_com_gpu="1", limits=True, sidecar=True)]))
    assert dict(r.gpu) == {"nvidia.com/gpu": 2}


def test_a_regular_init_container_needs_its_gpus_beside_the_sidecars_started_before_it():
    sidecar, init = _c(nvidia_com_gpu="1", sidecar=True, limits=True), _c(nvidia_com_gpu="2", limits=True)
    assert dict(pod_requests(_pod([_c(nvidia_com_gpu="1", limits=True)], [sidecar, init])).gpu) == {"nvidia.com/gpu": 3}
    # The same init container before the sidecar runs alone: max(1 + 1, 2) = 2.
    assert dict(pod_requests(_pod([_c(nvidia_com_gpu="1", limits=True)], [init, sidecar])).gpu) == {"nvidia.com/gpu": 2}


def test_overhead_adds_to_cpu_memory_and_devices():
    r = pod_requests(_pod([_c("1", "1Gi", nvidia_com_gpu="1")], overhead={"cpu": "250m", "memory": "120Mi"}))
    assert (r.cpu_milli, r.memory_bytes, dict(r.gpu)) == (1250, 1144 * MI, {"nvidia.com/gpu": 1})


def test_pod_level_limits_default_the_request_only_where_no_container_requests_it():
    # defaultPodRequests (pkg/apis/core/v1/defaults.go): the containers' request where they set one, else the limit.
    p = _pod([_c("500m")], pod_level={"limits": {"cpu": "4", "memory": "8Gi"}})
    r = pod_requests(p)
    assert (r.cpu_milli, r.memory_bytes) == (500, 8 * 1024 * MI)


def test_limits_stand_for_missing_requests_and_cpu_rounds_up_to_a_millicore():
    r = pod_requests(_pod([_c("0.0005", "1.5", limits=True)]))
    assert (r.cpu_milli, r.memory_bytes) == (1, 2)


@pytest.mark.parametrize("where, field, value, expected", [
    ("containers", "cpu", "-1", "spec.containers[0].resources.requests has '-1', a negative request"),
    ("containers", "memory", "lots", "spec.containers[0].resources.requests has 'lots', not a quantity"),
    ("initContainers", "cpu", "-500m", "spec.initContainers[0].resources.requests has '-500m', a negative request"),
    ("overhead", "memory", "-1Gi", "spec.overhead has '-1Gi', a negative request"),
])
def test_a_negative_or_unparsable_host_request_is_an_error_naming_where_it_was(where, field, value, expected):
    if where == "overhead":
        p = _pod([_c("1")], overhead={field: value})
    elif where == "initContainers":
        p = _pod([_c("1")], [_c(**{field: value})])
    else:
        p = _pod([_c(**{field: value})])
    r = pod_requests(p)
    assert len(r.errors) == 1 and str(r.errors[0]).startswith(f"resources {field}: {expected}")
    assert getattr(r, "cpu_milli" if field == "cpu" else "memory_bytes") is None  # unknown, never a guess


def test_a_cpu_only_pod_with_a_negative_request_fails_every_node_instead_of_being_scored():
    p = pod(gpus=None)
    p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "-1"}}
    job = Engine().job(p)
    assert [str(e) for e in job.errors] == [
        "resources cpu: spec.containers[0].resources.requests has '-1', a negative request; a request is at least 0"]


def test_explain_and_the_job_see_the_summed_gpu_request():
    p = pod({"gpuplace.io/vram": "10Gi"}, gpus=1)
    p["spec"]["initContainers"] = [{"name": "proxy", "restartPolicy": "Always",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    job = Engine().job(p)
    assert (job.req.resource, job.req.gpu_count) == ("nvidia.com/gpu", 2)


def test_the_content_key_tells_a_sidecar_from_a_regular_init_container():
    p = pod(gpus=1)
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    regular = as_pod(p).content_key()[0]
    p["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    assert as_pod(p).content_key()[0] != regular
    p["spec"]["initContainers"][0].pop("restartPolicy")
    p["spec"]["overhead"] = {"cpu": "1"}
    assert as_pod(p).content_key()[0] != regular


def test_the_simulators_pods_ask_what_the_one_definition_counts():
    # gpuplace simulate accounts each pod by its trace fields and the engine reads its manifest:
    # both must be the same requests, by the arithmetic above.
    from scheduler_extender.simulator.model import simulation_catalog
    from scheduler_extender.simulator.traces import openb_pods
    from tests.factories import ROOT
    pods, _ = openb_pods(ROOT / "tests/fixtures/sim/openb_pod_list_gpuspec33.csv", simulation_catalog(), cpu_only=True)
    assert pods
    for p in pods:
        r = pod_requests(p.manifest())
        assert (dict(r.gpu), r.cpu_milli, r.memory_bytes, r.errors) == (
            {"nvidia.com/gpu": p.gpus} if p.gpus else {}, p.cpu_milli,
            None if p.memory_mib is None else p.memory_mib * MI, ()), p.name


def test_the_cluster_cache_counts_a_bound_pods_sidecar_gpu_and_its_overhead_cpu():
    import json
    from scheduler_extender.cluster.cache import ClusterCache
    from scheduler_extender.core.catalog import default_catalog
    from tests.factories import gpu, inventory
    c = ClusterCache(default_catalog())
    c.replace_nodes([{"metadata": {"name": "n", "annotations": {
        "gpuplace.io/inventory": json.dumps(inventory("n", [gpu(0), gpu(1), gpu(2)]))}},
        "status": {"allocatable": {"nvidia.com/gpu": "3", "cpu": "16", "memory": "64Gi"}}}])
    p = _pod([_c("1", nvidia_com_gpu="1")], [_c("500m", nvidia_com_gpu="1", sidecar=True)], overhead={"cpu": "250m"})
    p["metadata"]["uid"] = "u1"
    p["spec"]["nodeName"] = "n"
    c.replace_pods([p])
    st = c.state("n")
    assert st.allocation.anonymous == {"nvidia.com/gpu": 2}
    assert st.cpu_milli_free == 16000 - 1750


def test_values_are_summed_exactly_and_rounded_up_once_as_kubernetes_rounds_the_sum():
    # Two containers of 500 microcores: Kubernetes sums 1000u and rounds to 1m, not 1m + 1m.
    r = pod_requests(_pod([_c("500u"), _c("500u")]))
    assert r.cpu_milli == 1


def test_the_content_key_tells_pod_level_requests_from_pod_level_limits():
    p = _pod([_c("500m")], pod_level={"requests": {"cpu": "2"}})
    q = _pod([_c("500m")], pod_level={"limits": {"cpu": "2"}})
    assert (pod_requests(p).cpu_milli, pod_requests(q).cpu_milli) == (2000, 500)
    assert as_pod(p).content_key()[0] != as_pod(q).content_key()[0]
