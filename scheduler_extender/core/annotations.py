"""The ``gpuplace.io/*`` pod annotations, declared once: key, accepted form, meaning, and who reads it.

``BUILTIN_ANNOTATIONS`` are the annotations ``core.requirements.parse_pod`` reads into
``JobRequirements`` fields (the estimate's, the filter's and the score's). A criterion may declare
annotations of its own (``core.criteria.Criterion.annotations``) with a ``parse`` function: those
are parsed by the same ``parse_pod`` into ``JobRequirements.declared`` and are known keys from
then on (unknown-key detection, the reference's table in ``docs/reference/``, explain), with no
other change. ``core.criteria.ANNOTATIONS`` is the whole list: the built-in ones, then the declared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

PREFIX = "gpuplace.io/"


@dataclass(frozen=True)
class Annotation:
    """One pod annotation.

    Attributes:
        key: the full key, ``gpuplace.io/...``.
        form: the accepted values, as an error message and the reference show them
            ("a number with an optional K, M, B or T suffix, e.g. 7B").
        summary: what it asks for, one line.
        used_by: what reads it: criteria and score components by name, or ``estimate``.
        parse: for an annotation a criterion declares: the value's text -> the parsed value
            (hashable: it is part of the job's memo key), raising ``ValueError`` when the text is
            not of ``form``; None for the built-in ones, which ``parse_pod`` reads itself.
    """

    key: str
    form: str
    summary: str
    used_by: tuple[str, ...] = ()
    parse: Callable[[str], Hashable] | None = None


def _a(name: str, form: str, summary: str, *used_by: str) -> Annotation:
    return Annotation(PREFIX + name, form, summary, used_by)


BUILTIN_ANNOTATIONS: tuple[Annotation, ...] = (
    _a("model-params", "`350M`, `7B`, `70B`, `1.3e9` (a number with an optional K, M, B or T suffix, at most 1000T)",
       "parameter count, for the VRAM estimate", "estimate"),
    _a("workload", "`training`, `finetune-lora`, `inference`",
       "what the job does with the model (default `inference`)", "estimate", "throughput"),
    _a("precision", "`fp32`, `tf32`, `bf16`, `fp16`, `fp8`, `fp6`, `fp4`, `int8`, `int4`",
       "weight precision (estimate default `bf16`); only an explicit value imposes hardware: bf16/tf32 need "
       "compute capability 8.0, fp8 8.9, fp6/fp4 10.0; on AMD the catalog row's native precisions decide",
       "estimate", "compute-capability"),
    _a("sharding", "`none`, `zero1`, `zero2`, `zero3`, `fsdp`",
       "how training state is split over the pod's GPUs", "estimate"),
    _a("vram", "`40Gi` (2^30 bytes), `40G` (10^9 bytes), `40960Mi`; at least one byte",
       "VRAM per GPU; replaces the estimate", "vram", "vramFit"),
    _a("gpu-models", "comma list of catalog ids or families, e.g. `A100-80GB,H100` (exact tokens, case-insensitive)",
       "allowed models (`gpuplace catalog` lists them)", "model-allowed", "tenant-allowed"),
    _a("exclude-gpu-models", "comma list of catalog ids or families", "models not allowed", "model-allowed"),
    _a("min-compute-capability", "`8.0`, `8.9` (at most three digits a part)",
       "minimum CUDA compute capability", "compute-capability"),
    _a("require", "comma list of `nvlink`, `ecc`, `full-gpu`, `mig`", "hard constraints",
       "nvlink", "ecc", "device-kind"),
    _a("prefer", "comma list of `nvlink`, `ecc`, `full-gpu`, `mig`", "soft preferences (score only)",
       "nvlink", "ecc", "mig"),
    _a("runtime", "`cuda` (default), `rocm`, `any`",
       "whose GPUs the software runs on (`amd.com/gpu` pods default to `rocm`)", "runtime"),
    _a("class", "a class of the policy", "pin the size class", "class-allowed"),
    _a("gpu-fraction", "`0.5`, `0.25` (above 0, at most 1, at most six decimals)",
       "a share of one GPU: on a time-sliced or MPS GPU the VRAM need is that share of the GPU's memory, and "
       "fragmentation counts the share; with 1 `nvidia.com/gpu` only", "shared-gpu", "fragmentation"),
    _a("claims", "`write` (default), `leave`",
       "Dynamic Resource Allocation: whether the claim webhook writes the GPU requests of the pod's "
       "ResourceClaims in gpuplace's order (`leave`: as the template wrote them)", "claim webhook"),
)
"""The annotations ``parse_pod`` reads itself, in the reference's order."""
