"""Checks shared by the rank scripts of tests/comm (run by ``hal run``, their folder on ``sys.path``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

E = TypeVar("E", bound=BaseException)


def say(line: str) -> None:
    """Print ``line`` with one write (ranks share the launcher's stdout)."""
    os.write(1, (line + "\n").encode())


def refused(error: type[E] | tuple[type[E], ...], call: Callable[[], object], what: str) -> E:
    """Return the ``error`` that ``call()`` raises; fail with ``"<what> passed"`` if it returns."""
    try:
        call()
    except error as exc:
        return exc
    raise AssertionError(f"{what} passed")
