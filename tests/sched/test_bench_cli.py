"""``hal bench sched``: runs the policies on an emulated heterogeneous pool and prints ratios."""

from __future__ import annotations

import json

import pytest

from hal.cli import main as hal_main


def test_bench_sched_prints_makespan_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    assert hal_main(["bench", "sched", "--tasks", "8", "--repeat", "1", "--op-ms", "1"]) == 0
    out = capsys.readouterr().out
    for policy in ("eft", "heft", "eager", "round-robin"):
        assert policy in out
    assert "1.00x" in out  # eft against itself; the others are printed as ratios (no timing asserts)


def test_bench_sched_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert hal_main(["bench", "sched", "--tasks", "8", "--repeat", "1", "--op-ms", "1",
                     "--policies", "eft,round-robin", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["policies"]) == {"eft", "round-robin"} and data["speeds"] == [1.0, 0.25, 0.25, 0.25]
    rr = data["policies"]["round-robin"]["tasks_per_device"]
    assert sorted(rr.values()) == [2, 2, 2, 2]  # dealt in turn


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--speeds", "1,fast"], "must be numbers"), (["--speeds", "1,0"], "must be positive"),
     (["--policies", "fifo"], "choose from")],
)
def test_bench_sched_rejects_bad_options(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert hal_main(["bench", "sched", *args]) == 2
    assert message in capsys.readouterr().err
