"""``hal.memset``: ranges, values, arrays, and bad input rejected before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

import hal


def _read(buf: hal.Buffer) -> np.ndarray:
    return buf.view(np.uint8).to_host()


def _buffer(device: hal.Device, stream: hal.Stream, n: int, fill: int) -> hal.Buffer:
    buf = device.alloc(n)
    hal.memset(buf, fill, stream=stream)
    stream.synchronize()
    return buf


@pytest.mark.parametrize("value", [0, 1, 0x7F, 0x80, 255, np.uint8(9), np.int64(200)])
def test_whole_buffer(device: hal.Device, stream: hal.Stream, value: int) -> None:
    with device.alloc(1027) as buf:
        hal.memset(buf, value, stream=stream)
        stream.synchronize()
        assert (_read(buf) == int(value)).all()


@pytest.mark.parametrize(
    ("offset", "nbytes"), [(0, 1), (1, 1), (3, 17), (100, None), (0, 0), (129, 0), (129, None)]
)
def test_ranges(device: hal.Device, stream: hal.Stream, offset: int, nbytes: int | None) -> None:
    with _buffer(device, stream, 129, 0x11) as buf:
        hal.memset(buf, 0xC3, stream=stream, offset=offset, nbytes=nbytes)
        stream.synchronize()
        expect = np.full(129, 0x11, np.uint8)
        end = 129 if nbytes is None else offset + nbytes
        expect[offset:end] = 0xC3
        np.testing.assert_array_equal(_read(buf), expect)


def test_array_view_respects_its_offset(device: hal.Device, stream: hal.Stream) -> None:
    with _buffer(device, stream, 64, 0) as buf:
        view = buf.view(np.uint16, (8,), offset=10)
        hal.memset(view, 0xFF, stream=stream)
        hal.memset(view, 0x01, stream=stream, offset=2, nbytes=2)
        stream.synchronize()
        raw = _read(buf)
        assert (raw[:10] == 0).all() and (raw[26:] == 0).all()
        np.testing.assert_array_equal(raw[10:26], [0xFF, 0xFF, 1, 1] + [0xFF] * 12)
        np.testing.assert_array_equal(view.to_host(), [0xFFFF, 0x0101] + [0xFFFF] * 6)


def test_in_order_with_copies(device: hal.Device, stream: hal.Stream) -> None:
    out = [np.zeros(32, np.uint8) for _ in range(3)]
    with device.alloc(32) as buf:
        for i, host in enumerate(out):
            hal.memset(buf, i + 1, stream=stream)
            hal.copy(host, buf, stream=stream)
        stream.synchronize()
    for i, host in enumerate(out):
        assert (host == i + 1).all()


@pytest.mark.parametrize(
    ("kwargs", "exc", "text"),
    [
        ({"value": 256}, ValueError, "value=256"),
        ({"value": -1}, ValueError, "value=-1"),
        ({"value": 1.0}, TypeError, "value=1.0"),
        ({"value": True}, TypeError, "value=True"),
        ({"value": b"\x01"}, TypeError, "value="),
        ({"value": 1, "offset": 33}, ValueError, "offset=33 is past the end"),
        ({"value": 1, "nbytes": 33}, ValueError, "nbytes=33 at offset=0 overruns"),
        ({"value": 1, "offset": 30, "nbytes": 3}, ValueError, "overruns"),
        ({"value": 1, "offset": -1}, ValueError, "offset=-1"),
        ({"value": 1, "nbytes": -4}, ValueError, "nbytes=-4"),
        ({"value": 1, "nbytes": 2.0}, TypeError, "nbytes=2.0"),
    ],
)
def test_bad_arguments_write_nothing(
    device: hal.Device,
    stream: hal.Stream,
    kwargs: dict[str, object],
    exc: type[Exception],
    text: str,
) -> None:
    with _buffer(device, stream, 32, 0x42) as buf:
        kwargs = dict(kwargs)
        value = kwargs.pop("value")
        with pytest.raises(exc, match=text):
            hal.memset(buf, value, stream=stream, **kwargs)  # type: ignore[arg-type]
        stream.synchronize()
        assert (_read(buf) == 0x42).all()


def test_bad_target_and_stream(device: hal.Device, stream: hal.Stream) -> None:
    with pytest.raises(TypeError, match="buf="):
        hal.memset(np.zeros(4, np.uint8), 0, stream=stream)  # type: ignore[arg-type]
    with device.alloc(4) as buf:
        with pytest.raises(TypeError, match="stream="):
            hal.memset(buf, 0, stream=None)  # type: ignore[arg-type]
        closed = device.create_stream()
        closed.close()
        with pytest.raises(hal.InvalidBufferError):
            hal.memset(buf, 0, stream=closed)


def test_stream_of_another_device(device_pair: tuple[hal.Device, hal.Device]) -> None:
    a, b = device_pair
    with a.create_stream() as sa, b.create_stream() as sb, _buffer(a, sa, 16, 5) as buf:
        with pytest.raises(hal.DeviceMismatchError, match="belongs to"):
            hal.memset(buf, 9, stream=sb)
        sb.synchronize()
        assert (_read(buf) == 5).all()
