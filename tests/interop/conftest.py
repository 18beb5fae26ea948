"""The interop matrix's marker (see test_agent_matrix.py)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "step(name, needs=()): a step of the agent flow; skipped when the agent cannot do it "
        "or a needed step did not pass",
    )
