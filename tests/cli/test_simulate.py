"""``hal simulate``: predictions of the planner on a described cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hal.cli._simulate import simulate
from hal.comm import _plan
from hal.comm._topo import Topology


def cluster(hosts: int, devices: int, bw: float = 25.0) -> dict[str, object]:
    """Return a topology dict of ``hosts`` x ``devices`` with one link model."""
    return {
        "version": 1,
        "hosts": [{"name": f"node{i:03d}", "devices": devices} for i in range(hosts)],
        "links": [{"hosts": ["node000", "node001"], "bandwidth_gbps": bw, "latency_us": 5.0}]
        if hosts > 1
        else [],
    }


def hal(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``hal`` command."""
    return subprocess.run(
        [sys.executable, "-m", "hal", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_large_cluster_prediction(tmp_path: Path) -> None:
    """128 hosts x 8 devices, 1G all_reduce: every algorithm predicted; hierarchical chosen; busbw = 2(p-1)/p algbw."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cluster(128, 8)))
    proc = hal("simulate", "--topology", str(path), "--op", "all_reduce", "--size", "1G", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["ranks"], out["hosts"], out["ranks_per_host"], out["transport"]) == (
        1024,
        128,
        8,
        "tcp",
    )
    rows = {r["algorithm"]: r for r in out["algorithms"]}
    assert set(rows) == {"ring", "recursive_doubling", "rabenseifner", "hierarchical"}
    assert out["chosen"] == "hierarchical" == min(rows, key=lambda a: rows[a]["time_us"])
    for r in rows.values():
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * 1023 / 1024, rel=1e-2)
    text = hal("simulate", "--topology", str(path), "--size", "1G").stdout
    assert "hierarchical" in text and "<- chosen" in text and "1024 ranks, 128 host(s)" in text


def test_same_numbers_as_the_planner() -> None:
    """The simulation calls the planner's predict(): same inputs, same time."""
    topo = Topology.from_dict(cluster(4, 2, bw=1.0))
    out = simulate(topo, "all_reduce", 64 << 20)
    from hal.comm._tcp import TcpTransport

    want = _plan.predict(
        "all_reduce",
        "ring",
        64 << 20,
        8,
        TcpTransport.alpha_s,
        TcpTransport.beta_s_per_byte,
        1 << 20,
        hosts=4,
        per_host=2,
        inter=topo.inter_host(),
    )
    ring = next(r for r in out["algorithms"] if r["algorithm"] == "ring")
    assert ring["time_us"] == pytest.approx(want * 1e6, rel=1e-6)


def test_one_host_never_hierarchical(tmp_path: Path) -> None:
    """On one host the hierarchical algorithm cannot run (shown as such) and shm is the transport."""
    out = simulate(Topology.from_dict(cluster(1, 4)), "all_reduce", 1 << 30)
    assert out["transport"] == "shm" and out["chosen"] != "hierarchical"
    assert next(r for r in out["algorithms"] if r["algorithm"] == "hierarchical")["time_us"] is None


@pytest.mark.parametrize("args", [["--size", "huge"], ["--op", "scan"]])
def test_bad_options(tmp_path: Path, args: list[str]) -> None:
    """A bad size or op is a usage error naming it."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cluster(2, 2)))
    proc = hal("simulate", "--topology", str(path), *args)
    assert proc.returncode == 2 and (args[1] in proc.stderr)


def test_bad_topology_file(tmp_path: Path) -> None:
    """A broken topology file is an error naming the file (hal simulate does not fall back)."""
    path = tmp_path / "c.json"
    path.write_text('{"hosts": [')
    proc = hal("simulate", "--topology", str(path))
    assert proc.returncode == 1 and "not valid JSON" in proc.stderr and str(path) in proc.stderr
