"""Prepared launches on the CPU emulator's native streams (``CpuStream.launcher``, SPI 1.2):
repeated op calls go through one generated function per kernel signature (argument block
packed, one cffi call); the fault model, freed memory and Python streams still behave."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import hal
import hal.kernels as hk
from hal.backends.cpu import _faults, clear_faults, inject_fault
from hal.backends.cpu._backend import CpuMemory, CpuStream
from hal.spi import impl_of

pytestmark = pytest.mark.usefixtures("requires_cpu")


@pytest.fixture
def s(cpu_kernel_stream: hal.Stream) -> hal.Stream:
    """A stream of cpu:0 with kernels, native and Python (tests/conftest.py's cpu_kernel_stream)."""
    return cpu_kernel_stream


def _arr(values: Any) -> hal.Array:
    return hal.asarray(np.asarray(values, dtype=np.float32), device=hal.device("cpu:0"))


def test_repeated_launches_go_through_the_prepared_launch(
    s: hal.Stream, traced_calls: Callable[..., set[str]]
) -> None:
    x, y, o = _arr([1, 2, 3]), _arr([10, 20, 30]), _arr([0, 0, 0])
    hk.axpy(2.0, x, y, out=o, stream=s)
    hk.axpy(2.0, x, y, out=o, stream=s)  # learned: the cache's prepared call from now on
    names = traced_calls(lambda: [hk.axpy(a, x, y, out=o, stream=s) for a in (3.0, 4)])
    native = impl_of(s).native is not None
    assert ("bound" in names) is native  # the generated launch (native streams only)
    assert ("launch" in names) is not native  # Python streams: CpuStream.launch, as before
    np.testing.assert_array_equal(o.to_host(stream=s), [14, 28, 42])  # alpha=4, the last call
    ops = _faults.faults(0).ops
    for a in range(5):
        hk.axpy(float(a), x, y, out=o, stream=s)
    s.synchronize()
    assert _faults.faults(0).ops == ops + 5  # counted like any launch
    np.testing.assert_array_equal(o.to_host(stream=s), [14, 28, 42])


def test_faults_injected_after_prepared_launches_apply(s: hal.Stream) -> None:
    x, y, o = _arr([1, 2]), _arr([3, 4]), _arr([0, 0])
    for _ in range(3):
        hk.add(x, y, out=o, stream=s)
    s.synchronize()
    try:
        inject_fault(0, fail=True)
        hk.add(x, y, out=o, stream=s)
        with pytest.raises(hal.StreamError, match="injected fault"):
            s.synchronize()
    finally:
        clear_faults(0)
    hk.add(x, x, out=o, stream=s)
    np.testing.assert_array_equal(o.to_host(stream=s), [2, 4])


def test_queued_prepared_launches_keep_order_and_memory(s: hal.Stream) -> None:
    x, y, o = _arr([1, 2]), _arr([3, 4]), _arr([0, 0])
    for _ in range(2):
        hk.add(x, y, out=o, stream=s)
    s.synchronize()
    gate = s.wait_host()
    hk.add(x, y, out=o, stream=s)  # queued behind the gate
    hk.mul(o, o, out=o, stream=s)
    x.close()
    y.close()  # the queued launch keeps their memory
    out = np.zeros(2, np.float32)
    hal.copy(out, o, stream=s)
    assert (out == 0).all()
    gate.set()
    s.synchronize()
    np.testing.assert_array_equal(out, [16, 36])
    with pytest.raises(hal.InvalidBufferError, match="closed"):
        hk.add(x, o, out=o, stream=s)  # a closed input takes the full path and its error


def test_freed_memory_raises_and_queues_nothing(s: hal.Stream) -> None:
    impl = impl_of(s)
    assert isinstance(impl, CpuStream)
    x, o = _arr([1, 2]), _arr([0, 0])
    hk.relu(x, out=o, stream=s)
    s.synchronize()
    from hal.kernels import _generic

    prog = _generic.program_for(s.device, "elementwise", np.dtype(np.float32))
    bound = impl.launcher(prog._impl, "relu", (2, 1, 1), work=2)
    if impl.native is None:
        assert bound is None  # Python streams launch through CpuStream.launch
        return
    assert bound is not None
    mem_x, mem_o = impl_of(x.buffer), impl_of(o.buffer)
    assert isinstance(mem_x, CpuMemory) and isinstance(mem_o, CpuMemory)
    bound(mem_o, 0, mem_x, 0, 2)
    s.synchronize()
    np.testing.assert_array_equal(o.to_host(stream=s), [1, 2])
    dead = mem_x.device.alloc(8)
    assert isinstance(dead, CpuMemory)
    dead.free()
    before = _faults.faults(0).ops
    with pytest.raises(hal.StreamError, match="kernel argument memory was freed"):
        bound(mem_o, 0, dead, 0, 2)
    assert _faults.faults(0).ops == before
