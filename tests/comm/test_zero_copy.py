"""hal.comm takes any DLPack producer on the rank's device zero-copy (issue #11, item 4).

torch CPU tensors on the CPU emulator: in process (``hal.comm.create``) and across 2 processes
(``hal run``), with ``data_ptr`` checks; and the refusals: wrong device, non-contiguous,
dtype that cannot be reduced, each naming the rank and the value.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hal
import hal.comm

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.usefixtures("requires_cpu")
WORKER = str(Path(__file__).resolve().parent / "torch_worker.py")


@pytest.fixture
def pair() -> Iterator[tuple[hal.comm.DeviceCommunicator, list[hal.Stream]]]:
    devs = hal.devices("cpu")[:2]
    comm = hal.comm.create(devs)
    yield comm, [d.create_stream() for d in devs]
    comm.close()


def test_torch_tensors_reduced_in_their_own_memory(pair: Any) -> None:
    comm, ss = pair
    ts = [torch.arange(1000, dtype=torch.float32) * (r + 1) for r in range(2)]
    ptrs = [t.data_ptr() for t in ts]
    comm.all_reduce(ts, op="sum", streams=ss).wait()
    assert [t.data_ptr() for t in ts] == ptrs
    for t in ts:  # the result is in the tensors: nothing was copied in and back out
        assert torch.equal(t, torch.arange(1000, dtype=torch.float32) * 3)
    # the adopted array is the tensor's memory (the same conversion the collective made)
    with hal.from_dlpack(ts[0], device=comm.devices[0]) as a:
        assert int(hal.spi.impl_of(a.buffer).storage.ctypes.data) == ts[0].data_ptr()


def test_torch_half_precision_and_numpy_producers(pair: Any) -> None:
    comm, ss = pair
    ts = [torch.tensor([0.1, 1000.0, -3.0], dtype=torch.bfloat16) * (r + 1) for r in range(2)]
    want = (ts[0].double() + ts[1].double()).to(torch.bfloat16)
    comm.all_reduce(ts, streams=ss).wait()
    assert all(torch.equal(t, want) for t in ts)
    xs = [np.full(5, r + 1, np.float16) for r in range(2)]  # NumPy arrays are producers too
    comm.all_reduce(xs, op="avg", streams=ss).wait()
    assert all(np.all(x == np.float16(1.5)) for x in xs)


def test_broadcast_and_all_gather_with_tensors(pair: Any) -> None:
    comm, ss = pair
    ts = [torch.full((4,), float(r)) for r in range(2)]
    comm.broadcast(ts, root=1, streams=ss).wait()
    assert all(torch.equal(t, torch.ones(4)) for t in ts)
    outs = [torch.zeros(6, dtype=torch.int32) for _ in range(2)]
    comm.all_gather(
        [torch.full((3,), r, dtype=torch.int32) for r in range(2)], outs, streams=ss
    ).wait()
    assert all(o.tolist() == [0, 0, 0, 1, 1, 1] for o in outs)


def test_wrong_device_names_rank_and_value() -> None:
    if "opencl" not in [d.backend for d in hal.devices()] or len(hal.devices("opencl")) < 2:
        pytest.skip("needs two OpenCL devices")
    devs = hal.devices("opencl")[:2]
    with hal.comm.create(devs) as comm:
        ss = [d.create_stream() for d in devs]
        ts = [torch.ones(3), torch.ones(3)]
        with pytest.raises(
            hal.DeviceMismatchError,
            match=r"rank 0: send \(a torch\.Tensor\) is not on this rank's device opencl:0: memory of kDLCPU:0",
        ):
            comm.all_reduce(ts, streams=ss)
        assert comm.last_plan is None
        assert all(torch.equal(t, torch.ones(3)) for t in ts)


def test_non_contiguous_and_bad_dtype_name_rank_and_value(pair: Any) -> None:
    comm, ss = pair
    base = torch.arange(20, dtype=torch.float32)
    with pytest.raises(
        ValueError, match=r"rank 1: send \(a torch\.Tensor\).*not C-contiguous \(strides \(2,\)"
    ):
        comm.all_reduce([torch.zeros(10), base[::2]], streams=ss)
    with pytest.raises(ValueError, match=r"rank 0: recv \(a torch\.Tensor\).*not C-contiguous"):
        comm.all_reduce([torch.zeros(10)] * 2, [base[::2], base[1::2]], streams=ss)
    with pytest.raises(TypeError, match=r"rank 0: send\.dtype=int16 is not supported by hal\.comm"):
        comm.all_reduce([torch.zeros(3, dtype=torch.int16)] * 2, streams=ss)
    with pytest.raises(TypeError, match=r"rank 0: send.dtype=complex64"):
        comm.all_reduce([torch.zeros(3, dtype=torch.complex64)] * 2, streams=ss)
    with pytest.raises(
        ValueError,
        match=r"rank 0: send \(a torch\.Tensor\): the producer refused to export.*require gradient",
    ):
        comm.all_reduce([torch.ones(3, requires_grad=True), torch.ones(3)], streams=ss)
    assert comm.last_plan is None
    assert torch.equal(base, torch.arange(20, dtype=torch.float32))


def test_two_processes_reduce_torch_tensors_zero_copy() -> None:
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.update({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1"})
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "run", "-n", "2", WORKER],
        env=child,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == 2, proc.stdout + proc.stderr
    assert "transport=shm" in proc.stdout, proc.stdout
