"""TCP transport paths: several sockets per peer (``HAL_COMM_NSOCKS``), interface choice (``HAL_COMM_IFNAME``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hal.comm._ifaces import interfaces, parse_ifname, select_interface

WORKER = str(Path(__file__).resolve().parent / "topo_worker.py")
IFACES = {
    "lo": "127.0.0.1",
    "docker0": "172.17.0.1",
    "eth0": "10.0.0.2",
    "eth1": "10.1.0.2",
    "ens5": "10.2.0.2",
}


def tcp_run(
    env: dict[str, str], n: int = 2, count: int = 1_000_000
) -> subprocess.CompletedProcess[str]:
    """Run the ``sockets`` scenario on ``n`` ranks over TCP."""
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.update(
        {"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1", "HAL_COMM_TRANSPORT": "tcp"}, **env
    )
    return subprocess.run(
        [sys.executable, "-m", "hal", "run", "-n", str(n), WORKER, "sockets", str(count)],
        env=child,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def reports(proc: subprocess.CompletedProcess[str]) -> list[dict[str, str]]:
    """Parse the ``SOCKETS`` lines of every rank."""
    out = []
    for line in proc.stdout.splitlines():
        if line.startswith("SOCKETS "):
            head, _, data = line.partition(" bytes=")
            fields = dict(kv.split("=", 1) for kv in head.split()[1:])
            fields["bytes"] = data
            out.append(fields)
    return out


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("eth", "eth0"),
        ("eth1", "eth1"),
        ("^lo,docker", "eth0"),
        ("=eth1", "eth1"),
        ("^=lo", "docker0"),
        ("ens,eth", "eth0"),
        (" ens ", "ens5"),
    ],
)
def test_select_interface_like_nccl(spec: str, want: str) -> None:
    """Prefix lists, ``^`` exclusion and ``=`` exact names pick the first match in kernel order."""
    assert select_interface(spec, IFACES) == (want, IFACES[want])


@pytest.mark.parametrize("spec", ["", "^", "=", " , ", "wlan", "=eth", "^lo,docker,eth,ens"])
def test_bad_or_unmatched_ifname_names_the_value(spec: str) -> None:
    """An empty or unmatched HAL_COMM_IFNAME is a ValueError quoting it (and listing the interfaces)."""
    with pytest.raises(ValueError, match="HAL_COMM_IFNAME="):
        select_interface(spec, IFACES)


def test_parse_ifname() -> None:
    """``^`` and ``=`` are flags in front of the list."""
    assert parse_ifname("^=lo,docker0") == (True, True, ["lo", "docker0"])
    assert parse_ifname("eth") == (False, False, ["eth"])


def test_this_host_has_loopback() -> None:
    """interfaces() reads this host's IPv4 addresses (loopback at least)."""
    assert interfaces().get("lo") == "127.0.0.1"


def test_large_messages_spread_over_every_socket() -> None:
    """HAL_COMM_NSOCKS=3: a 4 MB all_reduce cut in 64 KiB pieces uses all 3 sockets, about evenly."""
    proc = tcp_run({"HAL_COMM_NSOCKS": "3", "HAL_COMM_CHUNK_BYTES": "64K", "HAL_COMM_IFNAME": "lo"})
    got = reports(proc)
    assert proc.returncode == 0 and len(got) == 2, proc.stdout + proc.stderr
    for r in got:
        assert r["ok"] == "True" and r["iface"] == "lo"
        (per_socket,) = json.loads(r["bytes"]).values()
        sent = [s for s, _ in per_socket]
        assert len(sent) == 3 and min(sent) > 0.25 * sum(sent), sent
        assert sum(sent) >= 4_000_000 * 0.5  # ring: 2(p-1)/p of 4 MB per rank


def test_ifname_exclusion_picks_another_interface() -> None:
    """HAL_COMM_IFNAME=^lo puts the sockets on a non-loopback interface (when the host has one)."""
    others = [n for n in interfaces() if n != "lo"]
    if not others:
        pytest.skip("this host has no IPv4 interface besides loopback")
    got = reports(tcp_run({"HAL_COMM_IFNAME": "^lo"}, count=1000))
    assert [r["iface"] for r in got] == [others[0]] * 2


def test_unmatched_ifname_fails_at_init() -> None:
    """No interface matches: every rank stops at init with the value and the interfaces it has."""
    proc = tcp_run({"HAL_COMM_IFNAME": "nosuchif"}, count=10)
    assert proc.returncode != 0
    assert "HAL_COMM_IFNAME='nosuchif' matches no interface" in proc.stderr
