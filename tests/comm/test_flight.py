"""Flight recorder (``HAL_COMM_TRACE_FILE`` or the log), ``comm.abort()``, ``comm.shrink()``.

The short ``HAL_COMM_TIMEOUT_MS`` bounds the collectives only: the rendezvous of ``init`` and
``shrink`` waits ``HAL_COMM_INIT_TIMEOUT_MS`` (60 s here), so ranks that start seconds apart
under a loaded machine still meet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hal.comm._flight import FlightRecorder

WORKER = str(Path(__file__).resolve().parent / "flight_worker.py")


def run(n: int, scenario: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``flight_worker.py SCENARIO`` on ``n`` ranks."""
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.update({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1"}, **env)
    return subprocess.run(
        [sys.executable, "-m", "hal", "run", "-n", str(n), WORKER, scenario],
        env=child,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_recorder_keeps_the_last_n_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the last ``capacity`` calls are kept; ``{rank}`` in HAL_COMM_TRACE_FILE is the rank."""
    rec = FlightRecorder(3, capacity=4)
    for seq in range(1, 11):
        e = rec.add(
            **_fields(seq, op="all_reduce", reduce_op="sum", count=4, nbytes=16, algorithm="ring")
        )
        rec.state(e, "running")
        rec.state(e, "done" if seq < 10 else "failed", RuntimeError("boom") if seq == 10 else None)
    got = rec.entries()
    assert [e["seq"] for e in got] == [7, 8, 9, 10]
    assert got[-1]["state"] == "failed" and got[-1]["error"] == "RuntimeError: boom"
    monkeypatch.setenv("HAL_COMM_TRACE_FILE", str(tmp_path / "fr-{rank}.json"))
    path = rec.dump("test")
    assert path == str(tmp_path / "fr-3.json")
    data = json.loads(Path(path).read_text())
    assert data["rank"] == 3 and data["reason"] == "test" and len(data["calls"]) == 4


def _fields(seq: int, **changed: object) -> dict[str, object]:
    """A recorded call's fields: a 1024-element float32 all_gather, with ``changed`` replaced."""
    fields: dict[str, object] = dict(
        seq=seq,
        op="all_gather",
        reduce_op="",
        dtype="float32",
        count=1024,
        nbytes=8192,
        algorithm="recursive_doubling",
        peer=-1,
    )
    fields.update(changed)
    return fields


def test_repeated_calls_are_recorded_like_added_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call recorded by ``again`` (hal.comm's repeated calls) reads back, and dumps, as the same
    dict an ``add``ed running call has: same keys in the same order, its own seq and times, its
    states (running, done, failed with the error, aborted keeping it); the capacity counts both."""
    rec = FlightRecorder(1, capacity=5)
    first = rec.add(**_fields(1), running=True)  # type: ignore[arg-type]
    rec.state(first, "done")
    base = FlightRecorder.entry(**_fields(1), running=True)  # type: ignore[arg-type]
    again = [rec.again(base, seq) for seq in range(2, 8)]
    for r in again[:-2]:
        rec.state(r, "done")
    rec.state(again[-2], "failed", RuntimeError("boom"))
    got = rec.entries()
    assert [e["seq"] for e in got] == [3, 4, 5, 6, 7]  # the oldest two dropped
    assert [e["state"] for e in got] == ["done", "done", "done", "failed", "running"]
    want = rec.add(**_fields(8), running=True)  # type: ignore[arg-type]
    for e in got:
        assert list(e) == list(want)  # the same keys, in the same order
        assert {k: e[k] for k in ("op", "dtype", "count", "nbytes", "algorithm", "peer")} == {
            k: want[k] for k in ("op", "dtype", "count", "nbytes", "algorithm", "peer")
        }
        assert e["submitted"] == e["started"] is not None
    assert all(e["ended"] >= e["started"] and e["error"] is None for e in got[:3])
    assert got[3]["error"] == "RuntimeError: boom" and got[3]["ended"] >= got[3]["started"]
    assert got[4]["ended"] is None and got[4]["error"] is None
    rec.state(again[-2], "aborted")  # a later state keeps the error, as an added entry's does
    assert rec.entries()[-3]["state"] == "aborted"
    assert rec.entries()[-3]["error"] == "RuntimeError: boom"
    assert base["seq"] == 1 and base["state"] == "running"  # the base entry is not changed
    got[0]["state"] = "changed"  # copies: the record is not changed through them
    assert rec.entries()[0]["state"] == "done"
    monkeypatch.setenv("HAL_COMM_TRACE_FILE", str(tmp_path / "fr.json"))
    data = json.loads(Path(str(rec.dump("test"))).read_text())
    assert [(c["seq"], c["state"]) for c in data["calls"]] == [
        (4, "done"), (5, "done"), (6, "aborted"), (7, "running"), (8, "running"),
    ]  # fmt: skip


def test_entries_read_while_calls_are_recorded() -> None:
    """Another thread reads the record while calls are recorded and finished: each read is whole
    (no error, every entry running without an end or done with one, seqs in order)."""
    import threading

    rec = FlightRecorder(0, capacity=8)
    base = FlightRecorder.entry(**_fields(0), running=True)  # type: ignore[arg-type]
    stop = threading.Event()
    seen: list[list[dict[str, object]]] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                seen.append(rec.entries())
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)

    t = threading.Thread(target=read)
    t.start()
    try:
        for seq in range(1, 20001):
            r = rec.again(base, seq)
            rec.state(r, "done")
    finally:
        stop.set()
        t.join()
    assert not failed, failed
    assert seen
    for calls in seen:
        seqs = [c["seq"] for c in calls]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True, seqs
        for c in calls:
            assert (c["state"], c["ended"] is None) in (("running", True), ("done", False)), c


@pytest.mark.parametrize("bad", ["0", "-3", "many"])
def test_bad_capacity_is_rejected(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """HAL_COMM_TRACE_ENTRIES must be a positive integer."""
    monkeypatch.setenv("HAL_COMM_TRACE_ENTRIES", bad)
    with pytest.raises(ValueError, match="HAL_COMM_TRACE_ENTRIES"):
        FlightRecorder(0)


def test_failed_collective_dumps_the_record(tmp_path: Path) -> None:
    """Rank 1 falls behind: rank 0 times out naming rank 1 and writes its record (seq 1 done, 2 failed)."""
    proc = run(
        2,
        "behind",
        {
            "HAL_COMM_TIMEOUT_MS": "1500",
            "HAL_COMM_TRACE_FILE": str(tmp_path / "fr.json"),
            "BEHIND_S": "4",
        },
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 CommError op=all_reduce ranks=(1,)" in proc.stdout
    data = json.loads((tmp_path / "fr.json.rank0").read_text())
    assert [(c["seq"], c["op"], c["state"], c["algorithm"]) for c in data["calls"]] == [
        (1, "all_reduce", "done", "ring"),
        (2, "all_reduce", "failed", "ring"),
    ]
    assert data["calls"][1]["reduce_op"] == "max" and data["calls"][1]["nbytes"] == 4 << 20
    assert "not heard from rank(s) 1" in data["calls"][1]["error"]


def test_record_goes_to_the_log_without_a_file() -> None:
    """Without HAL_COMM_TRACE_FILE the record is logged (WARNING) with one line per call."""
    proc = run(2, "behind", {"HAL_COMM_TIMEOUT_MS": "1000", "BEHIND_S": "3"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0: flight recorder (all_reduce seq 2 failed" in proc.stderr
    assert (
        "seq=2 all_reduce op=max dtype=float32 count=1048576 bytes=4194304 algorithm=ring state=failed"
        in proc.stderr
    )


def test_abort_fails_the_running_call_at_once() -> None:
    """comm.abort() ends a call a peer never joins within moments; the communicator is closed after."""
    proc = run(2, "abort", {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("rank 0 aborted in"))
    assert float(line.split("in ")[1].split("s:")[0]) < 2.0 and "aborted by comm.abort()" in line
    assert 'RECORD [[1, "all_reduce", "done"], [2, "all_reduce", "aborted"]]' in proc.stdout
    assert "after abort: the communicator is closed" in proc.stdout


def test_shrink_to_the_live_ranks() -> None:
    """Rank 2 stalls; ranks 0 and 1 time out, shrink to 2 ranks and all_reduce correctly."""
    proc = run(3, "shrink", {"HAL_COMM_TIMEOUT_MS": "1500", "STALL_S": "6"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "SHRUNK old=0 new=0/2 ok=True" in proc.stdout
        and "SHRUNK old=1 new=1/2 ok=True" in proc.stdout
    )


def test_shrink_without_rank_0() -> None:
    """Rank 0 (the rendezvous server's rank) stalls: ranks 1 and 2 shrink to 2 ranks served by rank 1."""
    proc = run(3, "shrink0", {"HAL_COMM_TIMEOUT_MS": "1500", "STALL_S": "6"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "SHRUNK old=1 new=0/2 ok=True" in proc.stdout
        and "SHRUNK old=2 new=1/2 ok=True" in proc.stdout
    )
