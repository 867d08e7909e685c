"""The VRAM estimator against the figures of its sources (see scheduler_extender/core/estimate.py)."""

import pytest

from scheduler_extender.core.estimate import (
    BYTES_PER_PARAM, CUDA_CONTEXT_BYTES, EstimatorSettings, estimate_vram, format_params,
)
from scheduler_extender.core.quantity import GB

NO_RESERVE = EstimatorSettings(activation_reserve_ratio=0.0, cuda_context_bytes=0)


def test_inference_is_weights_times_1_2_plus_cuda_context():
    # Transformer Math 101: 13B in bf16 = 26 GB of weights, x1.2 = 31.2 GB; + 1.3 GB context.
    e = estimate_vram(params=13e9, workload="inference", precision="bf16", gpu_count=1, sharding=None)
    assert e.bytes_per_gpu == int(31.2 * GB + 1.3 * GB)
    assert e.describe() == "30.3 GiB needed (13B inference, bf16)"  # the need as the vram criterion's reason words it


@pytest.mark.parametrize("precision, bytes_per_param", [
    ("fp32", 4), ("tf32", 4), ("bf16", 2), ("fp16", 2), ("fp8", 1), ("fp6", 0.75), ("fp4", 0.5), ("int8", 1),
    ("int4", 0.5),
])
def test_inference_weights_scale_with_bytes_per_parameter(precision, bytes_per_param):
    e = estimate_vram(params=7e9, workload="inference", precision=precision, gpu_count=1, sharding=None,
                      settings=NO_RESERVE)
    assert e.bytes_per_gpu == pytest.approx(7e9 * bytes_per_param * 1.2, rel=1e-9)


def test_a_70b_model_in_fp4_needs_a_quarter_of_its_bf16_weights():
    # OCP MX v1.0 element widths: FP4 (E2M1) 4 bits, FP6 (E2M3/E3M2) 6 bits; block scales not counted.
    fp4 = estimate_vram(params=70e9, workload="inference", precision="fp4", gpu_count=1, sharding=None,
                        settings=NO_RESERVE)
    fp6 = estimate_vram(params=70e9, workload="inference", precision="fp6", gpu_count=1, sharding=None,
                        settings=NO_RESERVE)
    assert fp4.bytes_per_gpu == pytest.approx(35e9 * 1.2)
    assert fp6.bytes_per_gpu == pytest.approx(52.5e9 * 1.2)
    assert fp4.summary == "70B inference, fp4"


def test_mixed_precision_adamw_training_is_18_bytes_per_parameter():
    # HF "Model training anatomy": weights 6 + optimizer 8 + gradients 4 bytes per parameter.
    e = estimate_vram(params=1e9, workload="training", precision="bf16", gpu_count=1, sharding=None,
                      settings=NO_RESERVE)
    assert e.bytes_per_gpu == 18 * 10**9


def test_fp32_training_keeps_no_half_precision_copy():
    e = estimate_vram(params=1e9, workload="training", precision="fp32", gpu_count=1, sharding=None,
                      settings=NO_RESERVE)
    assert e.bytes_per_gpu == 16 * 10**9


@pytest.mark.parametrize("sharding, bytes_per_param_on_4_gpus", [
    ("none", 18),            # DDP: every GPU holds everything
    ("zero1", 6 + 8 / 4 + 4),  # optimizer partitioned
    ("zero2", 6 + (8 + 4) / 4),  # + gradients
    ("zero3", 18 / 4),       # + weights
    ("fsdp", 18 / 4),        # FSDP full shard == ZeRO-3
])
def test_zero_stages_divide_their_terms_by_the_gpu_count(sharding, bytes_per_param_on_4_gpus):
    e = estimate_vram(params=1e9, workload="training", precision="bf16", gpu_count=4, sharding=sharding,
                      settings=NO_RESERVE)
    assert e.bytes_per_gpu == pytest.approx(bytes_per_param_on_4_gpus * 1e9)


def test_training_adds_the_activation_reserve_of_the_policy():
    plain = estimate_vram(params=1e9, workload="training", precision="bf16", gpu_count=1, sharding=None,
                          settings=EstimatorSettings(activation_reserve_ratio=0.0))
    reserved = estimate_vram(params=1e9, workload="training", precision="bf16", gpu_count=1, sharding=None,
                             settings=EstimatorSettings(activation_reserve_ratio=0.25))
    assert reserved.bytes_per_gpu - plain.bytes_per_gpu == pytest.approx(0.25 * 18e9)


def test_lora_keeps_frozen_weights_at_their_precision_and_trains_a_small_adapter():
    e = estimate_vram(params=7e9, workload="finetune-lora", precision="bf16", gpu_count=1, sharding=None,
                      settings=NO_RESERVE)
    # 14 GB frozen bf16 weights + 1% adapter x 16 bytes (fp32 AdamW) = 1.12 GB
    assert e.bytes_per_gpu == pytest.approx(14e9 + 0.01 * 7e9 * 16)


def test_lora_7b_bf16_fits_a_24_gb_card_and_full_finetune_does_not():
    lora = estimate_vram(params=7e9, workload="finetune-lora", precision="bf16", gpu_count=1, sharding=None)
    full = estimate_vram(params=7e9, workload="training", precision="bf16", gpu_count=1, sharding=None)
    rtx_4090_bytes = 24564 * 2**20
    assert lora.bytes_per_gpu < rtx_4090_bytes < full.bytes_per_gpu


def test_multi_gpu_inference_splits_weights_unless_sharding_none():
    split = estimate_vram(params=70e9, workload="inference", precision="bf16", gpu_count=4, sharding=None,
                          settings=NO_RESERVE)
    copies = estimate_vram(params=70e9, workload="inference", precision="bf16", gpu_count=4, sharding="none",
                           settings=NO_RESERVE)
    assert split.bytes_per_gpu == pytest.approx(140e9 * 1.2 / 4)
    assert copies.bytes_per_gpu == pytest.approx(140e9 * 1.2)


def test_every_estimate_includes_the_cuda_context_once_per_gpu():
    e = estimate_vram(params=1e9, workload="inference", precision="int4", gpu_count=2, sharding=None)
    assert ("CUDA context (1.3 GB)", CUDA_CONTEXT_BYTES) in e.terms
    assert sum(v for _, v in e.terms) == pytest.approx(e.bytes_per_gpu, abs=2)


@pytest.mark.parametrize("bad", [
    dict(params=0, workload="inference", precision="bf16", gpu_count=1, sharding=None),
    dict(params=1e9, workload="pretraining", precision="bf16", gpu_count=1, sharding=None),
    dict(params=1e9, workload="inference", precision="nf4", gpu_count=1, sharding=None),
    dict(params=1e9, workload="training", precision="bf16", gpu_count=1, sharding="zero4"),
    dict(params=1e9, workload="training", precision="bf16", gpu_count=0, sharding=None),
])
def test_invalid_inputs_raise_value_error(bad):
    with pytest.raises(ValueError):
        estimate_vram(**bad)


@pytest.mark.parametrize("params, text", [(7e9, "7B"), (1.3e9, "1.3B"), (3.5e8, "350M"), (70e9, "70B"), (1e12, "1T")])
def test_parameter_counts_print_as_people_write_them(params, text):
    assert format_params(params) == text


def test_bytes_per_param_table_covers_every_annotated_precision():
    from scheduler_extender.core.requirements import PRECISIONS
    assert set(BYTES_PER_PARAM) == set(PRECISIONS)
