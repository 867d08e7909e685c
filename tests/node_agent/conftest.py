"""pytest fixtures of the node agent tests (helpers live in agent_fixtures.py)."""

import pytest

from tests.node_agent.agent_fixtures import LIBRARIES, inventory_of  # noqa: F401  (re-exported as a pytest fixture)


@pytest.fixture(autouse=True)
def _boundaries_kept():
    """Fail a test whose agent used a C symbol a stand-in does not implement (and the scenario's
    library was not declared to lack), or broke nvml.h's or amdsmi.h's contract at the boundary."""
    import pynvml

    LIBRARIES.clear()
    loaded = pynvml.nvmlLib
    yield
    pynvml.nvmlLib = loaded  # a stand-in must not outlive its test in pynvml's module state
    pynvml._nvmlGetFunctionPointer_cache.clear()
    unimplemented = sorted({name for lib in LIBRARIES for name in lib.unimplemented})
    violations = [v for lib in LIBRARIES for v in lib.violations]
    LIBRARIES.clear()
    assert not unimplemented, f"the agent called C symbols the stand-ins do not implement: {unimplemented}"
    assert not violations, f"calls that break nvml.h or amdsmi.h at a stand-in's boundary: {violations}"
