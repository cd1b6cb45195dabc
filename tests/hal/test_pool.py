"""hal's device memory pool (issue #15, item 1): reuse, stream order, stats, limits, OOM, bypass."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hal
from hal._pool import round_size

KiB = 1 << 10
MiB = 1 << 20
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "growing_cache.py"


@pytest.fixture
def cpu(hal_env: Callable[..., None]) -> Callable[..., hal.Device]:
    """Reload with one CPU-emulator device of ``memory`` bytes and the given HAL_MEMORY_* settings."""

    def make(memory: str = "64M", **env: str | None) -> hal.Device:
        base = {"HAL_MEMORY_POOL": None, "HAL_MEMORY_LIMIT": None, "HAL_MEMORY_RESERVE": None}
        hal_env(HAL_BACKENDS="cpu", HAL_CPU_DEVICES="1", HAL_CPU_MEMORY=memory, **{**base, **env})
        return hal.device("cpu:0")

    return make


def _backend_in_use(dev: hal.Device) -> int:
    return int(dev.properties()["memory_in_use"])  # the backend's own count (what the pool holds)


def test_size_classes() -> None:
    assert [round_size(n) for n in (1, 512, 513, 10 * KiB, MiB - 1, MiB, MiB + 1)] == [
        512,
        512,
        1024,
        10 * KiB,
        MiB,
        MiB,
        MiB + 128 * KiB,
    ]


def test_a_closed_block_is_reused_and_memory_in_use_means_live_buffers(
    cpu: Callable[..., hal.Device],
) -> None:
    dev = cpu()
    a = dev.alloc(10_000)
    impl = a._impl
    assert dev.memory_in_use == round_size(10_000) == _backend_in_use(dev)
    a.close()
    st = dev.memory_stats()
    assert dev.memory_in_use == 0 and st["in_use"] == 0  # a closed buffer returns its bytes at once
    assert (
        st["reserved"] == st["cached"] == round_size(10_000) == _backend_in_use(dev)
    )  # ... to the pool
    b = dev.alloc(9_800)  # the same size class
    assert b._impl is impl
    st = dev.memory_stats()
    assert (st["allocs"], st["cache_hits"], st["backend_allocs"], st["requested"]) == (
        2,
        1,
        1,
        9_800,
    )
    b.close()
    assert dev.empty_cache() == round_size(10_000)
    assert _backend_in_use(dev) == 0 and dev.memory_stats()["reserved"] == 0


def test_stream_ordered_reuse(cpu: Callable[..., hal.Device]) -> None:
    """A block freed while a stream may still read it goes to that stream at once, to others only after."""
    dev = cpu()
    s1, s2 = dev.create_stream(), dev.create_stream()
    data = np.arange(4096, dtype=np.uint8)
    buf = dev.alloc(4096)
    hal.copy(buf, data, stream=s1)
    s1.synchronize()
    gate = s1.wait_host()  # s1 holds its next work until the host says so
    out = np.zeros(4096, np.uint8)
    hal.copy(out, buf, stream=s1)  # queued: reads buf later
    impl = buf._impl
    buf.close()
    other = dev.alloc(4096, stream=s2)
    assert other._impl is not impl, "a block still read by s1 went to s2"
    hal.memset(other, 0xFF, stream=s2)
    same = dev.alloc(4096, stream=s1)
    assert same._impl is impl, (
        "s1's own order keeps its old and new work apart: the block should be reused"
    )
    hal.memset(same, 0xEE, stream=s1)  # runs after the queued copy, in s1's order
    gate.set()
    s1.synchronize()
    s2.synchronize()
    np.testing.assert_array_equal(out, data)  # the queued copy read the old bytes
    same.close()
    other.close()
    s1.synchronize()
    later = dev.alloc(4096, stream=s2)  # s1 is done now: anyone may have it
    assert later._impl in (impl, other._impl)
    later.close()


def test_out_of_memory_frees_the_cache_and_retries_once(cpu: Callable[..., hal.Device]) -> None:
    dev = cpu("64K")
    dev.alloc(40 * KiB).close()  # 40 KiB cached
    big = dev.alloc(48 * KiB)  # the backend has 24 KiB: the pool frees its cache and retries
    st = dev.memory_stats()
    assert (st["oom_retries"], st["ooms"], st["cached"], st["backend_frees"]) == (1, 0, 0, 1)
    with pytest.raises(hal.OutOfMemoryError) as info:
        dev.alloc(32 * KiB)
    msg = str(info.value)
    assert msg.startswith(
        "cpu:0: cannot allocate 32768 bytes: 16384 of 65536 free (raise HAL_CPU_MEMORY for more)"
    )
    assert (
        "pool: requested 32768 bytes (block 32768), in use 49152, reserved 49152, largest free block 0; "
        "the cache was empty: freeing it would not help"
    ) in msg
    assert dev.memory_in_use == 48 * KiB
    dev.alloc(8 * KiB).close()  # cached now
    with pytest.raises(
        hal.OutOfMemoryError,
        match=r"freeing the cache \(8192 bytes\) would not help: "
        r"16384 bytes would be free; kept it",
    ):
        dev.alloc(20 * KiB)
    st = dev.memory_stats()
    assert (st["cached"], st["ooms"], st["oom_retries"]) == (
        8 * KiB,
        2,
        1,
    )  # the failed call changed nothing
    assert dev.memory_in_use == 48 * KiB
    big.close()


def test_memory_limit(cpu: Callable[..., hal.Device]) -> None:
    dev = cpu("64M", HAL_MEMORY_LIMIT="1M")
    a = dev.alloc(768 * KiB)
    with pytest.raises(
        hal.OutOfMemoryError, match=r"HAL_MEMORY_LIMIT=1048576 allows 262144 more bytes"
    ) as info:
        dev.alloc(512 * KiB)
    assert "largest free block 0" in str(info.value)
    a.close()
    b = dev.alloc(1 * MiB)  # the 768 KiB block is freed to make room
    assert dev.memory_stats()["limit"] == MiB and dev.memory_stats()["reserved"] == MiB
    b.close()


def test_reserve_preallocates_and_stays(cpu: Callable[..., hal.Device]) -> None:
    dev = cpu()
    assert dev.reserve(3 * MiB) == 3 * MiB
    assert dev.memory_in_use == 0 and _backend_in_use(dev) == 3 * MiB
    allocs = dev.memory_stats()["backend_allocs"]
    with dev.alloc(3 * MiB - 5):
        assert dev.memory_stats()["backend_allocs"] == allocs  # served by the reservation
    assert dev.empty_cache() == 0 and dev.memory_stats()["cached"] == 3 * MiB  # kept
    with pytest.raises(ValueError, match="nbytes=-1"):
        dev.reserve(-1)
    with pytest.raises(hal.OutOfMemoryError):
        dev.reserve(1 << 40)
    assert _backend_in_use(dev) == 3 * MiB


def test_reserve_from_the_environment(cpu: Callable[..., hal.Device]) -> None:
    dev = cpu(HAL_MEMORY_RESERVE="2M")
    with dev.alloc(100):
        st = dev.memory_stats()
    assert st["kept_by_reserve"] == 2 * MiB and st["reserved"] == 2 * MiB + 512


def test_pool_off_goes_straight_to_the_backend(cpu: Callable[..., hal.Device]) -> None:
    dev = cpu(HAL_MEMORY_POOL="0")
    a = dev.alloc(10_000)
    assert dev.memory_in_use == 10_000  # exact: no size class
    a.close()
    assert _backend_in_use(dev) == 0
    st = dev.memory_stats()
    assert st["pool"] is False and st["reserved"] == 0 and dev.empty_cache() == 0
    with pytest.raises(hal.HalError, match="HAL_MEMORY_POOL=0"):
        dev.reserve(MiB)


def test_bad_settings_are_named(cpu: Callable[..., hal.Device]) -> None:
    dev = cpu(HAL_MEMORY_LIMIT="lots")
    with pytest.raises(hal.ConfigError, match="HAL_MEMORY_LIMIT='lots' is not a size"):
        dev.alloc(1)
    assert dev.memory_in_use == 0


def test_dlpack_exported_memory_is_never_handed_out_again(cpu: Callable[..., hal.Device]) -> None:
    dev = cpu()
    arr = hal.asarray(np.arange(1024, dtype=np.float32), device=dev)
    view = np.from_dlpack(arr)
    impl = arr.buffer._impl
    arr.close()
    with dev.alloc(4096) as again:
        assert again._impl is not impl
        hal.memset(again, 0, stream=dev.create_stream())
        dev.synchronize()
    np.testing.assert_array_equal(view, np.arange(1024, dtype=np.float32))


def test_stats_and_size_classes(cpu: Callable[..., hal.Device]) -> None:
    dev = cpu()
    keep = [dev.alloc(n) for n in (100, 3000, 3000, 2 * MiB)]
    keep[1].close()
    st = dev.memory_stats()
    assert st["size_classes"] == {
        "<=512": {"allocs": 1, "live": 1},
        "<=4K": {"allocs": 2, "live": 1},
        "<=2M": {"allocs": 1, "live": 1},
    }
    assert st["largest_free_block"] == 3072 and st["fragmentation"] == 0.0
    keep[3].close()
    st = dev.memory_stats()
    assert st["largest_free_block"] == 2 * MiB
    assert st["fragmentation"] == pytest.approx(1 - 2 * MiB / (2 * MiB + 3072))
    assert st["peak_in_use"] == 512 + 2 * 3072 + 2 * MiB
    json.dumps(st)


def test_growing_cache_keeps_running_and_hal_memory_reports_it(
    python_run: Callable[..., Any], tmp_path: Path
) -> None:
    """The seeds' growing-cache pattern under a 48 MiB limit: blocks of the wrong sizes fill the pool,
    the pool frees them and retries, nothing fails; ``hal memory --json`` reports the pool afterwards."""
    proc = python_run(
        ["-m", "hal", "memory", "--json", "--run", str(EXAMPLE)],
        env={"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1"},
        cwd=tmp_path,
    )
    first, rest = proc.stdout.split("\n", 1)
    run = json.loads(first.removeprefix("growing cache: "))
    stats = json.loads(rest)["devices"][0]
    assert run["ooms"] == 0 and run["oom_retries"] >= 1, run
    worst = run["worst"]
    assert worst["fragmentation"] > 0.5 and worst["largest_free_block"] < worst["cached"], run
    assert stats["device"] == "cpu:0" and stats["pool"] is True and stats["limit"] == 48 * MiB
    assert (
        stats["peak_reserved"] <= 48 * MiB
        and stats["ooms"] == 0
        and stats["oom_retries"] == run["oom_retries"]
    )
    assert {
        "fragmentation",
        "largest_free_block",
        "size_classes",
        "in_use",
        "reserved",
        "peak_in_use",
    } <= set(stats)


def test_hal_memory_table_and_bad_arguments(python_run: Callable[..., Any], tmp_path: Path) -> None:
    out = python_run(
        ["-m", "hal", "memory"],
        env={"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1", "HAL_MEMORY_RESERVE": "1M"},
        cwd=tmp_path,
    ).stdout
    assert "cpu:0: pool on" in out and "reserved             1.00 MiB" in out, out
    off = python_run(
        ["-m", "hal", "memory"], env={"HAL_BACKENDS": "cpu", "HAL_MEMORY_POOL": "0"}, cwd=tmp_path
    ).stdout
    assert "pool off (HAL_MEMORY_POOL=0)" in off
    bad = python_run(
        ["-m", "hal", "memory", "extra"], env={"HAL_BACKENDS": "cpu"}, cwd=tmp_path, check=False
    )
    assert bad.returncode == 2 and "give a script with --run" in bad.stderr


def test_the_timeline_gets_memory_counters(cpu: Callable[..., hal.Device]) -> None:
    dev = cpu()
    with hal.trace() as tr:
        a = dev.alloc(3 * MiB)
        a.close()
        dev.alloc(1000).close()
    doc = tr.to_json()
    events = doc["traceEvents"] if isinstance(doc, dict) else json.loads(doc)["traceEvents"]
    counters = [e["args"] for e in events if e.get("ph") == "C" and e.get("name") == "cpu:0 memory"]
    assert counters[:2] == [
        {"in_use": 3 * MiB, "reserved": 3 * MiB},
        {"in_use": 1024, "reserved": 3 * MiB + 1024},
    ]


def test_stream_ordered_reuse_on_every_backend(device: hal.Device) -> None:
    """The same rule on each backend of the suite (cpu, opencl): a block still read on s1 never goes to s2.

    The read is held on s1 by a host signal; a backend without ``host_signal`` (docs/write-a-backend.md's
    synchronous one) cannot have a read pending there, so the rule has nothing to check on it."""
    if not device.capabilities.host_signal:
        pytest.skip(
            f"{device} declares host_signal absent: {device.capabilities.reason_absent('host_signal')}"
        )
    s1, s2 = device.create_stream(), device.create_stream()
    data = (np.arange(8192) % 251).astype(np.uint8)
    buf = device.alloc(8192)
    hal.copy(buf, data, stream=s1)
    s1.synchronize()
    gate = s1.wait_host(timeout=60)
    out = np.zeros(8192, np.uint8)
    hal.copy(out, buf, stream=s1)
    impl = buf._impl
    buf.close()
    other = device.alloc(8192, stream=s2)
    try:
        assert other._impl is not impl
        hal.memset(other, 0xFF, stream=s2)
        s2.synchronize()
    finally:
        gate.set()
    s1.synchronize()
    np.testing.assert_array_equal(out, data)
    other.close()
    device.empty_cache()
