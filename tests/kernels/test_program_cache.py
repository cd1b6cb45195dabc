"""The in-memory program cache is bounded (least recently used dropped) and owned by the runtime."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import hal
import hal.kernels as hk
from hal.kernels._program import program_cache_keys

SRC = (
    "HAL_KERNEL void fill(HAL_GLOBAL hal_f32* p, hal_f32 v, hal_i64 n) "
    "{{ hal_i64 i = HAL_GLOBAL_ID(0); if (i < n) p[i] = v + {k}; }}"
)


@pytest.fixture
def cpu() -> Iterator[hal.Device]:
    hal.runtime().clear_caches()
    yield hal.devices("cpu")[0]
    hk.configure(None)
    hal.runtime().clear_caches()


def _keys(dev: hal.Device) -> list[str]:
    return [k for d, k in program_cache_keys() if d == dev]


def test_program_cache_keeps_the_most_recently_used(
    cpu: hal.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HAL_KERNELS_PROGRAM_CACHE", "2")
    p0 = hk.compile(SRC.format(k=0), cpu)
    p1 = hk.compile(SRC.format(k=1), cpu)
    assert hk.compile(SRC.format(k=0), cpu) is p0  # a hit makes p0 the most recent
    p2 = hk.compile(SRC.format(k=2), cpu)  # the third program drops p1, the least recent
    assert _keys(cpu) == [p0.key, p2.key]
    stats = hk.cache_stats()
    before = stats.memory_hits
    again = hk.compile(SRC.format(k=1), cpu)  # p1 was dropped: built again (from the disk cache)
    assert stats.memory_hits == before and again is not p1 and again.key == p1.key
    assert _keys(cpu) == [p2.key, p1.key]
    # an evicted program stays usable by whoever holds it
    buf = hal.asarray([0.0, 0.0], device=cpu, dtype="float32")
    with cpu.create_stream() as s:
        p0.launch("fill", 2, [buf, 5.0, 2], stream=s)
        assert buf.to_host(stream=s).tolist() == [5.0, 5.0]


def test_code_wins_over_the_environment(cpu: hal.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAL_KERNELS_PROGRAM_CACHE", "5")
    assert hk.configure(hk.KernelOptions(program_cache=1)).program_cache == 1
    hk.compile(SRC.format(k=10), cpu)
    p = hk.compile(SRC.format(k=11), cpu)
    assert _keys(cpu) == [p.key]
    hk.configure(None)  # back to the environment
    assert hk.configure().program_cache == 5


def test_bad_cache_sizes_are_named(cpu: hal.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(hal.ConfigError, match=r"KernelOptions.program_cache=0 is out of range"):
        hk.configure(hk.KernelOptions(program_cache=0))
    monkeypatch.setenv("HAL_KERNELS_PROGRAM_CACHE", "lots")
    with pytest.raises(
        hal.ConfigError, match=r"HAL_KERNELS_PROGRAM_CACHE='lots' is not an integer"
    ):
        hk.compile(SRC.format(k=20), cpu)
    monkeypatch.setenv("HAL_KERNELS_PROGRAM_CACHE", "8")
    monkeypatch.setenv("HAL_CACHE_MAX_BYTES", "inf")
    with pytest.raises(hal.ConfigError, match=r"HAL_CACHE_MAX_BYTES='inf' is not a size"):
        hk.compile(SRC.format(k=21), cpu)


def test_runtime_reset_drops_the_programs(cpu: hal.Device) -> None:
    hk.configure(hk.KernelOptions(program_cache=4))
    hk.compile(SRC.format(k=30), cpu)
    assert _keys(cpu)
    assert "hal.kernels.programs" in hal.runtime().caches()
    hal.runtime().reset()
    assert program_cache_keys() == []
    assert hk.configure().program_cache == 256  # the options given in code went too


def test_a_program_dropped_with_launches_queued_still_runs_them(
    cpu: hal.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    import numpy as np

    monkeypatch.setenv("HAL_KERNELS_PROGRAM_CACHE", "1")
    buf = hal.asarray(np.zeros(4096, np.float32), device=cpu)
    with cpu.create_stream() as s:
        gate = s.wait_host(timeout=30)  # everything after it stays queued until set()
        p = hk.compile(SRC.format(k=40), cpu)
        p.launch("fill", 4096, [buf, 2.0, 4096], stream=s)
        del p
        hk.compile(SRC.format(k=41), cpu)  # evicts the first: nothing holds it but the queue
        hal.runtime().clear_caches()
        gc.collect()
        gate.set()
        got = buf.to_host(stream=s)
    assert (got == 42.0).all()
