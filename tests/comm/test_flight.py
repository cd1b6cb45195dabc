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
            seq=seq,
            op="all_reduce",
            reduce_op="sum",
            dtype="float32",
            count=4,
            nbytes=16,
            algorithm="ring",
            peer=-1,
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
