"""Repeated small collectives (the fast path of repeated calls) keep every check and result.

2 ranks under ``hal run`` repeat calls on the same arrays, then change the count, dtype, op and
root, close a buffer, pass bad arguments, and finally disagree: each call after the repeated
ones gets the right result or the right named error (tests/comm/fastpath_worker.py), with the
native engine and on the Python path (``HAL_COMM_NATIVE=0``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hal.comm import _native

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comm_launch import hal_run  # noqa: E402

WORKER = str(HERE / "fastpath_worker.py")


@pytest.mark.parametrize("native", ["1", "0"])
def test_repeated_calls_then_changed_ones(native: str) -> None:
    """Results and errors after fast-path calls, native engine and Python path."""
    if native == "1" and _native.load() is None:
        pytest.skip("the native engine cannot be built here (no C compiler)")
    proc = hal_run(2, [WORKER], {"HAL_COMM_NATIVE": native}, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    engine = "python" if native == "0" else "native"
    for r in (0, 1):
        assert f"OK rank {r} engine={engine}" in proc.stdout, proc.stdout + proc.stderr
