"""hal.alloc_host / hal.empty_host: host memory the device copies from and to fastest (issue #15, item 2)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import hal


def _chain(arr: np.ndarray) -> list[object]:
    out: list[object] = []
    base: object = arr
    while base is not None:
        out.append(base)
        base = getattr(base, "base", None)
    return out


def test_round_trip_through_host_memory_of_the_device(device: hal.Device) -> None:
    h = hal.empty_host((4, 1000), np.float32, device=device)
    assert (
        h.shape == (4, 1000)
        and h.dtype == np.float32
        and h.flags.c_contiguous
        and h.flags.writeable
    )
    h[:] = np.arange(4000, dtype=np.float32).reshape(4, 1000)
    s = device.create_stream()
    with device.alloc(h.nbytes) as buf:
        hal.copy(buf, h, stream=s)
        out = hal.empty_host(4000, np.float32, device=device)
        hal.copy(out, buf, stream=s)
        s.synchronize()
    np.testing.assert_array_equal(out, h.ravel())
    raw = hal.alloc_host(100, device=str(device))
    assert raw.dtype == np.uint8 and raw.shape == (100,)


def test_what_each_backend_gives(device: hal.Device) -> None:
    provided = device._impl.alloc_host(64)
    if device.backend == "cpu":
        assert provided is None  # the emulator: plain host memory
        assert _chain(hal.alloc_host(64, device=device))[-1].__class__ is np.ndarray
    elif device.backend == "opencl":
        kinds = {type(x).__name__ for x in _chain(hal.alloc_host(64, device=device))}
        assert "MemoryMap" in kinds, (
            kinds
        )  # a mapped CL_MEM_ALLOC_HOST_PTR buffer, unmapped when collected
    elif device.backend == "cuda":
        assert type(provided).__name__ == "PinnedMemoryPointer"  # CuPy's page-locked memory
    del provided
    gc.collect()


def test_many_host_buffers_come_and_go(device: hal.Device) -> None:
    for i in range(50):
        h = hal.alloc_host(64 << 10, device=device)
        h[:8] = i
        assert int(h[7]) == i
    del h
    gc.collect()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="nbytes=-1 must be >= 0"):
        hal.alloc_host(-1)
    with pytest.raises(TypeError, match="nbytes='8' must be an integer"):
        hal.alloc_host("8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"shape=\(2, -1\) has a negative dimension"):
        hal.empty_host((2, -1))
    with pytest.raises(TypeError, match=r"shape=\(2.5,\) must hold integers"):
        hal.empty_host(2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dtype object"):
        hal.empty_host(3, object)
    with pytest.raises(TypeError, match=r"is not a hal\.Device"):
        hal.alloc_host(8, device=3)  # type: ignore[arg-type]
    assert hal.alloc_host(0).shape == (0,) and hal.empty_host((0, 3)).shape == (0, 3)
