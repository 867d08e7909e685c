"""Pod -> JobRequirements: GPU requests and every gpuplace.io/* annotation, good and bad."""

import pytest

from scheduler_extender.core.catalog import default_catalog
from scheduler_extender.core.requirements import parse_params, parse_pod, pod_gpu_requests
from tests.factories import pod

CAT = default_catalog()


def parse(annotations=None, **kw):
    return parse_pod(pod(annotations, **kw), CAT, ("small", "medium", "large"))


@pytest.mark.parametrize("text, value", [
    ("350M", 3.5e8), ("7B", 7e9), ("70B", 70e9), ("1.3e9", 1.3e9), ("7b", 7e9), ("1.5T", 1.5e12), ("13 B", 13e9),
])
def test_model_params_accepts_suffixes_and_scientific_notation(text, value):
    assert parse_params(text) == pytest.approx(value)


@pytest.mark.parametrize("annotation, value, must_mention", [
    ("gpuplace.io/model-params", "13 billion", "e.g. 350M, 7B"),
    ("gpuplace.io/model-params", "-7B", "parameter count"),
    ("gpuplace.io/workload", "pretraining", "training, finetune-lora, inference"),
    ("gpuplace.io/precision", "nf4", "fp32, tf32, bf16"),
    ("gpuplace.io/sharding", "zero4", "none, zero1"),
    ("gpuplace.io/vram", "forty gigs", "40Gi"),
    ("gpuplace.io/vram", "0", "40Gi"),
    ("gpuplace.io/gpu-models", "A100,B300X", "'B300X'"),
    ("gpuplace.io/exclude-gpu-models", "nope", "unknown GPU model"),
    ("gpuplace.io/min-compute-capability", "eight", "like 8.0"),
    ("gpuplace.io/require", "nvlink,infiniband", "nvlink, ecc, full-gpu, mig"),
    ("gpuplace.io/prefer", "fast", "nvlink, ecc, full-gpu, mig"),
    ("gpuplace.io/runtime", "opencl", "cuda, rocm, any"),
    ("gpuplace.io/class", "huge", "small, medium, large"),
])
def test_a_malformed_annotation_is_an_error_naming_it_and_the_accepted_form(annotation, value, must_mention):
    req = parse({annotation: value})
    assert len(req.errors) == 1
    text = str(req.errors[0])
    assert text.startswith(annotation + ":")
    assert must_mention in text


def test_every_bad_annotation_is_reported_not_only_the_first():
    req = parse({"gpuplace.io/workload": "x", "gpuplace.io/precision": "y", "gpuplace.io/vram": "z"})
    assert {e.field for e in req.errors} == {"gpuplace.io/workload", "gpuplace.io/precision", "gpuplace.io/vram"}


def test_vram_keeps_binary_and_decimal_units_apart():
    assert parse({"gpuplace.io/vram": "40Gi"}).vram_bytes == 40 * 2**30
    assert parse({"gpuplace.io/vram": "40G"}).vram_bytes == 40 * 10**9
    assert parse({"gpuplace.io/vram": "40960Mi"}).vram_bytes == 40 * 2**30


def test_gpu_models_match_exact_tokens_never_substrings():
    h20 = parse({"gpuplace.io/gpu-models": "H20"}).allowed_models
    assert h20 == CAT.resolve_token("H20")
    assert not h20 & (CAT.resolve_token("H100") | CAT.resolve_token("H200"))
    assert not parse({"gpuplace.io/gpu-models": "a10"}).allowed_models & CAT.resolve_token("A100")


def test_gpu_models_are_case_insensitive_comma_lists_of_ids_and_aliases():
    req = parse({"gpuplace.io/gpu-models": " a100-80gb , RTX 4090 "})
    assert req.allowed_models == CAT.resolve_token("A100-80GB") | CAT.resolve_token("rtx-4090")


def test_constraint_lists_and_runtime_parse():
    req = parse({"gpuplace.io/require": "NVLink,ecc", "gpuplace.io/prefer": "mig", "gpuplace.io/runtime": "any"})
    assert req.require == {"nvlink", "ecc"} and req.prefer == {"mig"} and req.runtime == "any"


def test_full_gpu_and_mig_cannot_both_be_required():
    assert "exclude each other" in str(parse({"gpuplace.io/require": "full-gpu,mig"}).errors[0])


def test_runtime_defaults_to_rocm_for_amd_gpus_and_cuda_otherwise():
    assert parse(resource="amd.com/gpu").runtime == "rocm"
    assert parse().runtime == "cuda"


def test_cuda_runtime_on_an_amd_request_is_a_contradiction():
    req = parse({"gpuplace.io/runtime": "cuda"}, resource="amd.com/gpu")
    assert "gpuplace.io/runtime" in str(req.errors[0])


def test_mig_resource_names_the_profile():
    req = parse(resource="nvidia.com/mig-3g.40gb", gpus=2)
    assert (req.resource, req.gpu_count, req.mig_profile) == ("nvidia.com/mig-3g.40gb", 2, "3g.40gb")


def test_fractional_gpu_request_is_an_error():
    req = parse(gpus="1.5")
    assert req.errors and "whole number" in str(req.errors[0])


def test_pod_gpu_request_sums_containers_and_takes_the_init_container_maximum():
    p = pod(gpus=1)
    p["spec"]["containers"].append({"name": "b", "resources": {"limits": {"nvidia.com/gpu": "2"}}})
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]
    assert pod_gpu_requests(p)[0] == {"nvidia.com/gpu": 4}
    p["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    assert pod_gpu_requests(p)[0] == {"nvidia.com/gpu": 3}


def test_requests_without_limits_count_too():
    p = pod(gpus=None)
    p["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "2"}}
    assert pod_gpu_requests(p)[0] == {"nvidia.com/gpu": 2}


def test_a_pod_with_no_gpu_and_no_annotation_wants_nothing():
    req = parse(gpus=None)
    assert not req.wants_gpu and not req.has_annotations and not req.errors


def test_precision_requirements_come_only_from_an_explicit_annotation():
    assert parse({"gpuplace.io/model-params": "7B"}).required_cc() is None
    assert parse({"gpuplace.io/precision": "bf16"}).required_cc() == ((8, 0), "bf16")
    assert parse({"gpuplace.io/precision": "fp8", "gpuplace.io/min-compute-capability": "8.0"}).required_cc() == ((8, 9), "fp8")


@pytest.mark.parametrize("precision", ["fp6", "fp4"])
def test_fp6_and_fp4_are_accepted_and_need_blackwell_compute_capability_10(precision):
    req = parse({"gpuplace.io/precision": precision})
    assert not req.errors
    assert req.precision == precision
    assert req.required_cc() == ((10, 0), precision)
    # an explicit min-compute-capability above it wins
    assert parse({"gpuplace.io/precision": precision,
                  "gpuplace.io/min-compute-capability": "12.0"}).required_cc() == ((12, 0), "gpuplace.io/min-compute-capability")


def test_garbage_metadata_never_raises():
    for bad in [{}, {"metadata": None}, {"metadata": {"annotations": "x"}}, {"spec": {"containers": [None, 3]}}]:
        req = parse_pod(bad, CAT)
        assert not req.wants_gpu


@pytest.mark.parametrize("value", ["0", "0Gi", "-1Gi", "1m", "500m"])
def test_a_vram_of_less_than_one_byte_is_refused_as_such_not_as_an_unreadable_quantity(value):
    req = parse({"gpuplace.io/vram": value})
    assert req.vram_bytes is None
    assert [str(e) for e in req.errors] == [
        f"gpuplace.io/vram: {value!r} is less than one byte; a VRAM need is at least one byte, "
        "e.g. 40Gi (GiB, 2^30 bytes) or 40G (10^9 bytes)"]


def test_a_fractional_vram_in_bytes_rounds_up_as_kubernetes_does():
    assert parse({"gpuplace.io/vram": "1.5"}).vram_bytes == 2
