"""``/dev/shm`` is checked up front by ``hal.comm.init()`` (issue #15, item 6).

A small tmpfs (Docker's default is 64 MiB) is mounted on ``/dev/shm`` in a private mount
namespace (``unshare -m``, as root) around a real ``hal run`` job. Before the check, 4 ranks
with the default rings (192 MiB together) were killed by SIGBUS at their first large write.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hal.comm._shm import FALLBACK_MARKER, space_needed

WORKER = str(Path(__file__).resolve().parent / "shm_space_worker.py")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) for a private /dev/shm",
)


def _run(
    shm_size: str, ranks: int, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.update(
        {"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1", "HAL_COMM_TIMEOUT_MS": "60000", **env}
    )
    script = (
        f'mount -t tmpfs -o size={shm_size} tmpfs /dev/shm && exec "$0" -m hal run -n {ranks} "$@"'
    )
    proc = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            sys.executable,
            WORKER,
            *args,
        ],
        env=child,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    if "mount:" in proc.stderr and "permission denied" in proc.stderr.lower():
        pytest.skip("this container may not mount a tmpfs")
    return proc


def test_four_ranks_in_64m_get_the_size_needed_and_how_to_give_more() -> None:
    proc = _run("64M", 4, {})
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, -signal.SIGBUS, 128 + signal.SIGBUS), out
    assert "SIGBUS" not in out and "Bus error" not in out, out
    need = space_needed(4, 4, 4 << 20)
    assert need > 64 << 20
    assert (
        f"/dev/shm has 64.0 MiB free but the shared-memory rings of 4 ranks need {need / (1 << 20):.1f} MiB"
        in out
    ), out
    assert "(4 ranks x 3 peers x 4 slots of 4.0 MiB)" in out, out
    assert "--shm-size=" in out and "HAL_COMM_SHM_FALLBACK=tcp" in out, out
    assert "OK rank=" not in out, out


def test_fallback_to_tcp_is_visible_and_the_job_runs() -> None:
    proc = _run("16M", 2, {"HAL_COMM_SHM_FALLBACK": "tcp"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert proc.stdout.count("transport=tcp") == 2 and proc.stdout.count("OK rank=") == 2, out
    assert proc.stderr.count(FALLBACK_MARKER) == 2, out
    assert "need 32.0 MiB" in proc.stderr, out


def test_rings_that_fit_use_shm_and_pass_32_mib() -> None:
    """The control: smaller rings (2 slots of 1 MiB, 4 MiB for 2 ranks) fit the same 16 MiB tmpfs."""
    proc = _run(
        "16M",
        2,
        {"HAL_COMM_SHM_SLOTS": "2", "HAL_COMM_CHUNK_BYTES": "1M", "HAL_COMM_SHM_FALLBACK": "tcp"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert proc.stdout.count("transport=shm") == 2 and proc.stdout.count("OK rank=") == 2, out
    assert FALLBACK_MARKER not in out, out


def test_a_bad_fallback_value_is_named_on_its_rank() -> None:
    proc = _run("16M", 2, {"HAL_COMM_SHM_FALLBACK": "udp"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "HAL_COMM_SHM_FALLBACK='udp' is not a known choice; allowed: one of none, tcp" in out, (
        out
    )
