"""gpuplace scheduler extender: filters and scores nodes for GPU pods on behalf of kube-scheduler."""
