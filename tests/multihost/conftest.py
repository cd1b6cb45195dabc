"""Emulated hosts: one network namespace per "host", joined by veth pairs to a bridge.

Needs root and ``ip netns`` (iproute2). Names carry a random tag, so runs never collide, and
every namespace is deleted after the test, even when it fails. Only addresses inside the
namespaces created here are used (10.<a>.<b>.0/24 on the bridge, and fdXX:XXXX::/64 for IPv6).
Every job gets a fresh ``HAL_COMM_SECRET`` unless the test says otherwise.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RANK = str(Path(__file__).resolve().parent / "rank.py")
STRANGER = str(Path(__file__).resolve().parent / "stranger.py")


def _skip_reason() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "multi-host tests need root (ip netns); CI runs them as root"
    if shutil.which("ip") is None:
        return "multi-host tests need `ip` (iproute2: apt-get install -y iproute2)"
    probe = f"h7probe{os.getpid()}"
    ok = (
        subprocess.run(["ip", "netns", "add", probe], capture_output=True, check=False).returncode
        == 0
    )
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    if not ok:
        return "`ip netns add` does not work here (no CAP_SYS_ADMIN?)"
    return None


def ip(*args: str) -> None:
    """Run ``ip ARGS``; raise with its stderr on failure."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


class Cluster:
    """``hosts`` namespaces on one bridge; :meth:`start` launches one rank per host."""

    def __init__(self, hosts: int) -> None:
        tag = f"{random.randrange(16**4):04x}"
        self.tag = tag
        self.sw = f"hal{tag}sw"
        self.ns = [f"hal{tag}h{i}" for i in range(hosts)]
        self.dev = [f"hv{tag}{i}" for i in range(hosts)]  # the host end of each veth
        net = f"10.{random.randrange(100, 250)}.{random.randrange(0, 250)}"
        self.addr = [f"{net}.{i + 1}" for i in range(hosts)]
        net6 = f"fd{random.randrange(16**2):02x}:{tag}"
        self.addr6 = [f"{net6}::{i + 1}" for i in range(hosts)]
        self.secret = secrets.token_hex(32)
        self.procs: list[subprocess.Popen[str]] = []
        self.others: list[subprocess.Popen[str]] = []
        self.created: list[str] = []

    def up(self) -> None:
        """Create the bridge namespace, the host namespaces and their veth pairs."""
        ip("netns", "add", self.sw)
        self.created.append(self.sw)
        ip("-n", self.sw, "link", "add", "br0", "type", "bridge")
        ip("-n", self.sw, "link", "set", "br0", "up")
        for i, ns in enumerate(self.ns):
            ip("netns", "add", ns)
            self.created.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
            ip(
                "link",
                "add",
                self.dev[i],
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                f"hs{self.tag}{i}",
                "netns",
                self.sw,
            )
            ip("-n", self.sw, "link", "set", f"hs{self.tag}{i}", "master", "br0")
            ip("-n", self.sw, "link", "set", f"hs{self.tag}{i}", "up")
            ip("-n", ns, "addr", "add", f"{self.addr[i]}/24", "dev", self.dev[i])
            ip("-n", ns, "-6", "addr", "add", f"{self.addr6[i]}/64", "dev", self.dev[i], "nodad")
            ip("-n", ns, "link", "set", self.dev[i], "up")

    def env(self, env: dict[str, str], *, world: int | None = None) -> dict[str, str]:
        """Return the ranks' environment: TCP, rendezvous at rank 0's address, the job's secret, ``env``."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
        base.update(
            {
                "HAL_BACKENDS": "cpu",
                "HAL_CPU_DEVICES": "1",
                "HAL_COMM_TRANSPORT": "tcp",
                "HAL_WORLD_SIZE": str(world or len(self.ns)),
                "HAL_STORE_ADDR": f"{self.addr[0]}:29517",
                "PYTHONUNBUFFERED": "1",
                "HAL_COMM_SECRET": self.secret,
            }
        )
        base.update(env)
        return {k: v for k, v in base.items() if v is not None and v != "<unset>"}

    def start(
        self,
        scenario: str,
        env: dict[str, str],
        *,
        hosts: list[int] | None = None,
        world: int | None = None,
    ) -> None:
        """Start rank i in namespace i (TCP transport, rendezvous at rank 0's address) for each i of ``hosts``."""
        base = self.env(env, world=world)
        for i in hosts if hosts is not None else range(len(self.ns)):
            child = dict(base, HAL_RANK=str(i), HAL_LOCAL_RANK="0")
            self.procs.append(self.spawn(i, [sys.executable, RANK, scenario], child))

    def spawn(self, host: int, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        """Run ``argv`` in namespace ``host`` (stdout/stderr piped); it is killed by :meth:`down`."""
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.ns[host], *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.others.append(p)
        return p

    def wait_started(self, timeout: float = 60) -> None:
        """Wait until every rank printed ``STARTED`` (reads stdout line by line)."""
        self.out: list[list[str]] = [[] for _ in self.procs]
        deadline = time.monotonic() + timeout
        for i, p in enumerate(self.procs):
            assert p.stdout is not None
            while time.monotonic() < deadline:
                line = p.stdout.readline()
                if not line:
                    raise AssertionError(
                        f"rank {i} ended before starting: {p.stderr.read() if p.stderr else ''}"
                    )
                self.out[i].append(line.rstrip())
                if line.startswith("STARTED"):
                    break

    def finish(self, timeout: float) -> list[tuple[int | None, str, str]]:
        """Wait for every rank (at most ``timeout`` s in all); return (code, stdout, stderr) per rank."""
        deadline = time.monotonic() + timeout
        results: list[tuple[int | None, str, str]] = []
        for i, p in enumerate(self.procs):
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill(p)
                out, err = p.communicate()
                results.append(
                    (None, "\n".join(getattr(self, "out", [[]] * len(self.procs))[i]) + out, err)
                )
                continue
            prior = "\n".join(self.out[i]) + "\n" if hasattr(self, "out") else ""
            results.append((p.returncode, prior + out, err))
        return results

    def finish_ok(self, timeout: float) -> list[tuple[int | None, str, str]]:
        """:meth:`finish`, asserting that every rank exited 0 and printed its ``OK rank=`` line."""
        res = self.finish(timeout)
        for code, out, err in res:
            assert code == 0 and "OK rank=" in out, out + err[-2000:]
        return res

    def limit_link(
        self, host: int, rate: str, burst: str, latency: str
    ) -> subprocess.CompletedProcess[str]:
        """Limit ``host``'s link with a ``tc tbf`` qdisc; return tc's result (not checked)."""
        qdisc = ["tbf", "rate", rate, "burst", burst, "latency", latency]
        return subprocess.run(
            ["tc", "-n", self.ns[host], "qdisc", "add", "dev", self.dev[host], "root", *qdisc],
            capture_output=True,
            text=True,
            check=False,
        )

    def pid_of_rank(self, i: int) -> int:
        """Return the pid of rank i's Python (``ip netns exec`` execs it, so it is the child's pid)."""
        return self.procs[i].pid

    @staticmethod
    def _kill(p: subprocess.Popen[str]) -> None:
        try:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        except ProcessLookupError:
            pass

    def down(self) -> None:
        """Kill what still runs and delete every namespace created (their veths go with them)."""
        for p in dict.fromkeys([*self.procs, *self.others]):
            if p.poll() is None:
                self._kill(p)
            try:
                p.communicate(timeout=10)  # also closes the pipes
            except (subprocess.TimeoutExpired, ValueError):  # pragma: no cover
                pass
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@pytest.fixture
def cluster() -> Iterator[Any]:
    """Return a factory ``cluster(hosts)`` of :class:`Cluster`; everything is removed afterwards."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    made: list[Cluster] = []

    def make(hosts: int) -> Cluster:
        c = Cluster(hosts)
        made.append(c)
        c.up()
        return c

    try:
        yield make
    finally:
        for c in made:
            c.down()
