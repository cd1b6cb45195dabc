"""The init (rendezvous) timeout apart from the collective timeout (``HAL_COMM_INIT_TIMEOUT_MS``).

Before, ``HAL_COMM_TIMEOUT_MS`` bounded the rendezvous too: a job with a short collective timeout
failed at init whenever its ranks started further apart than that. Real processes under ``hal run``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import hal
import hal.comm
from hal.comm._config import INIT_TIMEOUT_S, Config

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comm_launch import hal_run  # noqa: E402

WORKER = str(HERE / "init_timeout_worker.py")


def test_late_rank_joins_and_a_stall_still_fails_after_the_collective_timeout() -> None:
    """Rank 1 starts 4 s late with a 2 s collective timeout: init succeeds on both ranks (the
    rendezvous waits the init timeout, 60 s by default); its later stall still fails rank 0's
    all_reduce after 2 s of no progress, naming rank 1."""
    proc = hal_run(2, [WORKER, "1", "4", "stall"], {"HAL_COMM_TIMEOUT_MS": "2000"}, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "INIT-ERROR" not in proc.stdout, out
    assert "OK rank=0 sum_ok=True" in proc.stdout and "OK rank=1 sum_ok=True" in proc.stdout, out
    line = next((x for x in proc.stdout.splitlines() if x.startswith("CALL-ERROR rank=0")), "")
    assert "op=all_reduce ranks=(1,)" in line, out
    assert "no progress for 2000 ms (HAL_COMM_TIMEOUT_MS)" in line, out


def _torch_support() -> Any:
    spec = importlib.util.spec_from_file_location(
        "hal_torch_support", HERE.parent / "torch" / "support.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_late_rank_joins_under_torchrun() -> None:
    """The real torchrun (its store): rank 1 starts 4 s late with a 2 s collective timeout; both
    ranks meet through torchrun's store within the init timeout and all_reduce."""
    support = _torch_support()
    support.need_torchrun()
    env = support.child_env(HAL_COMM_TIMEOUT_MS="2000")
    proc = support.torchrun(["--standalone", "--nproc_per_node=2", WORKER, "1", "4"], env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "INIT-ERROR" not in proc.stdout, out
    assert "OK rank=0 sum_ok=True" in proc.stdout and "OK rank=1 sum_ok=True" in proc.stdout, out


def test_rank_that_never_comes_fails_init_after_the_init_timeout() -> None:
    """Rank 2 of 3 never calls init: ranks 0 and 1 fail after HAL_COMM_INIT_TIMEOUT_MS (not the
    10-minute collective timeout), each naming rank 2 and the rendezvous."""
    env = {"HAL_COMM_INIT_TIMEOUT_MS": "1500"}
    proc = hal_run(3, [WORKER, "2", "-1"], env, timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "ABSENT rank=2" in proc.stdout, out
    lines = [
        next((x for x in proc.stdout.splitlines() if x.startswith(f"INIT-ERROR rank={r} ")), "")
        for r in (0, 1)
    ]
    for line in lines:  # the first to give up says so; the rendezvous tells the other at once
        assert "op=init ranks=(2,)" in line, out
        assert "(HAL_COMM_INIT_TIMEOUT_MS); rank(s) 2 never arrived" in line, out
    timed_out = r"rendezvous \(round 0\) timed out after 1\.5 s \(HAL_COMM_INIT_TIMEOUT_MS\)"
    assert any(re.search(timed_out, line) for line in lines), out
    assert "OK rank=" not in proc.stdout, out


def test_init_timeout_defaults_and_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset: the larger of 60 s and the collective timeout; code > environment > default."""
    monkeypatch.delenv("HAL_COMM_TIMEOUT_MS", raising=False)
    monkeypatch.delenv("HAL_COMM_INIT_TIMEOUT_MS", raising=False)
    assert INIT_TIMEOUT_S == 60.0
    assert Config.from_options().init_timeout_s == 600.0  # the 10-minute collective default
    assert Config.from_env(timeout_ms=1000).init_timeout_s == 60.0
    monkeypatch.setenv("HAL_COMM_TIMEOUT_MS", "2000")
    assert Config.from_options().init_timeout_s == 60.0
    monkeypatch.setenv("HAL_COMM_INIT_TIMEOUT_MS", "5000")
    env = Config.from_options()
    assert (env.timeout_s, env.init_timeout_s) == (2.0, 5.0)
    opts = hal.comm.CommOptions(init_timeout_ms=7000)
    assert Config.from_options(opts).init_timeout_s == 7.0
    assert Config.from_env(options=opts, init_timeout_ms=9000).init_timeout_s == 9.0
    assert Config.from_env(timeout_ms=300_000, options=opts).init_timeout_s == 7.0  # as given
    assert hal.comm.CommOptions.variables()["init_timeout_ms"] == "HAL_COMM_INIT_TIMEOUT_MS"


@pytest.mark.parametrize(
    ("env", "kwargs", "message"),
    [
        (
            "-5",
            {},
            "HAL_COMM_INIT_TIMEOUT_MS='-5' is out of range; "
            "allowed: a finite number in (0, 604800000] ms",
        ),
        ("soon", {}, "HAL_COMM_INIT_TIMEOUT_MS='soon' is not a number"),
        ("inf", {}, "HAL_COMM_INIT_TIMEOUT_MS='inf' is not a finite number"),
        ("0", {}, "HAL_COMM_INIT_TIMEOUT_MS='0' is out of range"),
        (None, {"init_timeout_ms": -1}, "CommOptions.init_timeout_ms=-1 is out of range"),
        (None, {"init_timeout_ms": "soon"}, "CommOptions.init_timeout_ms='soon' is not a number"),
        (
            None,
            {"options": hal.comm.CommOptions(init_timeout_ms=float("nan"))},
            "CommOptions.init_timeout_ms=nan is not a finite number",
        ),
    ],
)
def test_bad_init_timeout_is_a_config_error_before_any_rendezvous(
    monkeypatch: pytest.MonkeyPatch, env: str | None, kwargs: dict[str, object], message: str
) -> None:
    """As every other setting: hal.ConfigError (a ValueError) naming the variable or the field."""
    if env is None:
        monkeypatch.delenv("HAL_COMM_INIT_TIMEOUT_MS", raising=False)
    else:
        monkeypatch.setenv("HAL_COMM_INIT_TIMEOUT_MS", env)
    # a launcher environment whose rank 0 would wait for rank 1: the error must come first
    monkeypatch.setenv("HAL_RANK", "1")
    monkeypatch.setenv("HAL_WORLD_SIZE", "2")
    monkeypatch.setenv("HAL_STORE_ADDR", "127.0.0.1:9")
    with pytest.raises(hal.ConfigError) as info:
        hal.comm.init(**kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)
