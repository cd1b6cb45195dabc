"""Ranks on 3 emulated hosts (network namespaces, TCP): a cut link, a killed rank, a stalled rank, a slow one;
strangers on another host; IPv6.

Each fault must end on the surviving ranks with a CommError within the timeout naming the
culprit rank and the operation; a slow-but-alive rank must not trip a timeout; a stranger
without the job's secret can neither join, read nor forge. The baseline and the three faults
run over hal's TCP transport and over UCX (``HAL_COMM_TRANSPORT=ucx``, UCX over TCP:
``UCX_TLS=tcp``; skipped with the reason where the UCX binding is not installed).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hal.comm._ucx import ucx_missing

RANK = str(Path(__file__).resolve().parent / "rank.py")
STRANGER = str(Path(__file__).resolve().parent / "stranger.py")

TIMEOUT_MS = 3000
# 3 calls of 8 MB: large enough that a fault injected after the first lands mid-call
LOOP = {
    "HAL_COMM_TIMEOUT_MS": str(TIMEOUT_MS),
    "MH_COUNT": str(2 << 20),
    "MH_CALLS": "400",
    "MH_VICTIM": "2",
}


_NO_UCX = ucx_missing()
#: The transports the fault tests run over: hal's TCP, and UCX over TCP.
TRANSPORTS = [
    "tcp",
    pytest.param(
        "ucx",
        marks=pytest.mark.skipif(_NO_UCX is not None, reason=f"UCX is not installed: {_NO_UCX}"),
    ),
]


def over(transport: str) -> dict[str, str]:
    """Return the ranks' environment for ``transport`` (UCX restricted to its TCP transport)."""
    if transport == "ucx":
        return {"HAL_COMM_TRANSPORT": "ucx", "UCX_TLS": "tcp"}
    return {"HAL_COMM_TRANSPORT": transport}


def errors(results: list[tuple[int | None, str, str]], ranks: list[int]) -> dict[int, str]:
    """Return the ERROR line of each rank in ``ranks`` (asserting each has one)."""
    out = {}
    for r in ranks:
        code, stdout, stderr = results[r]
        lines = [x for x in stdout.splitlines() if x.startswith("ERROR ")]
        assert code == 0 and lines, (
            f"rank {r} (exit {code}) has no CommError:\n{stdout}\n{stderr[-3000:]}"
        )
        out[r] = lines[0]
    return out


def check_named(lines: dict[int, str], culprit: int) -> None:
    """Every survivor names the culprit and the operation, and failed within the timeout (+ slack)."""
    for r, line in lines.items():
        assert "op=all_reduce" in line, line
        assert re.search(rf"ranks=\([^)]*\b{culprit}\b", line), (
            f"rank {r} does not name rank {culprit}: {line}"
        )
        after = float(line.split("after=")[1].split(":")[0])
        assert after < TIMEOUT_MS / 1e3 * 2 + 2, line


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_three_hosts_all_reduce(cluster: Any, transport: str) -> None:
    """Baseline: 3 namespaces, TCP with 2 sockets per peer, or UCX on the interface HAL_COMM_IFNAME names
    (mapped to UCX_NET_DEVICES); results match NumPy."""
    c = cluster(3)
    extra = {"HAL_COMM_IFNAME": f"hv{c.tag}"} if transport == "ucx" else {}
    c.start("ok", {"HAL_COMM_NSOCKS": "2", "MH_CALLS": "3", **over(transport), **extra})
    c.finish_ok(120)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_link_cut_mid_collective(cluster: Any, transport: str) -> None:
    """``ip link set DEV down`` on host 2 while calls run: ranks 0 and 1 fail naming rank 2."""
    c = cluster(3)
    c.start("loop", {**LOOP, **over(transport)})
    c.wait_started()
    subprocess.run(["ip", "-n", c.ns[2], "link", "set", c.dev[2], "down"], check=True)
    res = c.finish(60)
    check_named(errors(res, [0, 1]), 2)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_killed_rank(cluster: Any, transport: str) -> None:
    """SIGKILL of rank 2 mid-collective: ranks 0 and 1 fail naming rank 2."""
    c = cluster(3)
    c.start("loop", {**LOOP, **over(transport)})
    c.wait_started()
    os.kill(c.pid_of_rank(2), signal.SIGKILL)
    res = c.finish(60)
    check_named(errors(res, [0, 1]), 2)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_stalled_rank(cluster: Any, transport: str) -> None:
    """SIGSTOP of rank 2: its heartbeats stop; ranks 0 and 1 fail naming rank 2 (then it is killed)."""
    c = cluster(3)
    c.start("loop", {**LOOP, **over(transport)})
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
    tc = c.limit_link(2, "40mbit", "64kbit", "500ms")
    limited = tc.returncode == 0  # no tc / no sch_tbf: the CPU hog alone makes rank 2 slow
    env = {
        "HAL_COMM_TIMEOUT_MS": "1500",
        "MH_COUNT": str(2 << 20),
        "MH_CALLS": "2",
        "MH_VICTIM": "2",
    }
    t0 = time.monotonic()
    c.start("slow", env)
    c.finish_ok(180)
    took = time.monotonic() - t0
    if limited:
        assert took > 1.5 * 2, (
            f"calls took {took:.1f} s: the link limit did not slow them past the timeout"
        )
    else:
        print(f"tc could not limit the link ({tc.stderr.strip()}): checked with the CPU hog only")


def _line(p: subprocess.Popen[str], prefix: str, timeout: float = 60) -> str:
    """Return the first line of ``p``'s stdout starting with ``prefix``."""
    assert p.stdout is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError(
        f"no {prefix!r} line: {''.join(seen)}{p.stderr.read() if p.stderr else ''}"
    )


def test_strangers_cannot_join_read_or_forge(cluster: Any) -> None:
    """A job of 2 (hosts 0, 1) with a secret; on host 2, without it: a stock hal process claiming rank 1
    before the real one and a raw socket claiming rank 99 are refused and served nothing; then 100
    silent connections are held open on the rendezvous (reopened when dropped) while the real rank 1
    joins within the usual 3 s timeout, and both compute the right sums."""
    c = cluster(3)
    env = {"HAL_COMM_TIMEOUT_MS": "30000", "MH_COUNT": "4096", "MH_CALLS": "2"}
    c.start("ok", env, hosts=[0], world=2)
    stranger = {"HAL_COMM_SECRET": "<unset>"}
    stock = c.spawn(
        2,
        [sys.executable, RANK, "ok"],
        c.env({**env, **stranger, "HAL_RANK": "1", "HAL_LOCAL_RANK": "0"}, world=2),
    )
    out, err = stock.communicate(timeout=60)
    assert "REFUSED rank=1" in out and "did not prove it holds the job's secret" in out, (
        out + err[-2000:]
    )
    raw = c.spawn(
        2, [sys.executable, STRANGER, "claim", c.addr[0], "29517", "99", "2"], c.env(stranger)
    )
    out, err = raw.communicate(timeout=60)
    assert "authentication failed" in out and "HUNG UP" in out and "values" not in out, (
        out + err[-2000:]
    )
    flood = c.spawn(
        2, [sys.executable, STRANGER, "flood", c.addr[0], "29517", "100", "40"], c.env(stranger)
    )
    _line(flood, "FLOODING")
    c.start("ok", {**env, "HAL_COMM_TIMEOUT_MS": "3000"}, hosts=[1], world=2)  # under the flood
    c.finish_ok(60)
    assert flood.poll() is None  # the flood was still on


@pytest.mark.parametrize("attempt", [1, 2])
def test_killed_rank_every_survivor_names_it_and_shrinks(cluster: Any, attempt: int) -> None:
    """4 hosts, SIGKILL of rank 2; each survivor calls the default ``comm.shrink()`` at once (closing its
    sockets). Rank 0 is no ring neighbour of rank 2: it sees its neighbours hang up, yet names exactly rank 2
    (their heartbeats said whom they blame), as do the others; all three shrink to a working world of 3."""
    c = cluster(4)
    c.start("shrink", {**LOOP, "MH_LINGER_S": "0"})
    c.wait_started()
    os.kill(c.pid_of_rank(2), signal.SIGKILL)
    res = c.finish(90)
    lines = errors(res, [0, 1, 3])
    check_named(lines, 2)
    for r, line in lines.items():
        assert "ranks=(2,)" in line, f"rank {r} names another rank than the dead one: {line}"
        new_rank = r if r < 2 else r - 1
        assert f"SHRUNK rank={r} new_rank={new_rank} size=3 ok=True" in res[r][1], (
            res[r][1] + res[r][2][-3000:]
        )


def test_slow_link_2mbit_is_not_a_timeout(cluster: Any) -> None:
    """Host 2's link limited to 2 Mbit/s (``tc tbf``): one 700 KB piece takes ~3 s, twice the 1.5 s
    timeout, yet every call succeeds: progress counts bytes (a partial piece; a neighbour's bytes)."""
    c = cluster(3)
    tc = c.limit_link(2, "2mbit", "32kbit", "400ms")
    if tc.returncode:
        pytest.skip(f"tc cannot limit the link here: {tc.stderr.strip()}")
    c.start("ok", {"HAL_COMM_TIMEOUT_MS": "1500", "MH_COUNT": str(512 << 10), "MH_CALLS": "2"})
    c.finish_ok(240)


def test_ipv6_between_hosts(cluster: Any) -> None:
    """The rendezvous at rank 0's IPv6 address (``[fdXX:...::1]:PORT``) and the TCP mesh over IPv6."""
    c = cluster(3)
    c.start("ok", {"HAL_STORE_ADDR": f"[{c.addr6[0]}]:29517", "MH_CALLS": "2", "MH_COUNT": "65536"})
    c.finish_ok(120)
