"""The collective × op × dtype × in/out-of-place matrix, checked against NumPy on one rank.

Used by the multi-process worker (``worker.py`` under ``hal run``) and by the in-process
tests through the per-rank views of a DeviceCommunicator (one thread per rank).
Data are small integers (exact in every dtype), generated from (seed, rank, case), so
every rank can compute the expected result of every other rank.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

import hal
import hal.comm
from hal.comm._algorithms import split

DTYPES = ("float32", "float64", "int32", "int64")
OPS = ("sum", "prod", "max", "min", "avg")
_REDUCE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def data(
    seed: int, rank: int, case: int, n: int, dtype: str, op: str = "sum"
) -> np.ndarray[Any, Any]:
    """Return rank ``rank``'s input for case ``case`` (prod uses 1s and 2s to stay exact)."""
    rng = np.random.default_rng([seed, rank, case])
    if op == "prod":
        return rng.integers(1, 3, n).astype(dtype)
    return rng.integers(-50, 50, n).astype(dtype)


def reduce_all(inputs: list[np.ndarray[Any, Any]], op: str) -> np.ndarray[Any, Any]:
    """Return the NumPy reference of reducing ``inputs`` with ``op``."""
    fn = _REDUCE["sum" if op == "avg" else op]
    out = inputs[0].copy()
    for x in inputs[1:]:
        fn(out, x, out=out)
    if op == "avg":
        if out.dtype.kind == "f":
            out = (out.astype(np.float64) / len(inputs)).astype(out.dtype)
        else:
            out = np.trunc(out.astype(np.float64) / len(inputs)).astype(out.dtype)
    return out


def _same(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> bool:
    if got.shape != want.shape:
        return False
    if got.dtype.kind == "f":
        return bool(np.allclose(got, want, rtol=1e-6, atol=1e-6))
    return bool(np.array_equal(got, want))


def run(
    comm: hal.comm.Communicator,
    *,
    sizes: tuple[int, ...] = (0, 1, 13),
    dtypes: tuple[str, ...] = DTYPES,
    ops: tuple[str, ...] = OPS,
    seed: int = 1234,
    collectives: tuple[str, ...] = (
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "broadcast",
        "reduce",
        "all_to_all",
        "sendrecv",
        "barrier",
    ),
) -> tuple[int, list[str]]:
    """Run every combination on this rank; return (checks done, failure descriptions)."""
    p, r, dev = comm.size, comm.rank, comm.device
    stream = dev.create_stream()
    failures: list[str] = []
    checks = 0
    case = 0

    def put(x: np.ndarray[Any, Any]) -> hal.Array:
        return hal.asarray(x, device=dev)

    def check(label: str, arr: hal.Array, want: np.ndarray[Any, Any]) -> None:
        nonlocal checks
        checks += 1
        got = arr.to_host(stream=stream)
        if not _same(got.reshape(-1), want.reshape(-1)):
            failures.append(
                f"rank {r}: {label}: got {got.reshape(-1)[:8]} want {want.reshape(-1)[:8]}"
            )

    for coll in collectives:
        reducing = coll in ("all_reduce", "reduce_scatter", "reduce")
        for n, dt, op, inplace in itertools.product(
            sizes, dtypes, ops if reducing else ("-",), (False, True)
        ):
            case += 1
            label = f"{coll} n={n} {dt} op={op} {'in-place' if inplace else 'out-of-place'}"
            roots = (case % p,)
            if coll == "all_reduce":
                ins = [data(seed, k, case, n, dt, op) for k in range(p)]
                want = reduce_all(ins, op)
                x = put(ins[r])
                if inplace:
                    comm.all_reduce(x, op=op, stream=stream).wait()
                    check(label, x, want)
                else:
                    y = put(np.zeros(n, dt))
                    comm.all_reduce(x, y, op=op, stream=stream).wait()
                    check(label, y, want)
                    check(label + " (input kept)", x, ins[r])
            elif coll == "reduce_scatter":
                ins = [data(seed, k, case, n, dt, op) for k in range(p)]
                start, cnt = split(n, p)[r]
                want = reduce_all(ins, op)[start : start + cnt]
                x = put(ins[r])
                if inplace:
                    comm.reduce_scatter(x, op=op, stream=stream).wait()
                    check(label, x.buffer.view(x.dtype, cnt, offset=start * x.dtype.itemsize), want)
                else:
                    y = put(np.zeros(cnt, dt))
                    comm.reduce_scatter(x, y, op=op, stream=stream).wait()
                    check(label, y, want)
                    check(label + " (input kept)", x, ins[r])
            elif coll == "all_gather":
                ins = [data(seed, k, case, n, dt) for k in range(p)]
                want = np.concatenate(ins)
                if inplace:
                    buf = np.zeros(n * p, dt)
                    buf[r * n : (r + 1) * n] = ins[r]
                    y = put(buf)
                    comm.all_gather(None, y, stream=stream).wait()
                else:
                    y = put(np.zeros(n * p, dt))
                    comm.all_gather(put(ins[r]), y, stream=stream).wait()
                check(label, y, want)
            elif coll == "broadcast":
                for root in roots:
                    ins = [data(seed, k, case, n, dt) for k in range(p)]
                    x = put(ins[r])
                    if inplace:
                        comm.broadcast(x, root=root, stream=stream).wait()
                        check(label + f" root={root}", x, ins[root])
                    else:
                        y = put(np.zeros(n, dt))
                        comm.broadcast(x, y, root=root, stream=stream).wait()
                        check(label + f" root={root}", y, ins[root])
            elif coll == "reduce":
                for root in roots:
                    ins = [data(seed, k, case, n, dt, op) for k in range(p)]
                    want = reduce_all(ins, op)
                    x = put(ins[r])
                    if inplace:
                        comm.reduce(x, op=op, root=root, stream=stream).wait()
                        check(label + f" root={root}", x, want if r == root else ins[r])
                    else:
                        y = put(np.zeros(n, dt))
                        comm.reduce(x, y, op=op, root=root, stream=stream).wait()
                        if r == root:
                            check(label + f" root={root}", y, want)
                        check(label + " (input kept)", x, ins[r])
            elif coll == "all_to_all":
                ins = [data(seed, k, case, n * p, dt) for k in range(p)]
                want = np.concatenate([ins[k][r * n : (r + 1) * n] for k in range(p)])
                x = put(ins[r])
                if inplace:
                    comm.all_to_all(x, stream=stream).wait()
                    check(label, x, want)
                else:
                    y = put(np.zeros(n * p, dt))
                    comm.all_to_all(x, y, stream=stream).wait()
                    check(label, y, want)
            elif coll == "sendrecv":
                if inplace:
                    continue
                # a ring: send to r+1, receive from r-1 (even ranks send first)
                ins = [data(seed, k, case, n, dt) for k in range(p)]
                nxt, prv = (r + 1) % p, (r - 1) % p
                x, y = put(ins[r]), put(np.zeros(n, dt))
                if p > 1:
                    if r % 2 == 0:
                        w1 = comm.send(x, nxt, stream=stream)
                        w2 = comm.recv(y, prv, stream=stream)
                    else:
                        w2 = comm.recv(y, prv, stream=stream)
                        w1 = comm.send(x, nxt, stream=stream)
                    w1.wait()
                    w2.wait()
                    check(label, y, ins[prv])
            elif coll == "barrier" and not inplace:
                comm.barrier().wait()
                checks += 1
    stream.close()
    return checks, failures
