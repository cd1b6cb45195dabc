"""``hal.Array``: typed views, ``hal.asarray`` / ``to_host``, validation, DLPack."""

from __future__ import annotations

import numpy as np
import pytest

import hal

DTYPES = [np.int8, np.uint16, np.int32, np.int64, np.float32, np.float64, np.complex128, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (3, 5), (2, 3, 4), ()], ids=str)
def test_asarray_round_trip(device: hal.Device, dtype: type, shape: tuple[int, ...]) -> None:
    host = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    with hal.asarray(host, device=device) as arr:
        assert arr.shape == shape
        assert arr.dtype == np.dtype(dtype)
        assert arr.ndim == len(shape)
        assert arr.size == host.size
        assert arr.nbytes == host.nbytes == arr.buffer.nbytes
        assert arr.device == device
        assert arr.offset == 0
        back = arr.to_host()
        assert back.dtype == host.dtype and back.shape == shape
        np.testing.assert_array_equal(back, host)


def test_asarray_non_contiguous_and_conversion(device: hal.Device) -> None:
    host = np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2]
    with hal.asarray(host, device=device) as arr:
        assert arr.shape == (4, 3)
        np.testing.assert_array_equal(arr.to_host(), host)
    with hal.asarray([[1, 2], [3, 4]], device=device, dtype=np.float32) as arr:
        assert arr.dtype == np.float32
        np.testing.assert_array_equal(arr.to_host(), [[1, 2], [3, 4]])
    with hal.asarray(np.asfortranarray(np.eye(3)), device=device) as arr:
        np.testing.assert_array_equal(arr.to_host(), np.eye(3))


def test_asarray_on_a_stream(device: hal.Device, stream: hal.Stream) -> None:
    host = np.linspace(0, 1, 1000)
    arr = hal.asarray(host, device=device, stream=stream)
    out = arr.to_host(stream=stream)
    np.testing.assert_array_equal(out, host)
    arr.close()


def test_asarray_checks_arguments(device_pair: tuple[hal.Device, hal.Device]) -> None:
    a, b = device_pair
    before = a.memory_in_use
    with pytest.raises(TypeError, match="device="):
        hal.asarray(np.zeros(3), device="cpu:0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="object"):
        hal.asarray(np.array([object()]), device=a)
    with b.create_stream() as sb:
        with pytest.raises(hal.DeviceMismatchError):
            hal.asarray(np.zeros(3), device=a, stream=sb)
        with pytest.raises(TypeError, match="stream="):
            hal.asarray(np.zeros(3), device=a, stream=3)  # type: ignore[arg-type]
        with hal.asarray(np.zeros(3), device=a) as arr, pytest.raises(hal.DeviceMismatchError):
            arr.to_host(stream=sb)
    assert a.memory_in_use == before


def test_buffer_views(device: hal.Device, stream: hal.Stream) -> None:
    with device.alloc(64) as buf:
        hal.copy(buf, np.arange(16, dtype=np.float32), stream=stream)
        stream.synchronize()
        whole = buf.view(np.float32)
        assert whole.shape == (16,) and whole.buffer is buf and whole.nbytes == 64
        np.testing.assert_array_equal(whole.to_host(), np.arange(16))
        mid = buf.view(np.float32, (2, 3), offset=8)
        assert mid.offset == 8 and mid.nbytes == 24
        np.testing.assert_array_equal(mid.to_host(), np.arange(2, 8).reshape(2, 3))
        tail = buf.view(np.uint8, offset=60)
        assert tail.shape == (4,)
        flat = mid.reshape(6)
        assert flat.shape == (6,) and flat.offset == 8
        np.testing.assert_array_equal(mid.reshape(3, 2).to_host(), np.arange(2, 8).reshape(3, 2))
        assert buf.view(np.float64, offset=4).shape == (7,)
        assert buf.view(np.uint8, offset=64).shape == (0,)


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "text"),
    [
        ((object,), {}, TypeError, "cannot live in device memory"),
        (("not-a-dtype",), {}, TypeError, "dtype='not-a-dtype'"),
        ((np.float32, (5, 4)), {}, ValueError, "needs 80 bytes"),
        ((np.uint8, 65), {}, ValueError, "needs 65 bytes"),
        ((np.uint8, -1), {}, ValueError, "shape=-1"),
        ((np.uint8, (2.0,)), {}, TypeError, "shape=2.0"),
        ((np.uint8,), {"offset": 65}, ValueError, "offset=65 is past the end"),
        ((np.uint8,), {"offset": -1}, ValueError, "offset=-1"),
        ((np.uint8, 4), {"offset": 61}, ValueError, "at offset=61"),
    ],
)
def test_view_validation(
    device: hal.Device, args: tuple, kwargs: dict, exc: type[Exception], text: str
) -> None:
    with device.alloc(64) as buf, pytest.raises(exc, match=text):
        buf.view(*args, **kwargs)


def test_reshape_validation(device: hal.Device) -> None:
    with device.alloc(64) as buf:
        arr = buf.view(np.int32, (4, 4))
        with pytest.raises(ValueError, match="does not hold 16"):
            arr.reshape(3, 5)
        assert arr.reshape((2, 8)).shape == (2, 8)


def test_array_close_only_frees_owned_buffers(device: hal.Device) -> None:
    with device.alloc(16) as buf:
        view = buf.view(np.uint8)
        view.close()
        assert not buf.closed
    owned = hal.asarray(np.zeros(4), device=device)
    owned.close()
    assert owned.buffer.closed


# -- DLPack ----------------------------------------------------------------------------------


def _dlpack_reaches_host(device: hal.Device) -> bool:
    if not device.capabilities.dlpack:
        return False
    with device.alloc(8) as buf:
        return buf.view(np.uint8).__dlpack_device__()[0] == 1  # kDLCPU


def test_numpy_from_dlpack_is_zero_copy(device: hal.Device, stream: hal.Stream) -> None:
    if not _dlpack_reaches_host(device):
        pytest.skip(f"{device}: DLPack export to host memory not available")
    arr = hal.asarray(np.arange(12, dtype=np.float64).reshape(3, 4), device=device)
    view = np.from_dlpack(arr)
    assert view.shape == (3, 4) and view.dtype == np.float64
    np.testing.assert_array_equal(view, np.arange(12).reshape(3, 4))
    view[1, 2] = -5.0  # a host write is visible on the device
    assert arr.to_host()[1, 2] == -5.0
    hal.memset(arr, 0, stream=stream, offset=8, nbytes=8)  # a device write is visible on the host
    stream.synchronize()
    assert view[0, 1] == 0.0
    sub = arr.buffer.view(np.int32, (2,), offset=4)
    np.testing.assert_array_equal(
        np.from_dlpack(sub), np.frombuffer(arr.to_host().tobytes()[4:12], np.int32)
    )
    arr.close()


def test_from_dlpack_requests_checked(device: hal.Device) -> None:
    if not _dlpack_reaches_host(device):
        pytest.skip(f"{device}: DLPack export to host memory not available")
    with hal.asarray(np.ones(4), device=device) as arr:
        # issue #11: copy=True exports a copy (host memory), it no longer refuses
        copied = np.from_dlpack(arr, copy=True)
        copied[:] = 5
        np.testing.assert_array_equal(arr.to_host(), np.ones(4))
        with pytest.raises(BufferError, match="dl_device"):
            arr.__dlpack__(dl_device=(2, 0))
        with pytest.raises(BufferError, match="dl_device"):
            arr.__dlpack__(dl_device=(2, 0), copy=True)


def test_dlpack_unavailable_raises_buffer_error(device: hal.Device) -> None:
    if device.capabilities.dlpack:
        pytest.skip(f"{device} exports DLPack")
    with hal.asarray(np.ones(4), device=device) as arr:
        with pytest.raises(BufferError):
            np.from_dlpack(arr)
        with pytest.raises(BufferError):
            arr.__dlpack__()
        with pytest.raises(BufferError):
            arr.__dlpack_device__()
