"""The test that pytest collects for ``pytest --pyargs hal.conformance --hal-backend NAME``.

It is parametrized by :mod:`hal.conformance.pytest_plugin` over every requirement
instance of the backend under test.
"""

from __future__ import annotations

from typing import Any


def test_requirement(hal_instance: Any, hal_conformance: Any) -> None:
    """Check one requirement on one target of the backend under test."""
    hal_conformance.execute(hal_instance)
