"""A seeded generator of mixed LLM workloads, and the built-in mixed fleet it is meant for.

Distribution (``LLM_MIX``; one draw per pod, ``random.Random(seed)``):

==============  =====  ============================================================  ========
workload        share  model size (params, probability) -> GPUs per pod              median h
==============  =====  ============================================================  ========
inference       0.55   1B .15, 3B .15, 7B .25, 8B .10, 13B .15 -> 1; 34B .10 -> 2;    4
                       70B .10 -> 4. Precision bf16 .60, int8 .25, int4 .15
finetune-lora   0.25   7B .40, 8B .20, 13B .25 -> 1; 34B .10 -> 2 (fsdp); 70B .05 -> 4   2
                       (fsdp). bf16
training        0.20   350M .15, 1.3B .25 -> 1; 3B .20 -> 2 (fsdp); 7B .25 -> 8        12
                       (fsdp); 13B .15 -> 8 (fsdp). bf16
==============  =====  ============================================================  ========

Durations are log-normal around the median (sigma 1.0), at least 5 minutes. Each pod requests
4 CPU cores and 32 GiB of memory per GPU. Arrivals: in fill mode pods come one after another;
in replay mode as a Poisson process whose rate makes the offered GPU-hours per hour equal
``load`` x the fleet's GPUs (``rate_for_load``). The annotations are the user's API
(``gpuplace.io/model-params``, ``workload``, ``precision``, ``sharding``); the VRAM need used for
the OOM-risk count is gpuplace's own estimate of those annotations.
"""

from __future__ import annotations

import math
import random
from typing import Iterator

from scheduler_extender.core.catalog import Catalog
from scheduler_extender.core.requirements import A_PARAMS, A_PRECISION, A_SHARDING, A_WORKLOAD, parse_params
from scheduler_extender.simulator.model import SimNode, SimPod, make_inventory

# workload -> (share, median hours, [(params text, probability, gpus, sharding)], [(precision, p)])
LLM_MIX: dict[str, tuple[float, float, list[tuple[str, float, int, str | None]], list[tuple[str, float]]]] = {
    "inference": (0.55, 4.0, [
        ("1B", .15, 1, None), ("3B", .15, 1, None), ("7B", .25, 1, None), ("8B", .10, 1, None),
        ("13B", .15, 1, None), ("34B", .10, 2, None), ("70B", .10, 4, None),
    ], [("bf16", .60), ("int8", .25), ("int4", .15)]),
    "finetune-lora": (0.25, 2.0, [
        ("7B", .40, 1, None), ("8B", .20, 1, None), ("13B", .25, 1, None), ("34B", .10, 2, "fsdp"),
        ("70B", .05, 4, "fsdp"),
    ], [("bf16", 1.0)]),
    "training": (0.20, 12.0, [
        ("350M", .15, 1, None), ("1.3B", .25, 1, None), ("3B", .20, 2, "fsdp"), ("7B", .25, 8, "fsdp"),
        ("13B", .15, 8, "fsdp"),
    ], [("bf16", 1.0)]),
}
CPU_MILLI_PER_GPU = 4000
MEMORY_MIB_PER_GPU = 32 * 1024

# Built-in mixed fleet: (catalog id, GPUs per node, nodes, NVLink). 272 GPUs on 84 nodes.
MIXED_FLEET: list[tuple[str, int, int, bool]] = [
    ("h100-sxm5-80gb", 8, 4, True),
    ("a100-sxm4-80gb", 8, 8, True),
    ("l40s", 4, 8, False),
    ("rtx-4090", 4, 16, False),
    ("l4", 2, 8, False),
    ("a10", 1, 32, False),
    ("t4", 4, 8, False),
]


def mixed_fleet(catalog: Catalog) -> list[SimNode]:
    """The ``MIXED_FLEET`` nodes; each node has 16 cores and 128 GiB of memory per GPU."""
    nodes = []
    for model_id, count, n_nodes, nvlink in MIXED_FLEET:
        entry = catalog.entries[model_id]
        for i in range(n_nodes):
            name = f"{model_id}-{i}"
            nodes.append(SimNode(name=name, inventory=make_inventory(name, entry, count, nvlink=nvlink),
                                 cpu_milli=16000 * count, memory_mib=128 * 1024 * count,
                                 template=f"{model_id}x{count}"))
    return nodes


def _pick(rng: random.Random, items: list, weight_index: int):  # noqa: ANN001, ANN202
    return rng.choices(items, weights=[it[weight_index] for it in items])[0]


def llm_pods(seed: int, *, rate_per_hour: float | None = None) -> Iterator[SimPod]:
    """An endless stream of pods drawn from ``LLM_MIX``.

    Args:
        seed: makes the stream repeatable.
        rate_per_hour: Poisson arrival rate (replay); None: every pod arrives at time 0 (fill).
    """
    rng = random.Random(seed)
    workloads = [(name, spec[0]) for name, spec in LLM_MIX.items()]
    t = 0.0
    i = 0
    while True:
        workload = _pick(rng, workloads, 1)[0]
        _, median_h, sizes, precisions = LLM_MIX[workload]
        params_text, _, gpus, sharding = _pick(rng, sizes, 1)
        precision = _pick(rng, precisions, 1)[0]
        hours = max(5 / 60, median_h * math.exp(rng.gauss(0.0, 1.0)))
        if rate_per_hour:
            t += rng.expovariate(rate_per_hour) * 3600
        ann = {A_PARAMS: params_text, A_WORKLOAD: workload, A_PRECISION: precision}
        if sharding:
            ann[A_SHARDING] = sharding
        yield SimPod(
            name=f"llm-{i:06d}", gpus=gpus, annotations=ann, cpu_milli=CPU_MILLI_PER_GPU * gpus,
            memory_mib=MEMORY_MIB_PER_GPU * gpus, creation_s=t, duration_s=hours * 3600,
            params=parse_params(params_text), workload=workload,
        )
        i += 1


def mean_gpu_hours(sample: int = 20000) -> float:
    """Expected GPUs x hours of one pod of ``LLM_MIX`` (Monte Carlo over a fixed seed)."""
    gen = llm_pods(12345)
    total = sum(p.gpus * p.duration_s / 3600 for p, _ in zip(gen, range(sample)))
    return total / sample


def rate_for_load(load: float, capacity_gpus: int) -> float:
    """Pods per hour whose offered GPU-hours per hour are ``load`` x ``capacity_gpus``."""
    return load * capacity_gpus / mean_gpu_hours()
