"""``hal run`` hygiene: no orphan ranks after a SIGKILL of the launcher, no stale /dev/shm files,
OMP_NUM_THREADS=1 per rank (docs/reliability.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

_SLEEPER = """
import os, sys, time
path = sys.argv[1] + "." + os.environ["HAL_RANK"]
with open(path + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {os.environ.get('OMP_NUM_THREADS')}")
os.replace(path + ".tmp", path)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie waiting for its reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (FileNotFoundError, IndexError):
        return False


def _hal_run(
    nranks: int, script: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.pop("OMP_NUM_THREADS", None)
    child.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "hal", "run", "-n", str(nranks), str(script), *args],
        env=child,
        cwd=tempfile.gettempdir(),
    )


def _wait_for(paths: list[Path], timeout: float = 60.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, (
            f"ranks did not start: {[p for p in paths if not p.exists()]}"
        )
        time.sleep(0.05)
    return [p.read_text() for p in paths]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_sigkill_of_hal_run_leaves_no_orphan_ranks(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(_SLEEPER)
    launcher = _hal_run(2, script, str(tmp_path / "rank"))
    try:
        info = _wait_for([tmp_path / "rank.0", tmp_path / "rank.1"])
        pids = [int(i.split()[0]) for i in info]
        assert all(_alive(p) for p in pids)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(30)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in pids if _alive(p)], "ranks outlived a SIGKILL of hal run (orphans)"
    finally:
        launcher.kill()
        for i in (tmp_path / "rank.0", tmp_path / "rank.1"):
            if i.exists():
                pid = int(i.read_text().split()[0])
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_omp_num_threads_is_one_per_rank_unless_set(tmp_path: Path) -> None:
    script = tmp_path / "omp.py"
    script.write_text(
        "import os, sys\n"
        "open(sys.argv[1] + '.' + os.environ['HAL_RANK'], 'w').write(str(os.environ.get('OMP_NUM_THREADS')))\n"
    )
    assert _hal_run(2, script, str(tmp_path / "a")).wait(120) == 0
    assert [(tmp_path / f"a.{r}").read_text() for r in (0, 1)] == ["1", "1"]
    assert _hal_run(2, script, str(tmp_path / "b"), env={"OMP_NUM_THREADS": "3"}).wait(120) == 0
    assert [(tmp_path / f"b.{r}").read_text() for r in (0, 1)] == ["3", "3"]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_stale_shm_files_of_dead_ranks_are_removed_by_the_next_run(tmp_path: Path) -> None:
    """Files a rank killed during the shm set-up leaves behind go at the next run; live ones stay."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid whose process has exited (and was reaped)
    job = uuid.uuid4().hex
    stale = [
        Path(f"/dev/shm/hal-comm-{job}-0-{gone.pid}"),
        Path(f"/dev/shm/hal-comm-{job}-0-{gone.pid}.wake"),
    ]
    live = Path(f"/dev/shm/hal-comm-{job}-1-{os.getpid()}")  # its process (this one) runs
    for p in [*stale, live]:
        p.write_bytes(b"\0" * 64)
    try:
        script = tmp_path / "nothing.py"
        script.write_text("pass\n")
        assert _hal_run(2, script).wait(120) == 0
        assert not [p for p in stale if p.exists()], (
            "stale hal-comm files survived the next hal run"
        )
        assert live.exists(), "a file of a live process was removed"
    finally:
        for p in [*stale, live]:
            p.unlink(missing_ok=True)


def test_shm_communicator_removes_stale_files_and_leaves_none(tmp_path: Path) -> None:
    """A real 2-rank shm job under hal run: stale files removed at set-up, nothing of its own left."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = Path(f"/dev/shm/hal-comm-{uuid.uuid4().hex}-1-{gone.pid}")
    script = tmp_path / "job.py"
    script.write_text(
        "import numpy as np, hal, hal.comm, pathlib, sys\n"
        f"pathlib.Path({str(stale)!r}).write_bytes(b'x')  # planted after hal run's own sweep\n"
        "comm = hal.comm.init()\n"
        "a = hal.asarray(np.ones(4, np.float32), device=comm.device)\n"
        "with comm.device.create_stream() as s:\n"
        "    comm.all_reduce(a, op='sum', stream=s)\n"
        "    assert a.to_host(stream=s).tolist() == [2.0] * 4\n"
        "comm.close()\n"
    )
    before = {p.name for p in Path("/dev/shm").glob("hal-comm-*")}
    try:
        assert (
            _hal_run(2, script, env={"HAL_COMM_TRANSPORT": "shm", "HAL_BACKENDS": "cpu"}).wait(120)
            == 0
        )
        assert not stale.exists()
        leftover = {p.name for p in Path("/dev/shm").glob("hal-comm-*")} - before
        assert not leftover, leftover
    finally:
        stale.unlink(missing_ok=True)
