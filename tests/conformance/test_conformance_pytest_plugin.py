"""``pytest --pyargs hal.conformance --hal-backend NAME``: the suite as a pytest plugin."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from hal.conformance import validate

Run = Callable[..., subprocess.CompletedProcess[str]]


def _pytest(
    python_run: Run, cwd: Path, *args: str, **kw: object
) -> subprocess.CompletedProcess[str]:
    return python_run(
        ["-m", "pytest", "--pyargs", "hal.conformance", "-p", "no:cacheprovider", *args],
        check=False,
        cwd=cwd,
        **kw,
    )


def test_plugin_runs_requirements_as_tests_and_writes_the_certificate(
    python_run: Run, tmp_path: Path
) -> None:
    report, summary = tmp_path / "r.json", tmp_path / "r.md"
    proc = _pytest(
        python_run,
        tmp_path,
        "--hal-backend",
        "cpu",
        "-k",
        "ERR or P2P-QUERY",
        "-v",
        "--hal-report",
        str(report),
        "--hal-summary",
        str(summary),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_requirement[ERR-COPY-BOUNDS@cpu:0] PASSED" in proc.stdout
    assert "test_requirement[ERR-STREAM-MISMATCH@cpu:0->cpu:1] PASSED" in proc.stdout
    cert = json.loads(report.read_text())
    validate(cert)
    ids = {r["id"] for r in cert["requirements"]}
    assert (
        "P2P-QUERY" in ids and {i for i in ids if i.startswith("ERR-")} and "MEM-ALLOC" not in ids
    )
    assert cert["suite"]["selection"] == "ERR or P2P-QUERY" and cert["verdict"] == "not certified"
    assert "# HAL conformance: backend `cpu`" in summary.read_text()


def test_plugin_fails_a_broken_backend_on_the_requirement(
    python_run: Run, tmp_path: Path, mutant_path: list[Path]
) -> None:
    proc = _pytest(
        python_run,
        tmp_path,
        "--hal-backend",
        "mut_event_nowait",
        "-k",
        "EVENT-CROSS-STREAM",
        pythonpath=mutant_path,
        env={"HAL_CPU_JITTER": "2"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and "EVENT-CROSS-STREAM@mut_event_nowait:0" in proc.stdout


def test_plugin_needs_a_backend(python_run: Run, tmp_path: Path) -> None:
    proc = _pytest(python_run, tmp_path)
    assert proc.returncode == 4 and "--hal-backend NAME" in proc.stderr
