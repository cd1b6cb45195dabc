"""The CUDA backend (CuPy): plugin wiring, error translation, status without a GPU, GPU behaviour.

Without a GPU (here, CI) the backend must report ``unavailable`` with the reason (without a
driver library, found without importing CuPy; otherwise CuPy's) and every test marked ``gpu``
skips with that reason. The error translation is checked with
CuPy's real exception objects, which can be built without a GPU. On a machine with an
NVIDIA GPU (scripts/gpu-check.sh) the ``gpu`` tests run for real; the shared suite in
tests/hal runs there on ``cuda`` as well.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hal
from hal.backends import cuda as cuda_pkg
from hal.backends.cuda import (
    NOT_INSTALLED,
    CudaBackend,
    CudaInvalidValueError,
    parse_device_filter,
    status_name,
    translate_cuda_error,
    translate_status,
)
from hal.plugins import BackendRegistry
from hal.spi import BackendImpl, DeviceImpl, EventImpl, MemoryImpl, StreamImpl, impl_of

Run = Callable[..., Any]
# Subprocesses run in ``tmp_path``: started in the checkout, ``python -c`` would import its
# partial ``hal/`` folder instead of the installed package.


def _cuda_info() -> hal.BackendInfo:
    return next(b for b in hal.list_backends() if b.name == "cuda")


# -- the plugin and the SPI wiring (no GPU needed) ------------------------------------------
def test_plugin_import_does_not_import_cupy(python_json: Run, tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "import hal.backends.cuda, hal.plugins\n"
        "from hal.cli import main\n"
        "system = hal.plugins.get_system()\n"
        "print(json.dumps({'cupy': sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupy_backends')),"
        " 'plugins': [p.name for p in system.plugins]}))\n"
    )
    out = python_json(["-c", code], cwd=tmp_path)
    assert out["cupy"] == [], "importing or loading the cuda plugin imported CuPy"
    assert "cuda" in out["plugins"]


def test_hal_plugins_lists_cuda_without_importing_cupy(python_json: Run, tmp_path: Path) -> None:
    code = (
        "import io, json, sys, contextlib\n"
        "from hal.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    main(['plugins', '--json'])\n"
        "print(json.dumps({'out': json.loads(buf.getvalue()), 'cupy': 'cupy' in sys.modules}))\n"
    )
    out = python_json(["-c", code], cwd=tmp_path)
    assert out["cupy"] is False
    row = next(p for p in out["out"]["plugins"] if p["name"] == "cuda")
    assert row["value"] == "hal.backends.cuda:plugin"
    assert row["status"] == "loaded", row


def test_plugin_registers_the_backend_class() -> None:
    registry = BackendRegistry("cuda")
    cuda_pkg.plugin.hal_register_backends(registry=registry)
    assert registry.classes == (CudaBackend,)
    assert issubclass(CudaBackend, BackendImpl)
    assert CudaBackend.name == "cuda"
    assert CudaBackend.api_version[0] == hal.API_VERSION[0]
    assert not inspect.isabstract(CudaBackend)


def test_spi_classes_are_complete() -> None:
    pytest.importorskip("cupy", reason='CuPy is not installed: pip install "hal-sdk[cuda]"')
    from hal.backends.cuda import _device as impl

    for cls, base in (
        (impl.CudaDevice, DeviceImpl),
        (impl.CudaMemory, MemoryImpl),
        (impl.CudaStream, StreamImpl),
        (impl.CudaEvent, EventImpl),
    ):
        assert issubclass(cls, base) and not inspect.isabstract(cls), cls
    # The optional SPI hooks the backend supports are overridden, not inherited.
    assert impl.CudaStream.copy_peer is not StreamImpl.copy_peer
    assert impl.CudaDevice.can_access_peer is not DeviceImpl.can_access_peer
    assert impl.CudaDevice.enable_peer_access is not DeviceImpl.enable_peer_access
    assert impl.CudaMemory.dlpack is not MemoryImpl.dlpack
    assert impl.CudaMemory.dlpack_device is not MemoryImpl.dlpack_device
    assert impl.CudaStream.wait_host is not StreamImpl.wait_host  # host signals (_signal.py)


def test_package_exports() -> None:
    for name in cuda_pkg.__all__:
        assert getattr(cuda_pkg, name) is not None, name
        assert getattr(cuda_pkg, name).__doc__ or name in ("plugin", "NOT_INSTALLED"), name


# -- status without a GPU -------------------------------------------------------------------
def test_status_is_consistent() -> None:
    info = _cuda_info()
    assert info.status in ("available", "unavailable", "blocked"), info
    if info.status == "available":
        assert info.device_count >= 1 and info.reason == ""
        assert info.versions["cupy"] and info.versions["cuda_driver"] != "none"
    else:
        assert info.reason and info.device_count == 0


def test_unavailable_without_gpu_names_the_reason() -> None:
    info = _cuda_info()
    if info.status != "unavailable":
        pytest.skip(f"cuda backend is {info.status}: this test is for machines without a GPU")
    assert "CUDA" in info.reason or "CuPy" in info.reason, info.reason
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert info.reason == NOT_INSTALLED
    else:
        # CuPy's own words are kept (e.g. cudaErrorInsufficientDriver / cudaErrorNoDevice).
        assert "cudaError" in info.reason or "CUDA" in info.reason
    with pytest.raises(hal.BackendUnavailableError, match="cuda"):
        hal.devices("cuda")
    with pytest.raises(hal.BackendUnavailableError) as exc_info:
        hal.device("cuda:0")
    assert info.reason in exc_info.value.reason


def test_hal_info_json_reports_cuda(python_run: Run, tmp_path: Path) -> None:
    proc = python_run(["-m", "hal", "info", "--json"], cwd=tmp_path)
    data = json.loads(proc.stdout)
    by_name = {b["name"]: b for b in data["backends"]}
    assert by_name["cpu"]["status"] == "available"
    cuda = by_name["cuda"]
    assert cuda["plugin"] == "cuda" and cuda["dist"] == "hal-sdk"
    if cuda["status"] == "available":
        assert cuda["devices"] and cuda["devices"][0]["spec"] == "cuda:0"
        caps = cuda["devices"][0]["capabilities"]
        assert caps["ipc"] is True and caps["dlpack"] is True and caps["kernels"] is True
    else:
        assert cuda["status"] == "unavailable" and cuda["reason"], cuda
        assert cuda["devices"] == [] and cuda["device_count"] == 0
    assert "Traceback" not in proc.stderr


def test_missing_cupy_is_unavailable_with_install_hint(python_json: Run, tmp_path: Path) -> None:
    # ``sys.modules['cupy'] = None`` makes ``import cupy`` raise ImportError, as if not installed.
    code = (
        "import json, sys\n"
        "sys.modules['cupy'] = None\n"
        "import hal\n"
        "info = next(b for b in hal.list_backends() if b.name == 'cuda')\n"
        "print(json.dumps({'status': info.status, 'reason': info.reason,"
        " 'cpu': hal.device('cpu:0').name}))\n"
    )
    out = python_json(["-c", code], cwd=tmp_path)
    assert out == {"status": "unavailable", "reason": NOT_INSTALLED, "cpu": "CPU emulator device 0"}
    assert NOT_INSTALLED == 'CuPy is not installed: pip install "hal-sdk[cuda]"'


def _driver_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _fake_driver(tmp_path: Path) -> dict[str, str]:
    """Environment in which ``libcuda.so.1`` loads (a link to the C library) on a machine without a driver.

    The probe then goes on to import CuPy, as on a machine with a driver.
    """
    maps = Path("/proc/self/maps").read_text().splitlines()
    libc = next(line.split()[-1] for line in maps if "/libc.so" in line or "/libc-" in line)
    (tmp_path / "fake-driver").mkdir()
    (tmp_path / "fake-driver" / "libcuda.so.1").symlink_to(libc)
    paths = [str(tmp_path / "fake-driver"), os.environ.get("LD_LIBRARY_PATH", "")]
    return {"LD_LIBRARY_PATH": os.pathsep.join(p for p in paths if p)}


def test_no_driver_is_unavailable_without_importing_cupy(python_json: Run, tmp_path: Path) -> None:
    pytest.importorskip("cupy", reason='CuPy is not installed: pip install "hal-sdk[cuda]"')
    if _driver_loads():
        pytest.skip("libcuda.so.1 loads here: this test is for machines without a CUDA driver")
    code = (
        "import json, sys, hal\n"
        "info = next(b for b in hal.list_backends() if b.name == 'cuda')\n"
        "print(json.dumps({'status': info.status, 'reason': info.reason, 'cupy': 'cupy' in sys.modules}))\n"
    )
    out = python_json(["-c", code], cwd=tmp_path)
    assert out["status"] == "unavailable" and out["cupy"] is False, out
    assert out["reason"].startswith("CUDA driver not found (") and "libcuda.so.1" in out["reason"]
    # with a driver library that loads, the probe imports CuPy (which then reports on its own)
    out = python_json(["-c", code], env=_fake_driver(tmp_path), cwd=tmp_path)
    assert out["status"] == "unavailable" and out["cupy"] is True, out


def test_broken_cupy_is_unavailable_not_a_crash(python_json: Run, tmp_path: Path) -> None:
    # A CuPy whose import raises (a broken install), shadowing the real one if any, on a machine
    # with a driver library (without one the probe never imports CuPy: the test above)
    broken = tmp_path / "site"
    (broken / "cupy").mkdir(parents=True)
    (broken / "cupy" / "__init__.py").write_text(
        "raise RuntimeError('libcudart.so.13: cannot open shared object file')\n"
    )
    code = (
        "import json, hal\n"
        "info = next(b for b in hal.list_backends() if b.name == 'cuda')\n"
        "print(json.dumps({'status': info.status, 'reason': info.reason, 'cpu': len(hal.devices('cpu'))}))\n"
    )
    env = {} if _driver_loads() else _fake_driver(tmp_path)
    out = python_json(["-c", code], pythonpath=[broken], env=env, cwd=tmp_path)
    assert out["status"] == "unavailable" and out["cpu"] >= 1
    assert out["reason"].startswith("CuPy failed to import (RuntimeError: libcudart.so.13")


def test_disabled_cuda_is_never_imported(python_json: Run, tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "import hal\n"
        "info = next(b for b in hal.list_backends() if b.name == 'cuda')\n"
        "print(json.dumps({'status': info.status, 'loaded': 'hal.backends.cuda' in sys.modules,"
        " 'cupy': 'cupy' in sys.modules}))\n"
    )
    out = python_json(["-c", code], env={"HAL_DISABLE_BACKENDS": "cuda"}, cwd=tmp_path)
    assert out == {"status": "blocked", "loaded": False, "cupy": False}


# -- error translation, with CuPy's real exception objects (no GPU needed) ------------------
@pytest.fixture(scope="module")
def cupy_errors() -> Any:
    return pytest.importorskip(
        "cupy_backends.cuda.api.runtime",
        reason='CuPy is not installed: pip install "hal-sdk[cuda]"',
    )


@pytest.mark.parametrize(
    ("status", "expected", "name"),
    [
        (2, hal.OutOfMemoryError, "cudaErrorMemoryAllocation"),
        (1, CudaInvalidValueError, "cudaErrorInvalidValue"),
        (400, hal.DeviceError, "cudaErrorInvalidResourceHandle"),
        (700, hal.StreamError, "cudaErrorIllegalAddress"),
        (719, hal.StreamError, "cudaErrorLaunchFailure"),
        (999, hal.DeviceError, "cudaErrorUnknown"),
    ],
)
def test_runtime_errors_translate_into_the_hal_tree(
    cupy_errors: Any, status: int, expected: type[hal.HalError], name: str
) -> None:
    exc = cupy_errors.CUDARuntimeError(status)
    assert exc.status == status and name in str(exc)  # a real CuPy error object
    err = translate_cuda_error(exc, device="cuda:3")
    assert type(err) is expected
    assert isinstance(err, hal.DeviceError) and isinstance(err, hal.HalError)
    assert err.code == name and err.device == "cuda:3"
    assert str(err).startswith("cuda:3: ") and str(exc) in str(err)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (2, hal.OutOfMemoryError),
        (1, CudaInvalidValueError),
        (35, hal.BackendUnavailableError),
        (100, hal.BackendUnavailableError),
        (700, hal.StreamError),
        (400, hal.DeviceError),
    ],
)
def test_runtime_status_table(status: int, expected: type[hal.HalError]) -> None:
    # The same mapping by status code alone: runs where CuPy is not installed too.
    err = translate_status(status, device="cuda:0")
    assert type(err) is expected
    assert status_name(status) in str(err)


def test_invalid_value_is_also_a_value_error(cupy_errors: Any) -> None:
    err = translate_cuda_error(cupy_errors.CUDARuntimeError(1))
    assert isinstance(err, ValueError) and isinstance(err, hal.DeviceError)
    with pytest.raises(ValueError, match="invalid argument"):
        raise err


@pytest.mark.parametrize("status", [35, 100, 34, 46, 3, 803, 804])
def test_no_driver_or_device_translate_to_unavailable(cupy_errors: Any, status: int) -> None:
    exc = cupy_errors.CUDARuntimeError(status)
    err = translate_cuda_error(exc)
    assert isinstance(err, hal.BackendUnavailableError)
    assert err.backend == "cuda" and str(exc) in err.reason
    assert status_name(status) in err.reason


def test_cupy_pool_out_of_memory_translates() -> None:
    memory = pytest.importorskip(
        "cupy.cuda.memory", reason='CuPy is not installed: pip install "hal-sdk[cuda]"'
    )
    exc = memory.OutOfMemoryError(1 << 40, 1 << 30)
    err = translate_cuda_error(exc, device="cuda:0")
    assert type(err) is hal.OutOfMemoryError and "1,099,511,627,776" in str(err)


def test_other_exceptions_and_hal_errors() -> None:
    original = hal.InvalidBufferError("closed")
    assert translate_cuda_error(original) is original
    err = translate_cuda_error(KeyError("x"), device="cuda:1")
    assert type(err) is hal.DeviceError and "KeyError" in str(err) and err.device == "cuda:1"


def test_driver_status_codes_translate() -> None:
    # CuPy's CUDADriverError needs libcuda to be built (it asks the driver for the message),
    # so here the driver table is checked through translate_status; the GPU test below
    # checks the real object.
    oom = translate_status(2, api="driver", device="cuda:0")
    assert type(oom) is hal.OutOfMemoryError and oom.code == "CUDA_ERROR_OUT_OF_MEMORY"
    assert isinstance(translate_status(1, api="driver"), CudaInvalidValueError)
    no_dev = translate_status(100, api="driver")
    assert (
        isinstance(no_dev, hal.BackendUnavailableError) and "CUDA_ERROR_NO_DEVICE" in no_dev.reason
    )
    assert type(translate_status(719, api="driver")) is hal.StreamError
    odd = translate_status(12345, api="driver")
    assert type(odd) is hal.DeviceError and odd.code == "CUDA driver status 12345"


def test_translate_status_checks_its_argument() -> None:
    with pytest.raises(TypeError, match="status='2'"):
        bad: Any = "2"
        translate_status(bad)
    assert status_name(2) == "cudaErrorMemoryAllocation"
    assert status_name(2, "driver") == "CUDA_ERROR_OUT_OF_MEMORY"
    assert status_name(4242) == "CUDA runtime status 4242"


# -- HAL_CUDA_DEVICES ----------------------------------------------------------------------
def test_device_filter_parsing() -> None:
    assert parse_device_filter(None, 3) == [0, 1, 2]
    assert parse_device_filter("", 2) == [0, 1]
    assert parse_device_filter(" 2, 0 ", 3) == [2, 0]
    with pytest.raises(ValueError, match=r"HAL_CUDA_DEVICES='5'.*out of range \(2 CUDA"):
        parse_device_filter("5", 2)
    with pytest.raises(ValueError, match="'x' is not a CUDA device ordinal"):
        parse_device_filter("0,x", 2)
    with pytest.raises(ValueError, match="listed twice"):
        parse_device_filter("1,1", 2)
    with pytest.raises(ValueError, match="'-1' is not"):
        parse_device_filter("-1", 2)


def test_staging_switch_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cupy", reason='CuPy is not installed: pip install "hal-sdk[cuda]"')
    from hal.backends.cuda._device import staging_from_env

    monkeypatch.delenv("HAL_CUDA_STAGING", raising=False)
    assert staging_from_env() is True
    monkeypatch.setenv("HAL_CUDA_STAGING", "0")
    assert staging_from_env() is False
    monkeypatch.setenv("HAL_CUDA_STAGING", "maybe")
    with pytest.raises(ValueError, match="HAL_CUDA_STAGING='maybe'"):
        staging_from_env()


# -- the raw-CuPy baseline of `hal bench memory` -------------------------------------------
def test_baseline_validates_arguments_first() -> None:
    from hal.backends.cuda._baseline import memory_baseline

    with pytest.raises(ValueError, match="direction='sideways'"):
        memory_baseline("sideways", 1 << 20, 3)
    with pytest.raises(ValueError, match="nbytes=0"):
        memory_baseline("h2d", 0, 3)
    with pytest.raises(ValueError, match="repeat=0"):
        memory_baseline("h2d", 1024, 0)


def test_baseline_without_gpu_says_why() -> None:
    info = _cuda_info()
    if info.status == "available":
        pytest.skip("a GPU is present: see test_baseline_on_gpu")
    from hal.backends.cuda._baseline import memory_baseline

    with pytest.raises(hal.BackendUnavailableError) as exc_info:
        memory_baseline("h2d", 1024, 1)
    assert exc_info.value.reason == info.reason


# -- on a GPU ---------------------------------------------------------------------------------
@pytest.fixture
def gpu() -> hal.Device:
    """``cuda:0``; skips with the backend's reason where CUDA is not available."""
    info = _cuda_info()
    if info.status != "available":
        pytest.skip(f"cuda backend {info.status}: {info.reason}")
    return hal.device("cuda:0")


@pytest.fixture
def gstream(gpu: hal.Device) -> Iterator[hal.Stream]:
    s = gpu.create_stream()
    yield s
    s.close()


def _pinned_array(nbytes: int) -> tuple[np.ndarray[Any, Any], Any]:
    import cupy

    mem = cupy.cuda.alloc_pinned_memory(nbytes)
    raw = (ctypes.c_ubyte * nbytes).from_address(int(mem.ptr))
    return np.frombuffer(memoryview(raw), dtype=np.uint8), mem


@pytest.mark.gpu
def test_gpu_device_identity(gpu: hal.Device) -> None:
    assert gpu.vendor == "NVIDIA" and gpu.total_memory > 0
    props = gpu.properties()
    assert props["cuda_ordinal"] >= 0 and "." in props["compute_capability"]
    caps = gpu.capabilities
    assert caps.ipc and caps.dlpack and caps.timing_events and caps.fp16 and caps.kernels
    assert caps.reason_absent("kernels") is None  # hal.kernels: NVRTC (backends/cuda/_kernels.py)


@pytest.mark.gpu
def test_gpu_pageable_h2d_is_staged_and_host_reusable(gpu: hal.Device, gstream: hal.Stream) -> None:
    from hal.backends.cuda._device import STAGING_CHUNK

    n = 3 * STAGING_CHUNK + 12345  # several chunks and a ragged tail
    host = np.resize(np.arange(251, dtype=np.uint8), n)
    original = host.copy()
    with gpu.alloc(n + 7) as buf:
        hal.memset(buf, 0, stream=gstream)
        hal.copy(buf, host, stream=gstream, dst_offset=7)
        host[:] = 0  # staged: the caller's memory may change as soon as copy() returns
        back = np.empty(n, dtype=np.uint8)
        hal.copy(back, buf, stream=gstream, src_offset=7)
        gstream.synchronize()
        np.testing.assert_array_equal(back, original)


@pytest.mark.gpu
def test_gpu_pinned_host_copies(gpu: hal.Device, gstream: hal.Stream) -> None:
    n = 8 << 20
    src, src_mem = _pinned_array(n)
    dst, dst_mem = _pinned_array(n)
    src[:] = np.resize(np.arange(253, dtype=np.uint8), n)
    dst[:] = 0
    with gpu.alloc(n) as buf:
        hal.copy(buf, src, stream=gstream)
        hal.copy(dst, buf, stream=gstream)
        gstream.synchronize()
    np.testing.assert_array_equal(dst, src)
    del src_mem, dst_mem


@pytest.mark.gpu
@pytest.mark.parametrize(("dst_off", "src_off"), [(4, 0), (0, 4), (3 << 20, 0), (0, 3 << 20)])
def test_gpu_overlapping_copy_is_memmove(
    gpu: hal.Device, gstream: hal.Stream, dst_off: int, src_off: int
) -> None:
    n = 8 << 20
    data = np.resize(np.arange(241, dtype=np.uint8), n)
    with gpu.alloc(n) as buf:
        hal.copy(buf, data, stream=gstream)
        k = n - max(dst_off, src_off)
        hal.copy(buf, buf, stream=gstream, dst_offset=dst_off, src_offset=src_off, nbytes=k)
        expected = data.copy()
        expected[dst_off : dst_off + k] = data[src_off : src_off + k]
        out = np.empty(n, dtype=np.uint8)
        hal.copy(out, buf, stream=gstream)
        gstream.synchronize()
    np.testing.assert_array_equal(out, expected)


@pytest.mark.gpu
def test_gpu_events_order_streams_and_time(gpu: hal.Device) -> None:
    n = 64 << 20
    a, b = gpu.create_stream(), gpu.create_stream()
    start, done = gpu.create_event(timing=True), gpu.create_event(timing=True)
    with gpu.alloc(n) as x, gpu.alloc(n) as y:
        start.record(a)
        hal.memset(x, 0x5A, stream=a)
        for _ in range(4):  # keep stream a busy a while
            hal.copy(y, x, stream=a)
        done.record(a)
        b.wait(done)
        hal.copy(y, x, stream=b)
        out = np.empty(n, dtype=np.uint8)
        hal.copy(out, y, stream=b)
        b.synchronize()
        assert done.query() and (out == 0x5A).all()
        assert done.elapsed_ms(start) > 0.0
    for obj in (a, b, start, done):
        obj.close()


@pytest.mark.gpu
def test_gpu_dlpack_cupy_zero_copy_and_stream_order(gpu: hal.Device, gstream: hal.Stream) -> None:
    import cupy

    n = 16 << 20
    arr = hal.asarray(np.zeros(n // 4, dtype=np.float32), device=gpu)
    assert arr.__dlpack_device__() == (2, gpu.properties()["cuda_ordinal"])
    hal.memset(arr, 0x3F, stream=gstream)  # not synchronized: the consumer must wait for it
    view = cupy.from_dlpack(arr)
    assert view.data.ptr == impl_of(arr.buffer).ptr + arr.offset  # zero-copy
    assert view.shape == arr.shape and view.dtype == np.float32
    # cupy.asnumpy copies on CuPy's current stream, which hal made wait for the memset.
    # (Memory copies only: no kernel is compiled, so no NVRTC/CUDA_PATH is needed.)
    np.testing.assert_array_equal(
        cupy.asnumpy(view).view(np.uint8), np.full(n, 0x3F, dtype=np.uint8)
    )
    view[:4].set(np.ones(4, dtype=np.float32))  # a write through the consumer ...
    cupy.cuda.get_current_stream().synchronize()  # ... ordered before hal reads by the caller
    np.testing.assert_array_equal(arr.to_host()[:4], np.ones(4, dtype=np.float32))
    arr.close()


@pytest.mark.gpu
def test_gpu_dlpack_torch(gpu: hal.Device) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    arr = hal.asarray(np.arange(1024, dtype=np.float32), device=gpu)
    t = torch.from_dlpack(arr)
    assert t.is_cuda and t.data_ptr() == impl_of(arr.buffer).ptr
    assert float(t.sum().item()) == float(np.arange(1024, dtype=np.float32).sum())
    del t
    arr.close()


@pytest.mark.gpu
def test_gpu_out_of_memory(gpu: hal.Device) -> None:
    before = gpu.memory_in_use
    with pytest.raises(hal.OutOfMemoryError) as exc_info:
        gpu.alloc(gpu.total_memory * 4)
    assert exc_info.value.device == "cuda:0" and exc_info.value.code == "cudaErrorMemoryAllocation"
    assert gpu.memory_in_use == before
    with gpu.alloc(1 << 20):  # the device still works
        pass


@pytest.mark.gpu
def test_gpu_real_driver_error_translates(gpu: hal.Device) -> None:
    from cupy_backends.cuda.api.driver import CUDADriverError

    err = translate_cuda_error(CUDADriverError(2), device="cuda:0")
    assert type(err) is hal.OutOfMemoryError and err.code == "CUDA_ERROR_OUT_OF_MEMORY"


@pytest.mark.gpu
def test_gpu_peer_copies(gpu: hal.Device) -> None:
    devs = hal.devices("cuda")
    if len(devs) < 2:
        pytest.skip(f"peer tests need two CUDA devices; {len(devs)} visible")
    d0, d1 = devs[0], devs[1]
    n = 4 << 20
    data = np.resize(np.arange(239, dtype=np.uint8), n)
    with d0.alloc(n) as a, d1.alloc(n) as b:
        s, s1 = d0.create_stream(), d1.create_stream()
        hal.copy(b, data, stream=s1)
        s1.synchronize()
        expected_path = "peer" if d0.can_access_peer(d1) else "staged"
        assert hal.copy_path(a, b) == expected_path
        assert hal.copy(a, b, stream=s) == expected_path
        out = np.empty(n, dtype=np.uint8)
        hal.copy(out, a, stream=s)
        s.synchronize()
        np.testing.assert_array_equal(out, data)
        s.close()
        s1.close()


@pytest.mark.gpu
def test_gpu_device_filter(gpu: hal.Device, python_json: Run, tmp_path: Path) -> None:
    code = (
        "import json, hal\n"
        "info = next(b for b in hal.list_backends() if b.name == 'cuda')\n"
        "print(json.dumps({'status': info.status, 'reason': info.reason, 'count': info.device_count}))\n"
    )
    assert python_json(["-c", code], env={"HAL_CUDA_DEVICES": "0"}, cwd=tmp_path)["count"] == 1
    bad = python_json(["-c", code], env={"HAL_CUDA_DEVICES": "99"}, cwd=tmp_path)
    assert bad["status"] == "failed" and "HAL_CUDA_DEVICES='99'" in bad["reason"]


@pytest.mark.gpu
def test_baseline_on_gpu(gpu: hal.Device) -> None:
    from hal.backends.cuda._baseline import memory_baseline, transfer_seconds

    for direction in ("h2d", "d2h", "d2d"):
        assert 0.0 < memory_baseline(direction, 1 << 20, 3) < 1.0
        assert 0.0 < transfer_seconds(direction, 1 << 20, 3, host="pinned") < 1.0
    if len(hal.devices("cuda")) < 2:
        with pytest.raises(ValueError, match="peer"):
            memory_baseline("peer", 1 << 20, 3)


@pytest.mark.gpu
def test_gpu_host_signal_holds_later_work(gpu: hal.Device, gstream: hal.Stream) -> None:
    """Stream.wait_host() on CUDA: cuStreamWaitValue32 on pinned memory; nothing runs before set()."""
    import threading

    assert gpu.capabilities.host_signal, gpu.capabilities.reason_absent("host_signal")
    n = 1 << 20
    dst, dst_mem = _pinned_array(n)
    dst[:] = 0
    with gpu.alloc(n) as buf:
        for rnd in range(40):  # more rounds than one word's reuse: generations wrap correctly
            value = rnd % 250 + 1
            sig = gstream.wait_host()
            assert sig.native
            hal.memset(buf, value, stream=gstream)
            hal.copy(dst, buf, stream=gstream)
            seen: list[tuple[int, bool]] = []

            def setter(sig: hal.HostSignal = sig, seen: list[tuple[int, bool]] = seen) -> None:
                threading.Event().wait(0.02)
                seen.append((int(dst.max()), gstream.query()))
                sig.set()

            t = threading.Thread(target=setter)
            t.start()
            gstream.synchronize()
            t.join()
            assert seen[0] == (value - 1 if rnd else 0, False), (
                f"round {rnd}: work ran before set(): {seen}"
            )
            assert (dst == value).all()
        sig = gstream.wait_host(timeout=0.1)  # never set: the watchdog fails it, the stream goes on
        hal.memset(buf, 0, stream=gstream)
        with pytest.raises(hal.StreamError, match="not set within"):
            gstream.synchronize()
    del dst_mem


# -- this round: DLPack adopt/copy, IPC, pinned host memory, health, half precision ------------
def test_ipc_payload_is_validated() -> None:
    """A payload that is not the cuda backend's is a ValueError naming it (no GPU needed)."""
    pytest.importorskip("cupy_backends.cuda.api.runtime")
    from hal.backends.cuda import _ipc

    for bad in (
        "",
        "{}",
        '{"pid":1,"path":"/etc/passwd","handle":"00"}',
        '{"pid":1,"path":"/etc/hal-cuda-ipc-1-0","handle":"' + "00" * 64 + '"}',
    ):
        with pytest.raises(ValueError, match="is not one of the cuda backend"):
            _ipc.decode(bad)


def test_adopt_declines_memory_of_other_devices_without_touching_cuda() -> None:
    """adopt() answers None for host memory and other CUDA ordinals before any CUDA call (no GPU needed)."""
    pytest.importorskip("cupy")
    from hal.backends.cuda._device import CudaDevice

    dev = object.__new__(CudaDevice)  # no driver here: only the fields adopt reads first
    dev.ordinal = 1
    owner = object()
    for dl_device in ((1, 0), (3, 1), (2, 0), (2, 2), (13, 1)):
        assert dev.adopt(dl_device=dl_device, address=4096, nbytes=64, owner=owner) is None, (
            dl_device
        )


def test_ipc_exporter_frees_only_after_the_last_importer(tmp_path: Path) -> None:
    """The lock-file protocol of _ipc.py with a real second process holding the shared lock (no GPU)."""
    pytest.importorskip("cupy_backends.cuda.api.runtime")
    import fcntl
    import os
    import subprocess
    import sys
    import weakref

    from hal.backends.cuda import _ipc

    class Mem:  # stands for the cupy memory object: dropping the last reference is the cudaFree
        pass

    mem = Mem()
    alive = weakref.ref(mem)
    exp = object.__new__(_ipc.Export)
    exp.path = os.path.join(_ipc._dir(), f"hal-cuda-ipc-{os.getpid()}-test{id(mem)}")
    exp.fd = os.open(exp.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(exp.fd, b"A")
    # an importer: opens the file, takes the shared lock, reports, holds it until told to go
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys\n"
            f"fd = os.open({exp.path!r}, os.O_RDONLY)\n"
            "fcntl.flock(fd, fcntl.LOCK_SH)\n"
            "print(os.pread(fd, 1, 0).decode(), flush=True)\n"
            "sys.stdin.readline()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "A"
        _ipc.retire(exp, mem)
        del mem
        assert not os.path.exists(exp.path)  # no new importer can open it
        _ipc.reap()
        assert alive() is not None, "freed while an importer still held it"
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
        _ipc.reap()
        assert alive() is None, "not freed after the last importer closed"
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate()
    with pytest.raises(OSError):
        fcntl.flock(exp.fd, fcntl.LOCK_SH)  # the exporter's descriptor is closed


_IPC_CHILD = """
import sys
import numpy as np
import hal
handle = bytes.fromhex(sys.argv[1])
dev = hal.device("cuda:0")
buf = dev.import_handle(handle)
print("IN_USE", dev.memory_in_use, flush=True)
s = dev.create_stream()
view = buf.view(np.uint32)
seen = view.to_host(stream=s)
print("SEEN", int(seen[0]), int(seen[-1]), flush=True)
hal.copy(buf, np.array([4242], np.uint32), stream=s, dst_offset=4)
s.synchronize()
print("WROTE", flush=True)
sys.stdin.readline()
print("AFTER", int(view.to_host(stream=s)[0]), flush=True)
try:
    dev.import_handle(handle)
    print("REIMPORT ok", flush=True)
except hal.HalError as exc:
    print("REIMPORT", type(exc).__name__, flush=True)
buf.close()
"""


@pytest.mark.gpu
def test_gpu_ipc_two_processes(gpu: hal.Device, gstream: hal.Stream, tmp_path: Path) -> None:
    """export_handle/import_handle with cudaIpc*: shared writes; usable after the exporter's close."""
    import os
    import subprocess
    import sys

    assert gpu.capabilities.ipc
    n = 1024
    buf = gpu.alloc(4 * n)
    hal.copy(buf, np.arange(n, dtype=np.uint32) + 7, stream=gstream)
    gstream.synchronize()
    handle = buf.export_handle()
    env = dict(os.environ, HAL_BACKENDS="cuda")
    child = subprocess.Popen(
        [sys.executable, "-c", _IPC_CHILD, handle.hex()],
        env=env,
        cwd=tmp_path,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdin is not None

        def line(prefix: str) -> str:
            got = child.stdout.readline()  # type: ignore[union-attr]
            assert got.startswith(prefix), (
                f"{got!r}; stderr: {child.stderr.read() if child.stderr else ''}"
            )
            return got.strip()

        assert line("IN_USE") == "IN_USE 0"
        assert line("SEEN") == f"SEEN 7 {n - 1 + 7}"
        line("WROTE")
        assert int(buf.view(np.uint32).to_host(stream=gstream)[1]) == 4242
        used = gpu.memory_in_use
        buf.close()  # the importer still has it open: the cudaFree waits for it
        assert gpu.memory_in_use == used - 4 * n
        child.stdin.write("closed\n")
        child.stdin.flush()
        assert line("AFTER") == "AFTER 7"
        assert line("REIMPORT") == "REIMPORT HalError"
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    gpu.alloc(8).close()  # reaps the deferred free


@pytest.mark.gpu
def test_gpu_ipc_same_process(gpu: hal.Device, gstream: hal.Stream) -> None:
    buf = gpu.alloc(64)
    hal.copy(buf, np.arange(16, dtype=np.uint32), stream=gstream)
    gstream.synchronize()
    handle = buf.export_handle()
    other = gpu.import_handle(handle)
    assert other.nbytes == 64
    hal.copy(other, np.array([99], np.uint32), stream=gstream, dst_offset=8)
    gstream.synchronize()
    assert int(buf.view(np.uint32).to_host(stream=gstream)[2]) == 99
    buf.close()
    assert list(other.view(np.uint32).to_host(stream=gstream)[:2]) == [0, 1]  # still there
    with pytest.raises(hal.HalError, match="freed"):
        gpu.import_handle(handle)
    other.close()
    bad = handle.replace(b'\\"handle\\":\\"', b'\\"handle\\":\\"00')  # a 65-byte CUDA handle
    assert bad != handle
    with pytest.raises(ValueError, match="not one of the cuda backend"):
        gpu.import_handle(bad)


@pytest.mark.gpu
def test_gpu_from_dlpack_adopts_cupy_memory(gpu: hal.Device) -> None:
    import cupy

    with cupy.cuda.Device(gpu.properties()["cuda_ordinal"]):
        x = cupy.arange(1000, dtype=cupy.float32)
    before = gpu.memory_in_use
    arr = hal.from_dlpack(x)
    assert arr.device == gpu and impl_of(arr.buffer).ptr == x.data.ptr  # zero-copy
    assert gpu.memory_in_use == before  # the producer's memory, not counted
    np.testing.assert_array_equal(arr.to_host(), np.arange(1000, dtype=np.float32))
    s = gpu.create_stream()
    hal.memset(arr.buffer, 0, nbytes=8, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(x[:3]), [0, 0, 2])  # hal wrote the producer's memory
    arr.close()
    assert float(x[5]) == 5.0  # the producer's memory lives on


@pytest.mark.gpu
def test_gpu_from_dlpack_copy_true_of_device_memory(gpu: hal.Device) -> None:
    import cupy

    with cupy.cuda.Device(gpu.properties()["cuda_ordinal"]):
        x = cupy.arange(256, dtype=cupy.int32)
    dup = hal.from_dlpack(x, copy=True)
    assert dup.device == gpu and impl_of(dup.buffer).ptr != x.data.ptr
    x[:] = -1
    np.testing.assert_array_equal(dup.to_host(), np.arange(256, dtype=np.int32))
    cpu = [d for d in hal.devices() if d.backend == "cpu"]
    if cpu:
        there = hal.from_dlpack(x, copy=True, device=cpu[0])
        np.testing.assert_array_equal(there.to_host(), np.full(256, -1, np.int32))
        there.close()
    dup.close()


@pytest.mark.gpu
def test_gpu_dlpack_export_copy_true_stays_on_device(gpu: hal.Device) -> None:
    import cupy

    arr = hal.asarray(np.arange(64, dtype=np.float32), device=gpu)

    class Copied:
        def __dlpack__(self, **kw: Any) -> Any:
            return arr.__dlpack__(copy=True, **kw)

        def __dlpack_device__(self) -> tuple[int, int]:
            return arr.__dlpack_device__()

    view = cupy.from_dlpack(Copied())
    assert (
        view.data.ptr != impl_of(arr.buffer).ptr
        and view.device.id == gpu.properties()["cuda_ordinal"]
    )
    s = gpu.create_stream()
    hal.memset(arr.buffer, 0, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(view), np.arange(64, dtype=np.float32))  # a copy
    arr.close()
    del view


@pytest.mark.gpu
def test_gpu_alloc_host_is_pinned(gpu: hal.Device, gstream: hal.Stream) -> None:
    from hal.backends.cuda._device import is_pinned

    host = hal.alloc_host(1 << 20, device=gpu)
    assert host.nbytes >= 1 << 20 and is_pinned(int(host.ctypes.data))
    host[:] = 5
    with gpu.alloc(1 << 20) as buf:
        hal.copy(buf, host, stream=gstream)
        back = hal.alloc_host(1 << 20, device=gpu)
        hal.copy(back, buf, stream=gstream)
        gstream.synchronize()
        assert (back == 5).all()


@pytest.mark.gpu
def test_gpu_health_counters(gpu: hal.Device) -> None:
    counters = impl_of(gpu).health()
    assert set(counters) <= {"ecc_corrected", "ecc_uncorrected", "errors", "resets"}
    assert all(isinstance(v, int) and v >= 0 for v in counters.values())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_accumulate_half_precision(gpu: hal.Device, gstream: hal.Stream, dtype: str) -> None:
    """float16 runs on CuPy (float32 arithmetic, one rounding); bfloat16 takes the host route."""
    import ml_dtypes

    import hal.kernels as hk
    from hal.kernels._dispatch import trace

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(4096).astype(np.float32).astype(dt)
    b = rng.standard_normal(4096).astype(np.float32).astype(dt)
    dst, src = hal.asarray(a, device=gpu), hal.asarray(b, device=gpu)
    with trace() as records:
        hk.accumulate(dst, src, op="sum", stream=gstream)
    gstream.synchronize()
    want = (a.astype(np.float32) + b.astype(np.float32)).astype(dt)
    np.testing.assert_array_equal(dst.to_host().view(np.uint16), want.view(np.uint16))
    assert records[0].implementation == ("dedicated" if dtype == "float16" else "host"), records
    dst.close()
    src.close()
