"""Pools, quotas, gang tasks, timeouts, pinning, priority inheritance and metrics with ``hal.sched``.

Two pools share the CPU emulator's two devices: ``infer`` (priority 10, only cpu:0) and
``train`` (every device, a quota of one device per job). A training job runs a gang step
over both devices with an all_reduce on the communicator it is given; a hung task times out
without blocking its device; a high-priority task lifts its low-priority dependency; the
scheduler's metrics are printed and exposed in the Prometheus text format.

    python examples/sched_pools.py
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import numpy as np

import hal
from hal.sched import Scheduler, TaskContext, TaskTimeoutError

CONFIG = """
[scheduler]
policy = "eft"
timeout = 60.0            # the default per-task timeout (seconds)
short_threshold = 0.005   # tasks expected to take up to 5 ms go to the short queue
preemption_grace = 0.0

[health]
interval = 0.2
timeout = 2.0

[pools.infer]
devices = ["cpu:0"]
priority = 10

[pools.train]
priority = 0
quota = { max_cards = 2, max_memory = 268435456 }
"""


def allreduce_step(ctx: TaskContext, step: int) -> float:
    """A gang task: one array per device, summed across them with ctx.comm."""
    xs = [
        hal.asarray(np.full(1024, float(step + i), np.float32), device=d, stream=s)
        for i, (d, s) in enumerate(zip(ctx.devices, ctx.streams, strict=True))
    ]
    ctx.comm.all_reduce(xs, op="sum", streams=ctx.streams).wait()
    return float(xs[0].to_host(stream=ctx.streams[0])[0])


def main() -> None:
    devices = hal.devices("cpu")[:2]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sched.toml"
        path.write_text(CONFIG)
        sched = Scheduler.from_config(path, devices=devices)
    with sched:
        # a gang over both devices, in the train pool, counted against job "llm"
        steps = [
            sched.submit(allreduce_step, s, gang=2, pool="train", job="llm", name=f"step{s}")
            for s in range(3)
        ]
        print("gang all_reduce results:", [f.result() for f in steps], "(expected [1.0, 3.0, 5.0])")

        # pinning and the infer pool
        where = sched.submit(lambda ctx: str(ctx.device), pool="infer").result()
        pinned = sched.submit(lambda ctx: str(ctx.device), device="cpu:1").result()
        print(f"infer pool ran on {where}; device='cpu:1' ran on {pinned}")

        # a hung task times out; its device takes the next task at once
        gate = threading.Event()
        hung = sched.submit(lambda ctx: gate.wait(), name="hung", timeout=0.2, device="cpu:1")
        try:
            hung.result()
        except TaskTimeoutError as exc:
            print("timeout:", exc)
        print("cpu:1 still works:", sched.submit(lambda ctx: "yes", device="cpu:1").result())
        gate.set()

        # priority inheritance: 'report' (priority 10) lifts its dependency 'prepare' (priority 0)
        prepare = sched.submit(lambda ctx: 21, name="prepare", priority=0)
        report = sched.submit(lambda ctx, x: 2 * x, prepare, name="report", priority=10)
        print(
            f"report = {report.result()}; prepare ran at priority "
            f"{prepare.record.priority + prepare.record.inherited:g} (class {prepare.record.priority:g})"
        )

        sched.wait()
        m = sched.metrics()
        for name, p in m["pools"].items():
            print(
                f"pool {name:6} tasks {p['tasks']} wait p50 {p['wait_s']['p50'] * 1e3:.2f} ms "
                f"run p99 {p['run_s']['p99'] * 1e3:.2f} ms"
            )
        print("timeouts:", m["timeouts"], "evictions:", m["evictions"])
        text = sched.prometheus_text()
        print(f"Prometheus exposition: {len(text.splitlines())} lines, e.g.")
        print(
            "\n".join(
                line for line in text.splitlines() if line.startswith("hal_sched_queue_length")
            )
        )


if __name__ == "__main__":
    main()
