"""Out of memory: a real OutOfMemoryError, nothing leaked, the accounting stays right."""

from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np
import pytest

import hal

KiB = 1 << 10


def test_alloc_beyond_device_memory(device: hal.Device) -> None:
    gc.collect()
    before = device.memory_in_use
    too_big = device.total_memory + 1
    limit = device.capabilities.max_alloc_bytes
    if limit is not None and too_big > limit:
        with pytest.raises(ValueError, match=f"nbytes={too_big}"):
            device.alloc(too_big)
    else:
        with pytest.raises(hal.OutOfMemoryError) as info:
            device.alloc(too_big)
        assert str(device) in str(info.value)
    assert device.memory_in_use == before


@pytest.fixture
def small_cpu(hal_env: Callable[..., None]) -> list[hal.Device]:
    """Two CPU-emulator devices of 64 KiB each (plugins reloaded; restored after the test)."""
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_MEMORY="64K", HAL_CPU_DEVICES="2")
    devs = hal.devices("cpu")
    assert [d.total_memory for d in devs] == [64 * KiB, 64 * KiB]
    return devs


def test_small_cpu_memory_raises_out_of_memory(small_cpu: list[hal.Device]) -> None:
    dev = small_cpu[0]
    assert dev.memory_in_use == 0
    with pytest.raises(hal.OutOfMemoryError, match="HAL_CPU_MEMORY") as info:
        dev.alloc(64 * KiB + 1)
    assert isinstance(info.value, hal.DeviceError)
    assert info.value.device == "cpu:0"
    assert dev.memory_in_use == 0
    whole = dev.alloc(64 * KiB)
    assert dev.memory_in_use == 64 * KiB
    with pytest.raises(hal.OutOfMemoryError):
        dev.alloc(1)
    assert dev.memory_in_use == 64 * KiB
    whole.close()
    assert dev.memory_in_use == 0


def test_fill_up_then_free(small_cpu: list[hal.Device]) -> None:
    dev, other = small_cpu
    bufs = [dev.alloc(10 * KiB) for _ in range(6)]
    assert dev.memory_in_use == 60 * KiB
    with pytest.raises(hal.OutOfMemoryError, match=f"{4 * KiB} of {64 * KiB} free"):
        dev.alloc(5 * KiB)
    assert other.memory_in_use == 0, "devices account their memory separately"
    with other.alloc(64 * KiB):
        assert other.memory_in_use == 64 * KiB
    bufs[0].close()
    bufs[1].close()
    extra = dev.alloc(24 * KiB)
    assert dev.memory_in_use == 64 * KiB
    extra.close()
    del bufs
    gc.collect()
    assert dev.memory_in_use == 0


def test_asarray_out_of_memory_leaks_nothing(small_cpu: list[hal.Device]) -> None:
    dev = small_cpu[0]
    keep = dev.alloc(60 * KiB)
    with pytest.raises(hal.OutOfMemoryError):
        hal.asarray(np.zeros(8 * KiB, np.uint8), device=dev)
    assert dev.memory_in_use == 60 * KiB
    keep.close()
    arr = hal.asarray(np.ones(8 * KiB, np.uint8), device=dev)
    assert dev.memory_in_use == 8 * KiB
    arr.close()
    assert dev.memory_in_use == 0


def test_zero_capacity_device(hal_env: Callable[..., None]) -> None:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_MEMORY="0", HAL_CPU_DEVICES="1")
    dev = hal.device("cpu:0")
    with pytest.raises(hal.OutOfMemoryError):
        dev.alloc(1)
    with dev.alloc(0) as empty:
        assert empty.nbytes == 0
    assert dev.memory_in_use == 0
