"""OpenCL-specific tests (PoCL here): selection filters, unavailable reasons, error translation,
peer and staged copies, non-blocking queries, the raw-PyOpenCL baseline.

The shared HAL behaviour (round trips, ordering, timing ...) is tested in tests/hal/ over every
backend; this file covers what only the OpenCL backend does.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hal

cl = pytest.importorskip("pyopencl")

from hal.backends.opencl import status_name, translate_cl_error, translate_status  # noqa: E402
from hal.backends.opencl._baseline import DIRECTIONS, memory_baseline  # noqa: E402


def _opencl_devices() -> list[hal.Device]:
    try:
        return hal.devices("opencl")
    except hal.BackendUnavailableError as exc:
        pytest.skip(f"opencl backend unavailable: {exc.reason}")


@pytest.fixture
def ocl() -> list[hal.Device]:
    """The OpenCL devices (two under POCL_DEVICES="pthread pthread", set by conftest)."""
    return _opencl_devices()


@pytest.fixture
def ocl_pair(ocl: list[hal.Device]) -> tuple[hal.Device, hal.Device]:
    """Two OpenCL devices sharing a context."""
    if len(ocl) < 2 or not ocl[0].can_access_peer(ocl[1]):
        pytest.skip('needs two OpenCL devices in one context (POCL_DEVICES="pthread pthread")')
    return ocl[0], ocl[1]


class Gate:
    """A ``cl.UserEvent`` wrapped as a hal Event: streams that wait on it stall until ``open``."""

    def __init__(self, device: hal.Device) -> None:
        impl: Any = device._impl
        self.user = cl.UserEvent(impl.context)
        self.event = device.create_event()
        ev: Any = self.event._impl
        ev.marker, ev.context = self.user, impl.context

    def open(self, status: int = 0) -> None:
        self.user.set_status(status)


@pytest.fixture
def gate() -> Iterator[Callable[[hal.Device], Gate]]:
    """Make gates; any gate left closed is opened after the test so no queue stays stuck."""
    made: list[Gate] = []

    def make(device: hal.Device) -> Gate:
        g = Gate(device)
        made.append(g)
        return g

    yield make
    for g in made:
        if g.user.command_execution_status > 0:
            g.open()


# -- plugin import and availability ------------------------------------------------------------
def test_plugin_import_does_not_import_pyopencl(python_run: Callable[..., Any]) -> None:
    code = "import sys, hal.backends.opencl as m; print(m.plugin is not None, 'pyopencl' in sys.modules)"
    assert python_run(["-c", code]).stdout.split() == ["True", "False"]


_BACKENDS_JSON = (
    "import hal, json; print(json.dumps("
    "{b.name: [b.status, b.reason, b.device_count] for b in hal.list_backends()}))"
)


def test_unavailable_without_pyopencl(tmp_path: Path, python_json: Callable[..., Any]) -> None:
    fake = tmp_path / "pyopencl"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise ImportError('No module named pyopencl (hidden by the test)')\n"
    )
    out = python_json(["-c", _BACKENDS_JSON], pythonpath=[tmp_path])
    status, reason, count = out["opencl"]
    assert (status, count) == ("unavailable", 0)
    assert 'pip install "hal-sdk[opencl]"' in reason and "pyopencl[pocl]" in reason
    assert out["cpu"][0] == "available"


@pytest.fixture(scope="module")
def pyopencl_without_pocl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the pyopencl package whose ICD loader has no bundled PoCL next to it.

    The wheel's ICD loader also looks in ``pyopencl/.libs`` (where ``pocl.icd`` lives), so
    ``OCL_ICD_VENDORS`` alone does not hide PoCL: symlink the package, copy the extension
    and the loader, and leave ``pocl.icd`` out.
    """
    pkg = Path(cl.__file__).parent
    libs = pkg / ".libs"
    loaders = sorted(libs.glob("libOpenCL*")) if libs.is_dir() else []
    if not loaders or not (libs / "pocl.icd").exists():
        pytest.skip("this pyopencl has no bundled PoCL/ICD loader in .libs to hide")
    root = tmp_path_factory.mktemp("nopocl")
    dst = root / "pyopencl"
    (dst / ".libs").mkdir(parents=True)
    for entry in pkg.iterdir():
        if entry.name == ".libs":
            continue
        if entry.name.startswith("_cl") and entry.suffix == ".so":
            shutil.copy2(entry, dst / entry.name)
        else:
            (dst / entry.name).symlink_to(entry)
    for lib in loaders:
        shutil.copy2(lib, dst / ".libs" / lib.name)
    return root


def test_unavailable_without_icd(
    pyopencl_without_pocl: Path, tmp_path: Path, python_json: Callable[..., Any]
) -> None:
    empty = tmp_path / "vendors"
    empty.mkdir()
    out = python_json(
        ["-c", _BACKENDS_JSON],
        pythonpath=[pyopencl_without_pocl],
        env={"OCL_ICD_VENDORS": str(empty)},
    )
    status, reason, count = out["opencl"]
    assert (status, count) == ("unavailable", 0)
    assert "PLATFORM_NOT_FOUND_KHR" in reason
    assert str(empty) in reason and "pyopencl[pocl]" in reason and "ICD" in reason


def test_unavailable_when_platform_has_no_device(
    tmp_path: Path, python_json: Callable[..., Any]
) -> None:
    out = python_json(
        ["-c", _BACKENDS_JSON],
        env={"POCL_DEVICES": "nosuchdriver", "OCL_ICD_VENDORS": str(tmp_path)},
    )
    status, reason, _ = out["opencl"]
    assert status == "unavailable"
    assert "no device" in reason and "POCL_DEVICES='nosuchdriver'" in reason


def test_hal_info_json(python_json: Callable[..., Any]) -> None:
    data = python_json(["-m", "hal", "info", "--json"], env={"POCL_DEVICES": "pthread pthread"})
    (entry,) = [b for b in data["backends"] if b["name"] == "opencl"]
    assert entry["status"] == "available", entry["reason"]
    assert [d["index"] for d in entry["devices"]] == [0, 1]
    assert entry["p2p"] == [["local", "peer"], ["peer", "local"]]
    caps = entry["devices"][0]["capabilities"]
    assert caps["p2p"] and not caps["ipc"] and not caps["dlpack"]
    assert entry["devices"][0]["properties"]["context_peers"] == ["opencl:1"]
    assert "pyopencl" in entry["versions"]
    json.dumps(data)


# -- selection filters ---------------------------------------------------------------------------
def _status(name: str = "opencl") -> hal.BackendInfo:
    (info,) = [b for b in hal.list_backends() if b.name == name]
    return info


def test_platform_filter(hal_env: Callable[..., None]) -> None:
    platform = cl.get_platforms()[0].name
    hal_env(HAL_OPENCL_PLATFORM=platform[2:8].upper())
    assert len(hal.devices("opencl")) >= 1
    hal_env(HAL_OPENCL_PLATFORM="no such platform")
    info = _status()
    assert info.status == "unavailable"
    assert "HAL_OPENCL_PLATFORM='no such platform'" in info.reason and repr(platform) in info.reason


def test_devices_filter_by_index(
    ocl_pair: tuple[hal.Device, hal.Device], hal_env: Callable[..., None]
) -> None:
    hal_env(HAL_OPENCL_DEVICES="1")
    (only,) = hal.devices("opencl")
    assert only.index == 0
    impl: Any = only._impl
    assert impl.cl_device == cl.get_platforms()[0].get_devices()[1]  # the second OpenCL device
    caps = only.capabilities
    assert not caps.p2p and "only selected device" in (caps.reason_absent("p2p") or "")
    hal_env(HAL_OPENCL_DEVICES="1, 0")
    first, second = hal.devices("opencl")
    raw = cl.get_platforms()[0].get_devices()
    impls: list[Any] = [first._impl, second._impl]
    assert [i.cl_device for i in impls] == [raw[1], raw[0]]  # in the order given
    assert first.can_access_peer(second)


def test_devices_filter_by_name(
    ocl_pair: tuple[hal.Device, hal.Device], hal_env: Callable[..., None]
) -> None:
    word = ocl_pair[0].name.split()[0][:4].lower()
    hal_env(HAL_OPENCL_DEVICES=word)
    assert len(hal.devices("opencl")) == 2  # a substring selects every device it matches
    hal_env(HAL_OPENCL_DEVICES="0,0")
    assert len(hal.devices("opencl")) == 1  # duplicates collapse


@pytest.mark.parametrize(
    ("value", "status", "text"),
    [
        ("7", "unavailable", "index 7 is out of range"),
        ("nosuchdevice", "unavailable", "'nosuchdevice' matches no device name"),
        ("0,,1", "failed", "empty item"),
    ],
)
def test_devices_filter_errors(
    ocl: list[hal.Device], hal_env: Callable[..., None], value: str, status: str, text: str
) -> None:
    hal_env(HAL_OPENCL_DEVICES=value)
    info = _status()
    assert info.status == status
    assert text in info.reason and f"HAL_OPENCL_DEVICES={value!r}" in info.reason
    with pytest.raises(hal.BackendUnavailableError):
        hal.devices("opencl")


# -- capabilities ---------------------------------------------------------------------------------
def test_capabilities_are_honest(ocl: list[hal.Device]) -> None:
    for dev in ocl:
        impl: Any = dev._impl
        raw = impl.cl_device
        caps = dev.capabilities
        assert caps.max_alloc_bytes == raw.max_mem_alloc_size
        assert dev.total_memory == raw.global_mem_size
        assert caps.fp64 == ("cl_khr_fp64" in raw.extensions or bool(raw.double_fp_config))
        assert caps.fp16 == ("cl_khr_fp16" in raw.extensions)
        assert caps.timing_events
        for name in ("ipc", "dlpack"):
            assert not getattr(caps, name) and caps.absent_reasons.get(name)
        assert caps.kernels and dev.capabilities.reason_absent("kernels") is None  # hal.kernels
        assert caps.p2p == (len(ocl) > 1)


def test_dlpack_refused(ocl: list[hal.Device]) -> None:
    with hal.asarray(np.arange(4.0), device=ocl[0]) as arr, pytest.raises(BufferError):
        arr.__dlpack__()


# -- memory ---------------------------------------------------------------------------------------
def test_memory_accounting_and_oom(ocl: list[hal.Device]) -> None:
    dev = ocl[0]
    base = dev.memory_in_use
    assert base is not None
    chunk = dev.capabilities.max_alloc_bytes
    assert chunk is not None
    held = []
    try:
        with pytest.raises(hal.OutOfMemoryError, match="GLOBAL_MEM_SIZE"):
            for _ in range(dev.total_memory // chunk + 2):
                held.append(dev.alloc(chunk))
        assert dev.memory_in_use == base + len(held) * chunk
    finally:
        for b in held:
            b.close()
    assert dev.memory_in_use == base
    with pytest.raises(ValueError, match="largest allocation"):
        dev.alloc(chunk + 1)


def test_allocation_is_resident(ocl: list[hal.Device]) -> None:
    """The backend migrates each new buffer to its device, so the allocation exists now."""
    with ocl[0].alloc(1 << 20) as buf:
        raw: Any = buf._live()
        assert raw.buffer.size == 1 << 20
        assert ocl[0].memory_in_use is not None and ocl[0].memory_in_use >= 1 << 20


# -- error translation ----------------------------------------------------------------------------
def _cl_error(kind: type[Exception], routine: str, code: int) -> Exception:
    return kind(cl._cl._ErrorRecord(routine, code, "from the test"))


@pytest.mark.parametrize(
    ("code", "stream", "expected"),
    [
        (-4, True, hal.OutOfMemoryError),
        (-5, True, hal.OutOfMemoryError),
        (-6, False, hal.OutOfMemoryError),
        (-1001, False, hal.BackendUnavailableError),
        (-2, False, hal.BackendUnavailableError),
        (-2, True, hal.StreamError),
        (-30, True, hal.StreamError),
        (-36, False, hal.DeviceError),
        (-9999, True, hal.StreamError),
    ],
)
def test_translate_cl_error(code: int, stream: bool, expected: type[Exception]) -> None:
    exc = _cl_error(
        cl.MemoryError if code in (-4, -5, -6) else cl.LogicError, "clEnqueueCopyBuffer", code
    )
    err = translate_cl_error(exc, device="opencl:0", what="a copy", stream=stream)
    assert type(err) is expected or (
        expected is hal.StreamError and isinstance(err, hal.StreamError)
    )
    assert isinstance(err, hal.HalError)
    assert status_name(code) in str(err) and "a copy" in str(err)
    if isinstance(err, hal.DeviceError):
        assert err.code == status_name(code) and err.device == "opencl:0"


def test_translate_real_overlap_error(ocl: list[hal.Device]) -> None:
    impl: Any = ocl[0]._impl
    queue = cl.CommandQueue(impl.context, impl.cl_device)
    buf = cl.Buffer(impl.context, cl.mem_flags.READ_WRITE, 256)
    with pytest.raises(cl.Error) as info:
        cl.enqueue_copy(queue, buf, buf, byte_count=100, src_offset=0, dst_offset=50)
    err = translate_cl_error(info.value, device="opencl:0", what="copy")
    assert isinstance(err, hal.StreamError) and err.code == "MEM_COPY_OVERLAP"


def test_translate_status() -> None:
    assert isinstance(translate_status(-4, device="opencl:1", what="x"), hal.OutOfMemoryError)
    err = translate_status(-14, device="opencl:1", what="x")
    assert (
        isinstance(err, hal.StreamError) and err.code == "EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST"
    )
    assert translate_status(-1, device=None, what="x").code == "FAILED"
    assert (
        status_name(-1001) == "PLATFORM_NOT_FOUND_KHR"
        and status_name(-12345) == "UNKNOWN_STATUS_-12345"
    )


def test_asynchronous_failure_raised_at_synchronize(
    ocl: list[hal.Device], gate: Callable[[hal.Device], Gate]
) -> None:
    dev = ocl[0]
    with dev.create_stream() as s, dev.alloc(64) as buf:
        g = gate(dev)
        s.wait(g.event)
        hal.memset(buf, 1, stream=s)
        g.open(-5)  # the awaited event fails: the memset never runs
        with pytest.raises(hal.StreamError):
            s.synchronize()
        s.synchronize()  # the error is reported once; the stream works again
        hal.memset(buf, 2, stream=s)
        assert bytes(buf.view(np.uint8).to_host(stream=s)) == b"\x02" * 64


# -- streams and events ---------------------------------------------------------------------------
def test_query_never_blocks(ocl: list[hal.Device], gate: Callable[[hal.Device], Gate]) -> None:
    dev = ocl[0]
    with dev.create_stream() as s, dev.alloc(4096) as buf:
        g = gate(dev)
        ev = dev.create_event()
        assert ev.query()  # never recorded
        s.wait(g.event)
        hal.memset(buf, 7, stream=s)
        ev.record(s)
        for _ in range(3):  # would hang if query waited for the stalled queue
            assert not s.query() and not ev.query()
        g.open()
        ev.synchronize()
        s.synchronize()
        assert ev.query() and s.query()


def test_host_memory_kept_alive_until_copied(
    ocl: list[hal.Device], gate: Callable[[hal.Device], Gate]
) -> None:
    dev = ocl[0]
    with dev.create_stream() as s, dev.alloc(4 << 20) as buf:
        g = gate(dev)
        s.wait(g.event)
        hal.copy(buf, np.arange(1 << 20, dtype=np.int32), stream=s)  # a temporary host array
        gc.collect()
        np.full(1 << 20, -1, dtype=np.int32)  # likely reuses freed memory if it was freed
        g.open()
        out = buf.view(np.int32).to_host(stream=s)
    assert np.array_equal(out, np.arange(1 << 20, dtype=np.int32))


def test_event_orders_streams_and_times(
    ocl: list[hal.Device], gate: Callable[[hal.Device], Gate]
) -> None:
    dev = ocl[0]
    nbytes = 16 << 20
    with (
        dev.create_stream() as s1,
        dev.create_stream() as s2,
        dev.alloc(nbytes) as a,
        dev.alloc(nbytes) as b,
    ):
        g = gate(dev)
        start, done = dev.create_event(timing=True), dev.create_event(timing=True)
        s1.wait(g.event)
        start.record(s1)
        hal.memset(a, 5, stream=s1)
        done.record(s1)
        s2.wait(done)  # s2 must not copy before s1's memset
        hal.copy(b, a, stream=s2)
        g.open()
        out = b.view(np.uint8).to_host(stream=s2)
        assert (out == 5).all()
        assert done.elapsed_ms(start) > 0


def test_overlapping_copy_is_memmove(ocl: list[hal.Device], stream_ocl: hal.Stream) -> None:
    data = np.arange(64, dtype=np.uint8)
    with hal.asarray(data, device=ocl[0]) as arr:
        hal.copy(arr, arr, stream=stream_ocl, nbytes=32, src_offset=0, dst_offset=8)
        hal.copy(arr, arr, stream=stream_ocl, nbytes=16, src_offset=40, dst_offset=36)
        hal.copy(arr, arr, stream=stream_ocl, nbytes=8, src_offset=3, dst_offset=3)
        got = arr.to_host(stream=stream_ocl)
    want = data.copy()
    want[8:40] = data[0:32].copy()
    want[36:52] = want[40:56].copy()
    assert np.array_equal(got, want)


@pytest.fixture
def stream_ocl(ocl: list[hal.Device]) -> Iterator[hal.Stream]:
    """A stream of opencl:0."""
    with ocl[0].create_stream() as s:
        yield s


# -- peer and cross-backend copies ----------------------------------------------------------------
@pytest.mark.parametrize("on", ["dst", "src"])
def test_peer_copy(ocl_pair: tuple[hal.Device, hal.Device], on: str) -> None:
    d0, d1 = ocl_pair
    data = np.arange(1000, dtype=np.float64)
    src = hal.asarray(data, device=d1)
    dst = d0.alloc(data.nbytes + 16)
    with d0.create_stream() as zero:
        hal.memset(dst, 0, stream=zero)
    s = (d0 if on == "dst" else d1).create_stream()
    try:
        assert hal.copy_path(dst, src) == "peer"
        path = hal.copy(dst, src, stream=s, nbytes=800, src_offset=80, dst_offset=16)
        assert path == "peer"
        s.synchronize()
        out = dst.view(np.float64, offset=16, shape=100).to_host()
        assert np.array_equal(out, data[10:110])
    finally:
        s.close()
        src.close()
        dst.close()


@pytest.fixture
def cpu0() -> hal.Device:
    """The first CPU-emulator device."""
    return hal.device("cpu:0")


def test_staged_copy_opencl_to_cpu(ocl: list[hal.Device], cpu0: hal.Device) -> None:
    data = np.arange(4096, dtype=np.uint8)
    with (
        hal.asarray(data, device=ocl[0]) as src,
        cpu0.alloc(8192) as dst,
        cpu0.create_stream() as s,
    ):
        hal.memset(dst, 0, stream=s)
        assert hal.copy_path(dst, src) == "staged"
        assert hal.copy(dst, src, stream=s, nbytes=1000, src_offset=100, dst_offset=5) == "staged"
        out = dst.view(np.uint8).to_host(stream=s)
    assert (
        np.array_equal(out[5:1005], data[100:1100]) and not out[:5].any() and not out[1005:].any()
    )


def test_staged_copy_cpu_to_opencl(ocl: list[hal.Device], cpu0: hal.Device) -> None:
    data = np.linspace(0, 1, 512, dtype=np.float32)
    with (
        hal.asarray(data, device=cpu0) as src,
        ocl[0].alloc(data.nbytes) as dst,
        ocl[0].create_stream() as s,
    ):
        assert hal.copy(dst, src, stream=s) == "staged"
        out = dst.view(np.float32).to_host(stream=s)
    assert np.array_equal(out, data)


# -- the raw baseline of ``hal bench memory`` -----------------------------------------------------
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_memory_baseline(ocl_pair: tuple[hal.Device, hal.Device], direction: str) -> None:
    seconds = memory_baseline(direction, 1 << 16, 3)
    assert isinstance(seconds, float) and seconds > 0


def test_memory_baseline_rejects_bad_input(
    ocl: list[hal.Device], hal_env: Callable[..., None]
) -> None:
    with pytest.raises(ValueError, match="direction='sideways'"):
        memory_baseline("sideways", 1024, 1)
    with pytest.raises(ValueError, match="nbytes=0"):
        memory_baseline("h2d", 0, 1)
    with pytest.raises(ValueError, match="repeat=0"):
        memory_baseline("h2d", 1024, 0)
    hal_env(HAL_OPENCL_DEVICES="0")
    assert os.environ["HAL_OPENCL_DEVICES"] == "0"
    with pytest.raises(hal.DeviceMismatchError, match="two selected OpenCL devices"):
        memory_baseline("peer", 1024, 1)


def test_wait_on_event_of_peer_device(
    ocl_pair: tuple[hal.Device, hal.Device], gate: Callable[[hal.Device], Gate]
) -> None:
    """A stream waits on a marker of another device's queue in the same context, on the device."""
    d0, d1 = ocl_pair
    with (
        d1.create_stream() as s1,
        d0.create_stream() as s0,
        d1.alloc(1024) as src,
        d0.alloc(1024) as dst,
    ):
        g = gate(d1)
        s1.wait(g.event)
        hal.memset(src, 9, stream=s1)
        ready = d1.create_event()
        ready.record(s1)
        s0.wait(ready)  # enqueued on the device: returns at once although s1 is stalled
        hal.copy(dst, src, stream=s0)
        assert not s0.query()
        g.open()
        d0.synchronize()  # waits for every stream of d0
        assert s0.query()
        assert (dst.view(np.uint8).to_host(stream=s0) == 9).all()
