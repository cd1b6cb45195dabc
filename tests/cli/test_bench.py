"""``hal bench memory``: the JSON document, the size options and the raw baselines.

No timing is asserted (the numbers depend on the machine); the structure, the sizes and
directions measured, and that every hal copy produced the right bytes are.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hal.backends.cpu._baseline import memory_baseline
from hal.cli import main
from hal.cli.bench import format_size, parse_size
from hal.cli.bench._memory import DIRECTIONS, load_baseline, sizes_between

ROW_KEYS = {
    "direction",
    "nbytes",
    "path",
    "hal_s",
    "raw_s",
    "hal_GBps",
    "raw_GBps",
    "ratio",
    "overhead",
}


def test_bench_memory_json_structure(python_json: Callable[..., Any], tmp_path: Path) -> None:
    doc = python_json(
        ["-m", "hal", "bench", "memory", "--max", "64K", "--repeat", "2", "--json"], cwd=tmp_path
    )
    assert doc["benchmark"] == "memory"
    assert doc["sizes"] == [1024, 4096, 16384, 65536]
    assert doc["directions"] == ["h2d", "d2h", "d2d", "peer"]
    target = doc["target"]
    assert target["overhead_max"] == pytest.approx(0.10)
    assert target["min_nbytes"] == 1 << 20
    assert target["met"] is None  # nothing >= 1 MiB was measured
    names = [s["backend"] for s in doc["backends"]]
    assert "cpu" in names
    for section in doc["backends"]:
        if section["status"] != "available":  # listed with the reason, not measured
            assert section["reason"] and section["results"] == [], section
            continue
        assert section["target"]["met"] is None
        rows = section["results"]
        assert [(r["direction"], r["nbytes"]) for r in rows] == [
            (d, n) for d in DIRECTIONS for n in doc["sizes"]
        ]
        for row in rows:
            if "skipped" in row:
                continue
            assert ROW_KEYS <= row.keys(), row
            assert "hal_error" not in row, row
            assert row["verified"] is True, row
            assert row["hal_s"] > 0 and row["hal_GBps"] > 0
            assert row["path"] == {"peer": row["path"]}.get(row["direction"], "local")
            if row["raw_s"] is not None:
                assert row["ratio"] == pytest.approx(row["hal_s"] / row["raw_s"])
                assert row["overhead"] == pytest.approx(row["ratio"] - 1)
            else:
                assert row["ratio"] is None and row["raw_error"]
    cpu = next(s for s in doc["backends"] if s["backend"] == "cpu")
    assert cpu["baseline"] == "hal.backends.cpu._baseline"
    assert all(r["raw_s"] is not None for r in cpu["results"])
    assert [r["path"] for r in cpu["results"] if r["direction"] == "peer"] == ["peer"] * 4


def test_bench_memory_table(python_run: Callable[..., Any], tmp_path: Path) -> None:
    proc = python_run(
        [
            "-m",
            "hal",
            "bench",
            "memory",
            "--backend",
            "cpu",
            "--min",
            "1M",
            "--max",
            "1M",
            "--repeat",
            "1",
        ],
        cwd=tmp_path,
    )
    out = proc.stdout
    assert "backend cpu" in out
    for direction in DIRECTIONS:
        assert f"  {direction} " in out
    assert "target: hal time <= 1.10 x raw time" in out
    assert "cpu: met" in out or "cpu: NOT met" in out


def test_bench_memory_unknown_backend_exits_1(
    python_run: Callable[..., Any], tmp_path: Path
) -> None:
    result = python_run(
        ["-m", "hal", "bench", "memory", "--backend", "nosuch", "--max", "1K", "--json"],
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1
    section = json.loads(result.stdout)["backends"][0]
    assert section["status"] == "unavailable" and "nosuch" in section["reason"]


def test_bench_without_benchmark_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench"]) == 2
    assert "memory" in capsys.readouterr().out


def test_min_above_max_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "memory", "--min", "4K", "--max", "1K"]) == 2
    assert "--min 4096 is larger than --max 1024" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "value"),
    [("1024", 1024), ("64K", 65536), ("16M", 16 << 20), ("256MiB", 256 << 20), ("1g", 1 << 30)],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["0", "-1K", "1.5M", "lots", ""])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="must be a positive byte count"):
        parse_size(text)


def test_sizes_between_powers_of_four_and_max_included() -> None:
    assert sizes_between(1024, 65536) == [1024, 4096, 16384, 65536]
    assert sizes_between(1024, 1024) == [1024]
    assert sizes_between(1024, 10000) == [1024, 4096, 10000]
    assert len(sizes_between(1 << 10, 256 << 20)) == 10


def test_format_size() -> None:
    assert [format_size(n) for n in (1000, 1024, 16 << 20, 1 << 30)] == [
        "1000 B",
        "1 KiB",
        "16 MiB",
        "1 GiB",
    ]


def test_missing_baseline_is_reported_not_raised() -> None:
    fn, why = load_baseline("nosuchbackend")
    assert fn is None
    assert why.startswith("baseline unavailable: none registered for backend 'nosuchbackend'")
    assert "hal_register_baselines" in why  # what a vendor does about it


def test_cpu_baseline_times_a_copy() -> None:
    fn, why = load_baseline("cpu")
    assert fn is memory_baseline and why == "hal.backends.cpu._baseline"
    assert memory_baseline("h2d", 4096, 3) > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("sideways", 1024, 1), "direction='sideways'"),
        (("d2d", 0, 1), "nbytes=0"),
        (("d2d", 1024, 0), "repeat=0"),
    ],
)
def test_cpu_baseline_rejects_bad_arguments(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        memory_baseline(*args)


def test_bench_memory_alloc_rows_pool_and_no_pool(
    python_json: Callable[..., Any], tmp_path: Path
) -> None:
    """alloc+free per call through the pool and straight to the backend, beside a small copy (issue #15)."""
    doc = python_json(
        [
            "-m",
            "hal",
            "bench",
            "memory",
            "--backend",
            "cpu",
            "--min",
            "4K",
            "--max",
            "4K",
            "--repeat",
            "2",
            "--json",
        ],
        cwd=tmp_path,
    )
    cpu = doc["backends"][0]
    assert [r["nbytes"] for r in cpu["alloc"]] == [4 << 10, 64 << 10, 1 << 20, 16 << 20]
    for row in cpu["alloc"]:
        assert row["pool_us"] > 0 and row["no_pool_us"] > 0, row
        assert row["speedup"] == pytest.approx(row["no_pool_us"] / row["pool_us"])
        assert "cupy_pool_us" not in row
    assert cpu["alloc_vs_copy"]["copy_nbytes"] == 4096 and cpu["alloc_vs_copy"]["copy_us"] > 0


def test_bench_memory_pageable_and_pinned_side_by_side(
    python_json: Callable[..., Any], tmp_path: Path
) -> None:
    doc = python_json(
        ["-m", "hal", "bench", "memory", "--min", "64K", "--max", "64K", "--repeat", "2", "--json"],
        cwd=tmp_path,
    )
    kinds = {}
    for section in doc["backends"]:
        if section["status"] != "available":
            continue
        (row,) = section["pinned"]
        assert row["nbytes"] == 64 << 10
        for key in ("h2d_pageable_GBps", "h2d_pinned_GBps", "d2h_pageable_GBps", "d2h_pinned_GBps"):
            assert row[key] > 0, row
        kinds[section["backend"]] = row["pinned_kind"]
    assert kinds["cpu"] == "plain"
    if "opencl" in kinds:
        assert kinds["opencl"] == "backend"
