"""``hal.copy`` / ``hal.copy_path``: every direction, odd sizes and offsets, bad input rejected.

A rejected copy writes nothing: each error test checks that the destination is unchanged.
"""

from __future__ import annotations

import array
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hal

ODD = [
    (1, 0, 0),
    (7, 3, 5),
    (13, 0, 11),
    (255, 1, 0),
    (4099, 17, 3),
]  # (nbytes, dst_offset, src_offset)


def _pattern(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _read(buf: hal.Buffer) -> np.ndarray:
    return buf.view(np.uint8).to_host()


def _filled(device: hal.Device, data: np.ndarray) -> hal.Buffer:
    buf = device.alloc(data.nbytes)
    s = device.create_stream()
    hal.copy(buf, data, stream=s)
    s.close()
    return buf


@pytest.fixture
def pair_streams(
    device_pair: tuple[hal.Device, hal.Device],
) -> Iterator[tuple[hal.Stream, hal.Stream]]:
    a, b = device_pair
    sa, sb = a.create_stream(), b.create_stream()
    yield sa, sb
    sa.close()
    sb.close()


# -- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "doff", "soff"), ODD)
def test_host_device_host(
    device: hal.Device, stream: hal.Stream, n: int, doff: int, soff: int
) -> None:
    src = _pattern(n + soff, n)
    with device.alloc(n + doff + 2) as buf:
        hal.memset(buf, 0xAB, stream=stream)
        assert (
            hal.copy(buf, src, stream=stream, nbytes=n, dst_offset=doff, src_offset=soff) == "local"
        )
        back = np.full(n + 5, 0x11, np.uint8)
        assert (
            hal.copy(back, buf, stream=stream, nbytes=n, dst_offset=5, src_offset=doff) == "local"
        )
        stream.synchronize()
        np.testing.assert_array_equal(back[5:], src[soff:])
        assert (back[:5] == 0x11).all()
        whole = _read(buf)
        assert (whole[:doff] == 0xAB).all() and (whole[doff + n :] == 0xAB).all()


def test_default_nbytes_is_rest_of_src(device: hal.Device, stream: hal.Stream) -> None:
    src = _pattern(40)
    with device.alloc(64) as buf:
        hal.copy(buf, src, stream=stream, src_offset=9, dst_offset=3)
        out = np.zeros(64, np.uint8)
        hal.copy(out, buf, stream=stream)
        stream.synchronize()
        np.testing.assert_array_equal(out[3:34], src[9:])


@pytest.mark.parametrize(("n", "doff", "soff"), ODD)
def test_device_to_device(
    device: hal.Device, stream: hal.Stream, n: int, doff: int, soff: int
) -> None:
    data = _pattern(n + soff, 1)
    with _filled(device, data) as src, device.alloc(n + doff) as dst:
        hal.memset(dst, 0, stream=stream)
        assert hal.copy_path(dst, src) == "local"
        assert (
            hal.copy(dst, src, stream=stream, nbytes=n, dst_offset=doff, src_offset=soff) == "local"
        )
        stream.synchronize()
        got = _read(dst)
        np.testing.assert_array_equal(got[doff:], data[soff:])
        assert (got[:doff] == 0).all()


@pytest.mark.parametrize(("doff", "soff", "n"), [(0, 5, 20), (5, 0, 20), (3, 3, 10), (1, 0, 31)])
def test_overlapping_copy_within_one_buffer(
    device: hal.Device, stream: hal.Stream, doff: int, soff: int, n: int
) -> None:
    data = _pattern(32, 2)
    with _filled(device, data) as buf:
        hal.copy(buf, buf, stream=stream, nbytes=n, dst_offset=doff, src_offset=soff)
        stream.synchronize()
        expect = data.copy()
        expect[doff : doff + n] = data[soff : soff + n]  # memmove semantics
        np.testing.assert_array_equal(_read(buf), expect)


@pytest.mark.parametrize(("n", "doff", "soff"), ODD)
@pytest.mark.parametrize("stream_on", ["src", "dst"])
def test_peer_both_directions(
    device_pair: tuple[hal.Device, hal.Device],
    pair_streams: tuple[hal.Stream, hal.Stream],
    stream_on: str,
    n: int,
    doff: int,
    soff: int,
) -> None:
    a, b = device_pair
    expected_path = "peer" if a.can_access_peer(b) else "staged"
    for (src_dev, dst_dev), (s_src, s_dst) in [
        ((a, b), pair_streams),
        ((b, a), pair_streams[::-1]),
    ]:
        data = _pattern(n + soff, n + 3)
        with _filled(src_dev, data) as src, dst_dev.alloc(n + doff + 1) as dst:
            s = s_src if stream_on == "src" else s_dst
            hal.memset(dst, 0x5A, stream=s_dst)
            s_dst.synchronize()
            assert hal.copy_path(dst, src) == expected_path
            path = hal.copy(dst, src, stream=s, nbytes=n, dst_offset=doff, src_offset=soff)
            assert path == expected_path
            s.synchronize()
            got = _read(dst)
            np.testing.assert_array_equal(got[doff : doff + n], data[soff:])
            assert (got[:doff] == 0x5A).all() and got[-1] == 0x5A


def test_array_operands_use_their_offset(device: hal.Device, stream: hal.Stream) -> None:
    with device.alloc(64) as buf:
        hal.memset(buf, 0, stream=stream)
        view = buf.view(np.int32, (4,), offset=8)
        hal.copy(view, np.array([1, 2, 3, 4], np.int32), stream=stream)
        out = np.zeros(4, np.int32)
        hal.copy(out, view, stream=stream)
        stream.synchronize()
        np.testing.assert_array_equal(out, [1, 2, 3, 4])
        raw = _read(buf)
        np.testing.assert_array_equal(raw[8:24].view(np.int32), [1, 2, 3, 4])
        assert (raw[:8] == 0).all() and (raw[24:] == 0).all()
        with pytest.raises(ValueError, match="overruns dst"):
            hal.copy(view, np.zeros(5, np.int32), stream=stream)


@pytest.mark.parametrize(
    "make_host",
    [
        pytest.param(lambda d: bytearray(d.tobytes()), id="bytearray"),
        pytest.param(lambda d: array.array("B", d.tobytes()), id="array.array"),
        pytest.param(lambda d: memoryview(bytearray(d.tobytes())), id="memoryview"),
        pytest.param(lambda d: d.view(np.float64).reshape(3, 2).copy(), id="ndarray-2d-float64"),
    ],
)
def test_host_objects_with_buffer_protocol(
    device: hal.Device, stream: hal.Stream, make_host: object
) -> None:
    data = _pattern(48, 4)
    host_src = make_host(data)  # type: ignore[operator]
    host_dst = make_host(np.zeros(48, np.uint8))  # type: ignore[operator]
    with device.alloc(48) as buf:
        hal.copy(buf, host_src, stream=stream)
        hal.copy(host_dst, buf, stream=stream)
        stream.synchronize()
    assert bytes(memoryview(host_dst).cast("B")) == data.tobytes()


def test_bytes_is_a_valid_source(device: hal.Device, stream: hal.Stream) -> None:
    with device.alloc(5) as buf:
        hal.copy(buf, b"hello", stream=stream)
        stream.synchronize()
        assert _read(buf).tobytes() == b"hello"


def test_zero_byte_copy_enqueues_nothing(device: hal.Device, stream: hal.Stream) -> None:
    with device.alloc(8) as buf:
        assert (
            hal.copy(buf, np.zeros(8, np.uint8), stream=stream, nbytes=0, dst_offset=8) == "local"
        )
        stream.synchronize()


# -- rejected copies write nothing -----------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"nbytes": 17}, "nbytes=17 at src_offset=0 overruns src"),
        ({"nbytes": 9, "dst_offset": 8}, "overruns dst"),
        ({"src_offset": 17}, "src_offset=17 is past the end"),
        ({"nbytes": 1, "src_offset": 16}, "overruns src"),
        ({"dst_offset": 9}, "overruns dst"),
        ({"nbytes": -1}, "nbytes=-1"),
        ({"dst_offset": -2}, "dst_offset=-2"),
        ({"src_offset": -1}, "src_offset=-1"),
    ],
)
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
def test_out_of_bounds_rejected_nothing_written(
    device: hal.Device, stream: hal.Stream, direction: str, kwargs: dict[str, int], text: str
) -> None:
    src_data = _pattern(16, 5)
    dst_data = np.full(16, 0xEE, np.uint8)
    dev_src = _filled(device, src_data)
    dev_dst = _filled(device, dst_data)
    host_dst = dst_data.copy()
    dst, src = {"h2d": (dev_dst, src_data), "d2h": (host_dst, dev_src), "d2d": (dev_dst, dev_src)}[
        direction
    ]
    with pytest.raises(ValueError, match=text):
        hal.copy(dst, src, stream=stream, **kwargs)
    stream.synchronize()
    assert (host_dst == 0xEE).all()
    assert (_read(dev_dst) == 0xEE).all()
    np.testing.assert_array_equal(_read(dev_src), src_data)
    dev_src.close()
    dev_dst.close()


def test_out_of_bounds_peer_rejected_nothing_written(
    device_pair: tuple[hal.Device, hal.Device], pair_streams: tuple[hal.Stream, hal.Stream]
) -> None:
    a, b = device_pair
    with _filled(a, _pattern(16)) as src, _filled(b, np.full(16, 0xEE, np.uint8)) as dst:
        for kwargs in ({"nbytes": 17}, {"dst_offset": 1}, {"nbytes": 4, "dst_offset": 13}):
            with pytest.raises(ValueError, match="overruns"):
                hal.copy(dst, src, stream=pair_streams[0], **kwargs)
        pair_streams[0].synchronize()
        assert (_read(dst) == 0xEE).all()


@pytest.mark.parametrize(
    ("dst", "src", "exc", "text"),
    [
        ("host", 12, TypeError, "src=12"),
        (None, "buf", TypeError, "dst=None"),
        ("host", "host", TypeError, "at least one side"),
        ("bytes", "buf", ValueError, "read-only"),
        ("readonly", "buf", ValueError, "read-only"),
        ("fortran", "buf", ValueError, "non-contiguous"),
        ("buf", "strided", ValueError, "non-contiguous"),
    ],
)
def test_wrong_operand_types(
    device: hal.Device,
    stream: hal.Stream,
    dst: object,
    src: object,
    exc: type[Exception],
    text: str,
) -> None:
    ro = np.zeros(16, np.uint8)
    ro.flags.writeable = False
    with _filled(device, np.full(16, 3, np.uint8)) as buf:
        objects = {
            "buf": buf,
            "host": np.zeros(16, np.uint8),
            "bytes": bytes(16),
            "readonly": ro,
            "fortran": np.zeros((4, 4), np.uint8, order="F"),
            "strided": np.zeros(32, np.uint8)[::2],
        }
        d = objects.get(dst, dst) if isinstance(dst, str) else dst
        s = objects.get(src, src) if isinstance(src, str) else src
        with pytest.raises(exc, match=text):
            hal.copy(d, s, stream=stream)
        stream.synchronize()
        assert (_read(buf) == 3).all()


@pytest.mark.parametrize(
    ("kwargs", "exc", "text"),
    [
        ({"nbytes": 1.0}, TypeError, "nbytes=1.0"),
        ({"dst_offset": True}, TypeError, "dst_offset=True"),
        ({"src_offset": "0"}, TypeError, "src_offset='0'"),
    ],
)
def test_wrong_size_types(
    device: hal.Device,
    stream: hal.Stream,
    kwargs: dict[str, object],
    exc: type[Exception],
    text: str,
) -> None:
    host = np.full(8, 9, np.uint8)
    with device.alloc(8) as buf:
        with pytest.raises(exc, match=text):
            hal.copy(host, buf, stream=stream, **kwargs)  # type: ignore[arg-type]
    assert (host == 9).all()


def test_stream_must_be_a_stream(device: hal.Device) -> None:
    with device.alloc(8) as buf:
        with pytest.raises(TypeError, match="stream=None"):
            hal.copy(buf, bytes(8), stream=None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"is not a hal\.Stream"):
            hal.copy(buf, bytes(8), stream=device)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            hal.copy(buf, bytes(8))  # type: ignore[call-arg]


def test_closed_stream_rejected(device: hal.Device) -> None:
    s = device.create_stream()
    s.close()
    host = np.full(8, 1, np.uint8)
    with device.alloc(8) as buf:
        with pytest.raises(hal.InvalidBufferError, match="closed"):
            hal.copy(host, buf, stream=s)
        with pytest.raises(hal.InvalidBufferError):
            hal.copy(buf, host, stream=s)
    assert (host == 1).all()


def test_stream_of_uninvolved_device(
    device_pair: tuple[hal.Device, hal.Device], pair_streams: tuple[hal.Stream, hal.Stream]
) -> None:
    a, _ = device_pair
    other_stream = pair_streams[1]
    host = np.full(8, 4, np.uint8)
    with _filled(a, np.full(8, 6, np.uint8)) as x, _filled(a, np.full(8, 7, np.uint8)) as y:
        for dst, src in [(host, x), (x, host), (x, y)]:
            with pytest.raises(hal.DeviceMismatchError, match="stream belongs to"):
                hal.copy(dst, src, stream=other_stream)
        other_stream.synchronize()
        assert (host == 4).all() and (_read(x) == 6).all()


def test_stream_of_a_third_device(
    backend_name: str,
    device_pair: tuple[hal.Device, hal.Device],
    pair_streams: tuple[hal.Stream, hal.Stream],
) -> None:
    a, b = device_pair
    third = [d for d in hal.devices() if d not in (a, b)]
    if not third:
        pytest.skip(
            f"no device besides {a} and {b} (set HAL_CPU_DEVICES=3 or enable another backend)"
        )
    with (
        third[0].create_stream() as s3,
        _filled(a, _pattern(8)) as src,
        _filled(b, np.zeros(8, np.uint8)) as dst,
    ):
        with pytest.raises(hal.DeviceMismatchError):
            hal.copy(dst, src, stream=s3)
        s3.synchronize()
        assert (_read(dst) == 0).all()


# -- cross-backend (staged) ------------------------------------------------------------------


def _cross_backend_pairs() -> list[tuple[str, str]]:
    devs = hal.devices()
    names = list(dict.fromkeys(d.backend for d in devs))
    return [(x, y) for x in names for y in names if x != y]


@pytest.mark.parametrize("stream_on", ["src", "dst"])
def test_staged_cross_backend(stream_on: str) -> None:
    pairs = _cross_backend_pairs()
    if not pairs:
        pytest.skip(
            "only one backend is available; staged cross-backend copies need two (e.g. cpu and opencl)"
        )
    for src_name, dst_name in pairs:
        s_dev, d_dev = hal.devices(src_name)[0], hal.devices(dst_name)[0]
        assert not s_dev.can_access_peer(d_dev)
        data = _pattern(1001, 7)
        with _filled(s_dev, data) as src, d_dev.alloc(1010) as dst:
            with (s_dev if stream_on == "src" else d_dev).create_stream() as s:
                assert hal.copy_path(dst, src) == "staged"
                assert (
                    hal.copy(dst, src, stream=s, nbytes=999, dst_offset=7, src_offset=2) == "staged"
                )
                s.synchronize()
            np.testing.assert_array_equal(_read(dst)[7:1006], data[2:1001])


# -- property test against a NumPy model ----------------------------------------------------


@dataclass
class _Slot:
    name: str
    device: hal.Device | None  # None: host memory
    size: int


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_copies_match_numpy_model(backend_devices: list[hal.Device], data: st.DataObject) -> None:
    """Random sequences of copies and memsets (some invalid) on several streams match NumPy."""
    devs = backend_devices[:2]
    d0, d1 = devs[0], devs[-1]
    slots = [
        _Slot("A", d0, 37),
        _Slot("B", d0, 64),
        _Slot("C", d1, 53),
        _Slot("H", None, 45),
        _Slot("G", None, 29),
    ]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    model = {s.name: rng.integers(0, 256, s.size, dtype=np.uint8) for s in slots}
    host = {s.name: model[s.name].copy() for s in slots if s.device is None}
    streams = {d: d.create_stream() for d in devs}
    bufs: dict[str, hal.Buffer] = {}
    for s in slots:
        if s.device is not None:
            bufs[s.name] = _filled(s.device, model[s.name])
    obj = {**bufs, **host}
    last: hal.Stream | None = None
    try:
        for _ in range(data.draw(st.integers(1, 8), label="ops")):
            stream = streams[data.draw(st.sampled_from(devs), label="stream device")]
            if last is not None and last is not stream:  # keep one global order across streams
                ev = last.device.create_event()
                ev.record(last)
                stream.wait(ev)
            last = stream
            dst = data.draw(st.sampled_from(slots), label="dst")
            if data.draw(st.booleans(), label="memset") and dst.device is not None:
                off = data.draw(st.integers(0, dst.size + 2), label="offset")
                n = data.draw(st.none() | st.integers(0, dst.size + 2), label="nbytes")
                value = data.draw(st.integers(0, 255), label="value")
                count = dst.size - off if n is None else n
                if off > dst.size or off + count > dst.size:
                    expect: type[Exception] | None = ValueError
                elif stream.device != dst.device:
                    expect = hal.DeviceMismatchError
                else:
                    expect = None
                if expect is not None:
                    with pytest.raises(expect):
                        hal.memset(obj[dst.name], value, stream=stream, nbytes=n, offset=off)
                    continue
                hal.memset(obj[dst.name], value, stream=stream, nbytes=n, offset=off)
                model[dst.name][off : off + count] = value
                continue
            src = data.draw(st.sampled_from(slots), label="src")
            doff = data.draw(st.integers(0, dst.size + 2), label="dst_offset")
            soff = data.draw(st.integers(0, src.size + 2), label="src_offset")
            n = data.draw(st.none() | st.integers(0, max(dst.size, src.size)), label="nbytes")
            count = src.size - soff if n is None else n
            if soff > src.size or soff + count > src.size or doff + count > dst.size:
                expect = ValueError
            elif dst.device is None and src.device is None:
                expect = TypeError
            elif stream.device not in (dst.device, src.device):
                expect = hal.DeviceMismatchError
            else:
                expect = None
            if expect is not None:
                with pytest.raises(expect):
                    hal.copy(
                        obj[dst.name],
                        obj[src.name],
                        stream=stream,
                        nbytes=n,
                        dst_offset=doff,
                        src_offset=soff,
                    )
                continue
            hal.copy(
                obj[dst.name],
                obj[src.name],
                stream=stream,
                nbytes=n,
                dst_offset=doff,
                src_offset=soff,
            )
            model[dst.name][doff : doff + count] = model[src.name][soff : soff + count].copy()
        for s in streams.values():
            s.synchronize()
        for name, buf in bufs.items():
            np.testing.assert_array_equal(_read(buf), model[name], err_msg=f"device buffer {name}")
        for name, arr in host.items():
            np.testing.assert_array_equal(arr, model[name], err_msg=f"host buffer {name}")
    finally:
        for s in streams.values():
            s.close()
        for b in bufs.values():
            b.close()
