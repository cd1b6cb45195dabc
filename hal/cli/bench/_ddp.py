"""DDP step time on backend "hal" against gloo (``hal bench comm --baseline gloo``).

Run by the ranks of ``hal bench comm --baseline gloo`` (:func:`step_times`), or on its own as
``torchrun --standalone --nproc_per_node=N -m hal.cli.bench._ddp --out FILE``. The model, data
and optimizer are those of examples/ddp_torch.py (an MLP
64-256-256-10, batch 32 per rank, SGD with momentum); the default process group is "hal" and a
gloo group of the same ranks trains an identical copy. The two alternate in blocks of steps
(so that both see the same machine load), after a warm-up; each step is timed on the host
clock around forward, backward (where DDP reduces) and the optimizer step, and the slowest
rank's mean per step is reported. Rank 0 writes JSON: ``hal_step_ms``, ``gloo_step_ms``,
``ratio`` (hal / gloo), ``params``, ``batch``, ``ranks``, ``steps``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hal.torch

HIDDEN, BATCH, BLOCK, WARMUP = 256, 32, 5, 5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 10),
    )


def step_times(hal_group: Any, gloo_group: Any, steps: int) -> dict[str, Any]:
    """Train on ``hal_group`` and on ``gloo_group`` (the same ranks) in alternating blocks; the
    slowest rank's mean step time of each, as the JSON described above (on every rank)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    runs: dict[str, Any] = {}
    for name, group in (("hal", hal_group), ("gloo", gloo_group)):
        model = _model()
        ddp = DDP(model, process_group=group)
        runs[name] = {
            "ddp": ddp,
            "opt": torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9),
            "gen": torch.Generator().manual_seed(rank),
            "times": [],
        }
    w_true = torch.randn(64, 10, generator=torch.Generator().manual_seed(42))

    def step(run: dict[str, Any], timed: bool) -> None:
        x = torch.randn(BATCH, 64, generator=run["gen"])
        y = x @ w_true
        t0 = time.perf_counter()
        run["opt"].zero_grad()
        torch.nn.functional.mse_loss(run["ddp"](x), y).backward()
        run["opt"].step()
        if timed:
            run["times"].append(time.perf_counter() - t0)

    for run in runs.values():
        for _ in range(WARMUP):
            step(run, False)
    done = 0
    while done < steps:
        n = min(BLOCK, steps - done)
        for run in runs.values():
            dist.barrier(group=gloo_group)
            for _ in range(n):
                step(run, True)
        done += n
    means = torch.tensor(
        [sum(r["times"]) / len(r["times"]) * 1e3 for r in runs.values()], dtype=torch.float64
    )
    dist.all_reduce(means, op=dist.ReduceOp.MAX, group=gloo_group)
    hal_ms, gloo_ms = float(means[0]), float(means[1])
    return {
        "hal_step_ms": hal_ms,
        "gloo_step_ms": gloo_ms,
        "ratio": hal_ms / gloo_ms if gloo_ms else 0.0,
        "params": sum(p.numel() for p in _model().parameters()),
        "batch": BATCH,
        "ranks": size,
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> int:
    """Default group "hal", a gloo group beside it; rank 0 writes :func:`step_times` to ``--out``."""
    ap = argparse.ArgumentParser(prog="python -m hal.cli.bench._ddp")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args(argv)
    dist.init_process_group(hal.torch.BACKEND)
    result = step_times(None, dist.new_group(backend="gloo"), a.steps)
    if dist.get_rank() == 0:
        Path(a.out).write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
