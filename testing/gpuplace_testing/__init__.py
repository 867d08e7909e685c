"""gpuplace's test doubles, shipped apart from the product (the ``gpuplace-testing`` distribution).

- ``gpuplace_testing.nvml_standin``: a stand-in for ``libnvidia-ml.so.1`` at its C boundary, which
  the real pynvml wrappers run over (``NVMLProbe(library=...)``).
- ``gpuplace_testing.amdsmi_standin``: the same for ROCm's ``libamd_smi.so`` and the real amdsmi
  package (``AMDProbe(library=...)``).
- ``gpuplace_testing.c_boundary``: what the two share (ctypes arguments as C receives them).
- ``gpuplace_testing.fake_nvml`` / ``fake_amdsmi``: the YAML scenario schemas and loaders
  (``load_fixture``), scenarios in the repository's ``tests/fixtures/nvml`` and ``tests/fixtures/amdsmi``.

``gpuplace-agent --probe fake-nvml`` / ``fake-amdsmi`` find the loaders through the entry point group
``gpuplace.agent_probes``; no module of gpuplace imports this package.
"""
