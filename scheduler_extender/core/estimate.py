"""VRAM needed per GPU by a job, estimated from its parameter count, workload and precision.

All terms are computed in bytes from decimal-GB figures, as the sources state them; messages
print GiB. The estimate is a planning figure, not a measurement: a pod that knows better sets
``gpuplace.io/vram``, which replaces it.

Sources:
- Inference: weights = parameters x bytes per parameter of the precision, x 1.2 for KV cache,
  activations and framework buffers. EleutherAI, "Transformer Math 101" (Anthony, Biderman,
  Schoelkopf, 2023), section "Inference": "a 20% overhead ... total memory = 1.2 x model memory".
- Training with mixed-precision AdamW: 18 bytes per parameter = weights 6 (fp32 master copy 4 +
  half-precision copy 2), optimizer 8 (Adam moments, fp32), gradients 4. Hugging Face
  Transformers docs, "Model training anatomy", section "Anatomy of Model's Memory". Pure fp32
  training (fp32/tf32 weights) keeps no half copy: 4 + 8 + 4 = 16 bytes per parameter.
- ZeRO sharding (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", SC'20): stage 1 partitions the optimizer state across the data-parallel
  GPUs, stage 2 also the gradients, stage 3 also the weights. PyTorch FSDP (full shard) equals
  stage 3.
- Activations: they depend on batch size and sequence length, which a pod annotation does not
  give, so training keeps a reserve of ``activation_reserve_ratio`` (policy, default 20%) of the
  per-GPU model state. This is gpuplace's planning margin, not a figure from the sources.
- LoRA fine-tuning (Hu et al., "LoRA", ICLR 2022): the base weights are frozen at their
  precision; the adapter holds ``lora_trainable_ratio`` (policy, default 1%) of the parameters,
  trained in fp32 with AdamW at 16 bytes each (weights 4, gradients 4, Adam 8; "Model training
  anatomy"), plus the same activation reserve.
- CUDA context and kernels: about 1.3 GB per GPU ("Model training anatomy": "the kernels alone
  take up 1.3GB of GPU memory"). Decimal GB as the source writes it (1.3e9 bytes).
- Multi-GPU inference: weights are split across the pod's GPUs (tensor parallelism, as vLLM and
  TGI do) unless ``gpuplace.io/sharding: none`` says every GPU holds a full copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler_extender.core.quantity import GB, fmt_gib

BYTES_PER_PARAM: dict[str, float] = {
    "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp6": 0.75, "fp4": 0.5, "int8": 1, "int4": 0.5,
}
"""Bytes per weight by precision: the element width (tf32 is stored as fp32). FP6 and FP4 are the
OCP Microscaling Formats (MX) Specification v1.0 (2023) element widths, 6 bits (E2M3/E3M2) and
4 bits (E2M1), as NVIDIA's NVFP4 is. Their block scales (MX: one 8-bit scale per 32 elements,
0.25 bit each; NVFP4: one FP8 scale per 16 elements, 0.5 bit each) are left to the inference
overhead, as int4's group scales are."""

INFERENCE_OVERHEAD_RATIO = 1.2  # EleutherAI Transformer Math 101
CUDA_CONTEXT_BYTES = int(1.3 * GB)  # HF "Model training anatomy"
ADAMW_MIXED_BYTES = {"weights": 6, "optimizer": 8, "gradients": 4}  # HF "Model training anatomy"
ADAMW_FP32_BYTES = {"weights": 4, "optimizer": 8, "gradients": 4}
LORA_ADAPTER_BYTES_PER_PARAM = 16  # fp32 weights 4 + gradients 4 + AdamW 8
SHARDED_TERMS = {
    "none": frozenset(),
    "zero1": frozenset({"optimizer"}),
    "zero2": frozenset({"optimizer", "gradients"}),
    "zero3": frozenset({"optimizer", "gradients", "weights"}),
    "fsdp": frozenset({"optimizer", "gradients", "weights"}),
}


@dataclass(frozen=True)
class EstimatorSettings:
    """Tunables of the estimate; the policy's ``estimator`` section sets them."""

    inference_overhead_ratio: float = INFERENCE_OVERHEAD_RATIO
    activation_reserve_ratio: float = 0.2
    lora_trainable_ratio: float = 0.01
    cuda_context_bytes: int = CUDA_CONTEXT_BYTES


@dataclass(frozen=True)
class VramEstimate:
    """VRAM needed on each of the pod's GPUs.

    Attributes:
        bytes_per_gpu: the need, bytes.
        terms: (name, bytes) of each summand, per GPU, for ``gpuplace explain``.
        summary: what the estimate was made from, e.g. ``"13B inference, bf16"``.
        source: ``"estimate"`` or ``"annotation"`` (``gpuplace.io/vram``).
    """

    bytes_per_gpu: int
    summary: str
    source: str
    terms: tuple[tuple[str, int], ...] = field(default=())

    def describe(self, amount: str | None = None) -> str:
        """``'30.3 GiB needed (13B inference, bf16)'``; ``amount``: the need as a caller printed it
        (``quantity.fmt_gib_below``, beside what it is compared with)."""
        return f"{amount or fmt_gib(self.bytes_per_gpu)} needed ({self.summary})"


def format_params(params: float) -> str:
    """7e9 -> '7B', 1.3e9 -> '1.3B', 3.5e8 -> '350M'."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if params >= div:
            value = params / div
            text = f"{value:.1f}".rstrip("0").rstrip(".")
            return f"{text}{suffix}"
    return f"{params:g}"


def estimate_vram(
    *,
    params: float,
    workload: str,
    precision: str,
    gpu_count: int,
    sharding: str | None,
    settings: EstimatorSettings = EstimatorSettings(),
) -> VramEstimate:
    """Estimate the VRAM one of the pod's GPUs needs.

    Args:
        params: parameter count (e.g. 13e9).
        workload: ``training``, ``finetune-lora`` or ``inference``.
        precision: a key of ``BYTES_PER_PARAM``.
        gpu_count: GPUs (or MIG devices) of the pod, >= 1; divides the sharded terms.
        sharding: ``none``, ``zero1``, ``zero2``, ``zero3``, ``fsdp``, or ``None`` when not
            annotated (training: no sharding; inference: tensor parallel over the pod's GPUs).

    Returns:
        The estimate with its terms; the formulas and their sources are in the module docstring.

    Raises:
        ValueError: unknown workload, precision or sharding, params <= 0, gpu_count < 1.
    """
    if params <= 0:
        raise ValueError("params must be > 0")
    if gpu_count < 1:
        raise ValueError("gpu_count must be >= 1")
    if precision not in BYTES_PER_PARAM:
        raise ValueError(f"unknown precision {precision!r}")
    n = gpu_count
    bpp = BYTES_PER_PARAM[precision]
    terms: list[tuple[str, float]] = []
    label = f"{format_params(params)} {workload}, {precision}"

    if workload == "inference":
        split = n if (sharding is None or sharding != "none") and n > 1 else 1
        weights = params * bpp / split
        terms.append((f"weights ({format_params(params)} x {bpp:g} B{f' / {split} GPUs' if split > 1 else ''})", weights))
        overhead = weights * (settings.inference_overhead_ratio - 1)
        terms.append((f"KV cache and buffers ({settings.inference_overhead_ratio - 1:.0%} of weights)", overhead))
    elif workload == "training":
        shard = sharding or "none"
        if shard not in SHARDED_TERMS:
            raise ValueError(f"unknown sharding {sharding!r}")
        table = ADAMW_FP32_BYTES if precision in ("fp32", "tf32") else ADAMW_MIXED_BYTES
        state = 0.0
        for name, per_param in table.items():
            divided = name in SHARDED_TERMS[shard] and n > 1
            value = params * per_param / (n if divided else 1)
            terms.append((f"{name} ({per_param} B/param{f' / {n} GPUs' if divided else ''})", value))
            state += value
        terms.append((f"activation reserve ({settings.activation_reserve_ratio:.0%} of model state)",
                      state * settings.activation_reserve_ratio))
        if shard != "none":
            label += f", {shard} over {n}"
    elif workload == "finetune-lora":
        shard = sharding or "none"
        if shard not in SHARDED_TERMS:
            raise ValueError(f"unknown sharding {sharding!r}")
        split = n if "weights" in SHARDED_TERMS[shard] and n > 1 else 1
        frozen = params * bpp / split
        terms.append((f"frozen weights ({format_params(params)} x {bpp:g} B{f' / {split} GPUs' if split > 1 else ''})", frozen))
        adapter = params * settings.lora_trainable_ratio * LORA_ADAPTER_BYTES_PER_PARAM
        terms.append((f"adapter + AdamW ({settings.lora_trainable_ratio:.0%} of params x "
                      f"{LORA_ADAPTER_BYTES_PER_PARAM} B)", adapter))
        terms.append((f"activation reserve ({settings.activation_reserve_ratio:.0%})",
                      (frozen + adapter) * settings.activation_reserve_ratio))
    else:
        raise ValueError(f"unknown workload {workload!r}")

    terms.append(("CUDA context (1.3 GB)", settings.cuda_context_bytes))
    total = int(round(sum(v for _, v in terms)))
    return VramEstimate(
        bytes_per_gpu=total,
        summary=label,
        source="estimate",
        terms=tuple((name, int(round(v))) for name, v in terms),
    )
