"""Leak test (docs/reliability.md): alloc/free and communicator create/destroy cycles leak nothing.

10,000 alloc/free cycles, 10,000 in-process communicators, 2 x 25 multi-process (shm and
tcp) communicators; counted: device memory in use, threads, open file descriptors, /dev/shm
entries.
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import hal
import hal.comm

RANK = str(Path(__file__).resolve().parent / "leak_rank.py")


def own_segments() -> int:
    """Return how many of hal's /dev/shm segments this process made (``hal-comm-<job>-<rank>-<pid>``
    and its ``.wake``, named with the creating pid): other libraries' segments (MPICH's) and the
    segments of tests running beside this one in other processes are not this process's to leak."""
    shm = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    me = re.compile(rf"hal-comm-[0-9a-f]+-\d+-{os.getpid()}(\.wake)?")
    return sum(bool(me.fullmatch(name)) for name in shm)


def counts() -> dict[str, int]:
    """Return threads, open fds and hal's /dev/shm segments of this process."""
    gc.collect()
    return {
        "threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
        "shm": own_segments(),
    }


def assert_no_growth(before: dict[str, int], after: dict[str, int]) -> None:
    """No count grew (one may shrink: a daemon thread of an earlier test finishing meanwhile).

    A leaked segment carries its creator's pid: a leak of this test grows its count by one
    segment per cycle, far beyond the small slack.
    """
    assert after["threads"] <= before["threads"], (before, after)
    assert after["fds"] <= before["fds"], (before, after)
    assert after["shm"] <= before["shm"] + 2, (before, after)


def test_alloc_free_cycles() -> None:
    """10,000 alloc/copy/free cycles of odd sizes: device memory, threads and fds back to where they were."""
    dev = hal.devices("cpu")[0]
    # the baseline is taken with the device quiet: an earlier test's garbage or a free it left
    # deferred behind queued work (released when its stream passes) must not count here
    gc.collect()
    dev.synchronize()
    s = dev.create_stream()
    base_mem, before = dev.memory_in_use, counts()
    host = np.arange(4099, dtype=np.uint8)
    for i in range(10_000):
        n = 1 + (i * 7919) % 4099
        buf = dev.alloc(n)
        hal.copy(buf, host, stream=s, nbytes=n)
        if i % 3 == 0:
            arr = buf.view(np.uint8, n)
            arr.close()
        buf.close()
    s.synchronize()
    s.close()
    assert dev.memory_in_use == base_mem
    assert_no_growth(before, counts())


def test_in_process_communicators() -> None:
    """10,000 create/all_reduce/close cycles of hal.comm.create over 2 devices: no thread or fd left behind."""
    devs = hal.devices("cpu")[:2]
    streams = [d.create_stream() for d in devs]
    xs = [hal.asarray(np.ones(1000, dtype=np.float32), device=d) for d in devs]
    base_mem = [d.memory_in_use for d in devs]
    before = counts()
    for _ in range(10_000):
        with hal.comm.create(devs) as comm:
            comm.all_reduce(xs, op="max", streams=streams).wait()
    assert_no_growth(before, counts())
    assert [d.memory_in_use for d in devs] == base_mem
    for x in xs:
        x.close()
    for s in streams:
        s.close()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_multi_process_communicators(transport: str) -> None:
    """2 ranks x 25 init/all_reduce/close cycles: threads, fds, /dev/shm and device memory unchanged per rank."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1", "HAL_COMM_TRANSPORT": transport})
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "run", "-n", "2", RANK, "25"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = [
        json.loads(line.split(" ", 2)[2])
        for line in proc.stdout.splitlines()
        if line.startswith("LEAKS ")
    ]
    assert len(reports) == 2, proc.stdout + proc.stderr
    for r in reports:
        assert_no_growth(r["before"], r["after"])
        assert r["mem"][0] == r["mem"][1], r
