"""Buffers: allocation, zero size, lifetime (close, context manager, finalizer), use after close."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import hal


def _in_use(device: hal.Device) -> int:
    gc.collect()
    used = device.memory_in_use
    if used is None:
        pytest.skip(f"{device} does not track memory_in_use")
    return used


@pytest.mark.parametrize("nbytes", [1, 3, 4096, 65537, 1 << 20])
def test_alloc_sizes(device: hal.Device, nbytes: int) -> None:
    buf = device.alloc(nbytes)
    try:
        assert buf.nbytes == nbytes
        assert buf.device == device
        assert not buf.closed
        assert str(device) in repr(buf)
    finally:
        buf.close()
    assert buf.closed


def test_alloc_accepts_numpy_integers(device: hal.Device) -> None:
    with device.alloc(np.int64(16)) as buf:
        assert buf.nbytes == 16
        assert type(buf.nbytes) is int


@pytest.mark.parametrize(
    ("nbytes", "exc", "text"),
    [
        (-1, ValueError, "nbytes=-1"),
        (1.5, TypeError, "nbytes=1.5"),
        (True, TypeError, "nbytes=True"),
        ("8", TypeError, "nbytes='8'"),
        (None, TypeError, "nbytes=None"),
    ],
)
def test_alloc_rejects_bad_sizes(
    device: hal.Device, nbytes: object, exc: type[Exception], text: str
) -> None:
    with pytest.raises(exc, match=text.replace("(", r"\(")):
        device.alloc(nbytes)  # type: ignore[arg-type]


def test_alloc_above_max_alloc_is_value_error(device: hal.Device) -> None:
    limit = device.capabilities.max_alloc_bytes
    if limit is None:
        pytest.skip(f"{device} declares no max_alloc_bytes")
    with pytest.raises(ValueError, match=f"nbytes={limit + 1}"):
        device.alloc(limit + 1)


def test_zero_size_buffer(device: hal.Device, stream: hal.Stream) -> None:
    before = device.memory_in_use
    buf = device.alloc(0)
    assert buf.nbytes == 0
    assert device.memory_in_use == before
    arr = buf.view(np.float32)
    assert arr.shape == (0,)
    assert arr.to_host().shape == (0,)
    host = np.zeros(0, np.uint8)
    assert hal.copy(buf, host, stream=stream) == "local"
    assert hal.copy(host, buf, stream=stream) == "local"
    hal.memset(buf, 1, stream=stream)
    stream.synchronize()
    buf.close()
    buf.close()
    with pytest.raises(hal.InvalidBufferError):
        buf.view(np.uint8)


def test_close_is_idempotent(device: hal.Device) -> None:
    base = _in_use(device)
    buf = device.alloc(1000)
    assert _in_use(device) >= base + 1000
    buf.close()
    assert _in_use(device) == base
    buf.close()
    buf.close()
    assert buf.closed
    assert "closed" in repr(buf)
    assert _in_use(device) == base


def test_context_manager_closes(device: hal.Device) -> None:
    base = _in_use(device)
    with device.alloc(2048) as buf:
        assert not buf.closed
        assert _in_use(device) >= base + 2048
    assert buf.closed
    assert _in_use(device) == base


def test_context_manager_closes_on_error(device: hal.Device) -> None:
    base = _in_use(device)
    with pytest.raises(RuntimeError, match="inside"), device.alloc(64) as buf:
        raise RuntimeError("inside")
    assert buf.closed
    assert _in_use(device) == base


def test_finalizer_frees_unclosed_buffer(device: hal.Device) -> None:
    base = _in_use(device)
    bufs = [device.alloc(4096) for _ in range(4)]
    assert _in_use(device) >= base + 4 * 4096
    del bufs
    assert _in_use(device) == base


def test_finalizer_frees_unclosed_asarray(device: hal.Device) -> None:
    base = _in_use(device)
    arr = hal.asarray(np.arange(1000, dtype=np.int32), device=device)
    assert _in_use(device) >= base + 4000
    del arr
    assert _in_use(device) == base


def test_array_view_keeps_buffer_alive(device: hal.Device, stream: hal.Stream) -> None:
    base = _in_use(device)
    buf = device.alloc(64)
    hal.copy(buf, np.arange(64, dtype=np.uint8), stream=stream)
    stream.synchronize()
    view = buf.view(np.uint8)
    del buf
    assert _in_use(device) >= base + 64
    np.testing.assert_array_equal(view.to_host(), np.arange(64, dtype=np.uint8))
    del view
    assert _in_use(device) == base


def test_buffer_cannot_be_constructed_directly() -> None:
    with pytest.raises(TypeError, match="alloc"):
        hal.Buffer(16)
    with pytest.raises(TypeError, match="asarray"):
        hal.Array()


# -- use after close: every API that takes a buffer ----------------------------------------


@pytest.fixture(params=[0, 48], ids=["empty", "48B"])
def closed_buffer(device: hal.Device, request: pytest.FixtureRequest) -> hal.Buffer:
    buf = device.alloc(request.param)
    buf.close()
    return buf


def test_use_after_close_view(closed_buffer: hal.Buffer) -> None:
    with pytest.raises(hal.InvalidBufferError, match="closed"):
        closed_buffer.view(np.uint8)


def test_use_after_close_copy(
    device: hal.Device, stream: hal.Stream, closed_buffer: hal.Buffer
) -> None:
    host = np.zeros(closed_buffer.nbytes, np.uint8)
    with device.alloc(closed_buffer.nbytes) as live:
        for dst, src in [
            (closed_buffer, host),
            (host, closed_buffer),
            (closed_buffer, live),
            (live, closed_buffer),
        ]:
            with pytest.raises(hal.InvalidBufferError):
                hal.copy(dst, src, stream=stream)
            with pytest.raises(hal.InvalidBufferError):
                hal.copy_path(dst, src)
    stream.synchronize()


def test_use_after_close_memset(stream: hal.Stream, closed_buffer: hal.Buffer) -> None:
    with pytest.raises(hal.InvalidBufferError):
        hal.memset(closed_buffer, 0, stream=stream)


def test_use_after_close_array(
    device: hal.Device, stream: hal.Stream, closed_buffer: hal.Buffer
) -> None:
    live = device.alloc(closed_buffer.nbytes)
    arr = live.view(np.uint8)
    live.close()
    host = np.zeros(closed_buffer.nbytes, np.uint8)
    with pytest.raises(hal.InvalidBufferError):
        arr.to_host()
    with pytest.raises(hal.InvalidBufferError):
        arr.to_host(stream=stream)
    with pytest.raises(hal.InvalidBufferError):
        hal.copy(arr, host, stream=stream)
    with pytest.raises(hal.InvalidBufferError):
        hal.copy(host, arr, stream=stream)
    with pytest.raises(hal.InvalidBufferError):
        hal.memset(arr, 1, stream=stream)
    with pytest.raises(hal.InvalidBufferError):
        arr.__dlpack__()
    with pytest.raises(hal.InvalidBufferError):
        arr.__dlpack_device__()


def test_use_after_close_asarray_owner(device: hal.Device) -> None:
    arr = hal.asarray(np.ones(8), device=device)
    arr.close()
    assert arr.buffer.closed
    arr.close()
    with pytest.raises(hal.InvalidBufferError):
        arr.to_host()
    with hal.asarray(np.ones(8), device=device) as arr2:
        pass
    assert arr2.buffer.closed


def test_use_after_close_nothing_written(device: hal.Device, stream: hal.Stream) -> None:
    """A rejected copy from a closed buffer leaves the destination as it was."""
    src = device.alloc(16)
    src.close()
    host = np.full(16, 7, np.uint8)
    with pytest.raises(hal.InvalidBufferError):
        hal.copy(host, src, stream=stream)
    stream.synchronize()
    assert (host == 7).all()
