"""``hal bench comm --baseline gloo``: torch's gloo beside hal.comm (same sizes and columns), under
the real torchrun, and the DDP step time of examples/ddp_torch.py's training on "hal" vs gloo."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "hal_torch_support", Path(__file__).with_name("support.py")
)
assert _spec is not None and _spec.loader is not None
support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(support)


def test_bench_comm_gloo_baseline_json() -> None:
    support.need_torchrun()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hal",
            "bench",
            "comm",
            "--op",
            "all_reduce",
            "-n",
            "2",
            "--min",
            "4K",
            "--max",
            "8K",
            "--iters",
            "3",
            "--baseline",
            "gloo",
            "--ddp-steps",
            "5",
            "--json",
        ],
        env=support.child_env(HAL_COMM_TIMEOUT_MS="60000"),
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["baseline"] == "gloo" and result["ranks"] == 2
    assert [row["size"] for row in result["rows"]] == [4096, 8192]
    for row in result["rows"]:
        assert row["oop_wrong"] == 0 and row["inplace_wrong"] == 0, row
        assert row["gloo_time_us"] > 0
        assert (
            abs(row["gloo_busbw"] - row["size"] / row["gloo_time_us"] * 1e-3) < 1e-9
        )  # all_reduce, 2 ranks: factor 1
        # one ratio direction in every bench: hal time / baseline time, like for like
        assert row["ratio"] == pytest.approx(row["oop_time_us"] / row["gloo_time_us"])
        assert row["gloo_inplace_time_us"] > 0
        assert row["inplace_ratio"] == pytest.approx(
            row["inplace_time_us"] / row["gloo_inplace_time_us"]
        )
    ddp = result["ddp"]
    assert (
        ddp["ranks"] == 2
        and ddp["steps"] == 5
        and ddp["params"] == 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    )
    assert ddp["hal_step_ms"] > 0 and ddp["gloo_step_ms"] > 0
    assert abs(ddp["ratio"] - ddp["hal_step_ms"] / ddp["gloo_step_ms"]) < 1e-9
