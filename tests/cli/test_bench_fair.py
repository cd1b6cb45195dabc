"""The benches compare like with like and say how (issue #16 item 6), and write what the docs show.

Tiny sizes and one or two batches: the harness is tested, never a timing. Every ratio is
hal time / baseline time; every JSON carries its methodology, the load average at start and
end and the machine's memcpy bandwidth.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hal.cli.bench import RATIO, memcpy_bandwidth, method
from hal.cli.bench._comm import OPENMPI_INSTALL, openmpi_launch
from hal.cli.bench._kernels_run import blas_saxpy

METHOD_KEYS = {"clock", "repetitions", "statistic", "interleaving", "ratio"}
MPIEXEC = Path(sys.executable).with_name("mpiexec")


def _machine_fields(doc: dict[str, Any]) -> None:
    assert METHOD_KEYS <= doc["methodology"].keys(), doc["methodology"]
    assert doc["methodology"]["ratio"] == RATIO
    assert len(doc["loadavg"]) == 3 and len(doc["loadavg_end"]) == 3
    assert doc["memcpy_GBps"] > 0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update(HAL_BACKENDS="cpu", HAL_CPU_DEVICES="1", HAL_COMM_TIMEOUT_MS="60000")
    return env


def _hal(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> Any:
    proc = subprocess.run(
        [sys.executable, "-m", "hal", *args],
        env=env or _env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    return proc


def test_method_and_memcpy_helpers() -> None:
    m = method(clock="c", repetitions="r", statistic="s", interleaving="i", placement="p")
    assert m == {
        "clock": "c",
        "repetitions": "r",
        "statistic": "s",
        "interleaving": "i",
        "ratio": RATIO,
        "placement": "p",
    }
    assert memcpy_bandwidth(1 << 20, repeat=1) > 0


def test_blas_saxpy_is_blas_and_right() -> None:
    saxpy, how = blas_saxpy()
    assert saxpy is not None, how  # NumPy's wheel links OpenBLAS
    assert "saxpy" in how
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1001).astype(np.float32)
    y = rng.standard_normal(1001).astype(np.float32)
    want = np.float32(0.5) * x + y
    saxpy(0.5, x, y)
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_bench_kernels_ratios_are_hal_over_baseline(tmp_path: Path) -> None:
    proc = _hal(
        [
            *("bench", "kernels", "--backend", "cpu", "--op", "axpy", "--size", "4096"),
            *("--batches", "1", "--no-launch", "--json"),
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["benchmark"] == "kernels"
    _machine_fields(doc)
    (row,) = doc["results"]
    assert row["ratio"] == pytest.approx(row["hal_ms"] / row["numpy_ms"])
    assert row["blas_ms"] > 0 and row["blas_ratio"] == pytest.approx(row["hal_ms"] / row["blas_ms"])
    if row["torch_ms"] is not None:
        assert row["torch_ratio"] == pytest.approx(row["hal_ms"] / row["torch_ms"])
    assert row["hal_event_ms"] is None or row["hal_event_ms"] > 0
    assert "one pass" in row["method"] and "interleaved" in row["method"]
    (tmp_path / "kernels.json").write_text(proc.stdout)
    report = _hal(["bench", "report", str(tmp_path)], tmp_path)
    assert report.returncode == 0, report.stderr
    assert "### `hal bench kernels`" in report.stdout and "load average" in report.stdout
    assert "| cpu | axpy | 4K | generic |" in report.stdout


def test_bench_comm_mpi_in_place_out_of_place_avg(tmp_path: Path) -> None:
    if not MPIEXEC.exists():
        pytest.skip("mpiexec (the mpich wheel of the mpi extra) not installed")
    env = _env()
    env["PATH"] = f"{MPIEXEC.parent}{os.pathsep}{env.get('PATH', '')}"
    args = ["bench", "comm", "-n", "2", "--min", "4K", "--max", "64K", "-f", "16", "--iters", "2"]
    args += ["--batches", "1", "--redop", "avg", "--baseline", "mpi", "--json"]
    proc = _hal(args, tmp_path, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    _machine_fields(doc)
    assert doc["baseline"] == "mpi" and "MPICH" in doc["baseline_library"]
    assert [r["size"] for r in doc["rows"]] == [4096, 65536]  # -f 16
    for r in doc["rows"]:
        assert r["redop"] == "avg" and r["oop_wrong"] == 0 and r["inplace_wrong"] == 0, r
        assert r["ratio"] == pytest.approx(r["oop_time_us"] / r["mpi_time_us"])
        assert r["inplace_ratio"] == pytest.approx(r["inplace_time_us"] / r["mpi_inplace_time_us"])
    (tmp_path / "comm.json").write_text(proc.stdout)
    report = _hal(["bench", "report", str(tmp_path)], tmp_path)
    assert report.returncode == 0, report.stderr
    assert "beside MPICH" in report.stdout and "| 64 KiB |" in report.stdout
    assert "load average" in report.stdout


def test_bench_comm_openmpi_missing_says_how_to_install(tmp_path: Path) -> None:
    venv = tmp_path / "no-such-venv"
    found = openmpi_launch(str(venv))
    assert isinstance(found, str)
    proc = _hal(
        ["bench", "comm", "--baseline", "openmpi", "--openmpi-venv", str(venv), "--max", "4K"],
        tmp_path,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    for command in OPENMPI_INSTALL:
        assert command.format(venv=venv) in proc.stderr, proc.stderr
    assert "apt-get install -y openmpi-bin libopenmpi-dev" in proc.stderr


def test_bench_comm_openmpi_baseline(tmp_path: Path) -> None:
    found = openmpi_launch()
    if isinstance(found, str):
        pytest.skip(found.splitlines()[0])
    _mpirun, env = found
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    proc = _hal(
        [
            *("bench", "comm", "-n", "2", "--min", "4K", "--max", "4K", "--iters", "2"),
            *("--batches", "1", "--baseline", "openmpi", "--json"),
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["baseline"] == "openmpi" and "Open MPI" in doc["baseline_library"]
    (row,) = doc["rows"]
    assert row["oop_wrong"] == 0 and row["openmpi_time_us"] > 0
    assert row["ratio"] == pytest.approx(row["oop_time_us"] / row["openmpi_time_us"])


def test_bench_memory_and_sched_carry_their_method(
    python_json: Callable[..., Any], tmp_path: Path
) -> None:
    doc = python_json(
        [
            "-m",
            "hal",
            "bench",
            "memory",
            "--backend",
            "cpu",
            "--max",
            "1K",
            "--repeat",
            "1",
            "--json",
        ],
        cwd=tmp_path,
    )
    _machine_fields(doc)
    assert "pinned" in doc["methodology"]["placement"]
    (tmp_path / "memory.json").write_text(json.dumps(doc))
    report = _hal(["bench", "report", str(tmp_path)], tmp_path)
    assert report.returncode == 0 and "### `hal bench memory`" in report.stdout
    assert "| h2d | 1 KiB |" in report.stdout


def test_bench_report_needs_a_folder(tmp_path: Path) -> None:
    proc = _hal(["bench", "report", str(tmp_path / "missing")], tmp_path)
    assert proc.returncode == 2 and "is not a folder" in proc.stderr


def test_nox_bench_session_runs_every_bench() -> None:
    """noxfile's bench steps name real ``hal bench`` commands (parsed, not run)."""
    pytest.importorskip("nox", reason="noxfile imports nox (in the test extra)")
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    try:
        import noxfile
    finally:
        sys.path.remove(str(root))
    from hal.cli import build_parser

    parser = build_parser()
    kinds = set()
    for line in noxfile.BENCH_STEPS.values():
        args = parser.parse_args(["bench", *line.split(), "--json"])
        kinds.add(args.benchmark)
    assert kinds == {"memory", "kernels", "comm", "sched"}
    assert any("openmpi" in line for line in noxfile.BENCH_STEPS.values())


def test_pinned_rows_time_the_raw_pinned_copy_where_the_baseline_has_one() -> None:
    """A baseline module with ``transfer_seconds(..., host=)`` (CUDA's) gets pinned-vs-pinned columns."""
    import time
    import types

    import hal
    from hal.cli.bench._memory import pinned_rows

    module = types.ModuleType("hal_test_pinned_baseline")
    hosts: list[str] = []

    def transfer_seconds(
        direction: str, nbytes: int, repeat: int, *, host: str = "pageable"
    ) -> float:
        hosts.append(host)
        src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
        t0 = time.perf_counter()
        for _ in range(repeat):
            np.copyto(dst, src)
        return (time.perf_counter() - t0) / repeat

    def memory_baseline(direction: str, nbytes: int, repeat: int) -> float:
        return transfer_seconds(direction, nbytes, repeat)

    setattr(module, "transfer_seconds", transfer_seconds)  # noqa: B010 - a module built here
    memory_baseline.__module__ = module.__name__
    sys.modules[module.__name__] = module
    try:
        (row,) = pinned_rows(hal.device("cpu:0"), [4096], 2, memory_baseline)
        (plain,) = pinned_rows(hal.device("cpu:0"), [4096], 2, None)
    finally:
        del sys.modules[module.__name__]
    assert set(hosts) == {"pinned"}
    for direction in ("h2d", "d2h"):
        assert row[f"{direction}_raw_pinned_GBps"] > 0 and row[f"{direction}_pinned_GBps"] > 0
        assert row[f"{direction}_pinned_ratio"] == pytest.approx(
            row[f"{direction}_raw_pinned_GBps"] / row[f"{direction}_pinned_GBps"]
        )
        assert f"{direction}_raw_pinned_GBps" not in plain and plain[f"{direction}_pinned_GBps"] > 0


def test_memory_warm_up_is_as_long_on_both_sides_and_longer_for_small_copies() -> None:
    """hal's path reaches its steady state (CPython specializes after several calls) before the
    samples; the baseline gets as many untimed transfers, and each side's round starts warm."""
    import hal
    from hal.cli.bench import _memory

    calls: list[int] = []

    def baseline(direction: str, nbytes: int, repeat: int) -> float:
        calls.append(repeat)
        return 1e-6

    row = _memory.measure("h2d", hal.devices("cpu"), 1024, 9, baseline)
    assert row["verified"] and "raw_error" not in row
    assert calls[0] == _memory.warmup_count(1024) == _memory.WARMUP_MAX  # untimed, as hal's
    # then three rounds of 3 samples, each after WARMUP untimed transfers (as hal's rounds)
    assert calls[1:] == [_memory.WARMUP, 3] * 3
    assert _memory.warmup_count(1 << 20) == 64
    assert _memory.warmup_count(256 << 20) == _memory.WARMUP  # large copies: two, as before
