"""The ranks of ``hal bench comm`` (``python -m hal.cli.bench._comm_worker``).

Columns as nccl-tests: size (bytes), count (elements), type, redop, then time (us), algbw
and busbw (GB/s) and ``#wrong`` for out-of-place and in-place. busbw = algbw x factor:
all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce 1.

With a baseline (``mpi``: mpi4py under the launcher's MPI, MPICH or Open MPI; ``gloo``: torch's
gloo under torchrun) each rank also times the baseline's matching collective on the same data
(host NumPy copies of the device inputs, preallocated buffers, warmed up), out of place against
out of place and in place against in place (``MPI.IN_PLACE``; gloo's collectives are in place,
its out-of-place form copies first as a user would). ``avg`` is done by the baseline as
``sum`` then a division of the result by the rank count, inside the timed region (hal does the
same work). The four measurements (hal out of place, baseline out of place, hal in place,
baseline in place) are interleaved batch by batch, each batch after a barrier and timed with
the host clock (``time.perf_counter``) around ``iters`` blocking calls plus a synchronize;
each figure is the slowest rank's mean per call in its best batch. ``ratio`` = hal time /
baseline time (out of place), ``inplace_ratio`` the same in place: below 1, hal is faster.

With ``--baseline gloo``, in the same job, the DDP training of examples/ddp_torch.py runs on a
"hal" group and on the gloo group (``hal.cli.bench._ddp.step_times``).
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
#: Collectives that take a reduction op.
REDUCING = ("all_reduce", "reduce_scatter", "reduce")


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


def _iters(size: int) -> int:
    return max(3, min(100, (64 << 20) // max(size, 1) // 4))


#: A side of the comparison: (timed call, barrier before a batch, synchronize after it).
Side = tuple[Callable[[], None], Callable[[], None], Callable[[], None]]


def main_worker(argv: list[str] | None = None) -> int:
    """One rank of the benchmark (started by ``hal run``, mpiexec or torchrun)."""
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
    # the name of the baseline's JSON fields: mpi (MPICH, the wheel), openmpi, gloo
    ap.add_argument("--baseline-name", default=None)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--factor", type=int, default=2)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--ddp-steps", type=int, default=30)
    ap.add_argument("--out", default=None)
    # --ipc: also time the direct IPC path (on a second communicator)
    ap.add_argument("--ipc", action="store_true")
    a = ap.parse_args(argv)
    from hal.cli.bench import loadavg, memcpy_bandwidth, method

    load_start = loadavg()
    ipc_comm: Any = None
    if a.ipc:  # the slot path (IPC off) for the main columns; the IPC path forced on a second one
        import os

        saved = {k: os.environ.get(k) for k in ("HAL_COMM_IPC", "HAL_COMM_ALGO")}
        os.environ["HAL_COMM_IPC"] = "off"
        comm = hal.comm.init()
        os.environ.update(HAL_COMM_IPC="auto", HAL_COMM_ALGO=f"{a.op}:ipc")
        ipc_comm = hal.comm.init()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    else:
        comm = hal.comm.init()
    p, r, dev = comm.size, comm.rank, comm.device
    stream = dev.create_stream()
    dt = np.dtype(a.dtype)
    mpi: Any = None
    if a.baseline == "mpi":
        from mpi4py import MPI

        mpi = MPI
    gloo: Any = None
    if a.baseline == "gloo":  # started by torchrun: env:// meets on torchrun's store too
        import torch.distributed as dist

        dist.init_process_group("gloo")
        gloo = dist
    name = a.baseline_name or a.baseline
    rows = []

    def slowest(seconds: float) -> float:
        h = hal.asarray(np.array([seconds]), device=dev)
        try:
            comm.all_reduce(h, op="max", stream=stream).wait()
            return float(h.to_host(stream=stream)[0])
        finally:
            h.close()

    def hal_barrier() -> None:
        comm.barrier().wait()

    for size in _sizes(a.min, a.max, a.factor):
        count = max(1, size // dt.itemsize)
        count -= count % p if a.op != "all_reduce" else 0
        count = max(count, p)
        iters = a.iters or _iters(count * dt.itemsize)
        ins = [np.random.default_rng([7, k]).integers(-8, 8, count).astype(dt) for k in range(p)]
        host_in = ins[r]
        per = count // p
        if a.op == "all_gather":
            host_in = ins[r][:per]
        send = hal.asarray(host_in, device=dev)
        out_n = {"all_gather": per * p, "reduce_scatter": per}.get(a.op, count)
        recv = hal.asarray(np.zeros(out_n, dt), device=dev)
        want = _expected(a.op, ins, r, p, per, a.redop)

        def call(inplace: bool, send: Any = send, recv: Any = recv) -> Any:
            return _hal_call(comm, a.op, a.redop, send, recv, inplace, stream)

        sides: dict[str, Side] = {}
        for tag, inplace in (("oop", False), ("inplace", True)):

            def hal_call(inplace: bool = inplace) -> None:
                call(inplace).wait()

            sides[tag] = (hal_call, hal_barrier, stream.synchronize)
            if ipc_comm is not None:

                def ipc_call(inplace: bool = inplace, send: Any = send, recv: Any = recv) -> None:
                    _hal_call(ipc_comm, a.op, a.redop, send, recv, inplace, stream).wait()

                def ipc_barrier() -> None:
                    ipc_comm.barrier().wait()

                sides[f"ipc_{tag}"] = (ipc_call, ipc_barrier, stream.synchronize)
            if mpi is not None:
                fn = _mpi_call(mpi, a.op, host_in, r, p, per, dt, a.redop, inplace)
                sides[f"{name}_{tag}"] = (fn, mpi.COMM_WORLD.Barrier, _nothing)
            if gloo is not None:
                fn = _gloo_call(gloo, a.op, host_in, r, p, per, dt, a.redop, inplace)
                sides[f"{name}_{tag}"] = (fn, gloo.barrier, _nothing)
        best = _interleaved(sides, iters, a.batches)
        row: dict[str, Any] = {
            "size": count * dt.itemsize,
            "count": count,
            "type": dt.name,
            "redop": a.redop if a.op in REDUCING else "none",
            "iters": iters,
        }
        for tag, inplace in (("oop", False), ("inplace", True)):
            t = slowest(best[tag])
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
        if ipc_comm is not None:
            for tag, key in (("oop", ""), ("inplace", "_inplace")):
                row[f"ipc{key}_time_us"] = slowest(best[f"ipc_{tag}"]) * 1e6
                row[f"ipc{key}_ratio"] = row[f"ipc{key}_time_us"] / row[f"{tag}_time_us"]
            hal.copy(send, host_in, stream=stream)
            stream.synchronize()
            _hal_call(ipc_comm, a.op, a.redop, send, recv, False, stream).wait()
            wrong = _wrong(recv.to_host(stream=stream), want, a.op, r)
            row["ipc_wrong"] = int(slowest(float(wrong)))
        if name:
            factor = _bus_factor(a.op, p)
            for tag, key in (("oop", ""), ("inplace", "_inplace")):
                tb = slowest(best[f"{name}_{tag}"])
                row[f"{name}{key}_time_us"] = tb * 1e6
                row[f"{name}{key}_busbw"] = row["size"] / tb / 1e9 * factor if tb > 0 else 0.0
                hal_t = row[f"{tag}_time_us"]
                row[f"{key.lstrip('_')}_ratio" if key else "ratio"] = (
                    hal_t / row[f"{name}{key}_time_us"] if tb > 0 else 0.0
                )
        rows.append(row)
        send.close()
        recv.close()
    plan = comm.last_plan
    provider = comm.provider
    ipc_plan = ipc_comm.last_plan if ipc_comm is not None else None
    if ipc_comm is not None:
        ipc_comm.close()
    stream.close()
    comm.close()
    ddp = None
    if gloo is not None:  # the DDP step of examples/ddp_torch.py on "hal" and on gloo, same ranks
        import hal.torch
        from hal.cli.bench._ddp import step_times

        ddp = step_times(gloo.new_group(backend=hal.torch.BACKEND), None, a.ddp_steps)
        gloo.destroy_process_group()
    library = _library(mpi, gloo)
    if mpi is not None:
        mpi.COMM_WORLD.Barrier()
    if r == 0:
        result: dict[str, Any] = {
            "benchmark": "comm",
            "op": a.op,
            "ranks": p,
            "transport": plan.transport if plan else "",
            "device": f"{dev} ({dev.name})",  # the ranks' device (hal.comm.init's default choice)
            "backend": dev.backend,
            "rows": rows,
            "provider": provider,
            "methodology": method(
                clock="time.perf_counter on the host around each batch of blocking calls "
                "(hal: work.wait() per call, then Stream.synchronize; the baseline: its blocking call)",
                repetitions=f"{a.batches} batches per side and size, iters calls per batch (JSON iters), "
                "2 untimed calls first",
                statistic="the best batch's mean per call on each rank, then the slowest rank",
                interleaving="batch by batch: hal out of place, baseline out of place, hal in place, "
                "baseline in place, each after its own barrier",
                placement="out of place against out of place (ratio), in place against in place "
                "(inplace_ratio); avg: the baseline sums then divides by the rank count in the timed "
                "region",
                memory="hal: its device memory (hal.asarray; the CPU emulator's from 64 KiB in its "
                "shared arena, which hal.comm peers map: HAL_CPU_ARENA, HAL_COMM_MAP_PEERS); the "
                "baseline: NumPy arrays (MPI), torch tensors (gloo)",
            ),
            "loadavg": load_start,
            "loadavg_end": loadavg(),
            "memcpy_GBps": memcpy_bandwidth(),
        }
        if ipc_plan is not None:
            result.update(ipc_algorithm=ipc_plan.algorithm)
        if name:
            result.update(baseline=name, baseline_library=library)
        if ddp is not None:
            result.update(ddp=ddp)
        Path(a.out).write_text(json.dumps(result)) if a.out else print(json.dumps(result))
    return 0


def _nothing() -> None:
    """A synchronize for a blocking library call: nothing left to wait for."""


def _library(mpi: Any, gloo: Any) -> str:
    if mpi is not None:
        # "MPICH Version:      5.0.2" -> "MPICH 5.0.2"; "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
        first = mpi.Get_library_version().splitlines()[0].split(",")[0]
        return " ".join(first.replace("Version:", "").split())
    if gloo is not None:
        import torch

        return f"torch {torch.__version__} gloo"
    return ""


def _interleaved(sides: dict[str, Side], iters: int, batches: int) -> dict[str, float]:
    """Warm every side up, then time them batch by batch in turn; return each side's best mean."""
    order = sorted(sides, key=lambda k: (k.endswith("inplace"), k not in ("oop", "inplace")))
    for key in order:
        fn, barrier, sync = sides[key]
        barrier()
        for _ in range(2):
            fn()
        sync()
    best = dict.fromkeys(order, float("inf"))
    for _ in range(batches):
        for key in order:
            fn, barrier, sync = sides[key]
            barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            sync()
            best[key] = min(best[key], (time.perf_counter() - t0) / iters)
    return best


def _hal_call(
    comm: Any, op: str, redop: str, send: Any, recv: Any, inplace: bool, stream: Any
) -> Any:
    """One hal collective, out of place or in place (as the ``hal.comm`` docs define each)."""
    out = None if inplace else recv
    if op == "all_reduce":
        return comm.all_reduce(send, out, op=redop, stream=stream)
    if op == "all_gather":  # in place: the rank's part already sits in the output, as in NCCL
        return comm.all_gather(None if inplace else send, recv, stream=stream)
    if op == "reduce_scatter":
        return comm.reduce_scatter(send, out, op=redop, stream=stream)
    if op == "broadcast":
        return comm.broadcast(send, out, root=0, stream=stream)
    if op == "reduce":
        return comm.reduce(send, out, op=redop, root=0, stream=stream)
    return comm.all_to_all(send, out, stream=stream)


def _reduced(ins: list[np.ndarray[Any, Any]], redop: str) -> np.ndarray[Any, Any]:
    """The reduction of every rank's input by ``redop``, in the input's dtype (NumPy)."""
    dt = ins[0].dtype
    if redop in ("sum", "avg"):
        out = np.sum(ins, axis=0, dtype=dt)
        if redop == "avg":
            out = np.multiply(out, 1.0 / len(ins)).astype(dt)
        return out
    if redop == "prod":
        return np.asarray(np.prod(ins, axis=0)).astype(dt)
    if redop == "max":
        return np.asarray(np.max(ins, axis=0)).astype(dt)
    return np.asarray(np.min(ins, axis=0)).astype(dt)


def _expected(
    op: str, ins: list[np.ndarray[Any, Any]], r: int, p: int, per: int, redop: str = "sum"
) -> np.ndarray[Any, Any]:
    if op == "all_reduce":
        return _reduced(ins, redop)
    if op == "reduce":
        return _reduced(ins, redop) if r == 0 else ins[r]
    if op == "reduce_scatter":
        return _reduced(ins, redop)[r * per : (r + 1) * per]
    if op == "all_gather":
        return np.concatenate([x[:per] for x in ins])
    if op == "broadcast":
        return ins[0]
    return np.concatenate([ins[k][r * per : (r + 1) * per] for k in range(p)])


def _wrong(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], op: str, r: int) -> int:
    """Elements of ``got`` that differ from ``want`` (``avg``: by more than float rounding)."""
    if op == "reduce" and r != 0:
        return 0
    n = min(got.size, want.size)
    g, w = got.reshape(-1)[:n], want.reshape(-1)[:n]
    if g.dtype.kind == "f":
        bad = ~np.isclose(g, w, rtol=1e-6, atol=0)
    else:
        bad = g != w
    return int(np.count_nonzero(bad) + abs(got.size - want.size))


def _divide(buf: Any, p: int) -> None:
    """``avg``'s second half, done by the baseline itself: ``buf *= 1/p`` in place."""
    np.multiply(buf, 1.0 / p, out=buf, casting="unsafe")


def _mpi_call(
    mpi: Any,
    op: str,
    host_in: Any,
    r: int,
    p: int,
    per: int,
    dt: Any,
    redop: str,
    inplace: bool,
) -> Callable[[], None]:
    """mpi4py's collective on host buffers, out of place or with ``MPI.IN_PLACE``."""
    c = mpi.COMM_WORLD
    avg = redop == "avg"
    mop = {"sum": mpi.SUM, "prod": mpi.PROD, "max": mpi.MAX, "min": mpi.MIN, "avg": mpi.SUM}[redop]
    src = np.ascontiguousarray(host_in).copy()
    out_n = {"all_gather": per * p, "reduce_scatter": per}.get(op, src.size)
    dst = np.zeros(out_n, dt)
    ip = mpi.IN_PLACE
    if op == "all_gather" and inplace:
        dst[r * per : (r + 1) * per] = src

    def once() -> None:
        if op == "all_reduce":
            if inplace:
                c.Allreduce(ip, src, op=mop)
            else:
                c.Allreduce(src, dst, op=mop)
            if avg:
                _divide(src if inplace else dst, p)
        elif op == "all_gather":
            c.Allgather(ip if inplace else src, dst)
        elif op == "reduce_scatter":
            if inplace:  # the result lands in the first `per` elements of the input
                c.Reduce_scatter_block(ip, src, op=mop)
            else:
                c.Reduce_scatter_block(src, dst, op=mop)
            if avg:
                _divide(src[:per] if inplace else dst, p)
        elif op == "broadcast":
            if inplace:
                c.Bcast(src, root=0)
            else:  # out of place: the root's input goes to every rank's output
                if r == 0:
                    np.copyto(dst, src)
                c.Bcast(dst, root=0)
        elif op == "reduce":
            if inplace:
                c.Reduce(ip if r == 0 else src, src if r == 0 else None, op=mop, root=0)
            else:
                c.Reduce(src, dst, op=mop, root=0)
            if avg and r == 0:
                _divide(src if inplace else dst, p)
        else:
            c.Alltoall(ip if inplace else src, src if inplace else dst)

    return once


def _gloo_call(
    dist: Any,
    op: str,
    host_in: Any,
    r: int,
    p: int,
    per: int,
    dt: Any,
    redop: str,
    inplace: bool,
) -> Callable[[], None]:
    """torch gloo's collective on CPU tensors over the same data (gloo has no ``avg``: sum, divide)."""
    import warnings

    import torch

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 renamed *_tensor calls
    avg = redop == "avg"
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
    if op == "all_gather" and inplace:
        dst[r * per : (r + 1) * per] = src

    def div(t: Any) -> None:
        if avg:
            _divide(t.numpy(), p)

    def once() -> None:
        if op == "all_reduce":
            if not inplace:  # out of place: copy in, reduce the copy (what a gloo user writes)
                dst.copy_(src)
            dist.all_reduce(src if inplace else dst, op=rop)
            div(src if inplace else dst)
        elif op == "all_gather":
            dist.all_gather_into_tensor(dst, dst[r * per : (r + 1) * per] if inplace else src)
        elif op == "reduce_scatter":  # gloo has no in-place form: the same call both ways
            dist.reduce_scatter_tensor(dst, src, op=rop)
            div(dst)
        elif op == "broadcast":
            if not inplace and r == 0:
                dst.copy_(src)
            dist.broadcast(src if inplace else dst, src=0)
        elif op == "reduce":
            if not inplace:
                dst.copy_(src)
            dist.reduce(src if inplace else dst, dst=0, op=rop)
            if r == 0:
                div(src if inplace else dst)
        else:  # gloo has no in-place all_to_all: the same call both ways
            dist.all_to_all_single(dst, src)

    return once


if __name__ == "__main__":
    sys.exit(main_worker())
