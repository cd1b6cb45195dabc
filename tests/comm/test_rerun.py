"""Repeated small calls run again as prepared (``Engine.rerun``) and stay correct when what they depend on changes.

Real ranks under ``hal run`` (tests/comm/rerun_worker.py): the stream's earlier work held back
by a host signal (the same stream, another stream, a large call queued ahead), a buffer closed
and others allocated, a tracer opened, the communicator closed, a peer aborting, a peer silent
(timeout naming it and the op, flight entry failed), a shrink. Native engine, and the Python
path (``HAL_COMM_NATIVE=0``) where the calls never run prepared.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hal.comm import _native

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comm_launch import hal_run  # noqa: E402

WORKER = str(HERE / "rerun_worker.py")


def _native_or_skip(native: str) -> None:
    if native == "1" and _native.load() is None:
        pytest.skip("the native engine cannot be built here (no C compiler)")


def _ok(ranks: int, scenario: str, env: dict[str, str]) -> None:
    proc = hal_run(ranks, [WORKER, scenario], env, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in range(ranks):
        assert f'OK rank {r} "{scenario}"' in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("native", ["1", "0"])
def test_repeated_calls_keep_order_and_checks(native: str) -> None:
    """Stream order, another stream, a queued call ahead, closed buffers, a tracer, close."""
    _native_or_skip(native)
    _ok(2, "calls", {"HAL_COMM_NATIVE": native})


@pytest.mark.parametrize(
    ("ranks", "env"),
    [
        (2, {}),
        (3, {"EVICT": "1"}),
        (4, {"HAL_COMM_CHUNK_BYTES": "4K", "HAL_COMM_SHM_SLOTS": "2"}),
        (2, {"HAL_COMM_CHUNK_BYTES": "4K", "HAL_COMM_CMA_BYTES": "8K", "EVICT": "1"}),
    ],
)
def test_repeated_programs_equal_the_python_path(ranks: int, env: dict[str, str]) -> None:
    """reduce_scatter, reduce, all_gather, broadcast and all_reduce repeated on the same arrays run
    again as prepared programs (every collective on 3+ ranks, or of several pieces), also after
    the engine dropped their programs (EVICT), bit for bit equal to HAL_COMM_NATIVE=0."""
    _native_or_skip("1")
    _ok(ranks, "programs", env)


def test_a_silent_peer_times_out_a_repeated_call() -> None:
    """The prepared call's timeout names the silent rank and the op; the flight entry failed."""
    _native_or_skip("1")
    _ok(2, "timeout", {"HAL_COMM_TIMEOUT_MS": "1000"})


@pytest.mark.parametrize("how", ["silent", "exit"])
def test_a_repeated_program_names_a_silent_or_dead_peer(how: str) -> None:
    """A prepared reduce_scatter (a compiled program) whose peer falls silent times out naming it
    and the op; one whose peer exits names it dead; the flight entry failed."""
    _native_or_skip("1")
    proc = hal_run(
        2, [WORKER, "program_fails"], {"HAL_COMM_TIMEOUT_MS": "1000", "HOW": how}, timeout=200
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'OK rank 0 "program_fails"' in proc.stdout, proc.stdout + proc.stderr


def test_abort_after_repeated_calls() -> None:
    """The aborting rank's next call is refused; its peer's prepared call fails naming it."""
    _native_or_skip("1")
    _ok(2, "abort", {"HAL_COMM_TIMEOUT_MS": "5000"})


def test_shrink_after_repeated_calls() -> None:
    """A stalled rank after prepared calls: the others time out, shrink, and repeat calls correctly."""
    _native_or_skip("1")
    _ok(3, "shrink", {"HAL_COMM_TIMEOUT_MS": "1000"})


@pytest.mark.parametrize("pin", ["distinct", "same"])
def test_ranks_bound_one_per_core_poll(pin: str) -> None:
    """Ranks bound to a core each (as Open MPI's mpirun binds them) poll; two on one core do not."""
    _native_or_skip("1")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    _ok(2, "affinity", {"PIN": pin})
