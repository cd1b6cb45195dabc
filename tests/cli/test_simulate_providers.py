"""``hal simulate --provider`` / ``--sizes``: the provider path on a described cluster, per size, and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hal.cli._simulate import simulate
from hal.comm import _plan
from hal.comm._providers import providers
from hal.comm._topo import Topology


def _cluster(tmp_path: Path) -> Path:
    path = tmp_path / "c128.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "hosts": [{"name": f"node{i:03d}", "devices": 8} for i in range(128)],
                "links": [
                    {"hosts": ["node000", "node001"], "bandwidth_gbps": 25.0, "latency_us": 5.0}
                ],
            }
        )
    )
    return path


def _hal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hal", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_sizes_with_nccl_on_128_hosts(tmp_path: Path) -> None:
    """128 x 8 ranks: every size takes the nccl path, priced by the provider's α, β and the slowest link."""
    proc = _hal(
        "simulate",
        "--topology",
        str(_cluster(tmp_path)),
        "--sizes",
        "4K,1M,1G",
        "--provider",
        "nccl",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)
    assert [r["bytes"] for r in runs] == [4096, 1 << 20, 1 << 30]
    nccl = providers().get("nccl")
    for r in runs:
        assert r["path"] == "provider nccl" and "provider nccl serves every rank" in r["why"]
        row = next(x for x in r["algorithms"] if x["algorithm"] == "provider nccl")
        want = _plan.predict_provider(
            "all_reduce",
            r["bytes"],
            1024,
            nccl.alpha_s,
            nccl.beta_s_per_byte,
            hosts=128,
            per_host=8,
            inter=(5e-6, 1 / 25e9),
        )
        assert abs(row["time_us"] - want * 1e6) < 0.1
        assert r["chosen"] in (
            "ring",
            "recursive_doubling",
            "rabenseifner",
            "hierarchical",
        )  # hal's best, still shown
    assert runs[-1]["chosen"] == "hierarchical"


def test_sizes_generic_say_why(tmp_path: Path) -> None:
    """Without a provider the path is hal's algorithm the cost model picks; the text table has one line per size."""
    proc = _hal("simulate", "--topology", str(_cluster(tmp_path)), "--sizes", "4K,1G")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "recursive_doubling" in lines[2] and "cost model" in lines[2]
    assert "hierarchical" in lines[3]


def test_unknown_provider_is_refused(tmp_path: Path) -> None:
    proc = _hal("simulate", "--topology", str(_cluster(tmp_path)), "--provider", "ncl")
    assert proc.returncode == 2
    assert "'ncl' is not a collective provider; known: generic, nccl, mpi" in proc.stderr


def test_one_host_provider_row() -> None:
    """One host of 8: the mpi provider's row is its own α, β (no link between hosts)."""
    topo = Topology.from_dict({"version": 1, "hosts": [{"name": "a", "devices": 8}]})
    out = simulate(topo, "broadcast", 1 << 20, None, "mpi")
    mpi = providers().get("mpi")
    row = next(x for x in out["algorithms"] if x["algorithm"] == "provider mpi")
    assert (
        abs(
            row["time_us"]
            - 1e6
            * _plan.predict_provider("broadcast", 1 << 20, 8, mpi.alpha_s, mpi.beta_s_per_byte)
        )
        < 0.1
    )
    assert out["path"] == "provider mpi"
