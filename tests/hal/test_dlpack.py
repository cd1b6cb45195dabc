"""DLPack in and out (issue #11, item 4): ``hal.from_dlpack`` zero-copy, ``copy=True``, zero-size
exports, ``__dlpack__(copy=True)``, bfloat16, lifetimes and refusals, with real torch CPU tensors
and NumPy arrays."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

import hal
from hal.spi import impl_of

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

pytestmark = pytest.mark.usefixtures("requires_cpu")


def _address(arr: hal.Array) -> int:
    """Address of the first element of an emulator array (its storage is a NumPy byte array)."""
    storage = impl_of(arr.buffer).storage
    return int(storage.ctypes.data) + arr.offset


def _emulator() -> hal.Device:
    return hal.devices("cpu")[0]


# -- zero-copy in ---------------------------------------------------------------------------
def test_torch_cpu_tensor_is_adopted_zero_copy() -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    dev = _emulator()
    used = dev.memory_in_use
    with hal.from_dlpack(t) as a:
        assert a.device == dev  # the first emulator device, whatever hal.devices() lists first
        assert (a.shape, a.dtype) == ((3, 4), np.dtype(np.float32))
        assert _address(a) == t.data_ptr()
        assert dev.memory_in_use == used  # adopted memory is the producer's, not an allocation
        # a write through hal lands in the tensor
        s = dev.create_stream()
        hal.copy(a, np.full((3, 4), 7, np.float32), stream=s)
        s.synchronize()
        assert torch.equal(t, torch.full((3, 4), 7.0))
        # and a write to the tensor is what hal reads
        t[0, 0] = -1
        assert a.to_host()[0, 0] == -1


def test_numpy_array_adopted_on_the_device_asked_for() -> None:
    x = np.arange(5, dtype=np.int64)
    dev = hal.devices("cpu")[1]
    a = hal.from_dlpack(x, device=dev)
    assert a.device == dev and _address(a) == x.ctypes.data
    np.testing.assert_array_equal(a.to_host(), x)
    a.close()


def test_hal_array_gives_a_view_sharing_the_buffer() -> None:
    with hal.asarray(np.arange(6, dtype=np.float64).reshape(2, 3), device=_emulator()) as src:
        v = hal.from_dlpack(src)
        assert v.buffer is src.buffer and v.shape == (2, 3) and v.offset == src.offset
        other = hal.devices("cpu")[1]
        with pytest.raises(BufferError, match="copy=True") as err:
            hal.from_dlpack(src, device=other)
        assert err.value.reason == "device"  # type: ignore[attr-defined]
        c = hal.from_dlpack(src, device=other, copy=True)
        assert c.device == other and c.buffer is not src.buffer
        np.testing.assert_array_equal(c.to_host(), src.to_host())
        c.close()


def test_producer_memory_lives_until_the_array_is_closed() -> None:
    x = np.arange(1000, dtype=np.float32)
    alive = weakref.ref(x)
    a = hal.from_dlpack(x)
    del x
    gc.collect()
    assert alive() is not None  # hal holds the producer's capsule
    np.testing.assert_array_equal(a.to_host(), np.arange(1000, dtype=np.float32))
    a.close()
    del a
    gc.collect()
    assert alive() is None  # the DLPack deleter ran: the producer got its memory back


def test_a_legacy_producer_without_max_version() -> None:
    class Legacy:
        def __init__(self, arr: np.ndarray[Any, Any]) -> None:
            self.arr = arr

        def __dlpack__(self, stream: Any = None) -> Any:
            return self.arr.__dlpack__()

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    x = np.arange(4, dtype=np.int32)
    with hal.from_dlpack(Legacy(x)) as a:
        assert _address(a) == x.ctypes.data
        np.testing.assert_array_equal(a.to_host(), x)


# -- copies and refusals ----------------------------------------------------------------------
def test_copy_true_copies() -> None:
    t = torch.arange(4, dtype=torch.float64)
    with hal.from_dlpack(t, copy=True) as a:
        assert _address(a) != t.data_ptr()
        t[:] = 0
        np.testing.assert_array_equal(a.to_host(), np.arange(4.0))


def test_non_contiguous_refused_zero_copy_and_copied_on_request() -> None:
    t = torch.arange(20, dtype=torch.float32).reshape(4, 5)[:, ::2]
    with pytest.raises(BufferError, match=r"not C-contiguous \(strides \(5, 2\)") as err:
        hal.from_dlpack(t)
    assert err.value.reason == "strides"  # type: ignore[attr-defined]
    with hal.from_dlpack(t, copy=True) as a:
        np.testing.assert_array_equal(a.to_host(), t.numpy())
    # a transposed view, negative strides (NumPy)
    x = np.arange(12, dtype=np.int16).reshape(3, 4)
    for view in (x.T, x[::-1]):
        with hal.from_dlpack(view, copy=True) as a:
            np.testing.assert_array_equal(a.to_host(), view)


def test_read_only_refused_zero_copy() -> None:
    x = np.arange(3.0)
    x.flags.writeable = False
    with pytest.raises(BufferError, match="read-only") as err:
        hal.from_dlpack(x)
    assert err.value.reason == "readonly"  # type: ignore[attr-defined]
    with hal.from_dlpack(x, copy=True) as a:
        np.testing.assert_array_equal(a.to_host(), x)


def test_host_memory_is_not_opencl_memory() -> None:
    if "opencl" not in [d.backend for d in hal.devices()]:
        pytest.skip("no OpenCL device")
    dev = hal.devices("opencl")[0]
    x = np.arange(6, dtype=np.float32)
    with pytest.raises(
        BufferError, match=r"memory of kDLCPU:0 is not memory of device opencl:0"
    ) as err:
        hal.from_dlpack(x, device=dev)
    assert err.value.reason == "device"  # type: ignore[attr-defined]
    with hal.from_dlpack(x, device=dev, copy=True) as a:
        assert a.device == dev
        np.testing.assert_array_equal(a.to_host(), x)
    with pytest.raises(BufferError, match="copy=True"):
        hal.from_dlpack(torch.ones(2), device=dev, copy=False)


def test_opencl_memory_refuses_zero_copy_export_naming_the_device_and_the_copy() -> None:
    """numpy/torch.from_dlpack of an OpenCL array: BufferError naming opencl:0 and copy=True;
    numpy.from_dlpack(x, copy=True) then gives the values."""
    if "opencl" not in [d.backend for d in hal.devices()]:
        pytest.skip("no OpenCL device")
    with hal.asarray(np.arange(4, dtype=np.float32), device=hal.devices("opencl")[0]) as a:
        needle = r"opencl:0: .*not reachable through DLPack; for a host copy pass copy=True"
        for export in (
            a.__dlpack_device__,
            lambda: np.from_dlpack(a),
            lambda: torch.from_dlpack(a),
        ):
            with pytest.raises(BufferError, match=needle):
                export()
        assert np.from_dlpack(a, copy=True).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "needle"),
    [
        ((3,), {}, TypeError, "x=3 does not implement the DLPack protocol"),
        (([1.0, 2.0],), {}, TypeError, "DLPack protocol"),
        ((np.ones(2),), {"device": "cpu:0"}, TypeError, "device='cpu:0' is not a hal.Device"),
        ((np.ones(2),), {"copy": "yes"}, TypeError, "copy='yes'"),
    ],
)
def test_bad_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], exc: type[Exception], needle: str
) -> None:
    with pytest.raises(exc, match=needle):
        hal.from_dlpack(*args, **kwargs)


def test_a_producer_that_refuses_to_export() -> None:
    with pytest.raises(
        BufferError, match=r"the producer refused to export: BufferError: .*require gradient"
    ) as err:
        hal.from_dlpack(torch.ones(3, requires_grad=True))
    assert err.value.reason == "protocol"  # type: ignore[attr-defined]


def test_closed_hal_array_is_refused() -> None:
    a = hal.asarray(np.ones(3), device=_emulator())
    a.close()
    with pytest.raises(hal.InvalidBufferError):
        hal.from_dlpack(a)


# -- bfloat16 -------------------------------------------------------------------------------
def test_bfloat16_round_trip_with_torch() -> None:
    t = torch.tensor([1.5, -2.25, 3e38, 1e-3], dtype=torch.bfloat16)
    with hal.from_dlpack(t) as a:
        assert a.dtype == np.dtype(ml_dtypes.bfloat16)
        assert _address(a) == t.data_ptr()
        np.testing.assert_array_equal(a.to_host().astype(np.float32), t.float().numpy())
        back = torch.from_dlpack(a)  # hal exports bfloat16 as kDLBfloat, zero-copy
        assert back.dtype == torch.bfloat16 and back.data_ptr() == t.data_ptr()
    host = np.array([1, 2], dtype=ml_dtypes.bfloat16)
    with hal.asarray(host, device=_emulator()) as h:
        assert torch.equal(torch.from_dlpack(h), torch.tensor([1, 2], dtype=torch.bfloat16))


# -- out: zero-size, copy=True ----------------------------------------------------------------
@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 2, 2)])
def test_zero_size_arrays_export(shape: tuple[int, ...]) -> None:
    dev = _emulator()
    used = dev.memory_in_use
    with hal.asarray(np.zeros(shape, np.float32), device=dev) as z:
        assert z.__dlpack_device__() == (1, 0)
        assert np.from_dlpack(z).shape == shape
        assert tuple(torch.from_dlpack(z).shape) == shape
        assert np.from_dlpack(z, copy=True).shape == shape
    assert dev.memory_in_use == used  # the 1-byte export probe went with the buffer
    with hal.from_dlpack(torch.zeros(shape)) as a:
        assert a.shape == shape and a.size == 0


def test_dlpack_copy_true_exports_a_copy() -> None:
    with hal.asarray(np.arange(4, dtype=np.float32), device=_emulator()) as a:
        same = np.from_dlpack(a)
        copied = np.from_dlpack(a, copy=True)
        assert same.ctypes.data == _address(a)
        assert copied.ctypes.data != _address(a)
        copied[:] = -1
        np.testing.assert_array_equal(a.to_host(), np.arange(4, dtype=np.float32))
        t = torch.from_dlpack(a.__dlpack__(copy=True))
        assert t.data_ptr() != _address(a) and t.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"copy": "yes"}, "copy='yes' must be True, False or None"),
        ({"copy": 1}, "copy=1 must be True, False or None"),
        ({"dl_device": 1}, r"dl_device=1 must be None or a \(device_type, device_id\) pair"),
    ],
)
def test_dlpack_export_bad_arguments(kwargs: dict[str, Any], needle: str) -> None:
    """Array.__dlpack__ refuses a copy that is not a bool (a truthy string used to export a copy)
    and a dl_device that is not a pair with a TypeError naming the value, as hal.from_dlpack does."""
    with hal.asarray(np.arange(4, dtype=np.float32), device=_emulator()) as a:
        with pytest.raises(TypeError, match=needle):
            a.__dlpack__(**kwargs)
        with pytest.raises(TypeError, match=needle):
            np.from_dlpack(a, **kwargs) if "copy" in kwargs else a.__dlpack__(**kwargs)
        assert torch.from_dlpack(a.__dlpack__(copy=np.bool_(True))).tolist() == [0, 1, 2, 3]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stream", "exc", "needle"),
    [
        ("x", TypeError, r"stream='x' must be None or an int .*kDLCPU:0"),
        (True, TypeError, "stream=True must be None or an int"),
        (2.0, TypeError, "stream=2.0 must be None or an int"),
        (1, ValueError, "stream=1: memory of kDLCPU:0 has no streams"),
        (0, ValueError, "stream=0: memory of kDLCPU:0 has no streams"),
        (7, ValueError, "stream=7: memory of kDLCPU:0 has no streams"),
    ],
)
def test_dlpack_export_checks_the_stream(stream: Any, exc: type[Exception], needle: str) -> None:
    """Array.__dlpack__ of host memory takes only stream=None (or -1, no synchronization), as the
    array API says for devices without streams: a bad value is a TypeError/ValueError naming it, for
    a zero-copy export, a copy (copy=True) and a host copy of unreachable memory alike (it was ignored)."""
    with hal.asarray(np.arange(4, dtype=np.float32), device=_emulator()) as a:
        for kwargs in ({}, {"copy": True}, {"dl_device": (1, 0)}):
            with pytest.raises(exc, match=needle):
                a.__dlpack__(stream=stream, **kwargs)
        for ok in (None, -1, np.int64(-1)):
            assert torch.from_dlpack(a.__dlpack__(stream=ok)).tolist() == [0, 1, 2, 3]
    if "opencl" in [d.backend for d in hal.devices()]:
        with hal.asarray(np.arange(4, dtype=np.float32), device=hal.devices("opencl")[0]) as o:
            with pytest.raises(exc, match=needle):
                o.__dlpack__(stream=stream, copy=True)  # the host copy's stream rules
            assert torch.from_dlpack(o.__dlpack__(stream=-1, copy=True)).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("dl_device", "stream", "exc"),
    [
        ((2, 0), 0, ValueError),
        ((2, 0), -2, ValueError),
        ((2, 0), "s", TypeError),
        ((10, 0), 1, ValueError),
        ((10, 0), 2, ValueError),
    ],
)
def test_dlpack_stream_rules_of_gpu_memory(
    dl_device: tuple[int, int], stream: Any, exc: type
) -> None:
    """The array API's stream values for CUDA (None, -1, 1, 2, > 2) and ROCm (None, -1, 0, > 2);
    other device types leave the value to their backend."""
    from hal._dlpack import check_stream

    with pytest.raises(exc, match=f"stream={stream!r}"):
        check_stream(stream, dl_device)
    for ok in (None, -1, 3, 1 << 40):
        check_stream(ok, dl_device)
    check_stream(1 if dl_device[0] == 2 else 0, dl_device)
    check_stream(object(), (14, 0))  # kDLOneAPI: a SYCL queue is the backend's business


def test_unreachable_memory_tells_torch_users_the_way_to_a_host_copy() -> None:
    """torch.from_dlpack(x, copy=True) of OpenCL memory calls __dlpack_device__ first, which refuses
    (DLPACK-CONSISTENT): the message names the torch spelling that works, and that one works;
    numpy's dl_device=(1, 0) with copy=False names the memory, not 'device None'."""
    if "opencl" not in [d.backend for d in hal.devices()]:
        pytest.skip("no OpenCL device")
    with hal.asarray(np.arange(4, dtype=np.float32), device=hal.devices("opencl")[0]) as a:
        with pytest.raises(BufferError) as err:
            torch.from_dlpack(a, copy=True)
        assert "torch.from_dlpack(x.__dlpack__(copy=True))" in str(err.value), err.value
        assert torch.from_dlpack(a.__dlpack__(copy=True)).tolist() == [0, 1, 2, 3]
        with pytest.raises(BufferError) as err:
            np.from_dlpack(a, device="cpu", copy=False)
        assert (
            "DLPack device (none: opencl:0 memory is not reachable through DLPack) and copy=False"
            in str(err.value)
        ), err.value
        assert "None" not in str(err.value)


def test_a_foreign_dl_device_names_where_the_array_can_export() -> None:
    """dl_device of another device type without copy=True: the BufferError names the value and the
    devices it can go to (it said 'copy=True exports into ...' to a caller who never passed copy)."""
    with hal.asarray(np.arange(4, dtype=np.float32), device=_emulator()) as a:
        for kwargs in ({}, {"copy": True}):
            with pytest.raises(BufferError) as err:
                a.__dlpack__(dl_device=(2, 0), **kwargs)
            assert str(err.value) == (
                "dl_device=(2, 0): cpu:0 exports only to its own DLPack device (1, 0), or host memory "
                "(kDLCPU, (1, 0)) as a copy"
            )
