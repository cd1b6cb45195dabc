"""``hal bench comm``, the ranks (``python -m hal.cli.bench._comm_worker``): collectives timed with nccl-tests conventions, optionally beside mpi4py or gloo.

Columns as nccl-tests: size (bytes), count (elements), type, redop, then time (us), algbw
and busbw (GB/s) and ``#wrong`` for out-of-place and in-place. busbw = algbw x factor:
all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce 1.
With ``--baseline mpi`` each rank also times mpi4py's matching collective on the same data
(host NumPy copies of the device inputs, ``out=`` buffers, warmed up) and the ratio
``busbw(hal) / busbw(mpi)`` is printed. The ranks are started by mpiexec in that case,
by ``hal run`` otherwise. Times are the slowest rank's mean per iteration, over the best of
three timed batches (the same for hal and MPI).

With ``--baseline gloo`` the ranks are started by the real ``torchrun --standalone`` (hal.comm
meets on torchrun's store) and each rank also times torch's gloo collective on the same data
(CPU tensors over the same host copies, ``out=`` tensors, warmed up), with the same columns;
then, in the same job, the DDP training of examples/ddp_torch.py runs on a "hal" group and on
the gloo group (``hal.cli.bench._ddp.step_times``) and the mean step time of each is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BUS_FACTORS", "OPS", "main_worker"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")


def _bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _factor_of(op: str) -> Callable[[int], float]:
    def factor(n: int) -> float:
        return _bus_factor(op, n)

    return factor


#: nccl-tests bus-bandwidth factor per collective, as a function of the rank count.
BUS_FACTORS: dict[str, Callable[[int], float]] = {op: _factor_of(op) for op in OPS}


def _sizes(lo: int, hi: int, factor: int = 2) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


#: Timed batches per measurement; the best batch's mean is kept (for hal and MPI alike).
_BATCHES = 3


def _iters(size: int) -> int:
    return max(3, min(100, (64 << 20) // max(size, 1) // 4))


def main_worker(argv: list[str] | None = None) -> int:
    """One rank of the benchmark (started by ``hal run`` or mpiexec)."""
    import hal
    import hal.comm

    ap = argparse.ArgumentParser(prog="hal-bench-comm-worker")
    ap.add_argument("--op", default="all_reduce", choices=OPS)
    ap.add_argument("--min", type=int, default=1024)
    # --max-bytes: torchrun's own parser refuses "--max" (a prefix of its --max-restarts)
    ap.add_argument("--max", "--max-bytes", dest="max", type=int, default=64 << 20)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--redop", default="sum")
    ap.add_argument("--baseline", default=None, choices=[None, "mpi", "gloo"])
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--ddp-steps", type=int, default=30)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    comm = hal.comm.init()
    p, r, dev = comm.size, comm.rank, comm.device
    stream = dev.create_stream()
    dt = np.dtype(a.dtype)
    mpi = None
    if a.baseline == "mpi":
        from mpi4py import MPI

        mpi = MPI
    gloo: Any = None
    if a.baseline == "gloo":  # started by torchrun: env:// meets on torchrun's store too
        import torch.distributed as dist

        dist.init_process_group("gloo")
        gloo = dist
    rows = []
    timer = hal.asarray(np.zeros(1, np.float64), device=dev)

    def slowest(seconds: float) -> float:
        h = hal.asarray(np.array([seconds]), device=dev)
        comm.all_reduce(h, op="max", stream=stream).wait()
        return float(h.to_host()[0])

    for size in _sizes(a.min, a.max):
        count = max(1, size // dt.itemsize)
        count -= count % p if a.op != "all_reduce" else 0
        count = max(count, p)
        iters = a.iters or _iters(count * dt.itemsize)
        rng = np.random.default_rng([7, r])
        ins = [np.random.default_rng([7, k]).integers(-8, 8, count).astype(dt) for k in range(p)]
        host_in = ins[r]
        per = count // p
        if a.op == "all_gather":
            host_in = ins[r][:per]
        send = hal.asarray(host_in, device=dev)
        out_n = {"all_gather": per * p, "reduce_scatter": per}.get(a.op, count)
        recv = hal.asarray(np.zeros(out_n, dt), device=dev)
        want = _expected(a.op, ins, r, p, per)
        del rng

        def call(inplace: bool, send: Any = send, recv: Any = recv) -> Any:
            if a.op == "all_reduce":
                return comm.all_reduce(send, None if inplace else recv, op=a.redop, stream=stream)
            if a.op == "all_gather":
                return comm.all_gather(None if inplace else send, recv, stream=stream)
            if a.op == "reduce_scatter":
                return comm.reduce_scatter(
                    send, None if inplace else recv, op=a.redop, stream=stream
                )
            if a.op == "broadcast":
                return comm.broadcast(send, None if inplace else recv, root=0, stream=stream)
            if a.op == "reduce":
                return comm.reduce(
                    send, None if inplace else recv, op=a.redop, root=0, stream=stream
                )
            return comm.all_to_all(send, None if inplace else recv, stream=stream)

        row: dict[str, Any] = {
            "size": count * dt.itemsize,
            "count": count,
            "type": dt.name,
            "redop": a.redop if a.op in ("all_reduce", "reduce_scatter", "reduce") else "none",
        }
        for inplace in (False, True):
            tag = "inplace" if inplace else "oop"
            for _ in range(2):
                call(inplace).wait()
            best = float("inf")
            for _ in range(_BATCHES):
                comm.barrier().wait()
                t0 = time.perf_counter()
                for _ in range(iters):
                    call(inplace).wait()
                best = min(best, (time.perf_counter() - t0) / iters)
            t = slowest(best)
            # seeded check: fresh inputs, one call, compare with NumPy
            hal.copy(send, host_in, stream=stream)
            if inplace and a.op == "all_gather":
                buf = np.zeros(per * p, dt)
                buf[r * per : (r + 1) * per] = host_in
                hal.copy(recv, buf, stream=stream)
            stream.synchronize()
            call(inplace).wait()
            got = (recv if not inplace or a.op == "all_gather" else send).to_host(stream=stream)
            if inplace and a.op == "reduce_scatter":
                got = got[r * per : (r + 1) * per]
            wrong = _wrong(got, want, a.op, r)
            algbw = row["size"] / t / 1e9 if t > 0 else 0.0
            row[f"{tag}_time_us"] = t * 1e6
            row[f"{tag}_algbw"] = algbw
            row[f"{tag}_busbw"] = algbw * _bus_factor(a.op, p)
            row[f"{tag}_wrong"] = int(slowest(float(wrong)))
        if mpi is not None:
            row.update(_mpi_time(mpi, a.op, host_in, ins, r, p, per, dt, iters, a.redop))
            row["mpi_busbw"] = row["size"] / row["mpi_time_us"] * 1e-3 * _bus_factor(a.op, p)
            row["ratio"] = row["oop_busbw"] / row["mpi_busbw"] if row["mpi_busbw"] else 0.0
        if gloo is not None:
            row.update(_gloo_time(gloo, a.op, host_in, r, p, per, dt, iters, a.redop))
            row["gloo_busbw"] = row["size"] / row["gloo_time_us"] * 1e-3 * _bus_factor(a.op, p)
            row["ratio"] = row["oop_busbw"] / row["gloo_busbw"] if row["gloo_busbw"] else 0.0
        rows.append(row)
        send.close()
        recv.close()
    timer.close()
    plan = comm.last_plan
    comm.close()
    ddp = None
    if gloo is not None:  # the DDP step of examples/ddp_torch.py on "hal" and on gloo, same ranks
        import hal.torch
        from hal.cli.bench._ddp import step_times

        ddp = step_times(gloo.new_group(backend=hal.torch.BACKEND), None, a.ddp_steps)
        gloo.destroy_process_group()
    if r == 0:
        result = {
            "op": a.op,
            "ranks": p,
            "transport": plan.transport if plan else "",
            "rows": rows,
            "provider": comm.provider,
        }
        if ddp is not None:
            result.update(baseline="gloo", ddp=ddp)
        Path(a.out).write_text(json.dumps(result)) if a.out else print(json.dumps(result))
    return 0


def _expected(
    op: str, ins: list[np.ndarray[Any, Any]], r: int, p: int, per: int
) -> np.ndarray[Any, Any]:
    if op == "all_reduce":
        return np.sum(ins, axis=0, dtype=ins[0].dtype)
    if op == "reduce":
        return np.sum(ins, axis=0, dtype=ins[0].dtype) if r == 0 else ins[r]
    if op == "reduce_scatter":
        return np.sum(ins, axis=0, dtype=ins[0].dtype)[r * per : (r + 1) * per]
    if op == "all_gather":
        return np.concatenate([x[:per] for x in ins])
    if op == "broadcast":
        return ins[0]
    return np.concatenate([ins[k][r * per : (r + 1) * per] for k in range(p)])


def _wrong(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], op: str, r: int) -> int:
    if op == "reduce" and r != 0:
        return 0
    n = min(got.size, want.size)
    return int(
        np.count_nonzero(got.reshape(-1)[:n] != want.reshape(-1)[:n]) + abs(got.size - want.size)
    )


def _mpi_time(
    mpi: Any,
    op: str,
    host_in: Any,
    ins: Any,
    r: int,
    p: int,
    per: int,
    dt: Any,
    iters: int,
    redop: str,
) -> dict[str, float]:
    c = mpi.COMM_WORLD
    mop = {"sum": mpi.SUM, "prod": mpi.PROD, "max": mpi.MAX, "min": mpi.MIN, "avg": mpi.SUM}[redop]
    src = np.ascontiguousarray(host_in)
    out_n = {"all_gather": per * p, "reduce_scatter": per}.get(op, src.size)
    dst = np.zeros(out_n, dt)

    def once() -> None:
        if op == "all_reduce":
            c.Allreduce(src, dst, op=mop)
        elif op == "all_gather":
            c.Allgather(src, dst)
        elif op == "reduce_scatter":
            c.Reduce_scatter_block(src, dst, op=mop)
        elif op == "broadcast":
            c.Bcast(dst if r else src, root=0)
        elif op == "reduce":
            c.Reduce(src, dst, op=mop, root=0)
        else:
            c.Alltoall(src, dst)

    for _ in range(2):
        once()
    t = float("inf")
    for _ in range(_BATCHES):
        c.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            once()
        t = min(t, (time.perf_counter() - t0) / iters)
    return {"mpi_time_us": c.allreduce(t, op=mpi.MAX) * 1e6}


def _gloo_time(
    dist: Any, op: str, host_in: Any, r: int, p: int, per: int, dt: Any, iters: int, redop: str
) -> dict[str, float]:
    """torch gloo's collective on CPU tensors over the same data, timed as hal's (best batch, slowest rank)."""
    import torch

    rop = {
        "sum": dist.ReduceOp.SUM,
        "prod": dist.ReduceOp.PRODUCT,
        "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN,
        "avg": dist.ReduceOp.SUM,
    }[redop]
    src = torch.from_numpy(np.ascontiguousarray(host_in).copy())
    out_n = {"all_gather": per * p, "reduce_scatter": per}.get(op, src.numel())
    dst = torch.zeros(out_n, dtype=src.dtype)

    def once() -> None:
        if op == "all_reduce":  # out of place, like hal's: copy in, reduce the copy
            dst.copy_(src)
            dist.all_reduce(dst, op=rop)
        elif op == "all_gather":
            dist.all_gather_into_tensor(dst, src)
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(dst, src, op=rop)
        elif op == "broadcast":
            dist.broadcast(src if r == 0 else dst, src=0)
        elif op == "reduce":
            dst.copy_(src)
            dist.reduce(dst, dst=0, op=rop)
        else:
            dist.all_to_all_single(dst, src)

    import warnings

    with warnings.catch_warnings():  # torch 2.13 renamed *_into_tensor / *_tensor (FutureWarning)
        warnings.simplefilter("ignore", FutureWarning)
        for _ in range(2):
            once()
        t = float("inf")
        for _ in range(_BATCHES):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                once()
            t = min(t, (time.perf_counter() - t0) / iters)
    worst = torch.tensor([t], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return {"gloo_time_us": float(worst[0]) * 1e6}


if __name__ == "__main__":
    sys.exit(main_worker())
