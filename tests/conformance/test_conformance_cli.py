"""``hal conformance`` end to end: the golden CPU certificate, a broken backend, --compare.

The CPU emulator certifies at level ``full`` under ``HAL_CPU_JITTER`` and its certificate is
the golden reference; a mutant's certificate compared with it lists exactly the requirement
the mutant breaks.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hal.conformance import SCHEMA_VERSION, catalogue, suite_hash, validate

Run = Callable[..., subprocess.CompletedProcess[str]]


def _hal(python_run: Run, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return python_run(["-m", "hal", "conformance", *args], check=False, **kw)


@pytest.fixture(scope="module")
def golden(
    python_run: Run, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("golden")
    proc = _hal(
        python_run,
        "--backend",
        "cpu",
        "--report",
        str(out / "golden.json"),
        "--summary",
        str(out / "golden.md"),
        "--require",
        "full",
        # HAL_CPU_IPC=1: the emulator then declares ipc, so the golden run covers MEM-IPC-* too.
        env={"HAL_CPU_JITTER": "9", "HAL_CPU_DEVICES": "2", "HAL_CPU_IPC": "1"},
    )
    return out, proc


def test_cpu_certifies_full_under_jitter(
    golden: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, proc = golden
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[  1/" in proc.stdout and "MEM-ALLOC" in proc.stdout  # the progress display
    assert "certified (level full)" in proc.stdout
    cert = json.loads((out / "golden.json").read_text())
    validate(cert)
    assert cert["schema_version"] == SCHEMA_VERSION
    assert cert["verdict"] == "certified" and cert["level"] == "full"
    assert [r["id"] for r in cert["requirements"]] == [r.id for r in catalogue()]
    s = cert["summary"]
    assert s["total"] == len(catalogue()) and s["fail"] == 0 and s["deselected"] == 0
    assert all(
        r["status"] == "pass"
        for r in cert["requirements"]
        if r["area"] in ("MEM", "STREAM", "EVENT", "ERR", "P2P")
    )
    assert cert["suite"]["hash"] == suite_hash()[0]
    assert cert["environment"]["HAL_CPU_JITTER"] == "9"
    assert cert["backend"]["name"] == "cpu" and cert["backend"]["dist"] == "hal-sdk"
    assert [d["spec"] for d in cert["devices"]] == ["cpu:0", "cpu:1"]
    assert all(r["duration"] >= 0 and r["statement"] for r in cert["requirements"])
    md = (out / "golden.md").read_text()
    assert "**Verdict: certified** at level **full**" in md and "| MEM-OOM | pass |" in md


def test_compare_golden_with_itself(python_run: Run, golden: tuple[Path, Any]) -> None:
    g = str(golden[0] / "golden.json")
    proc = _hal(python_run, "--compare", g, g)
    assert proc.returncode == 0 and "no requirement differs" in proc.stdout


def test_declared_but_broken_capability_fails_the_default_command_and_compare_lists_it(
    python_run: Run, golden: tuple[Path, Any], mutant_path: list[Path], tmp_path: Path
) -> None:
    cert_path = tmp_path / "cert.json"
    proc = _hal(
        python_run,
        "--backend",
        "mut_peer_offset",
        "--report",
        str(cert_path),
        pythonpath=mutant_path,
    )
    assert proc.returncode == 1, (
        proc.stdout + proc.stderr
    )  # the documented default command, no --require
    assert "FAIL" in proc.stdout
    cert = json.loads(cert_path.read_text())
    validate(cert)
    # only P2P (a full-level area) broke, and a declared capability that fails fails the certificate
    assert cert["verdict"] == "not certified" and cert["level"] is None
    assert "P2P-COPY" in cert["verdict_reason"]
    broken = [r["id"] for r in cert["requirements"] if r["status"] == "fail"]
    # the peer copies break, and whatever is built on them (collectives), never the core
    assert {"P2P-COPY", "P2P-CROSS-DEVICE"} <= set(broken)
    assert all(
        r["area"] not in ("MEM", "STREAM", "EVENT", "ERR")
        for r in cert["requirements"]
        if r["id"] in broken
    )
    core = _hal(
        python_run, "--backend", "mut_peer_offset", "-k", "P2P-COPY", pythonpath=mutant_path
    )
    assert (
        core.returncode == 1 and "not certified" in core.stdout
    )  # a partial run certifies nothing
    cmp = _hal(python_run, "--compare", str(golden[0] / "golden.json"), str(cert_path))
    assert cmp.returncode == 1
    lines = [line for line in cmp.stdout.splitlines() if "golden pass" in line]
    listed = [line.split()[0] for line in lines if "(justified skip)" not in line]
    # the golden run declares ipc (HAL_CPU_IPC=1), this mutant does not: its MEM-IPC-* skips
    # are listed as justified and do not count against it
    justified = [line.split()[0] for line in lines if "(justified skip)" in line]
    assert justified == [r.id for r in catalogue() if r.id.startswith("MEM-IPC-")]
    n = len(broken) + len(justified)
    assert (
        listed == broken and f"{n} requirement(s) differ, {len(broken)} not justified" in cmp.stdout
    )


def test_selection_list_and_usage_errors(python_run: Run, tmp_path: Path) -> None:
    listing = _hal(python_run, "--list")
    assert listing.returncode == 0
    assert all(r.id in listing.stdout for r in catalogue())
    sel = _hal(
        python_run,
        "--backend",
        "cpu",
        "-k",
        "ERR-DISCOVERY or P2P-QUERY",
        "--report",
        str(tmp_path / "c.json"),
    )
    assert sel.returncode == 1 and "2 requirements: 2 passed" in sel.stdout
    cert = json.loads((tmp_path / "c.json").read_text())
    validate(cert)
    assert cert["verdict"] == "not certified" and cert["level"] is None
    assert cert["suite"]["selection"] == "ERR-DISCOVERY or P2P-QUERY"
    assert cert["summary"]["deselected"] == len(catalogue()) - 2
    for args, needle in (
        ((), "--backend NAME is required"),
        (("--backend", "no-such-backend"), "not a known backend"),
        (("--backend", "cpu", "-k", "MEM and ("), "-k expression"),
    ):
        proc = _hal(python_run, *args)
        assert proc.returncode == 2 and needle in proc.stderr, (args, proc.stderr)


def test_opencl_certifies_full_and_differs_from_golden_only_by_declared_skips(
    python_run: Run, golden: tuple[Path, Any], tmp_path: Path
) -> None:
    import hal

    info = {b.name: b for b in hal.list_backends()}.get("opencl")
    if info is None or info.status != "available":
        pytest.skip(f"opencl backend not available: {info.reason if info else 'not installed'}")
    cert_path = tmp_path / "opencl.json"
    proc = _hal(
        python_run,
        "--backend",
        "opencl",
        "--report",
        str(cert_path),
        "--require",
        "full",
        env={"POCL_DEVICES": "pthread pthread"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cert = json.loads(cert_path.read_text())
    validate(cert)
    assert cert["level"] == "full" and len(cert["devices"]) == 2
    cmp = _hal(python_run, "--compare", str(golden[0] / "golden.json"), str(cert_path))
    assert cmp.returncode == 0, cmp.stdout  # the only differences are justified skips
    by_id = {r["id"]: r for r in cert["requirements"]}
    for line in cmp.stdout.splitlines()[1:]:
        if line.startswith("  "):
            rid = line.split()[0]
            assert by_id[rid]["status"] == "skip" and "declared absent" in by_id[rid]["reason"], (
                line
            )
            assert "(justified skip)" in line
