"""One rank of the point-to-point tests: ``hal run -n N p2p_worker.py CASE [CASE ...]``.

Each case is a function of a rank's communicator that raises AssertionError on a wrong
value; the worker prints ``OK <case>`` per passed case and ``P2P-ERROR <case>: ...`` lines
for the error cases (the test reads them). Also used in-process (one thread per rank) by
tests/comm/test_p2p.py.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import hal
import hal.comm

Case = Callable[[Any, hal.Stream], None]


def say(line: str) -> None:
    """Print ``line`` with one write (ranks share the launcher's stdout)."""
    os.write(1, (line + "\n").encode())


def values(rank: int, n: int, salt: int = 0, dtype: Any = np.float32) -> np.ndarray[Any, Any]:
    """What ``rank`` sends (distinct per rank, salt and position)."""
    return (np.arange(n) % 1000 + 1000 * rank + 7 * salt).astype(dtype)


def put(comm: Any, arr: np.ndarray[Any, Any]) -> hal.Array:
    return hal.asarray(arr, device=comm.device)


def same(got: hal.Array, want: np.ndarray[Any, Any], what: str) -> None:
    host = got.to_host()
    assert host.dtype == want.dtype and np.array_equal(host, want), (
        f"{what}: got {host[:5]}..., want {want[:5]}..."
    )


# -- patterns -----------------------------------------------------------------------------------
def exchange(comm: Any, s: hal.Stream) -> None:
    """2 ranks: both send first, then receive (the case that raised a false mismatch), then the other orders."""
    assert comm.size == 2
    me, other = comm.rank, 1 - comm.rank
    for n in (0, 13, 70_001):
        x, y = put(comm, values(me, n)), put(comm, np.zeros(n, np.float32))
        w1 = comm.send(x, other, stream=s)
        w2 = comm.recv(y, other, stream=s)
        w1.wait()
        w2.wait()
        same(y, values(other, n), f"send-first exchange n={n}")
        y2 = put(comm, np.zeros(n, np.float32))
        w2 = comm.irecv(y2, other, tag=3, stream=s)
        w1 = comm.isend(x, other, tag=3, stream=s)
        w2.wait()
        w1.wait()
        same(y2, values(other, n), f"recv-first exchange n={n}")
    # the grouped forms
    x, y = put(comm, values(me, 1000, 1)), put(comm, np.zeros(1000, np.float32))
    with comm.group():
        ws = [comm.isend(x, other, stream=s), comm.irecv(y, other, stream=s)]
    for w in ws:
        w.wait()
    same(y, values(other, 1000, 1), "group exchange")
    y = put(comm, np.zeros(1000, np.float32))
    ops = [hal.comm.P2POp("irecv", y, other, tag=1), hal.comm.P2POp("isend", x, other, tag=1)]
    for w in comm.batch_isend_irecv(ops, stream=s):
        w.wait()
    same(y, values(other, 1000, 1), "batch_isend_irecv exchange")


def ring(comm: Any, s: hal.Stream) -> None:
    """Every rank sends to r+1 and receives from r-1, sends posted first (deadlocked before)."""
    p, r = comm.size, comm.rank
    nxt, prv = (r + 1) % p, (r - 1) % p
    for n in (1, 50_000):
        for dtype in (np.float32, np.int64):
            x, y = put(comm, values(r, n, 2, dtype)), put(comm, np.zeros(n, dtype))
            w1 = comm.send(x, nxt, stream=s)
            w2 = comm.recv(y, prv, stream=s)
            w1.wait()
            w2.wait()
            same(y, values(prv, n, 2, dtype), f"ring n={n} {np.dtype(dtype).name}")
    # and with tags, batched, the other direction
    x, y = put(comm, values(r, 999, 4)), put(comm, np.zeros(999, np.float32))
    ops = [hal.comm.P2POp("isend", x, prv, tag=11), hal.comm.P2POp("irecv", y, nxt, tag=11)]
    for w in comm.batch_isend_irecv(ops, stream=s):
        w.wait()
    same(y, values(nxt, 999, 4), "reverse ring with tag 11")


def halo(comm: Any, s: hal.Stream) -> None:
    """1-D domain decomposition: each rank swaps its edge cells with both neighbours (tags by direction)."""
    p, r = comm.size, comm.rank
    n, h = 4096, 64
    field = values(r, n + 2 * h, 5).astype(np.float64)
    arr = put(comm, field)
    left_in, right_in = put(comm, np.zeros(h)), put(comm, np.zeros(h))
    ops = []
    if r > 0:
        ops += [
            hal.comm.P2POp("isend", put(comm, field[h : 2 * h]), r - 1, tag=0),
            hal.comm.P2POp("irecv", left_in, r - 1, tag=1),
        ]
    if r < p - 1:
        ops += [
            hal.comm.P2POp("isend", put(comm, field[n : n + h]), r + 1, tag=1),
            hal.comm.P2POp("irecv", right_in, r + 1, tag=0),
        ]
    for w in comm.batch_isend_irecv(ops, stream=s):
        w.wait()
    if r > 0:
        left = values(r - 1, n + 2 * h, 5).astype(np.float64)
        same(left_in, left[n : n + h], "halo from the left")
    if r < p - 1:
        right = values(r + 1, n + 2 * h, 5).astype(np.float64)
        same(right_in, right[h : 2 * h], "halo from the right")
    arr.close()


def pipeline(comm: Any, s: hal.Stream) -> None:
    """1F1B on ``size`` stages, 8 micro-batches: sends are posted and waited for later (send now, recv later)."""
    p, st = comm.size, comm.rank
    m, n = 8, 20_000
    warm = min(p - st - 1, m)
    pending: list[Any] = []
    keep: list[hal.Array] = []

    def forward(i: int) -> None:
        act = put(comm, np.zeros(n, np.float32))
        if st > 0:
            comm.irecv(act, st - 1, tag=2 * i, stream=s).wait()
            same(act, np.full(n, i + st, np.float32), f"stage {st} forward input {i}")
        else:
            act = put(comm, np.full(n, i, np.float32))
        out = put(comm, act.to_host() + 1)
        keep.append(out)
        if st < p - 1:
            pending.append(comm.isend(out, st + 1, tag=2 * i, stream=s))

    def backward(i: int) -> None:
        grad = put(comm, np.zeros(n, np.float32))
        if st < p - 1:
            comm.irecv(grad, st + 1, tag=2 * i + 1, stream=s).wait()
            same(
                grad,
                np.full(n, -(i + 10 * (p - 1 - st)), np.float32),
                f"stage {st} backward input {i}",
            )
        else:
            grad = put(comm, np.full(n, -i, np.float32))
        out = put(comm, grad.to_host() - 10)
        keep.append(out)
        if st > 0:
            pending.append(comm.isend(out, st - 1, tag=2 * i + 1, stream=s))

    f = b = 0
    for _ in range(warm):
        forward(f)
        f += 1
    while f < m:
        forward(f)
        f += 1
        backward(b)
        b += 1
    while b < m:
        backward(b)
        b += 1
    for w in pending:
        w.wait()


def tags(comm: Any, s: hal.Stream) -> None:
    """FIFO per (pair, tag): rank 0 sends tags 5, 7, 5; rank 1 receives 7 first, then the two 5s in order."""
    if comm.rank == 0:
        ws = [
            comm.isend(put(comm, values(0, 100, k)), 1, tag=t, stream=s)
            for k, t in enumerate((5, 7, 5))
        ]
        for w in ws:
            w.wait()
    elif comm.rank == 1:
        a, b, c = (put(comm, np.zeros(100, np.float32)) for _ in range(3))
        comm.irecv(b, 0, tag=7, stream=s).wait()
        wa = comm.irecv(a, 0, tag=5, stream=s)
        wc = comm.irecv(c, 0, tag=5, stream=s)
        wa.wait()
        wc.wait()
        same(b, values(0, 100, 1), "tag 7")
        same(a, values(0, 100, 0), "first tag 5")
        same(c, values(0, 100, 2), "second tag 5")
    comm.barrier().wait()


def large(comm: Any, s: hal.Stream) -> None:
    """64 MiB each way at once between ranks 0 and 1 (the others idle)."""
    n = 16 << 20  # float32: 64 MiB
    if comm.rank < 2:
        other = 1 - comm.rank
        x, y = put(comm, values(comm.rank, n, 9)), put(comm, np.zeros(n, np.float32))
        w1 = comm.isend(x, other, tag=64, stream=s)
        w2 = comm.irecv(y, other, tag=64, stream=s)
        w1.wait()
        w2.wait()
        same(y, values(other, n, 9), "64 MiB exchange")
    comm.barrier().wait()


def mixed(comm: Any, s: hal.Stream) -> None:
    """Point-to-point calls and collectives interleaved: no false mismatch, values right."""
    p, r = comm.size, comm.rank
    for i in range(3):
        x, y = put(comm, values(r, 257, i)), put(comm, np.zeros(257, np.float32))
        w1 = comm.isend(x, (r + 1) % p, stream=s)
        w2 = comm.irecv(y, (r - 1) % p, stream=s)
        z = put(comm, np.full(5, r + 1, np.float64))
        comm.all_reduce(z, stream=s).wait()
        w1.wait()
        w2.wait()
        same(y, values((r - 1) % p, 257, i), "ring before all_reduce")
        same(z, np.full(5, p * (p + 1) / 2), "all_reduce after the ring")


# -- bad input ----------------------------------------------------------------------------------
def report(case: str, exc: BaseException) -> None:
    ranks = getattr(exc, "ranks", ())
    say(
        f"P2P-ERROR {case} rank={os.environ.get('HAL_RANK', '?')} {type(exc).__name__} ranks={ranks}: {exc}"
    )


def errors(comm: Any, s: hal.Stream) -> None:
    """Rank 1 posts bad receives; each fails alone and the communicator keeps working."""
    assert comm.size == 2
    r = comm.rank
    x = put(comm, values(r, 10))
    # size and dtype mismatches: only the receiver's call fails
    for case, buf in (("count", np.zeros(12, np.float32)), ("dtype", np.zeros(10, np.int32))):
        if r == 0:
            comm.isend(x, 1, tag=1, stream=s).wait()
        else:
            try:
                comm.irecv(put(comm, buf), 0, tag=1, stream=s).wait()
                raise AssertionError(f"{case} mismatch not detected")
            except hal.CommError as exc:
                report(case, exc)
        comm.barrier().wait()
    # a receive nobody sends to: the sender moves on to a collective, the receive fails at once
    if r == 1:
        try:
            comm.irecv(put(comm, np.zeros(4, np.float32)), 0, tag=42, stream=s).wait()
            raise AssertionError("a receive without a send completed")
        except hal.CommError as exc:
            report("nosend", exc)
    z = put(comm, np.ones(3, np.float32))
    comm.all_reduce(z, stream=s).wait()
    same(z, np.full(3, 2, np.float32), "all_reduce after the failed receives")
    # a receive nobody sends to while the peer is silent: a timeout naming it, then the communicator works
    job = (
        os.getppid() if "HAL_RANK" in os.environ or "PMI_RANK" in os.environ else os.getpid()
    )  # the launcher, or us
    flag = Path(tempfile.gettempdir()) / f"hal-p2p-test-{job}"
    if r == 1:
        t0 = time.monotonic()
        try:
            comm.irecv(put(comm, np.zeros(4, np.float32)), 0, tag=43, stream=s).wait()
            raise AssertionError("a receive without a send completed")
        except hal.CommError as exc:
            report("timeout", exc)
            say(f"timeout after {time.monotonic() - t0:.1f}s")
        finally:
            flag.touch()
    else:  # silent (no call) until rank 1's receive has failed
        deadline = time.monotonic() + 120
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    comm.barrier().wait()
    if r == 0:
        flag.unlink(missing_ok=True)
    # bad arguments: raised at the call, nothing enqueued
    bad: list[tuple[str, Callable[[], Any]]] = [
        ("noncontig", lambda: comm.isend(np.arange(20, dtype=np.float32)[::2], 1 - r, stream=s)),
        ("self", lambda: comm.isend(x, r, stream=s)),
        ("tag", lambda: comm.irecv(x, 1 - r, tag=-1, stream=s)),
        ("peer", lambda: comm.irecv(x, 5, stream=s)),
        ("op", lambda: hal.comm.P2POp("send", x, 1 - r)),
    ]
    others = [d for d in hal.devices(comm.device.backend) if d != comm.device]
    if others:
        bad.append(
            (
                "device",
                lambda: comm.isend(hal.asarray(values(r, 4), device=others[0]), 1 - r, stream=s),
            )
        )
    for case, fn in bad:
        try:
            fn()
            raise AssertionError(f"bad input {case} accepted")
        except (TypeError, ValueError, hal.HalError) as exc:
            if r == 1:
                report(case, exc)
    # still usable: a correct exchange
    y = put(comm, np.zeros(10, np.float32))
    with comm.group():
        ws = [comm.isend(x, 1 - r, stream=s), comm.irecv(y, 1 - r, stream=s)]
    for w in ws:
        w.wait()
    same(y, values(1 - r, 10), "exchange after the errors")


CASES: dict[str, Case] = {
    "exchange": exchange,
    "ring": ring,
    "halo": halo,
    "pipeline": pipeline,
    "tags": tags,
    "large": large,
    "mixed": mixed,
    "errors": errors,
}


def main(names: list[str]) -> int:
    """Run ``names`` in order on this rank."""
    comm = hal.comm.init()
    s = comm.device.create_stream()
    try:
        for name in names:
            CASES[name](comm, s)
            say(f"OK {name} rank={comm.rank} transport={comm.transport}")
    finally:
        s.close()
        comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
