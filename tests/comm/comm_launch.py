"""Launch helpers shared by the multi-process tests of hal.comm (``hal run`` on the CPU emulator)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence


def hal_run(
    n: int,
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 240,
    *,
    clean: Sequence[str] = ("HAL_",),
) -> subprocess.CompletedProcess[str]:
    """Run ``hal run -n N ARGS`` on the CPU emulator (1 device per rank), output captured.

    Args:
        n: ranks.
        args: the script and its arguments.
        env: variables set for the ranks, over the defaults.
        timeout: seconds before the launch is killed (``subprocess.TimeoutExpired``).
        clean: prefixes of the variables of this process the ranks do not inherit.
    """
    child = {k: v for k, v in os.environ.items() if not k.startswith(tuple(clean))}
    child.update({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1"})
    child.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hal", "run", "-n", str(n), *args],
        env=child,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(proc: subprocess.CompletedProcess[str], ranks: int) -> None:
    """Assert the launch succeeded and each of ``ranks`` ranks printed its ``OK`` line."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == ranks, proc.stdout + proc.stderr
