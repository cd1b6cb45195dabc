"""The native engine of the shared-memory transport (hal.comm._native) against the Python path.

Each comparison runs the same collectives twice under ``hal run``, with the native engine and
with ``HAL_COMM_NATIVE=0``, and compares every result bit for bit (the algorithms, and so the
order of the reductions, are the same; only who moves and reduces the bytes differs).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hal.comm import _native

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comm_launch import hal_run  # noqa: E402

WORKER = str(HERE / "native_worker.py")

pytestmark = pytest.mark.skipif(
    _native.load() is None, reason="the native engine cannot be built here (no C compiler)"
)


def _compare(ranks: int, sizes: str, env: dict[str, str], dtypes: str = "") -> None:
    proc = hal_run(ranks, [WORKER, "compare", sizes, *([dtypes] if dtypes else [])], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("engines=native/python") == ranks, proc.stdout + proc.stderr


def test_native_equals_python_2_ranks() -> None:
    """2 ranks, the planner's choices, odd sizes, every dtype and op (in place and out of place)."""
    _compare(2, "13,1001", {})


def test_native_equals_python_2_ranks_halves() -> None:
    """2 ranks, calls of 512 KiB to 2 MiB (the planner cuts them in two halves: the native
    engine's piece_for; a broadcast stays one piece) at an odd size, beside one under 512 KiB
    (uint8: one piece)."""
    _compare(2, "196613", {}, "float32,uint8")


def test_native_equals_python_2_ranks_broadcast_through_the_slots() -> None:
    """2 ranks, calls of 1 MiB + 12 B (float32): the broadcast's message goes through the slots in
    two pieces (a program; never by reference up to NativeShmTransport.bcast_slot_bytes), the
    other collectives' as the planner says; reduce_scatter and all_reduce copy their slot
    messages in before they check the peer's signature (POST)."""
    _compare(2, "262147", {}, "float32,uint8")


def test_native_equals_python_3_ranks_pipelined() -> None:
    """3 ranks, every collective on the ring (out-of-place reduction into the destination), many pieces."""
    env = {
        "HAL_COMM_ALGO": "all_reduce:ring,broadcast:scatter_allgather,reduce:reduce_scatter_gather",
        "HAL_COMM_CHUNK_BYTES": "4K",
        "HAL_COMM_SHM_SLOTS": "2",
        "HAL_COMM_CMA_BYTES": "0",  # every piece through the slots
    }
    _compare(3, "5003", env, "float32,float64,int32,int64,int8,uint8")


def test_native_equals_python_4_ranks() -> None:
    """4 ranks: Rabenseifner's all_reduce, recursive-doubling all_gather, tree broadcast and reduce."""
    env = {
        "HAL_COMM_ALGO": "all_reduce:rabenseifner,all_gather:recursive_doubling,broadcast:tree,reduce:tree",
        "HAL_COMM_CHUNK_BYTES": "8K",
    }
    _compare(4, "4099", env, "float32,int32,uint8,bfloat16")


def test_native_equals_python_2_ranks_pipelined() -> None:
    """2 ranks, messages of many pieces (4 KiB, 2 slots): every collective runs whole as one program;
    messages of 8 KiB and more are sent by reference (read from the sender's memory)."""
    env = {
        "HAL_COMM_ALGO": "broadcast:scatter_allgather",
        "HAL_COMM_CHUNK_BYTES": "4K",
        "HAL_COMM_SHM_SLOTS": "2",
        "HAL_COMM_CMA_BYTES": "8K",
    }
    _compare(2, "6007", env, "float32,int64,uint8")


@pytest.mark.parametrize("whole", ["1", "0"])
def test_native_equals_python_by_reference_odd_sizes(whole: str) -> None:
    """3 ranks, odd message sizes of many pieces sent by reference: in one descriptor per message
    (read whole, or reduced piece by piece; HAL_COMM_CMA_WHOLE=1) and in one per piece (0)."""
    env = {
        "HAL_COMM_ALGO": "all_reduce:ring,broadcast:tree,reduce:reduce_scatter_gather",
        "HAL_COMM_CHUNK_BYTES": "4K",
        "HAL_COMM_SHM_SLOTS": "2",
        "HAL_COMM_CMA_BYTES": "4K",
        "HAL_COMM_CMA_WHOLE": whole,
    }
    _compare(3, "7777,20011", env, "float32,int8")


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_native_equals_python_all_gather_in_place_by_reference(ranks: int) -> None:
    """all_gather in place, out of place, and mixed (the even ranks in place, the odd ones out of
    place), each twice (the second prepared), bit for bit against HAL_COMM_NATIVE=0 and the
    expected bytes: on 2 ranks one-piece messages of 256-512 KiB through the slots (one-piece
    actions), and 1 MiB + 12 B, a message of two pieces sent by reference (a program)."""
    sizes = "65535,65536,131072,131075,262147"  # float32: < 256 KiB, 256 KiB, 512 KiB (+12 B), 1 MiB + 12 B
    proc = hal_run(ranks, [WORKER, "gather", sizes], {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK gather 30 engines=native/python") == ranks, (
        proc.stdout + proc.stderr
    )
    if ranks == 2:  # both kinds of whole native calls ran
        for line in proc.stdout.splitlines():
            if line.startswith("OK gather"):
                assert "'program': 0" not in line and "'small': 0" not in line, proc.stdout


def test_native_repeated_calls_run_either_way_by_timing() -> None:
    """2 ranks, all_gathers (one-piece messages), reduce_scatters and broadcasts (one piece,
    each rank the root in turn), in place and out of place, of 256 KiB and 512 KiB messages
    repeated on the same arrays: the first prepared calls run through the slots and by reference
    (rank 0 looks, rank 1 follows; a broadcast's root looks, its receiver runs the program that
    takes a piece either way), then the faster; with the ranks forced apart (rank 0 by
    reference, rank 1 through the slots) every call still delivers the expected bytes. Each rank
    ran both ways when free, only its own way when forced. A broadcast of 256 KiB is below
    ``either_bcast_bytes``: through the slots only."""
    proc = hal_run(2, [WORKER, "either", "65536,131072"], {})  # 256 and 512 KiB messages
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("OK either")]
    assert len(lines) == 2, proc.stdout + proc.stderr
    for line in lines:
        r = int(line.split("rank=")[1].split()[0])
        for item in line.split()[3:]:
            tag, way, slots, ref = item.split(":")
            slots_n, ref_n = int(slots.split("=")[1]), int(ref.split("=")[1])
            if tag.startswith("bc65536"):  # one way: through the slots
                assert (slots_n > 0, ref_n) == (True, 0), line
                continue
            if tag.startswith("bc") and not tag.endswith(f"r{r}"):  # the receiver: its program
                assert (slots_n, ref_n > 0) == (0, True), line
                continue
            if way == "None":
                assert slots_n >= 3 and ref_n >= 3, line
            else:
                assert int(way) == 1 - r % 2, line
                assert (
                    (slots_n, ref_n > 0) == (0, True)
                    if way == "1"
                    else (slots_n > 0, ref_n) == (True, 0)
                ), line


@pytest.mark.parametrize("ranks", [2, 3])
def test_native_all_gather_out_of_place_copies_beside_the_step(ranks: int) -> None:
    """An out-of-place all_gather of 8 MiB + 12 B per rank (a program; the message by reference)
    copies the rank's input into its output beside the first step, whose send reads the input
    (hal.comm._shm's _copy_into_step), with non-temporal stores (4 MiB and more; the odd size
    puts rank 1's part off the vector alignment): in place, out of place and mixed, each twice,
    bit for bit against HAL_COMM_NATIVE=0 and the expected bytes; no program kept a whole local
    copy, and the out-of-place ones copy beside a step."""
    proc = hal_run(ranks, [WORKER, "gather", "2097155"], {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [
        x for x in proc.stdout.splitlines() if x.startswith("OK gather 6 engines=native/python")
    ]
    assert len(lines) == ranks, proc.stdout + proc.stderr
    for line in lines:
        assert "'program': 0" not in line and "copies=0 " in line, line
        assert "beside=0" not in line, line


@pytest.mark.parametrize(("cma", "reduce"), [("8K", "0"), ("0", "8K"), ("64K", "8K"), ("8K", "")])
def test_native_equals_python_reductions_by_reference_or_not(cma: str, reduce: str) -> None:
    """3 ranks, rings of many pieces: the messages a receiver reduces go by reference from
    HAL_COMM_CMA_REDUCE_BYTES, the copies from HAL_COMM_CMA_BYTES (in one call, some of each way;
    unset: the reductions follow HAL_COMM_CMA_BYTES where it is set)."""
    env = {
        "HAL_COMM_ALGO": "all_reduce:ring,broadcast:scatter_allgather,reduce:reduce_scatter_gather",
        "HAL_COMM_CHUNK_BYTES": "4K",
        "HAL_COMM_SHM_SLOTS": "2",
        "HAL_COMM_CMA_BYTES": cma,
        "HAL_COMM_CMA_REDUCE_BYTES": reduce,
    }
    _compare(3, "5003,40009", env, "float32,int8")


@pytest.mark.parametrize(
    ("ranks", "cell", "algo"),
    [
        (2, "256", "broadcast:tree"),
        (3, "1K", "all_reduce:ring,broadcast:tree,reduce:reduce_scatter_gather"),
        (
            4,
            "768",
            "all_reduce:rabenseifner,all_gather:recursive_doubling,broadcast:tree,reduce:tree",
        ),
        (2, "0", "broadcast:tree"),
    ],
)
def test_native_equals_python_shared_messages(ranks: int, cell: str, algo: str) -> None:
    """Messages sent by reference and shared (HAL_COMM_CELL_BYTES): the sender copies cells from
    the front through the slots while the receiver reads from the back, copies and reductions
    (HAL_COMM_CMA_REDUCE_BYTES), odd sizes whose last cell is short; 0: never shared."""
    env = {
        "HAL_COMM_ALGO": algo,
        "HAL_COMM_CHUNK_BYTES": "4K",
        "HAL_COMM_SHM_SLOTS": "3",
        "HAL_COMM_CMA_BYTES": "2K",
        "HAL_COMM_CMA_REDUCE_BYTES": "2K",
        "HAL_COMM_CELL_BYTES": cell,
    }
    _compare(ranks, "3001,50021", env, "float32,int8,float64")


def test_shared_messages_are_written_into_the_receivers_destination() -> None:
    """A shared message the receiver copies (broadcast, all_gather): its sender writes cells
    straight into the receiver's destination (process_vm_writev), a write that fails in the
    kernel gives its claim back (the receiver reads that part) and stops the writes, and
    without writes the cells go through the slots; every result bit for bit, each way. (The
    worker repeats its rounds until the writes and the failed write were seen: a sender writes
    only when it runs while its receiver still reads.)"""
    env = {
        "HAL_COMM_CMA_BYTES": "64K",
        "HAL_COMM_CELL_BYTES": "16K",
        "HAL_COMM_CHUNK_BYTES": "64K",
    }
    proc = hal_run(2, [WORKER, "written", "300001"], env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = [ln.split()[3:] for ln in proc.stdout.splitlines() if ln.startswith("OK written")]
    assert len(lines) == 2, out
    modes = [[tuple(int(v) for v in m.split(":")) for m in ln] for ln in lines]
    # the ranks ran the same rounds (they agree when to stop)
    assert [m[3] for m in modes[0]] == [m[3] for m in modes[1]], out
    # write_ok 1: the ranks wrote cells (each is a root, and a sender of the all_gathers)
    assert sum(rank[0][1] for rank in modes) > 0, out
    assert all(rank[0][2] == 1 for rank in modes), out
    # write_ok 2: a rank that wrote more than once per C call had the kernel refuse (EFAULT),
    # gave the claim back and stopped writing (0); the bytes are right either way (above)
    assert all(rank[1][2] in (0, 2) for rank in modes), out
    assert any(rank[1][2] == 0 for rank in modes), out
    # write_ok 0: nothing written
    assert all(rank[2][1] == 0 for rank in modes), out


@pytest.mark.parametrize(
    "name", ["HAL_COMM_CMA_REDUCE_BYTES", "HAL_COMM_CELL_BYTES", "HAL_COMM_YIELD_US"]
)
def test_bad_engine_size_is_a_config_error(name: str) -> None:
    """A bad HAL_COMM_CMA_REDUCE_BYTES, HAL_COMM_CELL_BYTES or HAL_COMM_YIELD_US stops
    hal.comm.init with a ConfigError naming the variable and the value."""
    proc = hal_run(2, [WORKER, "compare", "13"], {name: "lots"})
    assert proc.returncode != 0
    assert f"ConfigError: {name}='lots'" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("whole", ["1", "0"])
def test_python_path_reads_messages_sent_by_reference(whole: str) -> None:
    """Rank 1's data on an OpenCL device (its steps on the Python path, staged through the host),
    rank 0's natively on the CPU emulator: rank 1 reads rank 0's messages sent by reference piece
    by piece, one descriptor per message (HAL_COMM_CMA_WHOLE=1) or one per piece (0)."""
    if not _opencl():
        pytest.skip("no OpenCL device (PoCL) here")
    env = {
        "HAL_BACKENDS": "cpu,opencl",
        "HAL_COMM_CHUNK_BYTES": "4K",
        "HAL_COMM_CMA_BYTES": "8K",
        "HAL_COMM_CMA_WHOLE": whole,
    }
    proc = hal_run(2, [WORKER, "mixed"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK mixed") == 2, proc.stdout + proc.stderr


def _opencl() -> bool:
    import hal

    try:
        return bool(hal.devices("opencl"))
    except hal.HalError:
        return False


def test_native_equals_python_4_ranks_ring_pipelined() -> None:
    """4 ranks on rings of many pieces (wrapping rings, out-of-place reduction into the destination)."""
    env = {
        "HAL_COMM_ALGO": "all_reduce:ring,all_gather:ring,broadcast:tree,reduce:reduce_scatter_gather",
        "HAL_COMM_CHUNK_BYTES": "4K",
        "HAL_COMM_SHM_SLOTS": "3",
        "HAL_COMM_CMA_BYTES": "8K",  # by reference from 8 KiB
    }
    _compare(4, "9001", env, "float32,float64,int8")


@pytest.mark.parametrize(
    ("ranks", "coll"),
    [
        (2, "all_reduce"),
        (2, "all_gather"),
        (2, "reduce_scatter"),
        (2, "broadcast"),
        (3, "all_reduce"),
        (2, "all_gather:cma=0"),
        (2, "broadcast:whole=0"),
        (2, "reduce_scatter:reduce=64K"),
        (2, "broadcast:cells=0"),
        (2, "broadcast:out"),
        (2, "all_gather:yield"),
        (2, "reduce_scatter:yield"),
    ],
)
def test_a_rank_killed_mid_collective_is_named(ranks: int, coll: str) -> None:
    """The last rank exits inside a run of 16 MiB calls of 64 KiB pieces, each one native program:
    rank 0 (its ring neighbour) gets a CommError naming it and the operation, not a hang. By
    default the copies go by reference in one descriptor each (the dying rank's memory is
    read in one process_vm_readv) and the messages reduced (under 16 MiB) through the slots;
    ``cma=0`` sends every piece through the slots, ``whole=0`` one descriptor per piece,
    ``reduce=64K`` the reduced messages by reference too. Messages by reference are shared (the
    sender also copies cells of it through the slots) unless ``cells=0``; ``out``: out of place
    (the root copies its input to its output beside its sends); ``yield``: the ranks keep polling
    (with sched_yield) for as long as a peer is awake (HAL_COMM_YIELD_US=10 s), and the dying rank
    leaves its in-call word set, so rank 0 never sleeps: it still returns to check its peers."""
    env = {"HAL_COMM_CHUNK_BYTES": "64K", "HAL_COMM_TIMEOUT_MS": "120000"}
    coll, _, how = coll.partition(":")
    if how == "cma=0":
        env["HAL_COMM_CMA_BYTES"] = "0"
    elif how == "whole=0":
        env["HAL_COMM_CMA_WHOLE"] = "0"
    elif how == "reduce=64K":
        env["HAL_COMM_CMA_REDUCE_BYTES"] = "64K"
    elif how == "cells=0":
        env["HAL_COMM_CELL_BYTES"] = "0"
    elif how == "yield":
        env["HAL_COMM_YIELD_US"] = "10000000"
    worker_coll = f"{coll}_out" if how == "out" else coll
    if ranks > 2:
        env["HAL_COMM_ALGO"] = f"{coll}:ring"
    proc = hal_run(ranks, [WORKER, "die", worker_coll], env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("engine=native whole=1") == ranks, proc.stdout + proc.stderr
    line = next((x for x in proc.stdout.splitlines() if x.startswith("rank 0 CommError")), "")
    assert f"op={coll} ranks=({ranks - 1},)" in line and "died" in line, proc.stdout + proc.stderr


@pytest.mark.parametrize("cma", ["", "0"])
def test_a_mismatch_of_large_messages_is_named_on_every_rank(cma: str) -> None:
    """The ranks post their large sends by reference (or copy them into the slots that are free:
    HAL_COMM_CMA_BYTES=0) before they check their peers' signatures (the native engine's POST);
    a call that differs is still a mismatch on every rank, not a read."""
    proc = hal_run(2, [WORKER, "mismatch"], {"HAL_COMM_CMA_BYTES": cma} if cma else {}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if "CommError" in x]
    assert len(lines) == 2, proc.stdout + proc.stderr
    counts = ("count 1048576 vs 1049600", "count 1049600 vs 1048576")
    assert all("mismatch" in x and any(c in x for c in counts) for x in lines), lines


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_barrier_runs_whole_and_a_mismatch_is_named(ranks: int) -> None:
    """A barrier is its signatures alone, sent to every peer and compared in one C call (the
    order of the Python path); a barrier where a peer calls another collective is a mismatch
    on every rank."""
    proc = hal_run(ranks, [WORKER, "barrier"], {}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in range(ranks):
        assert f"OK barrier rank={r} small=5" in proc.stdout, proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if "CommError" in x]
    assert len(lines) == ranks and all("mismatch" in x for x in lines), proc.stdout + proc.stderr
    assert all("barrier" in x and "all_reduce" in x for x in lines), lines


@pytest.mark.parametrize("yield_us", ["", "10000000"])
def test_a_rank_waiting_for_a_sleeping_peer_sleeps(yield_us: str) -> None:
    """A rank waiting for a peer keeps polling with sched_yield while that peer is awake (in a C
    call of the engine and not asleep, or out of one for less than HAL_COMM_YIELD_US), then
    sleeps on its futex. Rank 1 sleeps in Python (its last call long over) while rank 0 waits
    inside an all_reduce: by default (200 us) rank 0 sleeps on its futex; with
    HAL_COMM_YIELD_US=10 s rank 1 still counts as awake and rank 0 keeps polling, in its C call.
    After a call each rank's in-call word is clear and holds the time it left the call."""
    proc = hal_run(2, [WORKER, "awake"], {"HAL_COMM_YIELD_US": yield_us} if yield_us else {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next((x for x in proc.stdout.splitlines() if x.startswith("rank 1 saw")), "")
    fields = dict(kv.split("=") for kv in line.split()[5:7])
    in_call, asleep = int(fields["in_call"]), int(fields["asleep"])
    if yield_us:
        assert in_call > 20 and asleep < 20, line
    else:
        assert asleep > 20, line
    for r in (0, 1):
        assert f"rank {r} after: in_call=0 left_in_call=True" in proc.stdout, proc.stdout


def test_native_off_is_a_setting() -> None:
    """HAL_COMM_NATIVE=0 is a registered setting: the reason the Python path runs names it."""
    code = "from hal.comm import _native; print(_native.unavailable_reason())"
    env = {**os.environ, "HAL_COMM_NATIVE": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "HAL_COMM_NATIVE=0", (
        proc.stdout + proc.stderr
    )


@pytest.mark.parametrize(
    ("env", "mapped"),
    [({}, True), ({"HAL_COMM_MAP_PEERS": "0"}, False), ({"HAL_CPU_ARENA": "0"}, False)],
    ids=["mapped", "map_peers_0", "arena_0"],
)
def test_messages_by_reference_through_the_peers_mapped_device_memory(
    env: dict[str, str], mapped: bool
) -> None:
    """The CPU emulator's device memory of 64 KiB and more lives in each process's shared arena;
    the ranks map each other's (one region per peer) and move the messages sent by reference
    with memcpy (``mapped`` bytes) instead of cross-memory attach: copies and reductions, shared
    messages whose senders write cells into the receiver's destination, odd sizes, 3 ranks; with
    ``HAL_COMM_MAP_PEERS=0`` or ``HAL_CPU_ARENA=0`` nothing is mapped and the reads go through
    process_vm_readv. Every result bit for bit against the Python path, each way."""
    base = {
        "HAL_COMM_ALGO": "all_reduce:ring,broadcast:tree,reduce:reduce_scatter_gather",
        "HAL_COMM_CHUNK_BYTES": "64K",
        "HAL_COMM_CMA_BYTES": "16K",
        "HAL_COMM_CMA_REDUCE_BYTES": "16K",
        "HAL_COMM_CELL_BYTES": "16K",
    }
    proc = hal_run(3, [WORKER, "compare", "40009,300007"], {**base, **env})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = [ln for ln in proc.stdout.splitlines() if "engines=native/python" in ln]
    assert len(lines) == 3, out
    for line in lines:
        counts = ast.literal_eval(line.split("native=", 1)[1])
        assert counts["peer_maps"] == (2 if mapped else 0), line
        assert (counts["mapped"] > 0) == mapped, line
