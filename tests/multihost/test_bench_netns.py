"""scripts/bench_comm_netns.py: tcp, ucx, mpi and MPICH side by side between two namespace hosts, in one run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hal.comm._ucx import ucx_missing

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_comm_netns.py"


def test_one_run_reports_every_engine() -> None:
    """One small run (4 KiB and 64 KiB, one batch): every engine's row has a time, a busbw and no wrong element."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns); CI runs as root")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed (the mpi extra)")
    engines = ["tcp", "mpi"] + ([] if ucx_missing() else ["ucx"])
    sizes = ["--min", "4K", "--max", "64K", "-f", "16", "--batches", "1"]
    argv = [
        sys.executable,
        str(SCRIPT),
        *sizes,
        "--json",
        "--engines",
        ",".join(engines),
        "--timeout",
        "240",
    ]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert not out["failed"], out["failed"]
    want = {"tcp", "mpi", "MPICH", *(["ucx"] if "ucx" in engines else [])}
    assert [r["size"] for r in out["rows"]] == [4096, 65536], out["rows"]
    for row in out["rows"]:
        for engine in want:
            assert row[f"{engine}_us"] > 0 and row[f"{engine}_busbw"] > 0, row
    for engine, res in out["runs"].items():
        assert res["ranks"] == 2 and all(r["oop_wrong"] == 0 for r in res["rows"]), (
            engine,
            res["rows"],
        )
    assert out["runs"]["mpi"]["transport"] == "mpi"
    if "ucx" in engines:
        assert out["runs"]["ucx"]["transport"] == "ucx"
