"""How often a call prepared both ways (hal.comm._shm._Either) looks at each way.

The leader's clock is the only input: a fake one makes each way take a fixed time, so the calls
that run the slower way are exactly the looks.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from hal.comm import _shm


class _Clock:
    """``time`` for _shm: a clock that only moves when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def _run(
    either: Any,
    clock: _Clock,
    cost: dict[str, float],
    calls: int,
    fail: frozenset[int] = frozenset(),
) -> list[str]:
    """Run ``calls`` calls; return the way of each ("slots" or "ref"). A call in ``fail`` raises
    before it completes (no ``done()``)."""
    ways = []
    for n in range(calls):
        way = "ref" if either.start() is either.ref else "slots"
        ways.append(way)
        clock.now += cost[way]
        if n not in fail:
            either.done()
    return ways


def _look_starts(ways: list[str], other: str) -> list[int]:
    """The calls that start a run of the way ``other`` (between looks the other way runs)."""
    return [i for i, w in enumerate(ways) if w == other and (i == 0 or ways[i - 1] != other)]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(_shm, "time", types.SimpleNamespace(perf_counter=c.perf_counter))
    return c


def _either() -> Any:
    return _shm._Either(("slots",), ("ref",), None)  # type: ignore[arg-type]


def test_looks_come_every_period_calls(clock: _Clock) -> None:
    """By reference faster, calls of seconds (``gap`` passes at once): the first look at call 0,
    then every 256 calls, each 7 calls through the slots and 7 by reference; nothing else runs
    the slower way."""
    e = _either()
    ways = _run(e, clock, {"slots": 2.0, "ref": 1.0}, 1100)
    assert _look_starts(ways, "slots") == [0, 256, 512, 768, 1024]
    k = e.warm + e.look
    assert ways[:k] == ["slots"] * k and ways[k : 2 * k] == ["ref"] * k
    assert ways.count("slots") == 5 * k


def test_looks_are_at_least_gap_seconds_apart(
    clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short calls (2^-13 s by reference): after a look the next waits until ``gap`` (here 2^-4
    s: 512 calls) has passed since it ended, not only 256 calls."""
    monkeypatch.setattr(_shm._Either, "gap", 2.0**-4)
    e = _either()
    ways = _run(e, clock, {"slots": 2.0**-12, "ref": 2.0**-13}, 2000)
    k = e.warm + e.look
    assert _look_starts(ways, "slots") == [0, 2 * k + 512, 2 * (2 * k + 512), 3 * (2 * k + 512)]


def test_a_way_that_slows_down_is_looked_at_again_at_once(clock: _Clock) -> None:
    """The slots faster, then from call 1,000 three times slower (the host's phase changed):
    after 4 calls in a row 1.5x slower than the last look found, the next call starts a look,
    which moves the calls to the other way, without waiting for the next period (1,024)."""
    e = _either()
    cost = {"slots": 1.0, "ref": 2.0}
    ways = _run(e, clock, cost, 1000)
    assert ways[-1] == "slots"
    cost["slots"] = 3.0
    ways += _run(e, clock, cost, 100)
    k = e.warm + e.look
    assert ways[1000:1004] == ["slots"] * 4
    assert _look_starts(ways, "ref") == [k, 256 + k, 512 + k, 768 + k, 1004 + k]
    assert ways[1004 + 2 * k :] == ["ref"] * (1100 - 1004 - 2 * k)


def test_a_look_cut_short_by_a_failed_call_starts_again(clock: _Clock) -> None:
    """The last call of the first look fails (no ``done()``): no way is chosen then, and the next
    call starts a new look instead of never looking again."""
    e = _either()
    k = e.warm + e.look
    ways = _run(e, clock, {"slots": 2.0, "ref": 1.0}, 600, fail=frozenset({2 * k - 1}))
    assert ways[2 * k : 3 * k] == ["slots"] * k  # the look again, from its start
    assert _look_starts(ways, "slots") == [0, 2 * k, 2 * k + 256, 2 * k + 512]
