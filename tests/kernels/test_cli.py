"""``hal kernels plan|accuracy|translate`` and ``hal bench kernels`` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import hal.kernels.spi


def _hal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hal", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "HAL_KERNELS_SUMMARY": "0"},
    )


def test_plan_json() -> None:
    out = _hal("kernels", "plan", "--backend", "cpu", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["plan"]
    assert {r["op"] for r in rows} == set(hal.kernels.spi.OPS)
    assert all(
        set(r) == {"backend", "device", "op", "dtype", "implementation", "name"} for r in rows
    )


def test_plan_table() -> None:
    out = _hal("kernels", "plan")
    assert out.returncode == 0, out.stderr
    assert "cpu:numpy.matmul(BLAS)" in out.stdout and "accumulate" in out.stdout


def test_accuracy_json() -> None:
    out = _hal(
        "kernels", "accuracy", "--backend", "cpu", "--op", "softmax", "--op", "accumulate", "--json"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["pass"] is True
    assert (
        doc["tolerances"]["float32"]["rtol"] == 1.3e-6
        and "PyTorch" in doc["tolerances"]["float32"]["source"]
    )
    row = doc["rows"][0]
    for key in (
        "op",
        "dtype",
        "implementation",
        "max_abs",
        "max_rel",
        "max_ulp",
        "rtol",
        "atol",
        "nan_inf",
        "pass",
    ):
        assert key in row
    assert {r["op"] for r in doc["rows"]} == {"softmax", "accumulate"}


def test_translate_prints_backend_code(tmp_path: Path) -> None:
    src = tmp_path / "k.c"
    src.write_text("HAL_KERNEL void k(HAL_GLOBAL T* p) { p[HAL_GLOBAL_ID(0)] = 1; }\n")
    out = _hal("kernels", "translate", str(src), "--backend", "opencl", "-D", "T=hal_f32")
    assert out.returncode == 0, out.stderr
    assert "__kernel void k(__global float* p__base, long p__off)" in out.stdout
    bad = _hal("kernels", "translate", str(src), "--backend", "fortran")
    assert bad.returncode == 1 and "fortran" in bad.stderr


def test_bench_kernels_json() -> None:
    out = _hal(
        "bench",
        "kernels",
        "--backend",
        "cpu",
        "--op",
        "axpy",
        "--size",
        "4096",
        "--batches",
        "1",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["results"]
    assert [(r["op"], r["implementation"], r["size"]) for r in rows] == [("axpy", "generic", 4096)]
    out = _hal(
        "bench",
        "kernels",
        "--backend",
        "cpu",
        "--op",
        "matmul",
        "--size",
        "48",
        "--batches",
        "1",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["results"]
    assert [r["implementation"] for r in rows] == ["dedicated", "generic"]
    for r in rows:
        assert r["hal_ms"] > 0 and r["numpy_ms"] > 0 and r["ratio"] > 0 and r["backend"] == "cpu"
