"""``hal bench sched``: runs the policies on an emulated heterogeneous pool and prints ratios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hal.cli import main as hal_main


def test_bench_sched_prints_makespan_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    assert hal_main(["bench", "sched", "--tasks", "8", "--repeat", "1", "--op-ms", "1"]) == 0
    out = capsys.readouterr().out
    for policy in ("eft", "heft", "eager", "round-robin"):
        assert policy in out
    assert (
        "1.00x" in out
    )  # eft against itself; the others are printed as ratios (no timing asserts)


def test_bench_sched_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        hal_main(
            [
                "bench",
                "sched",
                "--tasks",
                "8",
                "--repeat",
                "1",
                "--op-ms",
                "1",
                "--policies",
                "eft,round-robin",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert set(data["policies"]) == {"eft", "round-robin"} and data["speeds"] == [
        1.0,
        0.25,
        0.25,
        0.25,
    ]
    rr = data["policies"]["round-robin"]["tasks_per_device"]
    assert sorted(rr.values()) == [2, 2, 2, 2]  # dealt in turn


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speeds", "1,fast"], "must be numbers"),
        (["--speeds", "1,0"], "must be positive"),
        (["--policies", "fifo"], "choose from"),
    ],
)
def test_bench_sched_rejects_bad_options(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert hal_main(["bench", "sched", *args]) == 2
    assert message in capsys.readouterr().err


def test_bench_sched_ramp(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "ramp.png"
    assert (
        hal_main(
            [
                "bench",
                "sched",
                "--ramp",
                "--ramp-steps",
                "0.2,1.5",
                "--step-s",
                "0.2",
                "--op-ms",
                "2",
                "--speeds",
                "1,0.5",
                "--json",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["policy"] == "eft" and data["speeds"] == [1.0, 0.5]
    assert data["capacity_per_s"] == pytest.approx(1.5 / 0.002)
    rows = data["steps"]
    assert [r["load"] for r in rows] == [0.2, 1.5]
    assert rows[0]["offered_per_s"] < rows[1]["offered_per_s"]
    for r in rows:
        assert r["tasks"] >= 1 and r["throughput_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_sched_ramp_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        hal_main(
            ["bench", "sched", "--ramp", "--ramp-steps", "0.5", "--step-s", "0.1", "--op-ms", "2"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "hal bench sched --ramp: eft" in out and "p99 ms" in out and "knees" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ramp", "--ramp-steps", "0.5,x"], "--ramp-steps"),
        (["--ramp", "--step-s", "0"], "--step-s"),
        (["--plot", "x.png"], "--plot needs --ramp"),
    ],
)
def test_bench_sched_ramp_rejects_bad_options(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert hal_main(["bench", "sched", *args]) == 2
    assert message in capsys.readouterr().err


def test_bench_sched_with_pools(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        hal_main(
            ["bench", "sched", "--tasks", "8", "--repeat", "1", "--op-ms", "1", "--pools", "--json"]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert set(data["policies"]) == {"eft", "heft", "eager", "round-robin"}
    for r in data["policies"].values():
        assert (
            set(r["pool_wait_p50_s"]) == {"infer", "batch"}
            and sum(r["tasks_per_device"].values()) == 8
        )
