"""Shared helpers for the node agent tests: the published-output NVML and AMD SMI fixtures and probes on them."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from gpuplace_testing import amdsmi_standin
from gpuplace_testing.fake_amdsmi import Fixture as AMDFixture
from gpuplace_testing.fake_nvml import Fixture
from gpuplace_testing.nvml_standin import StandinLibrary
from node_agent.amd import AMDProbe
from node_agent.inventory import NodeGPUInventory
from node_agent.nvml import NVMLProbe

NVML_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"
A100_NVSWITCH = NVML_FIXTURES / "a100-sxm4-80gb-x8-nvswitch.yaml"
A100_MIG = NVML_FIXTURES / "a100-80gb-pcie-mig-2x3g.40gb.yaml"
H100_NVSWITCH = NVML_FIXTURES / "h100-sxm5-80gb-x8-nvswitch.yaml"
RTX4090 = NVML_FIXTURES / "rtx4090-no-nvlink.yaml"
AMDSMI_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "amdsmi"
MI300X = AMDSMI_FIXTURES / "mi300x-x8-xgmi.yaml"

FIXED_NOW = dt.datetime(2026, 11, 21, 8, 0, 0, tzinfo=dt.timezone.utc)


def fixture_data(path: Path) -> dict[str, Any]:
    """The fixture as plain data, to change a field before building the fake."""
    return yaml.safe_load(path.read_text())


LIBRARIES: list[StandinLibrary | amdsmi_standin.StandinLibrary] = []
"""Every stand-in built by a test; ``conftest.py`` fails the test if the agent looked up (NVML) or
called (AMD SMI) a symbol none of them implements or broke nvml.h's or amdsmi.h's contract at their
boundary."""


def fake_from(data: dict[str, Any]) -> StandinLibrary:
    """The stand-in ``libnvidia-ml.so.1`` for a scenario given as plain data."""
    library = StandinLibrary(Fixture.model_validate(data), source="test")
    LIBRARIES.append(library)
    return library


def amd_fake_from(data: dict[str, Any]) -> amdsmi_standin.StandinLibrary:
    """The stand-in ``libamd_smi.so`` for a scenario given as plain data."""
    library = amdsmi_standin.StandinLibrary(AMDFixture.model_validate(data), source="test")
    LIBRARIES.append(library)
    return library


def amd_probe_of(fake: amdsmi_standin.StandinLibrary, **kwargs: Any) -> AMDProbe:
    kwargs.setdefault("node_name", "mi300x-node-0")
    kwargs.setdefault("numa_lookup", fake.numa_affinity)
    kwargs.setdefault("clock", lambda: FIXED_NOW)
    return AMDProbe(library=fake, **kwargs)


def probe_of(fake: StandinLibrary, **kwargs: Any) -> NVMLProbe:
    kwargs.setdefault("node_name", "gpu-node-0")
    kwargs.setdefault("numa_lookup", fake.numa_affinity)
    kwargs.setdefault("clock", lambda: FIXED_NOW)
    return NVMLProbe(library=fake, **kwargs)


@pytest.fixture
def inventory_of() -> Callable[..., NodeGPUInventory]:
    """inventory_of(path_or_data, **probe_kwargs): probe a fixture once."""

    def run(source: Path | dict[str, Any], **kwargs: Any) -> NodeGPUInventory:
        data = fixture_data(source) if isinstance(source, Path) else source
        return probe_of(fake_from(data), **kwargs).probe()

    return run
