"""The metrics endpoint (Scheduler.serve_metrics) and ``hal sched top``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

import hal
from hal.cli import main as hal_main
from hal.sched import Pool, Scheduler

from .conftest import FAST_HEALTH


def test_metrics_endpoint_and_top(
    cpu_pair: list[hal.Device], capsys: pytest.CaptureFixture[str]
) -> None:
    with Scheduler(
        cpu_pair, pools=[Pool("infer", devices=("cpu:0",))], health=FAST_HEALTH
    ) as sched:
        for f in [sched.submit(lambda ctx: 1, pool="infer") for _ in range(5)]:
            f.result(timeout=60)
        url = sched.serve_metrics()
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = resp.read().decode()
        assert 'hal_sched_tasks{pool="infer",state="done"} 5.0' in text
        with urllib.request.urlopen(url + "/metrics.json", timeout=10) as resp:
            assert json.loads(resp.read())["pools"]["infer"]["tasks"] == {"done": 5}
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(url + "/nope", timeout=10)
        assert hal_main(["sched", "top", url, "--once"]) == 0
        out = capsys.readouterr().out
        assert "hal.sched (eft): queue 0, running 0" in out
        assert "infer" in out and "cpu:0" in out and "cpu:1" in out
    with pytest.raises(urllib.error.URLError):  # closed with the scheduler
        urllib.request.urlopen(url + "/metrics", timeout=2)
    assert hal_main(["sched", "top", url, "--once"]) == 1
    assert f"cannot read metrics from {url!r}" in capsys.readouterr().err


def test_serve_metrics_checks_the_port(cpu_pair: list[hal.Device]) -> None:
    with (
        Scheduler(cpu_pair[:1], health=FAST_HEALTH) as sched,
        pytest.raises(ValueError, match="port=70000"),
    ):
        sched.serve_metrics(70000)
