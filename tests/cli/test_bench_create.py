"""``hal bench comm --create``: the cost of an in-process communicator's create/close, in this process.

No timing is asserted (the numbers depend on the machine); the document, the devices used and
the error for too few devices are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def test_bench_comm_create_json(python_json: Callable[..., Any]) -> None:
    """Both timings, on the devices asked for, with the load average around them."""
    doc = python_json(
        ["-m", "hal", "bench", "comm", "--create", "--iters", "5", "--batches", "2", "--json"],
        env={"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "3"},
    )
    assert doc["devices"] == ["cpu:0", "cpu:1"]  # --nranks defaults to 2
    assert (doc["iters"], doc["batches"]) == (5, 2)
    assert doc["create_close_us"] > 0 and doc["cycle_us"] > 0
    assert len(doc["loadavg"]) == 3 and len(doc["loadavg_end"]) == 3


def test_bench_comm_create_table_and_device_count(python_run: Callable[..., Any]) -> None:
    """The table names both rows; more ranks than devices exits 1 naming both counts."""
    env = {"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "3"}
    args = ["-m", "hal", "bench", "comm", "--create", "--iters", "3", "--batches", "1"]
    out = python_run([*args, "-n", "3"], env=env).stdout
    assert "3 devices (cpu:0, cpu:1, cpu:2)" in out
    assert "create + close (unused)" in out and "create + all_reduce 4 KB + close" in out
    proc = python_run([*args, "-n", "4"], env=env, check=False)
    assert proc.returncode == 1
    assert "4 devices wanted, 3 found" in proc.stderr
