"""gpuplace node agent: reads every GPU of a node and publishes a NodeGPUInventory on its Node."""
