"""pytest fixtures of the node agent tests (helpers live in agent_fixtures.py)."""

from tests.node_agent.agent_fixtures import inventory_of  # noqa: F401  (re-exported as a pytest fixture)
