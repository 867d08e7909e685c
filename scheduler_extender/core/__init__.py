"""The decision core: pure functions of (job requirements, node inventory, allocations, policy).

Nothing here does I/O at request time or imports pynvml or the Kubernetes client (enforced by
import-linter, see pyproject.toml). Modules, in the order a decision uses them:

- ``quantity``      Kubernetes quantities and the MiB/GiB/GB conversions.
- ``pod``           the pod as the decision reads it (``Pod``), validated once where it enters.
- ``catalog``       GPU models: datasheet facts, driver names, family aliases.
- ``requirements``  a pod's GPU request and ``gpuplace.io/*`` annotations -> ``JobRequirements``.
- ``estimate``      VRAM needed per GPU, with the cited formula of each term.
- ``policy``        the platform team's policy: classes, catalog overrides, weights.
- ``devices``       a node's schedulable units (full GPUs or MIG devices) and which are free.
- ``filter``        the criteria, each a small named unit, and ``filter_node`` composing them.
- ``score``         score components and ``score_nodes`` (0-10).
- ``job``, ``engine`` a pod resolved against the policy; the plain, immutable ``Engine``.
- ``tenancy``, ``workload``, ``allocatable``, ``gfd``: namespaces' entitlements, the learned
  workload, a Node's allocatable, an inventory from GPU feature discovery's labels.
"""
