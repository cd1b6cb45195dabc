"""``hal`` commands given bad input end with a hal error naming the bad value and exit 2, never a
traceback (found by trying them as a user would)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _hal(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env["HAL_BACKENDS"] = "cpu"
    return subprocess.run(
        [sys.executable, "-m", "hal", *args], capture_output=True, text=True, env=env, check=False
    )


@pytest.mark.parametrize("n", ["0", "-3"])
def test_run_with_no_ranks(n: str) -> None:
    proc = _hal("run", "-n", n, "true")
    assert proc.returncode == 2, proc.stderr
    assert f"hal run: -n {n}: the number of ranks must be >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_topo_dump_to_a_path_that_cannot_be_written(tmp_path: Path) -> None:
    for target, why in (
        (tmp_path / "missing" / "topo.json", "No such file or directory"),
        (tmp_path, "Is a directory"),
    ):
        proc = _hal("topo", "--dump", str(target))
        assert proc.returncode == 2, proc.stderr
        assert f"hal topo: error: --dump {str(target)!r} cannot be written: {why}" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("option", ["--report", "--summary"])
def test_conformance_output_that_cannot_be_written_is_refused_before_the_run(
    option: str, tmp_path: Path
) -> None:
    """Checked before the suite runs (minutes), not a FileNotFoundError traceback after it."""
    for target, why in (
        (
            tmp_path / "missing" / "cert",
            f"is in {str(tmp_path / 'missing')!r}, which is not a directory",
        ),
        (tmp_path, "is a directory"),
    ):
        proc = _hal("conformance", "--backend", "cpu", "-k", "MEM-ALLOC", option, str(target))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"hal conformance: {option} {str(target)!r} {why}" in proc.stderr
        assert "Traceback" not in proc.stderr and "requirements:" not in proc.stdout


def test_trace_merge_to_a_path_that_cannot_be_written(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')
    out = tmp_path / "missing" / "merged.json"
    proc = _hal("trace", "merge", "-o", str(out), str(trace))
    assert proc.returncode == 2, proc.stderr
    assert (
        f"hal trace: error: -o {str(out)!r} cannot be written: No such file or directory"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr


def test_bench_report_out_that_cannot_be_written(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "report.md"
    proc = _hal("bench", "report", str(tmp_path), "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert (
        f"hal bench report: --out {str(out)!r} cannot be written: No such file or directory"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr


def test_doctor_reports_a_setting_hal_cannot_use() -> None:
    """HAL_MEMORY_LIMIT is read at the first allocation: hal doctor now names a bad value at once (exit 1)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update(HAL_BACKENDS="cpu", HAL_MEMORY_LIMIT="lots")
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "doctor", "--local"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ERROR   setting HAL_MEMORY_LIMIT='lots' is not a size" in proc.stdout
    assert "Traceback" not in proc.stderr
    clean = _hal("doctor", "--local")
    assert clean.returncode == 0 and "ERROR" not in clean.stdout, clean.stdout
