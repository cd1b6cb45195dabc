"""Dispatch: records, trace, strict mode, dedicated registration by a plugin, the host route."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import hal
import hal.kernels as hk
import hal.kernels.spi as hks
import hal.plugins
from hal.kernels import _dispatch
from hal.plugins import hookimpl


@pytest.fixture
def cpu() -> hal.Device:
    return hal.device("cpu:0")


def test_records_say_what_ran(cpu: hal.Device) -> None:
    a = hal.asarray(np.ones((8, 8), np.float32), device=cpu)
    with cpu.create_stream() as s, hk.trace() as records:
        hk.add(a, a, stream=s)
        hk.matmul(a, a, stream=s)
    add, mm = records
    assert (add.op, add.backend, add.device, add.dtype, add.implementation) == (
        "add",
        "cpu",
        "cpu:0",
        "float32",
        "generic",
    )
    assert len(add.kernel_hash) == 16 and add.kernel.startswith("generic:")
    assert (mm.implementation, mm.kernel, mm.kernel_hash) == (
        "dedicated",
        "cpu:numpy.matmul(BLAS)",
        "",
    )
    assert set(add.to_dict()) == {
        "op",
        "dtype",
        "backend",
        "device",
        "implementation",
        "kernel",
        "kernel_hash",
    }


def test_trace_nests_and_stops(cpu: hal.Device) -> None:
    a = hal.asarray(np.ones(4, np.float32), device=cpu)
    with cpu.create_stream() as s:
        with hk.trace() as outer:
            with hk.trace() as inner:
                hk.relu(a, stream=s)
            hk.exp(a, stream=s)
        hk.exp(a, stream=s)
    assert [r.op for r in inner] == ["relu"]
    assert [r.op for r in outer] == ["relu", "exp"]


def test_strict_mode_forbids_fallbacks(cpu: hal.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAL_KERNELS_STRICT", "1")
    a = hal.asarray(np.ones(4, np.float32), device=cpu)
    out = hal.asarray(np.zeros(4, np.float32), device=cpu)
    with cpu.create_stream() as s:
        with pytest.raises(hk.KernelFallbackError, match="HAL_KERNELS_STRICT=1") as info:
            hk.add(a, a, out=out, stream=s)
        assert (info.value.op, info.value.backend, info.value.implementation) == (
            "add",
            "cpu",
            "generic",
        )
        np.testing.assert_array_equal(out.to_host(stream=s), np.zeros(4))  # nothing was enqueued
        hk.accumulate(out, a, op="sum", stream=s)  # dedicated: allowed
        np.testing.assert_array_equal(out.to_host(stream=s), np.ones(4))


class _VendorPlugin:
    """A vendor plugin shipping a dedicated relu for the CPU emulator."""

    calls = 0

    @hookimpl
    def hal_register_kernels(self, registry: Any) -> None:
        registry.add("relu", "cpu", self.relu, dtypes=["float32"], name="vendor:relu")

    def relu(self, call: hks.OpCall) -> None:
        from hal.spi import impl_of

        _VendorPlugin.calls += 1
        src, dst = call.inputs[0], call.out
        mem_in, mem_out = impl_of(src.buffer), impl_of(dst.buffer)
        x = mem_in.bytes(src.offset, src.nbytes).view(np.float32)
        y = mem_out.bytes(dst.offset, dst.nbytes).view(np.float32)
        impl_of(call.stream).submit(lambda: np.maximum(x, 0, out=y))


@pytest.fixture
def vendor_plugin() -> Iterator[_VendorPlugin]:
    system = hal.plugins.get_system()
    plugin = _VendorPlugin()
    system.manager.register(plugin, name="test-vendor")
    hal.runtime().clear_caches()  # plugin registries are rebuilt from the hooks
    yield plugin
    system.manager.unregister(plugin)
    hal.runtime().clear_caches()  # plugin registries are rebuilt from the hooks


def test_dedicated_kernel_from_a_vendor_plugin(
    cpu: hal.Device, vendor_plugin: _VendorPlugin
) -> None:
    x = hal.asarray(np.array([-1.0, 2.0, -3.0], np.float32), device=cpu)
    with cpu.create_stream() as s, hk.trace() as records:
        got = hk.relu(x, stream=s).to_host(stream=s)
        hk.relu(hal.asarray(np.ones(2), device=cpu), stream=s)  # float64: not registered
    assert got.tolist() == [0.0, 2.0, 0.0] and _VendorPlugin.calls == 1
    assert [(r.implementation, r.kernel) for r in records] == [
        ("dedicated", "vendor:relu"),
        ("generic", "generic:relu"),
    ]
    plan = {(r["op"], r["dtype"]): r for r in hk.plan("cpu")}
    assert plan[("relu", "float32")]["implementation"] == "dedicated"
    assert plan[("relu", "float32")]["name"] == "vendor:relu"
    assert plan[("relu", "float64")]["implementation"] == "generic"


def test_a_failing_plugin_hook_is_skipped(cpu: hal.Device) -> None:
    class Broken:
        @hookimpl
        def hal_register_kernels(self, registry: Any) -> None:
            raise RuntimeError("vendor bug")

    system = hal.plugins.get_system()
    broken = Broken()
    system.manager.register(broken, name="broken-vendor")
    hal.runtime().clear_caches()  # plugin registries are rebuilt from the hooks
    try:
        assert "vendor bug" in _dispatch.hook_failures()["broken-vendor"]
        a = hal.asarray(np.ones(2, np.float32), device=cpu)
        with cpu.create_stream() as s:
            assert hk.add(a, a, stream=s).to_host(stream=s).tolist() == [2.0, 2.0]
    finally:
        system.manager.unregister(broken)
        hal.runtime().clear_caches()  # plugin registries are rebuilt from the hooks


def test_registry_validates(cpu: hal.Device) -> None:
    with pytest.raises(ValueError, match="op='conv'"):
        hks.register("conv", "cpu", lambda call: None)
    with pytest.raises(ValueError, match="does not take dtypes"):
        hks.register("relu", "cpu", lambda call: None, dtypes=["int32"])


def test_host_route_is_correct_and_recorded(cpu: hal.Device) -> None:
    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    hx = hal.asarray(x, device=cpu)
    with cpu.create_stream() as s, hk.route("host"), hk.trace() as records:
        got = hk.softmax(hx, stream=s).to_host(stream=s)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-6)
    assert records[0].implementation == "host" and records[0].kernel == "host:numpy"


def test_plan_covers_every_op_and_dtype() -> None:
    rows = hk.plan()
    backends = {r["backend"] for r in rows}
    for b in backends:
        mine = [r for r in rows if r["backend"] == b]
        dtypes = {d for spec in hks.OPS.values() for d in spec.dtypes}  # 8 since #11 (bf16, i8, u8)
        assert len(dtypes) == 8
        assert len(mine) == len(hks.OPS) * len(dtypes)
        assert {r["implementation"] for r in mine} <= {
            "dedicated",
            "generic",
            "host",
            "unsupported",
        }
    cpu = {(r["op"], r["dtype"]): r["implementation"] for r in rows if r["backend"] == "cpu"}
    assert cpu[("matmul", "float32")] == "dedicated"
    assert cpu[("axpy", "float32")] == "generic"
    assert cpu[("axpy", "int32")] == "unsupported"


def _child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
        check=False,
    )


CHILD = """
import numpy as np, hal, hal.kernels as hk, hal.kernels.spi as hks
d = hal.device("cpu:0")
a = hal.asarray(np.ones(3, np.float32), device=d)
with d.create_stream() as s:
    hk.add(a, a, stream=s).to_host(stream=s)
"""


def test_exit_summary_line_when_fallbacks_ran() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HAL_KERNELS_SUMMARY"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    assert "hal.kernels: 1 generic op call(s) ran without a dedicated kernel" in out.stderr
    assert "add[float32]" in out.stderr and "HAL_KERNELS_STRICT=1" in out.stderr
    quiet = _child(CHILD, HAL_KERNELS_SUMMARY="0")
    assert quiet.returncode == 0 and "hal.kernels" not in quiet.stderr
    strict = _child(CHILD, HAL_KERNELS_STRICT="1")
    assert strict.returncode != 0 and "KernelFallbackError" in strict.stderr


def test_opencl_reduction_kernel_sum() -> None:
    """PyOpenCL's ReductionKernel (dedicated full sum on OpenCL GPUs), called directly on PoCL."""
    pytest.importorskip("mako")
    try:
        dev = hal.device("opencl:0")
    except (ValueError, hal.BackendUnavailableError) as exc:
        pytest.skip(f"no OpenCL device: {exc}")
    entry = hks.registry().lookup("sum", "opencl", "float32")
    assert entry is not None and entry[0].startswith("opencl:pyopencl.ReductionKernel")
    x = np.random.default_rng(5).standard_normal(100_003).astype(np.float32)
    hx = hal.asarray(x, device=dev)
    out = dev.alloc(4).view(np.float32, ())
    with dev.create_stream() as s:
        call = hks.OpCall("sum", (hx,), out, {"axis": None}, s, hx.dtype)
        entry[1](call)
        got = float(out.to_host(stream=s))
    assert abs(got - x.astype(np.float64).sum()) <= 1e-5 * np.abs(x).sum()
    with dev.create_stream() as s, hk.trace() as records:
        hk.sum(hx, stream=s)  # on PoCL's CPU devices the condition sends it to the generic kernel
    assert records[0].implementation == "generic"
    # and the plan says what runs on this device (it once said "dedicated" here)
    assert hks.registry().lookup("sum", "opencl", "float32", device=dev) is None
    from hal.kernels._ops import plan_route

    assert plan_route("sum", dev, "float32")[0] == "generic"


NO_COMPILER = """
import numpy as np, hal, hal.kernels as hk, hal.kernels.spi as hks
d = hal.device("cpu:0")
assert not d.capabilities.kernels and "C compiler" in d.capabilities.reason_absent("kernels")
a = hal.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), device=d)
with d.create_stream() as s, hk.trace() as records:
    assert hk.sum(hk.add(a, a, stream=s), stream=s).to_host(stream=s) == 30
    assert hk.matmul(a, hk.cast(a.reshape(3, 2), "float32", stream=s), stream=s).to_host(stream=s).shape == (2, 2)
print(sorted({(r.op, r.implementation) for r in records}))
"""


def test_a_device_without_kernels_gets_every_op_by_the_host_route(tmp_path: Any) -> None:
    env = {
        **os.environ,
        "HAL_CPU_CC": str(tmp_path / "no-such-cc"),
        "PATH": str(tmp_path),
        "HAL_KERNELS_SUMMARY": "0",
    }
    out = subprocess.run(
        [sys.executable, "-c", NO_COMPILER],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert (
        "('add', 'host')" in out.stdout
        and "('sum', 'host')" in out.stdout
        and "('cast', 'host')" in out.stdout
    )
    assert "('matmul', 'dedicated')" in out.stdout  # NumPy/BLAS needs no compiler
