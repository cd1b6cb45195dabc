"""One rank of the IPC-path tests (tests/comm/test_ipc_path.py): ``hal run -n N ipc_worker.py SCENARIO``.

Prints ``OK <detail>`` on success (one write per line: the ranks share stdout).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

import hal
import hal.comm
from hal.comm import _ipc

FORCE = "allreduce:ipc,allgather:ipc,reducescatter:ipc,broadcast:ipc"


def say(line: str) -> None:
    """Write ``line`` with one write."""
    os.write(1, (line + "\n").encode())


def data(rank: int, n: int, dtype: str, salt: int = 0) -> np.ndarray[Any, Any]:
    """Small integer values (exact in every dtype and every summation order)."""
    return ((np.arange(n) * (rank + 3) + salt) % 11 - 5).astype(dtype)


def run_case(
    comm: Any, s: hal.Stream, case: tuple[str, str, str, int, bool, int]
) -> tuple[np.ndarray[Any, Any], Any]:
    """Run one collective and return this rank's output and its plan."""
    coll, dtype, op, n, inplace, root = case
    r, p, dev = comm.rank, comm.size, comm.device
    x = hal.asarray(data(r, n, dtype), device=dev)
    if coll == "all_reduce":
        out = None if inplace else hal.asarray(np.full(n, 99, dtype), device=dev)
        w = comm.all_reduce(x, out, op=op, stream=s)
        w.wait()
        return (x if out is None else out).to_host(), w.plan
    if coll == "all_gather":
        whole = hal.asarray(np.full(n * p, 99, dtype), device=dev)
        if inplace:
            hal.copy(
                whole.buffer.view(dtype, n, offset=r * n * np.dtype(dtype).itemsize),
                data(r, n, dtype),
                stream=s,
            )
            w = comm.all_gather(None, whole, stream=s)
        else:
            w = comm.all_gather(x, whole, stream=s)
        w.wait()
        return whole.to_host(), w.plan
    if coll == "reduce_scatter":
        big = hal.asarray(data(r, n * p + 1, dtype), device=dev)
        seg = np.array_split(np.arange(n * p + 1), p)[r]
        if inplace:
            w = comm.reduce_scatter(big, op=op, stream=s)
            w.wait()
            return big.to_host()[seg[0] : seg[0] + len(seg)], w.plan
        out = hal.asarray(np.full(len(seg), 99, dtype), device=dev)
        w = comm.reduce_scatter(big, out, op=op, stream=s)
        w.wait()
        return out.to_host(), w.plan
    out = None if inplace else hal.asarray(np.full(n, 99, dtype), device=dev)
    w = comm.broadcast(x, out, root=root, stream=s)
    w.wait()
    return (x if out is None else out).to_host(), w.plan


def cases(p: int, quick: bool = False) -> list[tuple[str, str, str, int, bool, int]]:
    """Every IPC collective x in/out of place x a few sizes, dtypes and ops (fewer sizes when ``quick``)."""
    out = []
    for n in (13, 4099) if quick else (1, 13, 4099):
        for inplace in (True, False):
            for dtype, op in (
                ("float32", "sum"),
                ("int64", "max"),
                ("float64", "avg"),
                ("int32", "prod"),
                ("float16", "sum"),
            ):
                out.append(("all_reduce", dtype, op, n, inplace, 0))
                out.append(("reduce_scatter", dtype, op, n, inplace, 0))
            out.append(("all_gather", "float32", "", n, inplace, 0))
            out.append(("all_gather", "uint8", "", n, inplace, 0))
            out.append(("broadcast", "int64", "", n, inplace, p - 1))
            out.append(("broadcast", "float32", "", n, inplace, 0))
    return out


def matrix() -> int:
    """The IPC path against the slot path, every case; every IPC plan says ipc."""
    os.environ["HAL_COMM_ALGO"] = FORCE
    ipc = hal.comm.init()
    os.environ["HAL_COMM_ALGO"] = ""
    os.environ["HAL_COMM_IPC"] = "off"
    slot = hal.comm.init()
    s = ipc.device.create_stream()
    bad = []
    todo = cases(ipc.size, quick="quick" in sys.argv[2:])
    for case in todo:
        a, pa = run_case(ipc, s, case)
        b, pb = run_case(slot, s, case)
        if pa.algorithm != "ipc" or pa.path != "ipc" or pa.fallback:
            bad.append(f"{case}: plan {pa}")
        if pb.algorithm == "ipc" or pb.path == "ipc":
            bad.append(f"{case}: HAL_COMM_IPC=off planned {pb}")
        if not np.array_equal(a, b):
            bad.append(f"{case}: ipc {a[:8]} != slot {b[:8]}")
    state = ipc._engine.ipc
    ipc.close()
    slot.close()
    if bad:
        print("\n".join(bad[:20]), file=sys.stderr)
        return 1
    say(f"OK rank={ipc.rank} cases={len(todo)} exported={state.exported} imported={state.imported}")
    return 0


def cached() -> int:
    """HAL_COMM_IPC=on: every call plans ipc; a buffer is exported once, and a freed one is dropped by the peers."""
    comm = hal.comm.init()
    s = comm.device.create_stream()
    p, n = comm.size, 1 << 16
    x = hal.asarray(np.ones(n, np.float32), device=comm.device)
    plans = []
    for _ in range(3):
        hal.copy(x, np.ones(n, np.float32), stream=s)
        w = comm.all_reduce(x, op="sum", stream=s)
        w.wait()
        plans.append(w.plan)
        assert float(x.to_host()[-1]) == p
    state = comm._engine.ipc
    assert all(pl.algorithm == "ipc" and pl.chosen_by == "HAL_COMM_IPC" for pl in plans), plans
    assert (state.exported, state.imported) == (1, p - 1), (state.exported, state.imported)
    x.close()  # freed: a later call every peer hears of tells them, and they close their import
    z = hal.asarray(np.ones(n, np.float32), device=comm.device)
    comm.broadcast(
        z, root=0, stream=s
    ).wait()  # only the root talks: the others keep x's id for later
    z.close()
    y = hal.asarray(np.ones(n, np.float32), device=comm.device)
    comm.all_reduce(y, op="sum", stream=s).wait()
    comm.all_reduce(y, op="sum", stream=s).wait()
    held = sum(len(c) for c in state._imports.values())
    root = comm.rank == 0
    want = (
        2 + root,
        2 * (p - 1) + (not root),
        p - 1,
    )  # exports x, y (+ z); imports x, y (+ z); held: y
    got = (state.exported, state.imported, held)
    assert got == want, (got, want)
    say(f"OK rank={comm.rank} plan={plans[-1]}")
    comm.close()
    return 0


def fallback() -> int:
    """Rank 1's buffer is adopted host memory (not shareable): every rank runs the slot algorithm."""
    os.environ["HAL_COMM_ALGO"] = FORCE
    comm = hal.comm.init()
    s = comm.device.create_stream()
    host = data(comm.rank, 1000, "float32")
    x = (
        hal.from_dlpack(host, device=comm.device)
        if comm.rank == 1
        else hal.asarray(host, device=comm.device)
    )
    w = comm.all_reduce(x, op="sum", stream=s)
    w.wait()
    want = sum(data(q, 1000, "float32") for q in range(comm.size))
    assert np.array_equal(x.to_host(), want), x.to_host()[:5]
    say(f"OK rank={comm.rank} algorithm={w.plan.algorithm} fallback={w.plan.fallback}")
    comm.close()
    return 0


def die() -> int:
    """Rank 1 dies after mapping its peers' memory: the others end with a CommError naming it."""
    os.environ["HAL_COMM_ALGO"] = FORCE
    comm = hal.comm.init()
    s = comm.device.create_stream()
    x = hal.asarray(np.ones(1 << 16, np.float32), device=comm.device)
    comm.all_reduce(x, stream=s).wait()  # a first call maps everything

    def hook(stage: str, rank: int) -> None:
        if stage == "mapped" and rank == 1:
            os._exit(0)

    _ipc._TEST_HOOK = hook
    t0 = time.monotonic()
    try:
        comm.all_reduce(x, stream=s).wait()
    except hal.CommError as exc:
        say(
            f"OK rank={comm.rank} after={time.monotonic() - t0:.2f}s op={exc.op} ranks={exc.ranks}: {exc}"
        )
        return 0
    return 1


def stall() -> int:
    """The last rank stops answering after mapping (alive, silent): the others fail within the timeout."""
    os.environ["HAL_COMM_ALGO"] = FORCE
    comm = hal.comm.init()
    s = comm.device.create_stream()
    p = comm.size
    x = hal.asarray(np.ones(1 << 12, np.float32), device=comm.device)
    comm.all_reduce(x, stream=s).wait()
    timeout_s = float(os.environ["HAL_COMM_TIMEOUT_MS"]) / 1e3

    def hook(stage: str, rank: int) -> None:
        if stage == "mapped" and rank == p - 1:
            time.sleep(timeout_s * 3)

    _ipc._TEST_HOOK = hook
    t0 = time.monotonic()
    try:
        comm.all_reduce(x, stream=s).wait()
    except hal.CommError as exc:
        if comm.rank != p - 1:
            say(
                f"OK rank={comm.rank} after={time.monotonic() - t0:.2f}s op={exc.op} ranks={exc.ranks}: {exc}"
            )
        return 0
    return 1 if comm.rank != p - 1 else 0


def reuse() -> int:
    """A rank that returns overwrites its buffers at once; a slow peer still reads the right values."""
    os.environ["HAL_COMM_ALGO"] = FORCE
    comm = hal.comm.init()
    r, p, dev = comm.rank, comm.size, comm.device
    s = dev.create_stream()
    n = 1 << 16

    def hook(stage: str, rank: int) -> None:
        if stage in ("mapped", "gather") and rank == p - 1:
            time.sleep(0.4)  # the last rank reads late

    _ipc._TEST_HOOK = hook
    bad = []
    part = hal.asarray(np.full(n, r + 1, np.int32), device=dev)
    whole = hal.asarray(np.zeros(n * p, np.int32), device=dev)
    comm.all_gather(part, whole, stream=s).wait()
    hal.copy(part, np.full(n, -7, np.int32), stream=s)  # reuse at once
    s.synchronize()
    want = np.repeat(np.arange(1, p + 1, dtype=np.int32), n)
    if not np.array_equal(whole.to_host(), want):
        bad.append("all_gather")
    x = hal.asarray(np.full(n, r + 1, np.int32), device=dev)
    comm.all_reduce(x, op="sum", stream=s).wait()
    got = x.to_host()
    hal.copy(x, np.full(n, -7, np.int32), stream=s)  # reuse at once
    s.synchronize()
    if not np.all(got == p * (p + 1) // 2):
        bad.append(f"all_reduce {got[:4]}")
    y = hal.asarray(np.full(n, 5 if r == 0 else 0, np.int32), device=dev)
    comm.broadcast(y, root=0, stream=s).wait()
    if r == 0:
        hal.copy(y, np.full(n, -7, np.int32), stream=s)
        s.synchronize()
    elif not np.all(y.to_host() == 5):
        bad.append("broadcast")
    comm.close()
    if bad:
        print(f"rank {r}: corrupted: {bad}", file=sys.stderr)
        return 1
    say(f"OK rank={r}")
    return 0


def forced() -> int:
    """HAL_COMM_ALGO=allreduce:ipc where IPC cannot run: a CommError at the call naming why."""
    os.environ["HAL_COMM_ALGO"] = "allreduce:ipc"
    comm = hal.comm.init()
    x = hal.asarray(np.ones(8, np.float32), device=comm.device)
    try:
        comm.all_reduce(x, stream=comm.device.create_stream())
    except hal.CommError as exc:
        say(f"OK rank={comm.rank} {exc}")
        return 0
    finally:
        comm.close()
    return 1


def forced_init() -> int:
    """HAL_COMM_IPC=on where IPC cannot run: init fails naming why."""
    os.environ["HAL_COMM_IPC"] = "on"
    try:
        hal.comm.init()
    except hal.CommError as exc:
        say(f"OK {exc}")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(globals()[sys.argv[1]]())
