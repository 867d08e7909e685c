"""kube-scheduler's default resource scores of a node for a pod: how the extender breaks its own ties.

With one round trip (``--filter-returns-best``) the extender passes one node, so kube-scheduler's
score plugins no longer choose among gpuplace's equally scored nodes; the extender chooses as the
default profile's resource plugins would (``pkg/scheduler/framework/plugins/noderesources`` in
Kubernetes v1.34): NodeResourcesFit with ``LeastAllocated`` (100 x the mean free fraction) plus
NodeResourcesBalancedAllocation (100 x (1 - the standard deviation of the used fractions)), over
CPU and memory after placing the pod, each at weight 1. A pod none of whose containers names CPU
(or memory) is scored as if it asked 100 millicores (200 MB) (``schedutil.DefaultMilliCPURequest``,
``DefaultMemoryRequest``, kube-scheduler's ``NonMissingContainerRequests``). ``gpuplace simulate``
places with the same formula over its arrays (``scheduler_extender.simulator.baselines.kube_scores``; a test holds
the two equal). It is kube-scheduler's up to two details: kube-scheduler applies the defaults per
container and counts the node's pods by their non-zero requests (``NonZeroRequested``), where this
takes the pod's summed request and the node's free amounts as the extender counts them.
"""

from __future__ import annotations

DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST_BYTES = 200 * 10**6


def default_profile_score(cpu_milli: int | None, memory_bytes: int | None,
                          cpu_milli_free: int | None, memory_bytes_free: int | None,
                          cpu_milli_allocatable: int | None, memory_bytes_allocatable: int | None) -> int:
    """0-200: LeastAllocated plus BalancedAllocation over the resources whose allocatable and free
    amounts are known (CPU in millicores, memory in bytes); 0 when neither is."""
    fractions = []
    for request, default, free, allocatable in (
            (cpu_milli, DEFAULT_MILLI_CPU_REQUEST, cpu_milli_free, cpu_milli_allocatable),
            (memory_bytes, DEFAULT_MEMORY_REQUEST_BYTES, memory_bytes_free, memory_bytes_allocatable)):
        if free is None or not allocatable:
            continue
        used = allocatable - free + (default if request is None else request)
        fractions.append(min(1.0, max(0.0, used / allocatable)))
    if not fractions:
        return 0
    mean = sum(fractions) / len(fractions)
    std = (sum((f - mean) ** 2 for f in fractions) / len(fractions)) ** 0.5
    return round(100 * (1 - mean)) + round(100 * (1 - std))
