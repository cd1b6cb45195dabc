"""Non-blocking point-to-point calls and groups (isend/irecv, comm.group(), batch_isend_irecv).

Real processes through ``hal run`` (shared memory and TCP on loopback), mpiexec (the MPI
transport), and the in-process communicator: 2-rank exchanges posted in every order, 3- and
4-rank rings, a 4-rank halo exchange, a 1F1B pipeline on 4 ranks, tags (FIFO per pair and
tag), a 64 MiB exchange, collectives interleaved; bad input fails the call only, naming the
ranks and values, and the communicator keeps working. tests/comm/p2p_worker.py holds the
patterns.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hal
import hal.comm

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "p2p_worker.py")
EXAMPLE = HERE.parents[1] / "examples" / "comm_p2p_ring.py"
sys.path.insert(0, str(HERE))
import p2p_worker  # noqa: E402
from comm_launch import hal_run  # noqa: E402


def passed(
    proc: subprocess.CompletedProcess[str], ranks: int, cases: list[str], transport: str
) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for case in cases:
        for r in range(ranks):
            assert f"OK {case} rank={r} transport={transport}" in proc.stdout, out


SMALL_PIECES = {
    "HAL_COMM_CHUNK_BYTES": "16K",
    "HAL_COMM_SHM_SLOTS": "2",
}  # large messages block until read


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_two_ranks_exchange_tags_and_64mib(transport: str) -> None:
    """Both ranks send first (was a false 'send/recv mismatch'), receive first, grouped, batched; FIFO per tag;
    64 MiB each way at once (once: over shared memory)."""
    cases = ["exchange", "tags", "large"] if transport == "shm" else ["exchange", "tags"]
    passed(hal_run(2, [WORKER, *cases], {"HAL_COMM_TRANSPORT": transport}), 2, cases, transport)


@pytest.mark.parametrize(("transport", "ranks"), [("shm", 3), ("tcp", 3), ("shm", 4), ("tcp", 4)])
def test_rings_halo_and_pipeline(transport: str, ranks: int) -> None:
    """Rings (deadlocked before) on 3 and 4 ranks; on 4, the halo exchange and 1F1B pipeline too."""
    cases = ["ring"] if ranks == 3 else ["ring", "halo", "pipeline"]
    env = {"HAL_COMM_TRANSPORT": transport, **SMALL_PIECES}
    if transport == "tcp":
        env["HAL_COMM_NSOCKS"] = "2"
    passed(hal_run(ranks, [WORKER, *cases], env), ranks, cases, transport)


def test_memory_the_host_cannot_map() -> None:
    """PoCL OpenCL ranks: device memory the host cannot map, pieces staged with hal.copy (16 KiB pieces)."""
    try:
        import pyopencl  # noqa: F401
    except ImportError:
        pytest.skip("pyopencl is not installed")
    cases = ["exchange", "tags"]
    env = {"HAL_BACKENDS": "opencl", "POCL_DEVICES": "pthread", "HAL_COMM_CHUNK_BYTES": "16K"}
    passed(hal_run(2, [WORKER, *cases], env), 2, cases, "shm")


def _errors(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    found = dict(re.findall(r"^P2P-ERROR (\w+) rank=1 (.*)$", proc.stdout, re.M))
    return found


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_bad_input_fails_the_call_only(transport: str) -> None:
    """Mismatched count and dtype, a receive without a send, a timeout, bad arguments: each names the
    rank and the value, and the communicator is used correctly afterwards (the worker checks)."""
    env = {"HAL_COMM_TRANSPORT": transport, "HAL_COMM_TIMEOUT_MS": "2500", "HAL_CPU_DEVICES": "2"}
    proc = hal_run(2, [WORKER, "errors"], env, timeout=120)
    errs = _errors(proc)
    assert "OK errors rank=0" in proc.stdout and "OK errors rank=1" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    assert errs["count"].startswith("CommError ranks=(1, 0): send/recv mismatch"), errs
    assert "rank 0 sent 10 x float32" in errs["count"] and "12 x float32" in errs["count"], errs
    assert "count 10 vs 12" in errs["count"]
    assert "dtype float32 vs int32" in errs["dtype"], errs
    assert "ranks=(1, 0)" in errs["nosend"] and "no matching send" in errs["nosend"], errs
    assert "rank 0 moved on to all_reduce" in errs["nosend"] and "tag 42" in errs["nosend"]
    assert "ranks=(0,)" in errs["timeout"] and "no progress for 2500 ms" in errs["timeout"], errs
    assert "recv(from rank 0, tag 43, 4 x float32) on rank 1" in errs["timeout"]
    assert errs["noncontig"].startswith("ValueError") and "rank 1" in errs["noncontig"], errs
    assert "contiguous" in errs["noncontig"]
    assert errs["device"].startswith("DeviceMismatchError") and "rank 1" in errs["device"], errs
    assert "cpu:0" in errs["device"] and "cpu:1" in errs["device"]
    assert "rank 1" in errs["self"] and "peer=1" in errs["self"], errs
    assert "tag=-1" in errs["tag"] and "peer=5" in errs["peer"] and "op='send'" in errs["op"], errs


def _mpiexec() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    found = Path(sys.executable).parent / "mpiexec"
    return str(found) if found.exists() else None


def test_under_mpiexec_mpi_transport() -> None:
    """The MPI transport (pieces with MPI_Isend/MPI_Irecv) carries the same patterns."""
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpi4py/mpiexec not installed (pip install 'hal-sdk[mpi]')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update(
        HAL_BACKENDS="cpu",
        HAL_CPU_DEVICES="1",
        HAL_COMM_TRANSPORT="mpi",
        HAL_COMM_CHUNK_BYTES="16K",
    )
    cases = ["exchange", "tags", "ring", "mixed"]
    proc = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, WORKER, *cases],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    passed(proc, 2, cases, "mpi")


def test_example_ring_and_halo_with_hal_run() -> None:
    """docs/comm.md's example, as documented: ``hal run -n 3 examples/comm_p2p_ring.py``."""
    proc = hal_run(3, [str(EXAMPLE)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r, prv, nxt in ((0, 2, 1), (1, 0, 2), (2, 1, 0)):
        assert (
            f"rank {r}: ring got 1048576 x {prv} from rank {prv}; halos from ranks {prv} and {nxt} correct"
            in proc.stdout
        )


# -- in process ----------------------------------------------------------------------------------
def _threads(comm: hal.comm.DeviceCommunicator, case: Any) -> None:
    errors: list[str] = []

    def one(r: int) -> None:
        rank = comm.ranks[r]
        s = rank.device.create_stream()
        try:
            case(rank, s)
        except Exception as exc:  # reported below
            errors.append(f"rank {r}: {type(exc).__name__}: {exc}")
        finally:
            s.close()

    ts = [threading.Thread(target=one, args=(r,)) for r in range(comm.size)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), (
        f"{case.__name__}: a rank is still running after 120 s"
    )
    assert not errors, errors


@pytest.fixture
def cpu4(hal_env: Any) -> list[hal.Device]:
    """Four CPU emulator devices (the plugins reloaded with HAL_CPU_DEVICES=4)."""
    hal_env(HAL_CPU_DEVICES="4")
    return hal.devices("cpu")[:4]


def test_in_process_ring_halo_pipeline(cpu4: list[hal.Device]) -> None:
    """The same patterns between the devices of one process (one engine thread each)."""
    with hal.comm.create(cpu4, timeout_ms=60_000) as comm:
        for case in (p2p_worker.ring, p2p_worker.halo, p2p_worker.pipeline, p2p_worker.mixed):
            _threads(comm, case)
    with hal.comm.create(cpu4[:2], timeout_ms=60_000) as comm:
        _threads(comm, p2p_worker.exchange)
        _threads(comm, p2p_worker.tags)


def test_in_process_bad_input_fails_the_call_only(
    cpu4: list[hal.Device], capfd: pytest.CaptureFixture[str]
) -> None:
    """The bad-input cases between two devices of one process (the peer moves on, times out ...)."""
    with hal.comm.create(cpu4[:2], timeout_ms=1000) as comm:
        _threads(comm, p2p_worker.errors)
    out = capfd.readouterr().out
    for want in (
        "count 10 vs 12",
        "dtype float32 vs int32",
        "rank 0 moved on to all_reduce",
        "no progress for 1000 ms",
        "not C-contiguous",
        "data lives on cpu:0; this rank's device is cpu:1",
    ):
        assert want in out, out


def test_in_process_device_communicator_both_ways_and_mismatch(cpu4: list[hal.Device]) -> None:
    """DeviceCommunicator.send/recv posted both ways before any wait; a mismatch fails the receive only."""
    with hal.comm.create(cpu4[:2]) as comm:
        ss = [d.create_stream() for d in comm.devices]
        x = [
            hal.asarray(np.full(100, r + 1, np.float32), device=d)
            for r, d in enumerate(comm.devices)
        ]
        y = [hal.asarray(np.zeros(100, np.float32), device=d) for d in comm.devices]
        with comm.group():
            ws = [
                comm.send(x[0], 0, 1, tag=4, stream=ss[0]),
                comm.send(x[1], 1, 0, tag=4, stream=ss[1]),
                comm.recv(y[0], 0, 1, tag=4, stream=ss[0]),
                comm.recv(y[1], 1, 0, tag=4, stream=ss[1]),
            ]
        for w in ws:
            w.wait(60)
        assert (y[0].to_host() == 2).all() and (y[1].to_host() == 1).all()
        short = hal.asarray(np.zeros(99, np.float32), device=comm.devices[1])
        w_send = comm.send(x[0], 0, 1, stream=ss[0])
        with pytest.raises(
            hal.CommError, match=r"rank 0 sent 100 x float32 .* count 100 vs 99"
        ) as info:
            comm.recv(short, 1, 0, stream=ss[1]).wait(60)
        assert info.value.ranks == (1, 0)
        w_send.wait(60)
        comm.all_reduce(x, streams=ss).wait(60)  # still usable
        assert (x[0].to_host() == 3).all()
        for s in ss:
            s.close()


def test_group_rules(cpu4: list[hal.Device]) -> None:
    """Collectives inside a group are refused; a group left by an exception starts nothing."""
    with hal.comm.create(cpu4[:2]) as comm:
        rank0 = comm.ranks[0]
        s = rank0.device.create_stream()
        x = hal.asarray(np.ones(4, np.float32), device=rank0.device)
        with pytest.raises(hal.CommError, match="only point-to-point calls"), rank0.group():
            rank0.all_reduce(x, stream=s)
        with pytest.raises(RuntimeError, match="boom"), rank0.group():
            w = rank0.isend(x, 1, stream=s)
            raise RuntimeError("boom")
        with pytest.raises(hal.CommError, match="was not started"):
            w.wait(5)
        with pytest.raises(TypeError, match="P2POp"):
            rank0.batch_isend_irecv([x], stream=s)  # type: ignore[list-item]
        assert rank0.batch_isend_irecv([], stream=s) == []
        s.close()


def test_transport_with_exchange_only_runs_messages_in_order(cpu4: list[hal.Device]) -> None:
    """A third-party Transport without a port of its own: messages run one by one over exchange()."""
    from hal.comm._p2p import BlockingPort

    with hal.comm.create(cpu4[:2]) as comm:
        for r, c in enumerate(comm.ranks):
            tr = c._engine.transport
            tr.__dict__["_hal_p2p_port"] = BlockingPort(tr, r)
        ss = [d.create_stream() for d in comm.devices]
        x = hal.asarray(np.arange(50, dtype=np.int64), device=comm.devices[0])
        y = hal.asarray(np.zeros(50, np.int64), device=comm.devices[1])
        w1 = comm.send(x, 0, 1, tag=9, stream=ss[0])
        comm.recv(y, 1, 0, tag=9, stream=ss[1]).wait(60)
        w1.wait(60)
        assert (y.to_host() == np.arange(50)).all()
        w1 = comm.send(x, 0, 1, stream=ss[0])
        with pytest.raises(hal.CommError, match="count 50 vs 49"):
            comm.recv(
                hal.asarray(np.zeros(49, np.int64), device=comm.devices[1]), 1, 0, stream=ss[1]
            ).wait(60)
        w1.wait(60)
        for s in ss:
            s.close()
