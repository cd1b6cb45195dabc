"""hal.comm's own reduction steps never print the user-facing fallback summary (issue #11, item 6).

Real ``hal run`` jobs of 2 ranks; stderr is captured whole (the summary is logged at exit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = str(Path(__file__).resolve().parent / "fallback_worker.py")
SUMMARY = "ran without a dedicated kernel"


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.update(env)
    return subprocess.run(
        [sys.executable, "-m", "hal", "run", "-n", "2", WORKER, *args],
        env=child,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_avg_all_reduce_prints_no_fallback_summary() -> None:
    proc = _run({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == 2, proc.stdout + proc.stderr
    assert SUMMARY not in proc.stderr, proc.stderr


def test_a_user_fallback_still_prints_the_summary() -> None:
    """The control: the same job plus one user op without a dedicated kernel warns, once per rank."""
    proc = _run({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1"}, "--user-op")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count(SUMMARY) == 2, proc.stderr
    assert "scale[float32]" in proc.stderr and "accumulate" not in proc.stderr, proc.stderr


def test_strict_mode_does_not_refuse_comm_internal_steps() -> None:
    """HAL_KERNELS_STRICT=1 governs the user's ops; hal.comm's avg (generic scale) still runs."""
    proc = _run({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1", "HAL_KERNELS_STRICT": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == 2, proc.stdout + proc.stderr


def test_default_device_is_opencl_and_still_silent() -> None:
    """Without HAL_BACKENDS the real backend (PoCL OpenCL) is each rank's default device, and
    its generic accumulate/scale kernels stay out of the summary too."""
    pytest.importorskip("pyopencl")
    proc = _run({"POCL_DEVICES": "pthread"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("device=opencl:0") == 2, proc.stdout + proc.stderr
    assert SUMMARY not in proc.stderr, proc.stderr
