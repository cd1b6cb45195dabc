"""What ``hal.comm.create`` and ``close`` cost: a communicator's thread and stream come with its first call.

Frameworks build a communicator per sub-group (torch ``new_group``, pipeline stages), many of
them used rarely or never: ``create`` makes no thread and no stream; the first call queued to a
device's engine starts them, and ``close`` ends and releases what was made (docs/comm.md).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import hal
import hal.comm


def _comm_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hal-comm-local-rank")]


@pytest.fixture
def pair() -> list[hal.Device]:
    devs = hal.devices("cpu")[:2]
    if len(devs) < 2:
        pytest.skip("needs 2 cpu devices")
    return devs


def test_create_and_close_start_no_thread(pair: list[hal.Device]) -> None:
    """An unused communicator starts no engine thread; the first call starts one per device, close joins them."""
    before = _comm_threads()
    comm = hal.comm.create(pair)
    assert _comm_threads() == before
    comm.close()
    assert _comm_threads() == before

    comm = hal.comm.create(pair)
    streams = [d.create_stream() for d in pair]
    xs = [hal.asarray(np.full(4, r + 1, np.float32), device=d) for r, d in enumerate(pair)]
    comm.all_reduce(xs, op="sum", streams=streams).wait()
    assert [x.to_host().tolist() for x in xs] == [[3.0] * 4] * 2
    started = [t for t in _comm_threads() if t not in before]
    assert sorted(t.name for t in started) == ["hal-comm-local-rank0", "hal-comm-local-rank1"]
    comm.close()
    assert not any(t.is_alive() for t in started)
    assert _comm_threads() == before
    for x in xs:
        x.close()
    for s in streams:
        s.close()


def test_unused_communicators_release_everything(pair: list[hal.Device]) -> None:
    """Communicators never called, closed or aborted, leave no device memory behind; close stays idempotent."""
    mem = [d.memory_in_use for d in pair]
    for _ in range(50):
        comm = hal.comm.create(pair)
        comm.close()
        comm.close()
    comm = hal.comm.create(pair)
    for rank in comm.ranks:
        rank.abort()
    comm.close()
    assert [d.memory_in_use for d in pair] == mem
    streams = [d.create_stream() for d in pair]
    xs = [hal.asarray(np.ones(4, np.float32), device=d) for d in pair]
    with pytest.raises(hal.CommError, match="closed"):
        comm.all_reduce(xs, streams=streams)
    for x in xs:
        x.close()
    for s in streams:
        s.close()


def test_close_finishes_the_queued_calls(pair: list[hal.Device]) -> None:
    """close() returns after the calls queued before it completed (every device's thread ends at once)."""
    comm = hal.comm.create(pair)
    streams = [d.create_stream() for d in pair]
    n = 1 << 16  # 256 KiB: queued on the engine threads
    xs = [hal.asarray(np.full(n, r + 1, np.float32), device=d) for r, d in enumerate(pair)]
    works = [comm.all_reduce(xs, op="sum", streams=streams) for _ in range(3)]
    comm.close()
    assert all(w.done() for w in works)
    for w in works:
        w.wait()
    assert all(float(x.to_host()[0]) == 3.0 * 2**2 for x in xs)  # 3, then 6, then 12
    for x in xs:
        x.close()
    for s in streams:
        s.close()


def test_each_create_reads_the_environment(
    pair: list[hal.Device], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resolved settings are reused only while the variables are unchanged: each create sees a change."""
    streams = [d.create_stream() for d in pair]
    xs = [hal.asarray(np.ones(8, np.float32), device=d) for d in pair]

    def algorithm() -> tuple[str, str]:
        with hal.comm.create(pair) as comm:
            w = comm.all_reduce(xs, op="max", streams=streams)
            w.wait()
            return w.plan[0].algorithm, w.plan[0].chosen_by

    monkeypatch.setenv("HAL_COMM_ALGO", "allreduce:ring")
    assert algorithm() == ("ring", "HAL_COMM_ALGO")
    monkeypatch.delenv("HAL_COMM_ALGO")
    assert algorithm()[1] != "HAL_COMM_ALGO"
    monkeypatch.setenv("HAL_COMM_ALGO", "allreduce:ring")
    assert algorithm() == ("ring", "HAL_COMM_ALGO")
    monkeypatch.setenv("HAL_COMM_TIMEOUT_MS", "-5")
    for _ in range(2):  # a bad value fails every create, not only the first
        with pytest.raises(hal.ConfigError, match="HAL_COMM_TIMEOUT_MS"):
            hal.comm.create(pair)
    monkeypatch.delenv("HAL_COMM_TIMEOUT_MS")
    assert algorithm() == ("ring", "HAL_COMM_ALGO")
    for x in xs:
        x.close()
    for s in streams:
        s.close()
