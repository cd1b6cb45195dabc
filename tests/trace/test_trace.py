"""The timeline: valid Chrome Trace Event JSON, well nested per track, every layer on it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hal
import hal.kernels
from hal.cli import main as hal_main
from hal.cli._trace import check, load, merge, summarize
from hal.sched import Scheduler


def _events(data: dict[str, Any], ph: str, cat: str | None = None) -> list[dict[str, Any]]:
    return [
        e for e in data["traceEvents"] if e["ph"] == ph and (cat is None or e.get("cat") == cat)
    ]


def _tracks(data: dict[str, Any]) -> dict[int, str]:
    return {
        e["tid"]: e["args"]["name"]
        for e in data["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


def test_copies_and_kernels_on_stream_tracks(requires_cpu: None, tmp_path: Path) -> None:
    d0, d1 = hal.devices("cpu")[:2]
    path = tmp_path / "t.json"
    with hal.trace(path, rank=None) as tr:
        s0, s1 = d0.create_stream(), d1.create_stream()
        a = hal.asarray(np.ones((32, 32), np.float32), device=d0, stream=s0)
        b = hal.kernels.matmul(a, a, stream=s0)
        c = d1.alloc(b.nbytes).view(np.float32, (32, 32))
        s0.synchronize()
        hal.copy(c, b, stream=s1)
        c.to_host(stream=s1)
        s1.synchronize()
    assert tr.closed
    data = json.loads(path.read_text())  # valid JSON
    assert check(data) == []  # well nested per track
    tracks = _tracks(data)
    assert {tr.stream_track(s0), tr.stream_track(s1)} <= set(tracks.values())
    assert tr.stream_track(s0).startswith("cpu:0 stream") and tr.stream_track(s1).startswith(
        "cpu:1 stream"
    )
    kernels = _events(data, "X", "kernel")
    assert [k["name"] for k in kernels] == ["matmul"]
    assert kernels[0]["args"]["implementation"] == "dedicated" and tracks[
        kernels[0]["tid"]
    ] == tr.stream_track(s0)
    copies = {e["name"]: e for e in _events(data, "X", "copy")}
    assert copies["copy peer"]["args"] == {
        "path": "peer",
        "bytes": 4096,
        "src": "cpu:0",
        "dst": "cpu:1",
    }
    assert "copy H2D" in copies and "copy D2H" in copies
    h2d = copies["copy H2D"]
    assert kernels[0]["ts"] >= h2d["ts"] + h2d["dur"] - 1  # stream order shows on the timeline


def test_scheduler_tasks_flows_and_queue_depth(requires_cpu: None) -> None:
    devs = hal.devices("cpu")[:2]
    x = hal.asarray(np.eye(64, dtype=np.float32), device=devs[0])
    with hal.trace() as tr, Scheduler(devs, policy="eft") as sched:
        a = sched.submit(hal.kernels.matmul, x, x, name="a")
        b = sched.submit(hal.kernels.matmul, a, x, name="b")
        c = sched.submit(hal.kernels.matmul, a, b, name="c")
        c.result()
    data = tr.to_json()
    assert check(data) == []
    tasks = {e["name"]: e for e in _events(data, "X", "task")}
    assert set(tasks) == {"a", "b", "c"}
    for e in tasks.values():
        assert "wait_ms" in e["args"] and _tracks(data)[e["tid"]].endswith(" sched")
    starts, ends = _events(data, "s"), _events(data, "f")
    assert len(starts) == len(ends) == 3  # a->b, a->c, b->c
    assert {e["id"] for e in starts} == {e["id"] for e in ends}
    assert all(e["bp"] == "e" for e in ends)
    counters = [
        e for e in data["traceEvents"] if e["ph"] == "C" and e["name"] == "sched queue depth"
    ]
    assert counters and set(counters[0]["args"]) == {str(d) for d in devs}


def test_nested_traces_both_receive_events(requires_cpu: None) -> None:
    d = hal.devices("cpu")[0]
    with hal.trace() as outer:
        s = d.create_stream()
        with hal.trace() as inner:
            hal.asarray(np.ones(8, np.float32), device=d, stream=s)
            s.synchronize()
        hal.asarray(np.ones(8, np.float32), device=d, stream=s)
        s.synchronize()

    def mine(data: dict[str, Any]) -> list[dict[str, Any]]:
        tracks = _tracks(data)  # only this test's stream (probes of other tests' pools may run)
        return [e for e in _events(data, "X", "copy") if tracks[e["tid"]] == inner.stream_track(s)]

    assert len(mine(inner.to_json())) == 1
    assert len(mine(outer.to_json())) == 2
    assert hal.tracer() is None


def test_check_finds_partial_overlaps_and_unpaired_events() -> None:
    bad = {
        "traceEvents": [
            {"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 0, "tid": 1},
            {"ph": "X", "name": "b", "ts": 5, "dur": 10, "pid": 0, "tid": 1},
            {"ph": "X", "name": "c", "ts": 5, "dur": 10, "pid": 0, "tid": 2},  # other track: fine
            {"ph": "B", "name": "d", "ts": 0, "pid": 0, "tid": 3},
        ]
    }
    problems = check(bad)
    assert len(problems) == 2
    assert any("'b'" in p and "partially overlaps" in p for p in problems)
    assert any("B without E" in p for p in problems)
    good = {
        "traceEvents": [
            {"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 0, "tid": 1},
            {"ph": "X", "name": "b", "ts": 2, "dur": 3, "pid": 0, "tid": 1},
            {"ph": "X", "name": "c", "ts": 10, "dur": 1, "pid": 0, "tid": 1},
        ]
    }
    assert check(good) == []


def test_rank_path_and_bad_arguments() -> None:
    assert hal._trace.rank_path("out/trace.json", 3) == Path("out/trace.rank3.json")
    assert hal._trace.rank_path("trace.json", None) == Path("trace.json")
    with pytest.raises(TypeError, match="path=42"):
        with hal.trace(42):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError, match="rank=-1"):
        with hal.trace(rank=-1):
            pass


SCRIPT = """
import numpy as np, hal
d = hal.devices("cpu")[0]
s = d.create_stream()
hal.asarray(np.ones(1024, np.float32), device=d, stream=s)
s.synchronize()
print("ok")
"""


def test_hal_trace_env_writes_one_file_per_rank_and_merge(
    requires_cpu: None, python_run: Callable[..., Any], tmp_path: Path
) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    base = tmp_path / "trace.json"
    python_run([str(script)], env={"HAL_TRACE": str(base)}, cwd=tmp_path)
    assert check(load(base)) == []
    for rank in (0, 1):
        python_run([str(script)], env={"HAL_TRACE": str(base), "HAL_RANK": str(rank)}, cwd=tmp_path)
    r0, r1 = tmp_path / "trace.rank0.json", tmp_path / "trace.rank1.json"
    assert r0.exists() and r1.exists()
    merged = merge([r0, r1])
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}
    assert check(merged) == []
    out = tmp_path / "merged.json"
    assert hal_main(["trace", "merge", "-o", str(out), str(r0), str(r1)]) == 0
    assert hal_main(["trace", "check", str(out)]) == 0
    assert hal_main(["trace", "summary", str(out)]) == 0


def test_hal_run_ranks_write_their_own_trace(
    requires_cpu: None, python_run: Callable[..., Any], tmp_path: Path
) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    python_run(
        ["-m", "hal", "run", "-n", "2", str(script)],
        env={"HAL_TRACE": str(tmp_path / "t.json")},
        cwd=tmp_path,
    )
    files = sorted(p.name for p in tmp_path.glob("t*.json"))
    assert files == ["t.rank0.json", "t.rank1.json"]  # the launcher traced nothing: no t.json


def test_summary_reports_top_costs_and_communication_share(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = {
        "traceEvents": [
            {
                "ph": "X",
                "name": "matmul",
                "cat": "kernel",
                "ts": 0,
                "dur": 3000,
                "pid": 0,
                "tid": 1,
            },
            {
                "ph": "X",
                "name": "copy peer",
                "cat": "copy",
                "ts": 3000,
                "dur": 1000,
                "pid": 0,
                "tid": 1,
            },
            {
                "ph": "X",
                "name": "all_reduce",
                "cat": "collective",
                "ts": 4000,
                "dur": 1000,
                "pid": 0,
                "tid": 2,
            },
            {
                "ph": "X",
                "name": "t",
                "cat": "task",
                "ts": 0,
                "dur": 4000,
                "pid": 0,
                "tid": 3,
                "args": {"wait_ms": 2.0},
            },
        ]
    }
    s = summarize(data)
    assert s["communication_share"] == pytest.approx(0.4)
    assert s["top"][0]["name"] in ("matmul", "t") and s["tasks"]["mean_wait_ms"] == 2.0
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    assert hal_main(["trace", "summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "communication share: 40.0%" in out and "matmul" in out
    assert hal_main(["trace", "summary", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["communication_share"] == pytest.approx(0.4)
    (tmp_path / "bad.json").write_text("{nope")
    assert hal_main(["trace", "summary", str(tmp_path / "bad.json")]) == 2
    assert "not a readable JSON trace" in capsys.readouterr().err


def test_tracing_off_costs_nothing_visible() -> None:
    assert hal.tracer() is None
    assert sys.modules["hal._trace"].tracer() is None
