"""One rank of tests/comm/test_fastpath.py (2 ranks, started by ``hal run``).

Repeats small collectives on the same arrays (the calls that take the fast path of repeated
calls: arguments checked once, the plan and the packed signature cached), then changes what
the cached facts cover: the count, the dtype, the op, the root, a buffer closed since, and
finally a mismatch between the ranks. Checks every result and every error; prints
``OK rank R`` at the end.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from rank_checks import refused, say

import hal
import hal.comm


def main() -> None:
    comm = hal.comm.init()
    r, dev = comm.rank, comm.device
    assert comm.size == 2
    s = dev.create_stream()
    engine = "native" if os.environ.get("HAL_COMM_NATIVE", "1") != "0" else "python"

    def host(arr: hal.Array) -> np.ndarray:
        return arr.to_host(stream=s).reshape(-1)

    # 1. the same in-place call again and again: each doubles the sum of the two ranks' values
    x = hal.asarray(np.full(1024, r + 1, np.float32), device=dev)
    seqs = []
    for k in range(1, 21):
        w = comm.all_reduce(x, stream=s)
        w.wait()
        assert w.done()
        seqs.append(w.plan.seq)
        got = host(x)
        assert (got == 3 * 2 ** (k - 1)).all(), (k, got[:4])
    assert seqs == list(range(seqs[0], seqs[0] + 20)), seqs
    assert w.plan.algorithm == "recursive_doubling" and w.plan.engine == engine, w.plan
    entry = comm.flight_record()[-1]
    assert entry["state"] == "done" and entry["started"] is not None and entry["seq"] == seqs[-1], (
        entry
    )

    # 2. out of place, the op changes from call to call (same arrays)
    a = hal.asarray(np.full(1024, r + 1, np.float32), device=dev)
    y = hal.asarray(np.zeros(1024, np.float32), device=dev)
    want = {"sum": 3.0, "prod": 2.0, "max": 2.0, "min": 1.0, "avg": 1.5}
    for _ in range(3):
        for op, v in want.items():
            comm.all_reduce(a, y, op=op, stream=s).wait()
            got = host(y)
            assert (got == v).all(), (op, got[:4])
    assert (host(a) == r + 1).all()  # out of place: the input is untouched

    # 3. the count changes: views of the same buffer, of other sizes (and a 2-D one)
    for n in (1024, 512, 1024, 7, 1, 512):
        src = a.buffer.view(np.float32, n)
        dst = y.buffer.view(np.float32, n)
        w = comm.all_reduce(src, dst, op="sum", stream=s)
        w.wait()
        assert w.plan.nbytes == 4 * n, w.plan
        assert (host(dst) == 3.0).all(), n
    grid = a.buffer.view(np.float32, (32, 32))
    comm.all_reduce(grid, y, op="max", stream=s).wait()
    assert (host(y) == 2.0).all()

    # 4. the dtype changes: the same bytes read as int32, then as float64
    ints = a.buffer.view(np.int32, 1024)
    out = y.buffer.view(np.int32, 1024)
    mine = np.full(1024, r + 1, np.float32).view(np.int32)
    both = np.full(1024, 1, np.float32).view(np.int32) + np.full(1024, 2, np.float32).view(np.int32)
    for _ in range(2):
        comm.all_reduce(ints, out, op="sum", stream=s).wait()
        assert (host(out) == both).all()
        assert (host(ints) == mine).all()
        f64 = hal.asarray(np.full(64, r + 0.25, np.float64), device=dev)
        comm.all_reduce(f64, op="max", stream=s).wait()
        assert (host(f64) == 1.25).all()
        comm.all_reduce(a, y, op="sum", stream=s).wait()
        assert (host(y) == 3.0).all()

    # 5. the root changes (broadcast), between repeated all_reduces
    b = hal.asarray(np.full(256, 10 * (r + 1), np.int32), device=dev)
    for root in (0, 1, 1, 0):
        b2 = hal.asarray(np.full(256, 10 * (r + 1), np.int32), device=dev)
        comm.broadcast(b2, root=root, stream=s).wait()
        assert (host(b2) == 10 * (root + 1)).all(), root
        comm.all_reduce(b, op="min", stream=s).wait()
        assert (host(b) == 10).all()

    # 5b. 2-D arrays repeated, in place and out of place, every collective (the first repeats
    # flatten them for the full path; in place stays in place)
    m = hal.asarray(np.zeros((16, 64), np.float32), device=dev)
    m2 = hal.asarray(np.zeros((16, 64), np.float32), device=dev)
    h2 = hal.asarray(np.zeros((8, 64), np.float32), device=dev)
    for k in range(5):
        mine2 = np.full((16, 64), r + 1 + k, np.float32)
        hal.copy(m, mine2, stream=s)
        comm.all_reduce(m, m2, op="max", stream=s).wait()
        assert (host(m2) == 2 + k).all() and (host(m) == r + 1 + k).all(), ("2-D out of place", k)
        comm.all_reduce(m, stream=s).wait()
        assert (host(m) == 3 + 2 * k).all(), ("2-D in place", k)
        hal.copy(h2, mine2[:8], stream=s)
        comm.all_gather(h2, m2, stream=s).wait()
        assert (host(m2)[: 8 * 64] == 1 + k).all() and (host(m2)[8 * 64 :] == 2 + k).all(), k
        hal.copy(m, mine2, stream=s)
        comm.all_gather(None, m, stream=s).wait()
        assert (host(m) == host(m2)).all(), ("2-D all_gather in place", k)
        comm.broadcast(m, m2, root=1, stream=s).wait()
        comm.broadcast(m, root=0, stream=s).wait()
        assert (host(m2) == host(m)).all(), ("2-D broadcast", k)
        hal.copy(m, mine2, stream=s)
        comm.reduce_scatter(m, h2, stream=s).wait()
        assert (host(h2) == 3 + 2 * k).all(), ("2-D reduce_scatter", k)
        comm.reduce(m, m2, op="min", root=1, stream=s).wait()
        if r == 1:
            assert (host(m2) == 1 + k).all(), ("2-D reduce", k)

    # 6. bad arguments after fast-path calls: named errors, nothing sent (the ranks stay in step)
    bad_stream: Any = object()
    exc = refused(
        TypeError,
        lambda: comm.all_reduce(a, y, stream=bad_stream),
        "a stream that is not a hal.Stream",
    )
    assert "stream=" in str(exc), exc
    exc = refused(ValueError, lambda: comm.all_reduce(a, y, op="mean", stream=s), "op='mean'")
    assert "op='mean'" in str(exc), exc
    z = hal.asarray(np.full(1024, r + 1, np.float32), device=dev)
    zz = hal.asarray(np.zeros(1024, np.float32), device=dev)
    for _ in range(3):
        comm.all_reduce(z, zz, stream=s).wait()
        comm.all_reduce(z, stream=s).wait()
    s.synchronize()
    zz.buffer.close()
    exc = refused(
        hal.InvalidBufferError, lambda: comm.all_reduce(z, zz, stream=s), "a closed recv buffer"
    )
    assert f"rank {r}: recv" in str(exc), exc
    z.buffer.close()
    exc = refused(
        hal.InvalidBufferError, lambda: comm.all_reduce(z, stream=s), "a closed send buffer"
    )
    assert f"rank {r}: send" in str(exc), exc
    exc = refused(
        ValueError,
        lambda: comm.all_reduce(a, y.buffer.view(np.float32, 512), stream=s),
        "a recv of another size",
    )
    assert "512" in str(exc), exc
    comm.all_reduce(a, y, stream=s).wait()  # the communicator still works
    assert (host(y) == 3.0).all()

    # 7. the ranks disagree after fast-path calls: both get the CommError naming both ranks
    n = 1024 if r == 0 else 512
    for _ in range(3):
        comm.all_reduce(a, y, stream=s).wait()
    exc = refused(
        hal.CommError,
        lambda: comm.all_reduce(
            a.buffer.view(np.float32, n), y.buffer.view(np.float32, n), stream=s
        ).wait(),
        "a mismatch",
    )
    text = str(exc)
    assert "all_reduce" in text and "mismatch" in text and "count" in text, text
    assert exc.op == "all_reduce" and set(exc.ranks) == {0, 1}, (exc.op, exc.ranks)
    say(f"OK rank {r} engine={engine}")
    comm.close()


if __name__ == "__main__":
    main()
