"""gpuplace's placement simulator: replay a workload over a fleet of NodeGPUInventory documents
through the extender's own filter and score (``scheduler_extender.core.engine.Engine``), next to
baselines that model kube-scheduler with a device plugin but without gpuplace.

Pure: no Kubernetes client, no HTTP. Modules: ``model`` (nodes, pods, the simulation catalog),
``traces`` (input adapters), ``workload`` (the seeded LLM workload generator and mixed fleet),
``baselines`` (placement policies), ``run`` (fill and replay modes), ``report`` (table, JSON,
charts), ``cli`` (``gpuplace simulate``).
"""
