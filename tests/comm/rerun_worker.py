"""One rank of tests/comm/test_rerun.py (``hal run -n N rerun_worker.py SCENARIO``).

Repeated small calls on the same arrays and stream run again as prepared (``Engine.rerun``:
one native call, no planning). Each scenario changes what the prepared call depends on and
checks the result or the named error: the stream's earlier work (same stream, another
stream, a large call queued ahead), a buffer closed and another allocated, a tracer, the
communicator closed, aborted by a peer, timed out and shrunk. Prints ``OK rank R``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from rank_checks import refused, say

import hal
import hal.comm

N = 1024  # 4 KiB of float32: inline, one piece
NATIVE = os.environ.get("HAL_COMM_NATIVE", "1") != "0"


def called(fn: Callable[[], Any]) -> dict[str, int]:
    """How many times each Python function of hal.comm's engine ran during ``fn()`` (sys.setprofile)."""
    counts: dict[str, int] = {}

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.endswith("_engine.py"):
            name = frame.f_code.co_name
            counts[name] = counts.get(name, 0) + 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts


def hold(s: hal.Stream) -> None:
    """Hold ``s``: what is enqueued on it next starts only 50 ms from now (a host signal)."""
    signal = s.wait_host()
    threading.Timer(0.05, signal.set).start()


def calls(comm: hal.comm.Communicator) -> None:
    r, dev = comm.rank, comm.device
    s = dev.create_stream()
    s2 = dev.create_stream()
    a = hal.asarray(np.zeros(N, np.float32), device=dev)
    out = hal.asarray(np.zeros(N, np.float32), device=dev)
    host = np.zeros(N, np.float32)

    def check(arr: hal.Array, want: float, what: str) -> None:
        got = arr.to_host(stream=s)
        assert (got == want).all(), (what, got[:4], want)

    # 1. in place and out of place, each input written on the stream just before the call, held
    # back 50 ms: the call reads it only once the stream's earlier work is done
    for k in range(6):
        hold(s)
        hal.copy(a, np.full(N, r + 1 + k, np.float32), stream=s)
        comm.all_reduce(a, out, stream=s)  # no wait: the copy below is ordered after it
        hal.copy(host, out, stream=s)
        s.synchronize()
        assert (host == 3 + 2 * k).all(), ("out of place", k, host[:4])
        hold(s)
        hal.copy(a, np.full(N, r + 1 + k, np.float32), stream=s)
        comm.all_reduce(a, stream=s)
        hal.copy(host, a, stream=s)
        s.synchronize()
        assert (host == 3 + 2 * k).all(), ("in place", k, host[:4])

    # ... and those repeated calls ran again as prepared (native engine), not through submit
    works: list[Any] = []

    def repeat() -> None:
        for _ in range(5):
            works.append(comm.all_reduce(a, out, stream=s))
            works[-1].wait()

    n = called(repeat)
    if NATIVE:
        assert n.get("rerun") == 5 and "submit" not in n and "_execute" not in n, n
    else:
        assert n.get("submit") == 5 and n.get("_execute") == 5, n
    rec = comm.flight_record()[-5:]
    seqs = [e["seq"] for e in rec]
    assert seqs == list(range(seqs[0], seqs[0] + 5)), seqs
    for e in rec:
        assert e["op"] == "all_reduce" and e["state"] == "done" and e["nbytes"] == 4 * N, e
        assert e["started"] is not None and e["ended"] >= e["started"], e
    # each call's plan: its own seq, the same plan in comm.plans and comm.last_plan
    plans = [w.plan for w in works]
    assert [p.seq for p in plans] == seqs, (plans, seqs)
    assert comm.plans[-5:] == plans and comm.last_plan == plans[-1], (comm.plans[-5:], plans)
    for w, p in zip(works, plans, strict=True):
        assert p.collective == "all_reduce" and p.nbytes == 4 * N and p.algorithm == e["algorithm"]
        assert p.engine == ("native" if NATIVE else "python"), p
        assert w.done() and w.plan is p  # read again: the same plan
    # another thread reads the record and the plans while calls run: whole entries, in order
    stop = threading.Event()
    reads: list[Any] = []

    def read() -> None:
        while not stop.is_set():
            reads.append((comm.flight_record(), comm.plans))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(200):
            comm.all_reduce(a, out, stream=s).wait()
    finally:
        stop.set()
        reader.join()
    assert reads
    for got, got_plans in reads:
        seqs = [e["seq"] for e in got]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        for e in got:
            assert (e["state"], e["ended"] is None) in (("running", True), ("done", False)), e
        pseqs = [p.seq for p in got_plans]
        assert pseqs == list(range(pseqs[0], pseqs[0] + len(pseqs))), pseqs
    assert [e["state"] for e in comm.flight_record()[-3:]] == ["done"] * 3

    # 2. another stream: the call waits for that stream's earlier work, then again on the first
    for k in range(3):
        hold(s2)
        hal.copy(a, np.full(N, 10.0 * (r + 1) + k, np.float32), stream=s2)
        comm.all_reduce(a, out, stream=s2)
        hal.copy(host, out, stream=s2)
        s2.synchronize()
        assert (host == 30 + 2 * k).all(), ("another stream", k, host[:4])
        hal.copy(a, np.full(N, r + 1.0, np.float32), stream=s)
        comm.all_reduce(a, out, stream=s).wait()
        check(out, 3.0, "back on the first stream")

    # 3. a large call queued ahead on the engine: the small one runs after it, not inline
    big = comm._engine.inline_bytes // 4 + 1024  # above the inline size: queued to the engine
    x = hal.asarray(np.full(big, r + 1.0, np.float32), device=dev)
    for _ in range(3):
        hal.copy(a, np.full(N, r + 1.0, np.float32), stream=s)
        w1 = comm.all_reduce(x, op="max", stream=s)
        ws: list[Any] = []
        n = called(lambda ws=ws: ws.append(comm.all_reduce(a, out, stream=s)))  # type: ignore[misc]
        w2 = ws[0]
        assert n.get("submit") == 1, n  # not run again inline: queued behind the large call
        w2.wait()
        w1.wait()
        assert w1.plan.seq + 1 == w2.plan.seq, (w1.plan, w2.plan)
        check(out, 3.0, "after a queued call")
    check(x, 2.0, "the queued call")

    # 4. a buffer closed: its array is refused by name; arrays allocated after run correctly
    for k in range(3):
        s.synchronize()
        a.buffer.close()
        exc = refused(
            hal.InvalidBufferError,
            functools.partial(comm.all_reduce, a, out, stream=s),
            "a closed send buffer",
        )
        assert f"rank {r}: send" in str(exc), exc
        a = hal.asarray(np.full(N, r + 1.0 + k, np.float32), device=dev)  # maybe the same memory
        for _ in range(3):
            hal.copy(a, np.full(N, r + 1.0 + k, np.float32), stream=s)
            comm.all_reduce(a, out, stream=s).wait()
            check(out, 3.0 + 2 * k, f"a new buffer ({k})")
    s.synchronize()
    out.buffer.close()
    exc = refused(
        hal.InvalidBufferError, lambda: comm.all_reduce(a, out, stream=s), "a closed recv buffer"
    )
    assert f"rank {r}: recv" in str(exc), exc
    out = hal.asarray(np.zeros(N, np.float32), device=dev)

    # 5. a tracer opened after prepared calls: each call is on the timeline
    for _ in range(3):
        comm.all_reduce(a, out, stream=s).wait()
    with hal.trace() as t:
        for _ in range(3):
            comm.all_reduce(a, out, stream=s).wait()
    names = [e.get("name") for e in t.to_json()["traceEvents"] if e.get("cat") == "collective"]
    assert names.count("all_reduce") == 3, names
    comm.all_reduce(a, out, stream=s).wait()

    # 6. the other collectives, repeated on the same arrays, in place and out of place, each input
    # written on a held stream just before the call; then bad arguments and a closed buffer
    half = N // 2
    g = hal.asarray(np.zeros(N, np.float32), device=dev)
    part = hal.asarray(np.zeros(half, np.float32), device=dev)
    for k in range(4):
        v = float(10 * k + r + 1)
        hold(s)
        hal.copy(part, np.full(half, v, np.float32), stream=s)
        comm.all_gather(part, g, stream=s)
        want = np.repeat([10.0 * k + 1, 10.0 * k + 2], half)
        assert (g.to_host(stream=s) == want).all(), ("all_gather", k)
        hold(s)
        hal.copy(g, np.full(N, v, np.float32), stream=s)
        comm.all_gather(None, g, stream=s)
        got = g.to_host(stream=s)
        assert (got[r * half : (r + 1) * half] == v).all() and (got == want).all(), ("in place", k)
        for root in (0, 1):
            hold(s)
            hal.copy(a, np.full(N, v, np.float32), stream=s)
            comm.broadcast(a, out, root=root, stream=s)
            check(out, 10.0 * k + 1 + root, f"broadcast root {root}")
            hold(s)
            hal.copy(a, np.full(N, v, np.float32), stream=s)
            comm.broadcast(a, root=root, stream=s)
            check(a, 10.0 * k + 1 + root, f"broadcast in place, root {root}")
        hold(s)
        hal.copy(a, np.full(N, v, np.float32), stream=s)
        comm.reduce(a, out, op="max", root=1, stream=s).wait()
        if r == 1:
            check(out, 10.0 * k + 2, "reduce")
        hold(s)
        hal.copy(a, np.full(N, v, np.float32), stream=s)
        comm.reduce_scatter(a, part, stream=s).wait()
        check(part, 20.0 * k + 3, "reduce_scatter")

    def others() -> None:
        for _ in range(3):
            comm.all_gather(part, g, stream=s).wait()
            comm.broadcast(a, out, root=1, stream=s).wait()

    n = called(others)
    if NATIVE:
        assert n.get("rerun") == 6 and "submit" not in n, n
    for bad, what in (({"root": True}, "root=True"), ({"root": 2}, "root=2")):
        exc = refused(
            (TypeError, ValueError),
            functools.partial(comm.broadcast, a, out, stream=s, **bad),
            f"broadcast {what}",
        )
        assert what in str(exc), exc
    exc = refused(
        ValueError, lambda: comm.reduce(a, out, op="mean", root=0, stream=s), "reduce op='mean'"
    )
    assert "op='mean'" in str(exc), exc
    s.synchronize()
    part.buffer.close()
    exc = refused(
        hal.InvalidBufferError, lambda: comm.all_gather(part, g, stream=s), "a closed send buffer"
    )
    assert f"rank {r}: send" in str(exc), exc
    exc = refused(
        hal.InvalidBufferError,
        lambda: comm.reduce_scatter(a, part, stream=s),
        "a closed recv buffer",
    )
    assert f"rank {r}: recv" in str(exc), exc

    # 7. closed: the prepared call is refused
    comm.close()
    exc = refused(
        hal.CommError, lambda: comm.all_reduce(a, out, stream=s), "a call on a closed communicator"
    )
    assert "closed" in str(exc), exc


def timeout(comm: hal.comm.Communicator) -> None:
    """Rank 1 stops calling: rank 0's prepared call times out naming rank 1 and the op."""
    r, dev = comm.rank, comm.device
    s = dev.create_stream()
    a = hal.asarray(np.full(N, r + 1.0, np.float32), device=dev)
    for _ in range(4):
        comm.all_reduce(a, stream=s).wait()
    if r == 1:
        time.sleep(float(os.environ["HAL_COMM_TIMEOUT_MS"]) / 1e3 * 3)  # alive, silent
        comm.abort()
        return
    ws: list[Any] = []  # run again as prepared, it returns failed: a stream waiting on it fails
    n = called(lambda: ws.append(comm.all_reduce(a, stream=s)))
    assert n.get("rerun") == 1 and "submit" not in n, n
    w = ws[0]
    s2 = dev.create_stream()
    w.wait(stream=s2)
    err = refused(hal.StreamError, s2.synchronize, "a stream waiting on the failed call")
    exc = refused(hal.CommError, w.wait, "a call rank 1 never joined")
    assert err.__cause__ is exc, (err, err.__cause__, exc)
    assert exc.op == "all_reduce" and exc.ranks == (1,) and "no progress" in str(exc), exc
    s2.synchronize()  # raised once
    last = comm.flight_record()[-1]
    assert last["state"] == "failed" and "no progress" in last["error"], last
    assert last["op"] == "all_reduce" and last["ended"] >= last["started"], last
    assert comm.last_plan is not None and comm.last_plan.seq == last["seq"], (comm.last_plan, last)
    exc = refused(
        hal.CommError, lambda: comm.all_reduce(a, stream=s).wait(), "a call after the failure"
    )
    assert "failed earlier" in str(exc), exc
    comm.abort()


def program_fails(comm: hal.comm.Communicator) -> None:
    """Repeated reduce_scatters (prepared programs), then rank 1 falls silent (``HOW=silent``: rank
    0's call times out naming rank 1 and the op) or exits (``HOW=exit``: named as dead)."""
    r, dev = comm.rank, comm.device
    s = dev.create_stream()
    x = hal.asarray(np.full(1 << 16, r + 1.0, np.float32), device=dev)
    out = hal.asarray(np.zeros(1 << 15, np.float32), device=dev)

    def repeat() -> None:
        for _ in range(4):
            comm.reduce_scatter(x, out, stream=s).wait()

    for _ in range(2):
        comm.reduce_scatter(x, out, stream=s).wait()
    n = called(repeat)
    assert n.get("rerun") == 4 and "submit" not in n, n  # ran again as prepared programs
    assert (out.to_host(stream=s) == 3.0).all()
    if r == 1:
        if os.environ["HOW"] == "exit":
            os._exit(0)
        time.sleep(float(os.environ["HAL_COMM_TIMEOUT_MS"]) / 1e3 * 3)  # alive, silent
        comm.abort()
        return
    exc = refused(
        hal.CommError,
        lambda: comm.reduce_scatter(x, out, stream=s).wait(),
        "a call rank 1 never joined",
    )
    assert exc.op == "reduce_scatter" and exc.ranks == (1,), (exc, exc.ranks)
    want = "no progress" if os.environ["HOW"] == "silent" else "died"
    assert want in str(exc), exc
    last = comm.flight_record()[-1]
    assert last["op"] == "reduce_scatter" and last["state"] == "failed", last
    comm.abort()


def abort(comm: hal.comm.Communicator) -> None:
    """Rank 0 aborts after prepared calls: its next call is refused, rank 1's fails naming rank 0."""
    r, dev = comm.rank, comm.device
    s = dev.create_stream()
    a = hal.asarray(np.full(N, r + 1.0, np.float32), device=dev)
    for _ in range(4):
        comm.all_reduce(a, stream=s).wait()
    if r == 0:
        comm.abort()
        exc = refused(hal.CommError, lambda: comm.all_reduce(a, stream=s), "a call after abort")
        assert "closed" in str(exc), exc
        return
    exc = refused(hal.CommError, lambda: comm.all_reduce(a, stream=s).wait(), "a call rank 0 left")
    assert exc.op == "all_reduce" and 0 in exc.ranks, (exc, exc.ranks)
    comm.abort()


def shrink(comm: hal.comm.Communicator) -> None:
    """Rank 2 stalls after prepared calls; 0 and 1 time out, shrink, and repeat calls on the new one."""
    r, dev = comm.rank, comm.device
    s = dev.create_stream()
    a = hal.asarray(np.full(N, r + 1.0, np.float32), device=dev)
    for _ in range(4):
        comm.all_reduce(a, stream=s).wait()
    if r == 2:
        time.sleep(float(os.environ["HAL_COMM_TIMEOUT_MS"]) / 1e3 * 4)
        comm.abort()
        return
    # rank 0 waits for rank 2; rank 1 (recursive doubling) for rank 0
    exc = refused(
        hal.CommError, lambda: comm.all_reduce(a, stream=s).wait(), "a call rank 2 never joined"
    )
    assert exc.op == "all_reduce" and exc.ranks == ((2,) if r == 0 else (0,)), (exc, exc.ranks)
    new = comm.shrink(exclude=[2])
    exc = refused(
        hal.CommError, lambda: comm.all_reduce(a, stream=s), "a call on the shrunk communicator"
    )
    assert "closed" in str(exc), exc
    with new:
        for k in range(4):
            hal.copy(a, np.full(N, new.rank + 1.0 + k, np.float32), stream=s)
            new.all_reduce(a, stream=s).wait()
            got = a.to_host(stream=s)
            assert (got == 3 + 2 * k).all(), (k, got[:4])


def affinity(comm: hal.comm.Communicator) -> None:
    """The ranks poll before sleeping unless they outnumber the cores they run on together."""
    nat = comm._engine.transport._native
    assert nat is not None
    together = os.environ["PIN"] == "distinct"  # one core each: 2 ranks on 2 cores
    assert nat.oversubscribed is (not together), (os.environ["PIN"], os.sched_getaffinity(0))
    assert nat.ctx.spin_ns == (20_000 if together else 0), nat.ctx.spin_ns
    a = hal.asarray(np.full(N, comm.rank + 1.0, np.float32), device=comm.device)
    out = hal.asarray(np.zeros(N, np.float32), device=comm.device)
    s = comm.device.create_stream()
    for _ in range(3):
        comm.all_reduce(a, out, stream=s).wait()
        assert (out.to_host(stream=s) == 3.0).all()
    comm.close()


def _programs_run(
    comm: hal.comm.Communicator, evict: bool
) -> tuple[dict[str, bytes], dict[str, dict[str, int]]]:
    """Repeat each collective on the same arrays, new inputs written on a held stream before every
    call; return each result's bytes and, per collective, the engine functions its repeats ran.

    With ``evict``, 40 reduce_scatters on other arrays run after the first repeat: more programs
    than the native engine keeps (32), so it drops (and closes the scratch space of) the ones the
    repeated calls prepared; their next call must notice and prepare again.
    """
    s = comm.device.create_stream()
    out: dict[str, bytes] = {}
    runs: dict[str, dict[str, int]] = {}
    others = [hal.asarray(np.ones(64 + 8 * i, np.int32), device=comm.device) for i in range(40)]
    for dt in (np.float32, np.int32):
        _programs_dtype(comm, s, np.dtype(dt), others if evict else [], out, runs)
    s.synchronize()
    return out, runs


def _programs_dtype(
    comm: hal.comm.Communicator,
    s: hal.Stream,
    dt: np.dtype[Any],
    others: list[hal.Array],
    out: dict[str, bytes],
    runs: dict[str, dict[str, int]],
) -> None:
    """The calls of :func:`_programs_run` in one dtype (``others``: the calls that evict)."""
    p, r, dev = comm.size, comm.rank, comm.device
    n = 5003  # uneven segments on 3 and 4 ranks
    rng = np.random.default_rng([5, r, dt.itemsize])
    x = hal.asarray(np.zeros(n, dt), device=dev)
    seg = hal.asarray(np.zeros(split_len(n, p, r), dt), device=dev)
    part = hal.asarray(np.zeros(n // p, dt), device=dev)
    g = hal.asarray(np.zeros(n // p * p, dt), device=dev)
    y = hal.asarray(np.zeros(n, dt), device=dev)
    cases: list[tuple[str, Callable[[], Any], hal.Array, hal.Array]] = [
        ("reduce_scatter sum out", lambda: comm.reduce_scatter(x, seg, stream=s), x, seg),
        ("reduce_scatter max in", lambda: comm.reduce_scatter(x, op="max", stream=s), x, x),
        ("reduce sum out", lambda: comm.reduce(x, y, root=p - 1, stream=s), x, y),
        ("reduce min in", lambda: comm.reduce(x, op="min", root=0, stream=s), x, x),
        ("all_gather out", lambda: comm.all_gather(part, g, stream=s), part, g),
        ("all_gather in", lambda: comm.all_gather(None, g, stream=s), g, g),
        ("broadcast out", lambda: comm.broadcast(x, y, root=1, stream=s), x, y),
        ("broadcast in", lambda: comm.broadcast(x, root=p - 1, stream=s), x, x),
        ("all_reduce sum out", lambda: comm.all_reduce(x, y, stream=s), x, y),
        ("all_reduce prod in", lambda: comm.all_reduce(x, op="prod", stream=s), x, x),
    ]
    for label, fn, src, res in cases:
        counts: dict[str, int] = {}
        for k in range(6):
            if others and k == 3:
                for o in others:  # more programs than are kept: the prepared one is dropped
                    comm.reduce_scatter(o, stream=s).wait()
            data = rng.integers(-3, 4, src.size).astype(dt)
            if "prod" in label:
                data = np.where(data == 0, 1, data).astype(dt)
            hold(s)
            hal.copy(src, data, stream=s)
            if k < 2:
                fn().wait()
            else:  # the repeats: how they ran
                for name, c in called(lambda fn=fn: fn().wait()).items():  # type: ignore[misc]
                    counts[name] = counts.get(name, 0) + c
            out[f"{label} {dt.name} {k}"] = res.to_host(stream=s).tobytes()
        runs[f"{label} {dt.name}"] = counts


def split_len(n: int, p: int, r: int) -> int:
    """Elements of segment ``r`` when ``n`` are cut into ``p`` (the first ``n % p`` one longer)."""
    return n // p + (1 if r < n % p else 0)


def programs(comm: hal.comm.Communicator) -> None:
    """Repeated calls that run as compiled programs (reduce_scatter, reduce, the collectives of
    several pieces or ranks) run again as prepared, also after their programs were dropped, and
    their results equal the Python path's (HAL_COMM_NATIVE=0) bit for bit."""
    evict = os.environ.get("EVICT") == "1"
    fast, runs = _programs_run(comm, evict)
    assert comm.last_plan is not None and comm.last_plan.engine == "native", comm.last_plan
    comm.close()
    os.environ["HAL_COMM_NATIVE"] = "0"
    slow_comm = hal.comm.init()
    slow, slow_runs = _programs_run(slow_comm, evict)
    assert slow_comm.last_plan is not None and slow_comm.last_plan.engine == "python"
    slow_comm.close()
    differ = sorted(k for k in fast if fast[k] != slow[k])
    assert sorted(fast) == sorted(slow) and not differ, differ[:8]
    for label, n in runs.items():
        # 4 repeats; with eviction the first after it finds its program dropped: it runs through
        # submit and is prepared again (the 40 other calls ran through submit, not counted here)
        stale = 1 if evict else 0
        assert n.get("rerun") == 4 and n.get("submit", 0) == stale, (label, n)
        assert slow_runs[label].get("submit") == 4 and "rerun" not in slow_runs[label], slow_runs
    os.environ["HAL_COMM_NATIVE"] = "1"


def main(scenario: str) -> None:
    if scenario == "affinity":  # before init: each rank on one core (Open MPI's mpirun binds so)
        os.sched_setaffinity(
            0, {int(os.environ["HAL_RANK"]) if os.environ["PIN"] == "distinct" else 0}
        )
    comm = hal.comm.init()
    scenarios = {
        "calls": calls,
        "timeout": timeout,
        "program_fails": program_fails,
        "abort": abort,
        "shrink": shrink,
        "affinity": affinity,
        "programs": programs,
    }
    scenarios[scenario](comm)
    say(f"OK rank {comm.rank} {json.dumps(scenario)}")


if __name__ == "__main__":
    main(sys.argv[1])
