"""Ranks on 3 emulated hosts (network namespaces, TCP): a cut link, a killed rank, a stalled rank, a slow one.

Each fault must end on the surviving ranks with a CommError within the timeout naming the
culprit rank and the operation; a slow-but-alive rank must not trip a timeout.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from typing import Any

TIMEOUT_MS = 3000
# 3 calls of 8 MB: large enough that a fault injected after the first lands mid-call
LOOP = {"HAL_COMM_TIMEOUT_MS": str(TIMEOUT_MS), "MH_COUNT": str(2 << 20), "MH_CALLS": "400", "MH_VICTIM": "2"}


def errors(results: list[tuple[int | None, str, str]], ranks: list[int]) -> dict[int, str]:
    """Return the ERROR line of each rank in ``ranks`` (asserting each has one)."""
    out = {}
    for r in ranks:
        code, stdout, stderr = results[r]
        lines = [x for x in stdout.splitlines() if x.startswith("ERROR ")]
        assert code == 0 and lines, f"rank {r} (exit {code}) has no CommError:\n{stdout}\n{stderr[-3000:]}"
        out[r] = lines[0]
    return out


def check_named(lines: dict[int, str], culprit: int) -> None:
    """Every survivor names the culprit and the operation, and failed within the timeout (+ slack)."""
    for r, line in lines.items():
        assert "op=all_reduce" in line, line
        assert re.search(rf"ranks=\([^)]*\b{culprit}\b", line), f"rank {r} does not name rank {culprit}: {line}"
        after = float(line.split("after=")[1].split(":")[0])
        assert after < TIMEOUT_MS / 1e3 * 2 + 2, line


def test_three_hosts_all_reduce(cluster: Any) -> None:
    """Baseline: 3 namespaces, TCP with 2 sockets per peer, results match NumPy."""
    c = cluster(3)
    c.start("ok", {"HAL_COMM_NSOCKS": "2", "MH_CALLS": "3"})
    res = c.finish(120)
    for code, out, err in res:
        assert code == 0 and "OK rank=" in out, out + err[-2000:]


def test_link_cut_mid_collective(cluster: Any) -> None:
    """``ip link set DEV down`` on host 2 while calls run: ranks 0 and 1 fail naming rank 2."""
    c = cluster(3)
    c.start("loop", LOOP)
    c.wait_started()
    subprocess.run(["ip", "-n", c.ns[2], "link", "set", c.dev[2], "down"], check=True)
    res = c.finish(60)
    check_named(errors(res, [0, 1]), 2)


def test_killed_rank(cluster: Any) -> None:
    """SIGKILL of rank 2 mid-collective: ranks 0 and 1 fail naming rank 2."""
    c = cluster(3)
    c.start("loop", LOOP)
    c.wait_started()
    os.kill(c.pid_of_rank(2), signal.SIGKILL)
    res = c.finish(60)
    check_named(errors(res, [0, 1]), 2)


def test_stalled_rank(cluster: Any) -> None:
    """SIGSTOP of rank 2: its heartbeats stop; ranks 0 and 1 fail naming rank 2 (then it is killed)."""
    c = cluster(3)
    c.start("loop", LOOP)
    c.wait_started()
    os.kill(c.pid_of_rank(2), signal.SIGSTOP)
    t0 = time.monotonic()
    res_01 = []
    for i in (0, 1):
        out, err = c.procs[i].communicate(timeout=60)
        res_01.append((c.procs[i].returncode, "\n".join(c.out[i]) + "\n" + out, err))
    assert time.monotonic() - t0 < 30
    os.kill(c.pid_of_rank(2), signal.SIGKILL)
    check_named(errors([*res_01, (0, "", "")], [0, 1]), 2)


def test_slow_rank_does_not_time_out(cluster: Any) -> None:
    """Host 2's link limited to 40 Mbit/s and its CPU hogged: calls take longer than the timeout, yet all succeed."""
    c = cluster(3)
    tc = subprocess.run(["tc", "-n", c.ns[2], "qdisc", "add", "dev", c.dev[2], "root", "tbf", "rate", "40mbit",
                         "burst", "64kbit", "latency", "500ms"], capture_output=True, text=True, check=False)
    limited = tc.returncode == 0  # no tc / no sch_tbf: the CPU hog alone makes rank 2 slow
    env = {"HAL_COMM_TIMEOUT_MS": "1500", "MH_COUNT": str(2 << 20), "MH_CALLS": "2", "MH_VICTIM": "2"}
    t0 = time.monotonic()
    c.start("slow", env)
    res = c.finish(180)
    took = time.monotonic() - t0
    for code, out, err in res:
        assert code == 0 and "OK rank=" in out, out + err[-2000:]
    if limited:
        assert took > 1.5 * 2, f"calls took {took:.1f} s: the link limit did not slow them past the timeout"
    else:
        print(f"tc could not limit the link ({tc.stderr.strip()}): checked with the CPU hog only")
