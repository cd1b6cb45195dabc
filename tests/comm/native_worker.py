"""One rank of the native-engine tests (tests/comm/test_native.py), started by ``hal run``.

``native_worker.py compare SIZES [DTYPES]``: runs every collective x op x dtype x
in/out-of-place on random data (the same on every run: seeded by rank and case) twice, with
the native engine and then with ``HAL_COMM_NATIVE=0`` (a new communicator), and compares
every result bit for bit; prints ``OK <results> engines=native/python`` or the differences.

``native_worker.py die``: rank 1 exits while the ranks run large all_reduces back to back;
rank 0 prints the CommError it gets.

``native_worker.py mismatch``: the ranks call a 2 x 4 MiB all_gather with different counts (their
messages go by reference, posted before the peers' signatures are checked); each prints the
CommError it gets.

``native_worker.py barrier``: 5 barriers (each one C call: ``small`` counts them), then rank 0
calls a barrier where the others call an all_reduce; each prints the CommError it gets.

``native_worker.py awake``: rank 0 enters an all_reduce while rank 1 sleeps in Python; rank 1
samples rank 0's doorbell words (in a C call? sleeping on its futex?) and prints the counts.

``native_worker.py gather SIZES``: all_gather only, in place, out of place, and mixed (the even
ranks in place, the odd ones out of place), each twice (the second call runs prepared), with the
native engine and then with ``HAL_COMM_NATIVE=0``; compares every result bit for bit with the
other engine's and with the expected concatenation; prints ``OK gather ...`` with the native
counts and, over the programs kept, the whole local copies (``copies=``) and the copies beside
a step (``beside=``).

``native_worker.py mixed``: rank 0 on the CPU emulator (native, sends by reference), rank 1 on
an OpenCL device (Python path): rank 1 reads rank 0's descriptors piece by piece.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from typing import Any

import numpy as np

import hal
import hal.comm
from hal.comm._algorithms import split

#: how the native engine ran the calls of the last run (NativeShmTransport.native_counts)
COUNTS: dict[str, int] = {}
DTYPES = ("float32", "float64", "int32", "int64", "int8", "uint8", "float16", "bfloat16")
OPS = ("sum", "prod", "max", "min", "avg")


def say(line: str) -> None:
    """Print ``line`` with one write (ranks share the launcher's stdout)."""
    os.write(1, (line + "\n").encode())


def _data(rank: int, case: int, n: int, dtype: Any, op: str) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng([77, rank, case])
    if dtype.kind == "f" or dtype.name == "bfloat16":
        if op == "prod":
            return rng.uniform(0.5, 1.5, n).astype(dtype)
        return rng.standard_normal(n).astype(dtype)
    if op == "prod":
        return rng.integers(1, 3, n).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), n, endpoint=True).astype(dtype)


def compare(sizes: list[int], names: tuple[str, ...]) -> int:
    """Run the matrix with the native engine, then on the Python path; compare the results."""
    os.environ["HAL_COMM_NATIVE"] = "1"
    fast, fast_engines = run(sizes, names)
    counts = dict(COUNTS)
    os.environ["HAL_COMM_NATIVE"] = "0"
    slow, slow_engines = run(sizes, names)
    rank = int(os.environ["HAL_RANK"])
    if fast_engines != {"native"} or slow_engines != {"python"}:
        say(f"rank {rank}: engines {fast_engines} with the native engine, {slow_engines} without")
        return 1
    # every call of a dtype the C reducers have runs whole (one C call): no step from Python;
    # float16/bfloat16 reductions widen to float32 on the Python path, one C call per step
    halves = {"float16", "bfloat16"} & set(names)
    if not counts.get("program") or (not halves and counts.get("step")):
        say(f"rank {rank}: the native engine ran {counts} (whole programs expected, no steps)")
        return 1
    if sorted(fast) != sorted(slow) or not fast:
        say(f"rank {rank}: different result sets")
        return 1
    differ = [k for k in fast if not np.array_equal(fast[k], slow[k])]
    if differ:
        say(f"rank {rank}: the native engine differs from the Python path in {differ[:10]}")
        return 1
    say(f"OK {len(fast)} engines=native/python rank={rank} native={counts}")
    return 0


def run(
    sizes: list[int], names: tuple[str, ...]
) -> tuple[dict[str, np.ndarray[Any, Any]], set[str]]:
    """Run the matrix on a new communicator; return every result's bytes and the plans' engines."""
    from hal.comm._ops import DTYPES as ALL

    dtypes = {dt.name: dt for dt in ALL}
    comm = hal.comm.init()
    p, r, dev = comm.size, comm.rank, comm.device
    s = dev.create_stream()
    results: dict[str, np.ndarray[Any, Any]] = {}
    engines: set[str] = set()
    case = 0

    def put(x: np.ndarray[Any, Any]) -> hal.Array:
        return hal.asarray(x, device=dev)

    def keep(label: str, arr: hal.Array, work: Any) -> None:
        engines.add(work.plan.engine)
        results[label] = arr.to_host(stream=s).reshape(-1).view(np.uint8).copy()

    for n in sizes:
        for name in names:
            dt = dtypes[name]
            for inplace in (False, True):
                how = "in" if inplace else "out"
                for op in OPS:
                    case += 1
                    for coll, out_n in (("all_reduce", n), ("reduce_scatter", split(n, p)[r][1])):
                        if coll == "reduce_scatter":
                            case += 1
                        x = put(_data(r, case, n, dt, op))
                        y = x if inplace else put(np.zeros(out_n, dt))
                        args = (x,) if inplace else (x, y)
                        w = getattr(comm, coll)(*args, op=op, stream=s)
                        w.wait()
                        keep(f"{coll} {n} {name} {op} {how}", y, w)
                    case += 1
                    root = case % p
                    x = put(_data(r, case, n, dt, op))
                    w = comm.reduce(x, op=op, root=root, stream=s)
                    w.wait()
                    if r == root:
                        keep(f"reduce {n} {name} {op} {how}", x, w)
                case += 1
                x = put(_data(r, case, n, dt, "sum"))
                if inplace:
                    buf = np.zeros(n * p, dt)
                    buf[r * n : (r + 1) * n] = _data(r, case, n, dt, "sum")
                    y = put(buf)
                    w = comm.all_gather(None, y, stream=s)
                else:
                    y = put(np.zeros(n * p, dt))
                    w = comm.all_gather(x, y, stream=s)
                w.wait()
                keep(f"all_gather {n} {name} {how}", y, w)
                case += 1
                root = case % p
                x = put(_data(r, case, n, dt, "sum"))
                if inplace:
                    w = comm.broadcast(x, root=root, stream=s)
                    w.wait()
                    keep(f"broadcast {n} {name} {how}", x, w)
                else:
                    y = put(np.zeros(n, dt))
                    w = comm.broadcast(x, y, root=root, stream=s)
                    w.wait()
                    keep(f"broadcast {n} {name} {how}", y, w)
                    # the root copies its input to its output beside its sends: the input stays
                    keep(f"broadcast {n} {name} {how} input", x, w)
    transport = comm._engines[0].transport
    COUNTS.clear()
    if hasattr(transport, "native_counts"):
        COUNTS.update(transport.native_counts())
    comm.close()
    return results, engines


def die(coll: str = "all_reduce") -> int:
    """The last rank exits in the middle of a run of large ``coll`` calls; the others report their errors."""
    comm = hal.comm.init()
    dev = comm.device
    s = dev.create_stream()
    x = hal.asarray(np.ones(4 << 20, np.float32), device=dev)
    if coll == "all_gather":
        call = lambda: comm.all_gather(None, x, stream=s)  # noqa: E731
    elif coll == "broadcast":
        call = lambda: comm.broadcast(x, root=0, stream=s)  # noqa: E731
    elif coll == "broadcast_out":  # out of place: the root copies to its output beside its sends
        y = hal.asarray(np.zeros(4 << 20, np.float32), device=dev)
        call = lambda: comm.broadcast(x, y, root=0, stream=s)  # noqa: E731
    else:
        call = lambda: getattr(comm, coll)(x, stream=s)  # noqa: E731
    w = call()
    w.wait()
    counts = comm._engines[0].transport.native_counts()
    say(f"rank {comm.rank} engine={w.plan.engine} whole={counts['program'] + counts['small']}")
    if comm.rank == comm.size - 1:
        threading.Timer(0.05, os._exit, (0,)).start()
    try:
        for i in range(100000):  # noqa: B007 - i is reported below
            call().wait()
    except hal.CommError as exc:
        say(f"rank {comm.rank} CommError at call {i} op={exc.op} ranks={exc.ranks}: {exc}")
        return 0
    return 1


def mismatch() -> int:
    """Every rank calls a large all_gather of another count; print the CommError each gets."""
    comm = hal.comm.init()
    dev = comm.device
    s = dev.create_stream()
    n = (1 << 20) + 1024 * comm.rank
    x = hal.asarray(np.ones(n, np.float32), device=dev)
    y = hal.asarray(np.zeros(comm.size * n, np.float32), device=dev)
    try:
        comm.all_gather(x, y, stream=s).wait()
    except hal.CommError as exc:
        say(f"rank {comm.rank} CommError ranks={exc.ranks}: {exc}")
        return 0
    return 1


def barrier() -> int:
    """Barriers run whole in the native engine (one C call of signatures); a barrier against
    another collective is a mismatch on every rank. Prints ``OK barrier small=<calls>`` and the
    CommError each rank gets."""
    comm = hal.comm.init()
    s = comm.device.create_stream()
    tr = comm._engines[0].transport
    before = tr.native_counts()["small"]
    for _ in range(5):
        comm.barrier().wait()
    say(f"OK barrier rank={comm.rank} small={tr.native_counts()['small'] - before}")
    x = hal.asarray(np.ones(4, np.float32), device=comm.device)
    try:
        (comm.barrier() if comm.rank == 0 else comm.all_reduce(x, stream=s)).wait()
    except hal.CommError as exc:
        say(f"rank {comm.rank} CommError ranks={exc.ranks}: {exc}")
        return 0
    return 1


def awake() -> int:
    """Rank 1 watches rank 0 wait for it: prints how often rank 0 was in a C call and asleep.

    After a first all_reduce, rank 1 sleeps in Python while rank 0 waits inside the next one; rank
    1 reads rank 0's doorbell page (mapped in every rank: its in-call word at 192, its count of
    futex sleepers at 64) 40 times, then joins the call. Both print their own words after it:
    not in a call, and the time they left the last one (CLOCK_MONOTONIC, as time.monotonic_ns).
    """
    comm = hal.comm.init()
    s = comm.device.create_stream()
    x = hal.asarray(np.ones(1024, np.float32), device=comm.device)
    comm.all_reduce(x, stream=s).wait()
    nat = comm._engines[0].transport._native
    me = int(nat.bell_arr[comm.rank])
    if comm.rank == 1:
        peer = int(nat.bell_arr[0])
        in_call = asleep = 0
        time.sleep(0.1)
        for _ in range(40):
            time.sleep(0.005)
            in_call += ctypes.c_uint32.from_address(peer + 192).value == 1
            asleep += ctypes.c_uint32.from_address(peer + 64).value > 0
        say(f"rank 1 saw rank 0 in_call={in_call} asleep={asleep} of 40")
    before = time.monotonic_ns()
    comm.all_reduce(x, stream=s).wait()
    after = time.monotonic_ns()
    left = ctypes.c_int64.from_address(me + 200).value
    word = ctypes.c_uint32.from_address(me + 192).value
    say(f"rank {comm.rank} after: in_call={word} left_in_call={before <= left <= after}")
    comm.close()
    return 0


def gather(sizes: list[int]) -> int:
    """all_gather in place, out of place and mixed across ranks: native against the Python path."""
    got: dict[str, dict[str, np.ndarray[Any, Any]]] = {}
    counts: dict[str, int] = {}
    copies = beside = 0
    r = int(os.environ["HAL_RANK"])
    for native in ("1", "0"):
        os.environ["HAL_COMM_NATIVE"] = native
        comm = hal.comm.init()
        p, dev = comm.size, comm.device
        s = dev.create_stream()
        res = got.setdefault(native, {})
        for n in sizes:
            want = np.concatenate(
                [
                    np.random.default_rng([5, q, n]).standard_normal(n).astype(np.float32)
                    for q in range(p)
                ]
            )
            mine = want[r * n : (r + 1) * n]
            for how in ("in", "out", "mixed"):
                inplace = how == "in" or (how == "mixed" and r % 2 == 0)
                for again in range(2):
                    buf = np.zeros(n * p, np.float32)
                    if inplace:
                        buf[r * n : (r + 1) * n] = mine
                    y = hal.asarray(buf, device=dev)
                    x = None if inplace else hal.asarray(mine, device=dev)
                    w = comm.all_gather(x, y, stream=s)
                    w.wait()
                    if w.plan.engine != ("native" if native == "1" else "python"):
                        say(
                            f"rank {r}: all_gather ran on {w.plan.engine} with HAL_COMM_NATIVE={native}"
                        )
                        return 1
                    out = y.to_host(stream=s)
                    if not np.array_equal(out.view(np.uint8), want.view(np.uint8)):
                        say(f"rank {r}: all_gather {n} {how} differs (HAL_COMM_NATIVE={native})")
                        return 1
                    res[f"{n} {how} {again}"] = out.view(np.uint8).copy()
        if native == "1":
            tr = comm._engines[0].transport
            counts = tr.native_counts()
            # the kept programs' whole local copies (COPY actions) and copies beside a step
            progs = tr._native.progs.values()
            copies = sum(a[0] == 3 for v in progs for a in v[1])
            beside = sum(x[5] == -1 for v in progs for x in v[3])
        comm.close()
    differ = [k for k in got["1"] if not np.array_equal(got["1"][k], got["0"][k])]
    if differ or sorted(got["1"]) != sorted(got["0"]):
        say(f"rank {r}: the native engine differs from the Python path in {differ[:10]}")
        return 1
    say(
        f"OK gather {len(got['1'])} engines=native/python rank={r} native={counts} "
        f"copies={copies} beside={beside}"
    )
    return 0


def either(sizes: list[int]) -> int:
    """2 ranks, all_gathers, reduce_scatters and broadcasts (each rank the root in turn) in
    place and out of place repeated on the same arrays (prepared both ways: through the slots and
    by reference, hal.comm._shm's _Either): first each rank picks its way by rank 0's timing
    (the first calls look at both; a broadcast's root leads, its receiver runs the program by
    reference, which takes a piece either way), then rank 0 always sends by reference and rank 1
    always through the slots. ``sizes``: elements of one rank's message. Every call's result is
    compared bit for bit with the expected bytes (the arrays reset before each call); prints
    ``OK either`` with how many prepared calls ran each way."""
    from hal.comm import _shm

    r = int(os.environ["HAL_RANK"])
    comm = hal.comm.init()
    p, dev = comm.size, comm.device
    s = dev.create_stream()
    tr = comm._engines[0].transport
    ran = []
    for way in (None, 1 - r % 2):
        _shm._Either.way = way
        for n in sizes:
            parts = [
                np.random.default_rng([9, q, n]).integers(-64, 64, n * p).astype(np.float32)
                for q in range(p)
            ]
            calls = [("ag", True, 0), ("ag", False, 0), ("rs", True, 0), ("rs", False, 0)]
            calls += [("bc", inplace, root) for inplace in (True, False) for root in range(p)]
            for op, inplace, root in calls:
                mine = parts[r][:n]
                if op == "bc":  # the root's message (in place: in y; out of place: from x)
                    want = parts[root][:n]
                    buf = want.copy() if r == root and inplace else np.zeros(n, np.float32)
                elif op == "ag":
                    want = np.concatenate([parts[q][:n] for q in range(p)])
                    buf = np.zeros(n * p, np.float32)
                    if inplace:
                        buf[r * n : (r + 1) * n] = mine
                else:  # small integers: the sums are exact in any order
                    want = sum(parts)[r * n : (r + 1) * n]
                    buf = parts[r].copy()
                y = hal.asarray(buf, device=dev)
                x = None
                if not inplace:
                    x = hal.asarray(mine if op != "rs" else np.zeros(n, np.float32), device=dev)
                before = tr.native_counts()
                for k in range(2 * (_shm._Either.warm + _shm._Either.look) + 3):
                    if k == 2:  # the first two calls are not prepared yet (they run as a program)
                        before = tr.native_counts()
                    hal.copy(y, buf, stream=s)
                    if op == "bc":
                        if inplace:
                            comm.broadcast(y, root=root, stream=s).wait()
                        else:
                            comm.broadcast(x, y, root=root, stream=s).wait()
                        got = y.to_host(stream=s)
                    elif op == "ag":
                        comm.all_gather(x, y, stream=s).wait()
                        got = y.to_host(stream=s)
                    else:
                        comm.reduce_scatter(y, x, stream=s).wait()
                        got = (
                            y.to_host(stream=s)[r * n : (r + 1) * n]
                            if x is None
                            else x.to_host(stream=s)
                        )
                    if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
                        say(f"rank {r}: {op} {n} in place {inplace} call {k} differs (way {way})")
                        return 1
                after = tr.native_counts()
                slots, ref = after["small"] - before["small"], after["program"] - before["program"]
                if op == "rs":  # both ways are programs: count the calls by reference instead
                    ref = after.get("either_ref", 0) - before.get("either_ref", 0)
                    slots = after["program"] - before["program"] - ref
                tag = f"{op}{n}{'i' if inplace else 'o'}" + (f"r{root}" if op == "bc" else "")
                ran.append(f"{tag}:{way}:slots={slots}:ref={ref}")
                for a in (x, y):
                    if a is not None:
                        a.close()
    comm.close()
    _shm._Either.way = None
    say(f"OK either rank={r} " + " ".join(ran))
    return 0


def written(n: int) -> int:
    """2 ranks, broadcasts (each rank the root in turn) and in-place all_gathers of ``n`` float32
    elements per message, in rounds, with the senders of shared messages writing their cells
    into the receivers' destinations (``write_ok`` 1), with writes after each C call's first
    failing in the kernel (2: the claim goes back, the receiver reads it), and without writes
    (0). A sender writes only when it runs while the receiver still reads (a loaded machine may
    not run it in time), so modes 1 and 2 repeat rounds, up to 400, until some rank wrote (1) or
    had a write fail (2), which the ranks agree on after each round; mode 0 runs 5. Every result
    is compared bit for bit with the expected bytes; prints ``OK written`` with the bytes this
    rank wrote, its ``write_ok`` after each mode and the rounds run."""
    r = int(os.environ["HAL_RANK"])
    comm = hal.comm.init()
    p, dev = comm.size, comm.device
    s = dev.create_stream()
    tr = comm._engines[0].transport
    ctx = tr._native.ctx
    modes = []
    for mode in (1, 2, 0):
        ctx.write_ok = mode
        before = tr.native_counts()["written"]
        rounds = 0
        while rounds < (5 if mode == 0 else 400):
            k = rounds
            rounds += 1
            for root in range(p):
                want = np.random.default_rng([5, mode, k, root]).standard_normal(n)
                want = want.astype(np.float32)
                x = hal.asarray(want if r == root else np.zeros(n, np.float32), device=dev)
                comm.broadcast(x, root=root, stream=s).wait()
                if not np.array_equal(x.to_host(stream=s).view(np.uint8), want.view(np.uint8)):
                    say(f"rank {r}: broadcast from {root} differs (write_ok {mode}, call {k})")
                    return 1
                x.close()
            parts = [
                np.random.default_rng([6, mode, k, q]).standard_normal(n).astype(np.float32)
                for q in range(p)
            ]
            buf = np.zeros(n * p, np.float32)
            buf[r * n : (r + 1) * n] = parts[r]
            y = hal.asarray(buf, device=dev)
            comm.all_gather(None, y, stream=s).wait()
            if not np.array_equal(
                y.to_host(stream=s).view(np.uint8), np.concatenate(parts).view(np.uint8)
            ):
                say(f"rank {r}: all_gather differs (write_ok {mode}, call {k})")
                return 1
            y.close()
            if mode:  # seen on some rank: the bytes written (1), a write refused (2)
                seen = tr.native_counts()["written"] > before if mode == 1 else not ctx.write_ok
                flag = hal.asarray(np.array([int(seen)], np.int32), device=dev)
                comm.all_reduce(flag, op="max", stream=s).wait()
                done = bool(flag.to_host(stream=s)[0])
                flag.close()
                if done and rounds >= 5:
                    break
        written = tr.native_counts()["written"] - before
        modes.append(f"{mode}:{written}:{int(ctx.write_ok)}:{rounds}")
    comm.close()
    say(f"OK written rank={r} " + " ".join(modes))
    return 0


def mixed() -> int:
    """Rank 1 reads rank 0's large messages sent by reference on the Python path.

    Rank 1's data lives on an OpenCL device (memory the host cannot reach: its steps run on the
    Python path, staged through the host) while rank 0's runs natively on the CPU emulator and
    sends by reference: rank 1 reads rank 0's descriptors (one per message, or one per piece)
    piece by piece. Prints ``OK mixed`` with the rank's native counts.
    """
    r = int(os.environ["HAL_RANK"])
    dev = hal.devices("cpu")[0] if r == 0 else hal.devices("opencl")[0]
    comm = hal.comm.init(device=dev)
    s = dev.create_stream()
    n = 50_001  # float32 elements per rank: many 4 KiB pieces, an odd size
    mine = np.arange(n, dtype=np.float32) * (r + 1)
    y = hal.asarray(np.zeros(2 * n, np.float32), device=dev)
    comm.all_gather(hal.asarray(mine, device=dev), y, stream=s).wait()
    want = np.concatenate([np.arange(n, dtype=np.float32) * (q + 1) for q in range(2)])
    if not np.array_equal(y.to_host(stream=s), want):
        say(f"rank {r}: all_gather differs")
        return 1
    x = hal.asarray(mine, device=dev)
    comm.all_reduce(x, stream=s).wait()
    if not np.array_equal(x.to_host(stream=s), np.arange(n, dtype=np.float32) * 3):
        say(f"rank {r}: all_reduce differs")
        return 1
    counts = comm._engines[0].transport.native_counts()
    say(f"OK mixed rank={r} native={counts}")
    comm.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "mixed":
        sys.exit(mixed())
    if sys.argv[1] == "written":
        sys.exit(written(int(sys.argv[2])))
    if sys.argv[1] == "either":
        sys.exit(either([int(v) for v in sys.argv[2].split(",")]))
    if sys.argv[1] == "gather":
        sys.exit(gather([int(v) for v in sys.argv[2].split(",")]))
    if sys.argv[1] == "barrier":
        sys.exit(barrier())
    if sys.argv[1] == "awake":
        sys.exit(awake())
    if sys.argv[1] == "mismatch":
        sys.exit(mismatch())
    if sys.argv[1] == "compare":
        names = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else DTYPES
        sys.exit(compare([int(v) for v in sys.argv[2].split(",")], names))
    sys.exit(die(*sys.argv[2:3]))
