"""Running the real ``torchrun`` (from the torch CPU wheel, the ``test`` extra) in tests.

Every test here skips, with the reason, only when torch is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
JOB = str(HERE / "job.py")


def torchrun_binary() -> str | None:
    """The ``torchrun`` next to this Python (the venv's), else the one on PATH; None without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    here = Path(sys.executable).parent / "torchrun"
    return str(here) if here.exists() else shutil.which("torchrun")


def need_torchrun() -> str:
    """Return the torchrun binary or skip the test (torch absent)."""
    exe = torchrun_binary()
    if exe is None:
        pytest.skip("torch is not installed (pip install 'hal-sdk[torch]'; the test extra pins torch==2.13.0)")
    return exe


def child_env(**extra: str) -> dict[str, str]:
    """A clean environment for ranks: no HAL_* (CPU emulator, one device), one OpenMP thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAL_", "TORCHELASTIC_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1", "PYTHONUNBUFFERED": "1"})
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def torchrun(args: list[str], *, timeout: float = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``torchrun ARGS`` (from a scratch directory) and return the finished process."""
    return subprocess.run(
        [need_torchrun(), *args], env=env or child_env(), cwd=tempfile.gettempdir(),
        capture_output=True, text=True, timeout=timeout, check=False,
    )
