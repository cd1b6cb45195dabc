"""``hal bench sched``: makespan of the scheduling policies on a heterogeneous emulated pool.

The pool is built in a child process (``python -m hal.cli.bench._sched``) so that the CPU
emulator starts with the requested speeds (``HAL_CPU_CONFIG``): by default one fast and
three slow devices (``1,0.25,0.25,0.25``). Each device op costs ``--op-ms / speed`` of
emulated device time (the ``delay_ms`` fault) on top of its real work stretched by the
speed factor, so that four devices run in parallel even on a machine with fewer cores.
The workload is a set of chains (think micro-batches through layers): each step takes the
previous step's result (which stays on the device that produced it) and runs one or four
128x128 matmuls (seeded mix); the first input lives on the first device. Each policy
runs it ``--repeat`` times after a shared warm-up (which also calibrates the history
model), the policies interleaved so that they share the host's load; the best makespan
(noise only adds time), the median, and the best's ratio to ``eft`` are printed. Ratios,
not absolute times, are the point.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from typing import Any

from hal.cli._output import write_output

__all__ = ["OVERHEAD_TARGET", "RAMP_STEPS", "add_command", "overhead", "run_child", "run_ramp"]

#: scheduler time per trivial task at most this many times ThreadPoolExecutor's (issue #13)
OVERHEAD_TARGET = 3.0

POLICIES = ("eft", "heft", "eager", "round-robin")

#: offered load of each ``--ramp`` step, as a fraction of the pool's capacity
RAMP_STEPS = (0.1, 0.25, 0.5, 0.7, 0.85, 1.0, 1.2, 1.5)


def add_command(benches: Any) -> None:
    """Add ``sched`` to the ``hal bench`` subcommands."""
    from hal.cli.bench import positive_int

    p = benches.add_parser(
        "sched",
        help="scheduler policies on one fast and three slow emulated devices (makespan ratios)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.add_argument(
        "--speeds", default="1,0.25,0.25,0.25", help="relative speed per emulated device"
    )
    p.add_argument(
        "--tasks", type=positive_int, default=48, help="tasks in the workload (default 48)"
    )
    p.add_argument(
        "--op-ms",
        type=float,
        default=3.0,
        help="emulated device time per op at speed 1 (default 3)",
    )
    p.add_argument(
        "--repeat",
        type=positive_int,
        default=5,
        help="runs per policy (default 5); the best is kept",
    )
    p.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated (default {','.join(POLICIES)})",
    )
    p.add_argument(
        "--overhead",
        action="store_true",
        help="only the per-task overhead: trivial tasks, latency and throughput beside a ThreadPoolExecutor",
    )
    p.add_argument(
        "--ramp",
        action="store_true",
        help="a load ramp: open-loop arrivals from low to beyond the pool's capacity; throughput and "
        "p50/p99 latency per step (read the knees off)",
    )
    p.add_argument(
        "--ramp-steps",
        default=",".join(map(str, RAMP_STEPS)),
        help="offered load per step as fractions of capacity (default %(default)s)",
    )
    p.add_argument(
        "--step-s", type=float, default=1.0, help="seconds of arrivals per ramp step (default 1)"
    )
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="with --ramp: also draw throughput and latency against load (PNG)",
    )
    p.add_argument(
        "--pools",
        action="store_true",
        help="two pools share the devices: half the chains in 'infer' (priority 10), half in 'batch' "
        "(priority 0); prints each pool's p50 wait beside the makespans",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run)


def _trivial(ctx: Any) -> int:
    return 1


def _trivial_plain() -> int:
    return 1


def overhead(*, tasks: int = 2000, latency_tasks: int = 300, repeat: int = 5) -> dict[str, Any]:
    """Time trivial tasks on a :class:`Scheduler` (eft, the CPU emulator's devices) beside a
    ``ThreadPoolExecutor`` with as many workers, interleaved, best of ``repeat``.

    latency: submit one task and wait for its result, ``latency_tasks`` times (per task);
    throughput: submit ``tasks`` then wait for all (tasks per second). Ratios are
    scheduler / executor time per task (at most :data:`OVERHEAD_TARGET`: the issue #13 target).
    """
    import time
    from concurrent.futures import ThreadPoolExecutor

    import hal
    from hal.sched import Scheduler

    devices = hal.devices("cpu")
    out: dict[str, Any] = {
        "benchmark": "sched-overhead",
        "devices": len(devices),
        "tasks": tasks,
        "latency_tasks": latency_tasks,
    }
    with Scheduler(devices) as sched, ThreadPoolExecutor(len(devices)) as pool:

        def lat_s() -> float:
            t0 = time.perf_counter()
            for _ in range(latency_tasks):
                sched.submit(_trivial).result()
            return (time.perf_counter() - t0) / latency_tasks

        def lat_p() -> float:
            t0 = time.perf_counter()
            for _ in range(latency_tasks):
                pool.submit(_trivial_plain).result()
            return (time.perf_counter() - t0) / latency_tasks

        def thr_s() -> float:
            t0 = time.perf_counter()
            for f in [sched.submit(_trivial) for _ in range(tasks)]:
                f.result()
            return (time.perf_counter() - t0) / tasks

        def thr_p() -> float:
            t0 = time.perf_counter()
            for g in [pool.submit(_trivial_plain) for _ in range(tasks)]:
                g.result()
            return (time.perf_counter() - t0) / tasks

        for fn in (lat_s, lat_p, thr_s, thr_p):  # warm-up (calibrates the history model)
            fn()
        best = {
            "lat_s": float("inf"),
            "lat_p": float("inf"),
            "thr_s": float("inf"),
            "thr_p": float("inf"),
        }
        for _ in range(repeat):
            for name, fn in (
                ("lat_s", lat_s),
                ("lat_p", lat_p),
                ("thr_s", thr_s),
                ("thr_p", thr_p),
            ):
                best[name] = min(best[name], fn())
    out["latency_us"] = {"sched": best["lat_s"] * 1e6, "executor": best["lat_p"] * 1e6}
    out["throughput_per_s"] = {"sched": 1 / best["thr_s"], "executor": 1 / best["thr_p"]}
    out["latency_ratio"] = best["lat_s"] / best["lat_p"]
    out["throughput_ratio"] = best["thr_s"] / best["thr_p"]
    out["target"] = OVERHEAD_TARGET
    from hal.cli.bench import loadavg, memcpy_bandwidth, method

    out["loadavg"] = list(os.getloadavg())
    out["loadavg_end"] = loadavg()
    out["memcpy_GBps"] = memcpy_bandwidth()
    out["methodology"] = method(
        clock="time.perf_counter on the host around each measurement (submit + result for latency; "
        "submit all, then wait for all, for throughput)",
        repetitions=f"{repeat} rounds after one warm-up round; {latency_tasks} tasks per latency "
        f"measurement, {tasks} per throughput measurement",
        statistic="the best round per measurement (time per task)",
        interleaving="round by round: scheduler latency, executor latency, scheduler throughput, "
        "executor throughput",
    )
    return out


def _print_overhead(r: dict[str, Any]) -> None:
    load = r["loadavg"]
    print(
        f"hal bench sched --overhead: trivial tasks on {r['devices']} cpu devices (eft) beside a "
        f"ThreadPoolExecutor({r['devices']}); load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"  {'measure':<34} {'sched':>10} {'executor':>10} {'ratio':>6}  target")
    for label, key, unit, ratio in (
        (
            f"latency (submit + result, x{r['latency_tasks']})",
            "latency_us",
            "us",
            r["latency_ratio"],
        ),
        (
            f"throughput ({r['tasks']} submitted, then waited)",
            "throughput_per_s",
            "/s",
            r["throughput_ratio"],
        ),
    ):
        v = r[key]
        verdict = "met" if ratio <= r["target"] else "MISSED"
        print(
            f"  {label:<34} {v['sched']:>8.0f}{unit:>2} {v['executor']:>8.0f}{unit:>2} {ratio:>6.2f}"
            f"  <= {r['target']:g}: {verdict}"
        )
    print(
        "  ratio = scheduler time per task / executor time per task, i.e. hal time / baseline time "
        "(best of 5, interleaved; < 1: hal faster)"
    )


def _ramp_task(ctx: Any) -> None:
    """A ramp task: one small kernel (its device time is the emulated op cost)."""
    import hal.kernels

    hal.kernels.relu(_RAMP_INPUT[ctx.device], stream=ctx.stream)


_RAMP_INPUT: dict[Any, Any] = {}


def run_ramp(
    fractions: list[float], step_s: float, op_ms: float, policy: str = "eft"
) -> dict[str, Any]:
    """Drive the pool of this process from low to full load (open loop); return one row per step.

    Each task costs one emulated op (``op_ms / speed`` of device time), so the pool's capacity
    is ``sum(speeds) / op_ms`` tasks per ms. Step *i* submits tasks at ``fractions[i]`` of it,
    evenly spaced for ``step_s`` seconds regardless of completions, then waits for them; its
    row has the offered and achieved rates and the p50/p99 latency (submit to end).
    """
    import statistics
    import time

    import numpy as np

    import hal
    from hal.sched import Scheduler

    devices = hal.devices("cpu")
    speeds = [float(d.properties().get("speed", 1.0)) for d in devices]
    capacity = sum(speeds) / (op_ms / 1e3) if op_ms > 0 else float("inf")
    for d in devices:
        _RAMP_INPUT[d] = hal.asarray(np.ones(64, np.float32), device=d)
    rows = []
    with Scheduler(devices, policy=policy) as sched:
        for f in [
            sched.submit(_ramp_task) for _ in range(4 * len(devices))
        ]:  # warm-up, calibration
            f.result()
        for frac in fractions:
            rate = frac * capacity
            n = max(1, round(rate * step_s))
            t0 = time.perf_counter()
            futs = []
            for i in range(n):
                due = t0 + i / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                futs.append(sched.submit(_ramp_task))
            for f in futs:
                f.result()
            recs = [f.record for f in futs]
            lat = sorted((r.end or 0.0) - r.submit for r in recs)
            span = max(r.end or 0.0 for r in recs) - min(r.submit for r in recs)
            rows.append(
                {
                    "load": frac,
                    "offered_per_s": rate,
                    "tasks": n,
                    "throughput_per_s": n / span if span > 0 else 0.0,
                    "p50_ms": statistics.median(lat) * 1e3,
                    "p99_ms": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))] * 1e3,
                }
            )
    return {
        "policy": policy,
        "capacity_per_s": capacity,
        "speeds": speeds,
        "op_ms": op_ms,
        "step_s": step_s,
        "steps": rows,
    }


def _png(
    path: str,
    series: list[tuple[list[float], list[float], tuple[int, int, int]]],
    w: int = 480,
    h: int = 240,
) -> None:
    """Write a small line chart (each series scaled to its own maximum) as a PNG, with the stdlib only."""
    import struct
    import zlib

    px = bytearray(b"\xff" * (w * h * 3))

    def dot(x: int, y: int, c: tuple[int, int, int]) -> None:
        for dx in (0, 1):
            for dy in (0, 1):
                xx, yy = x + dx, y + dy
                if 0 <= xx < w and 0 <= yy < h:
                    px[(yy * w + xx) * 3 : (yy * w + xx) * 3 + 3] = bytes(c)

    for i in range(w):  # axes
        dot(i, h - 10, (0, 0, 0))
    for j in range(h):
        dot(10, j, (0, 0, 0))
    for xs, ys, color in series:
        if not xs:
            continue
        xmax, ymax = max(xs) or 1.0, max(ys) or 1.0
        pts = [
            (10 + int(x / xmax * (w - 20)), h - 10 - int(y / ymax * (h - 20)))
            for x, y in zip(xs, ys, strict=True)
        ]
        for (x1, y1), (x2, y2) in itertools.pairwise(pts):
            steps = max(abs(x2 - x1), abs(y2 - y1), 1)
            for k in range(steps + 1):
                dot(x1 + (x2 - x1) * k // steps, y1 + (y2 - y1) * k // steps, color)
    raw = b"".join(b"\x00" + bytes(px[r * w * 3 : (r + 1) * w * 3]) for r in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    with open(path, "wb") as f:
        f.write(
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


def _print_ramp(r: dict[str, Any]) -> None:
    print(
        f"hal bench sched --ramp: {r['policy']} on devices at speeds {', '.join(f'{s:g}' for s in r['speeds'])}, "
        f"{r['op_ms']:g} ms per task at speed 1 (capacity {r['capacity_per_s']:.0f} tasks/s); "
        f"{r['step_s']:g} s per step"
    )
    print(f"  {'load':>5} {'offered/s':>10} {'done/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for row in r["steps"]:
        print(
            f"  {row['load']:>5.2f} {row['offered_per_s']:>10.0f} {row['throughput_per_s']:>9.0f} "
            f"{row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f}"
        )
    print(
        "  knees: latency leaves its floor where queues start to form; throughput stops following "
        "the offered load at saturation"
    )


def _bench_env(values: list[float], op_ms: float) -> dict[str, str]:
    config = {
        "devices": {str(i): {"speed": v, "delay_ms": op_ms / v} for i, v in enumerate(values)}
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_CPU_")}
    env.update(
        HAL_CPU_DEVICES=str(len(values)), HAL_CPU_CONFIG=json.dumps(config), HAL_BACKENDS="cpu"
    )
    env.pop("HAL_TRACE", None)
    return env


def _ramp(args: argparse.Namespace, values: list[float], policy: str) -> int:
    try:
        fractions = [float(s) for s in args.ramp_steps.split(",") if s.strip()]
    except ValueError:
        fractions = []
    if not fractions or min(fractions) <= 0:
        print(
            f"hal bench sched: error: --ramp-steps {args.ramp_steps!r} must be positive numbers",
            file=sys.stderr,
        )
        return 2
    if not 0 < args.step_s <= 600 or not args.op_ms > 0:
        print(
            f"hal bench sched: error: --step-s {args.step_s!r} must be in (0, 600] and --op-ms {args.op_ms!r} > 0",
            file=sys.stderr,
        )
        return 2
    spec = json.dumps(
        {"fractions": fractions, "step_s": args.step_s, "op_ms": args.op_ms, "policy": policy}
    )
    cmd = [sys.executable, "-m", "hal.cli.bench._sched", "ramp", spec]
    proc = subprocess.run(
        cmd, env=_bench_env(values, args.op_ms), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 1
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if args.plot:
        rows = result["steps"]
        offered = [r["offered_per_s"] for r in rows]
        curves = [
            (offered, [r["throughput_per_s"] for r in rows], (0, 90, 200)),
            (offered, [r["p99_ms"] for r in rows], (200, 30, 30)),
            (offered, [r["p50_ms"] for r in rows], (230, 140, 0)),
        ]
        if not write_output(
            "hal bench sched: error", "--plot", args.plot, lambda: _png(args.plot, curves)
        ):
            return 2
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_ramp(result)
        if args.plot:
            print(
                f"  plot: {args.plot} (x: offered load; blue: throughput, red: p99, orange: p50, each to its maximum)"
            )
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.plot and not args.ramp:
        print("hal bench sched: error: --plot needs --ramp", file=sys.stderr)
        return 2
    if args.overhead:
        res = overhead()
        if args.json:
            print(json.dumps(res, indent=2))
        else:
            _print_overhead(res)
        return 0
    speeds = [s.strip() for s in args.speeds.split(",") if s.strip()]
    try:
        values = [float(s) for s in speeds]
    except ValueError:
        print(f"hal bench sched: error: --speeds {args.speeds!r} must be numbers", file=sys.stderr)
        return 2
    if not values or min(values) <= 0:
        print(f"hal bench sched: error: --speeds {args.speeds!r} must be positive", file=sys.stderr)
        return 2
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        print(
            f"hal bench sched: error: --policies {args.policies!r}: choose from {', '.join(POLICIES)}",
            file=sys.stderr,
        )
        return 2
    if not args.op_ms >= 0:
        print(f"hal bench sched: error: --op-ms {args.op_ms!r} must be >= 0", file=sys.stderr)
        return 2
    if args.ramp:
        return _ramp(args, values, policies[0])  # the first policy named (eft by default)
    from hal.cli.bench import loadavg, memcpy_bandwidth, method

    load_start = loadavg()
    env = _bench_env(values, args.op_ms)
    cmd = [
        sys.executable,
        "-m",
        "hal.cli.bench._sched",
        str(args.tasks),
        str(args.repeat),
        ",".join(policies),
    ]
    if args.pools:
        cmd.append("pools")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 1
    result = json.loads(proc.stdout)
    result["benchmark"] = "sched"
    result["speeds"] = values
    result["loadavg"] = load_start
    result["loadavg_end"] = loadavg()
    result["memcpy_GBps"] = memcpy_bandwidth()
    result["methodology"] = method(
        clock="time.perf_counter on the host from the first submit to the last result (makespan)",
        repetitions=f"{args.repeat} runs per policy after a shared warm-up",
        statistic="the best run (noise only adds time) and the median",
        interleaving="run by run: the policies in turn, sharing the host's load",
        ratio="policy makespan / eft makespan (the baseline here is the eft policy)",
    )
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"hal bench sched: {args.tasks} tasks in chains of 4 (1, 4 or 12 matmuls 128^2 each, data stays where "
        f"produced); devices at speeds {', '.join(speeds)}, {args.op_ms} ms per op at speed 1; best of {args.repeat}"
        + ("; pools: infer (priority 10) and batch (0) share every device" if args.pools else "")
    )
    pools_hdr = f" {'infer p50 wait':>14} {'batch p50 wait':>14}" if args.pools else ""
    print(
        f"  {'policy':<12} {'best ms':>9} {'median ms':>10} {'vs eft':>8}{pools_hdr}  tasks per device"
    )
    base = result["policies"].get("eft", {}).get("makespan_s")
    for name, r in result["policies"].items():
        ratio = f"{r['makespan_s'] / base:.2f}x" if base else "-"
        per = " ".join(f"{n}" for n in r["tasks_per_device"].values())
        waits = ""
        if args.pools:
            w = r["pool_wait_p50_s"]
            waits = f" {w['infer'] * 1e3:>11.1f} ms {w['batch'] * 1e3:>11.1f} ms"
        print(
            f"  {name:<12} {r['makespan_s'] * 1e3:>9.1f} {r['median_s'] * 1e3:>10.1f} {ratio:>8}{waits}  {per}"
        )
    return 0


def _layer(ctx: Any, x: Any, depth: int) -> Any:
    """A task: ``depth`` chained matmuls of ``x`` by itself, on the task's stream."""
    import hal.kernels

    y = x
    for _ in range(depth):
        y = hal.kernels.matmul(y, x, stream=ctx.stream)
    return y


def run_child(tasks: int, repeat: int, policies: list[str], pools: bool = False) -> dict[str, Any]:
    """Run the workload under each policy in this process; return makespans and placements.

    With ``pools``, chains alternate between the pools ``infer`` (priority 10) and ``batch``
    (priority 0), which share every device; each run also reports each pool's p50 wait.
    """
    import random
    import statistics
    import time

    import numpy as np

    import hal
    import hal.kernels
    from hal.sched import Graph, Links, PerfModel, Pool, Scheduler

    devices = hal.devices("cpu")
    home = devices[0]
    rng = random.Random(1234)
    x = hal.asarray(np.eye(128, dtype=np.float32), device=home)
    steps = 4
    chains = max(tasks // steps, 1)
    depths = [[rng.choice((1, 1, 1, 4, 4, 12)) for _ in range(steps)] for _ in range(chains)]
    model, links = PerfModel(), Links()

    pool_defs = [Pool("infer", priority=10), Pool("batch", priority=0)] if pools else []

    def pool_of(chain: int) -> str:
        return ("infer" if chain % 2 else "batch") if pools else "default"

    def workload(policy: str) -> tuple[float, dict[str, int], dict[str, float]]:
        with Scheduler(devices, policy=policy, model=model, links=links, pools=pool_defs) as sched:
            t0 = time.perf_counter()
            if policy == "heft":
                g = Graph()
                for c, chain in enumerate(depths):
                    node: Any = x
                    for i, depth in enumerate(chain):
                        node = g.add(
                            _layer,
                            node,
                            depth,
                            name=f"c{c}s{i}",
                            idempotent=True,
                            out_bytes=x.nbytes,
                            footprint=depth,
                            pool=pool_of(c),
                        )
                futures = list(sched.submit_graph(g).values())
            else:
                futures = []
                for c, chain in enumerate(depths):
                    f: Any = x
                    for depth in chain:
                        f = sched.submit(
                            _layer, f, depth, idempotent=True, footprint=depth, pool=pool_of(c)
                        )
                        futures.append(f)
            for f in futures:
                f.result()
            span = time.perf_counter() - t0
            per = {str(d): 0 for d in devices}
            for r in sched.records():
                per[str(r.device)] += 1
            waits = {name: p["wait_s"]["p50"] for name, p in sched.metrics()["pools"].items()}
        return span, per, waits

    workload("eft")  # warm-up: kernels, link measurements, history calibration
    workload("eft")
    out: dict[str, Any] = {"tasks": tasks, "repeat": repeat, "policies": {}}
    runs: dict[str, list[tuple[float, dict[str, int], dict[str, float]]]] = {
        p: [] for p in policies
    }
    for _ in range(repeat):  # interleaved, so that every policy sees the same host load
        for p in policies:
            runs[p].append(workload(p))
    for p in policies:
        spans = [s for s, _, _ in runs[p]]
        best = min(range(len(spans)), key=spans.__getitem__)
        out["policies"][p] = {
            "makespan_s": spans[best],
            "median_s": statistics.median(spans),
            "runs_s": spans,
            "tasks_per_device": runs[p][best][1],
        }
        if pools:
            out["policies"][p]["pool_wait_p50_s"] = {
                name: statistics.median(r[2].get(name, 0.0) for r in runs[p])
                for name in ("infer", "batch")
            }
    return out


if __name__ == "__main__":  # the child of `hal bench sched`
    if sys.argv[1] == "ramp":
        spec = json.loads(sys.argv[2])
        print(
            json.dumps(run_ramp(spec["fractions"], spec["step_s"], spec["op_ms"], spec["policy"]))
        )
    else:
        n, rep, pols = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
        print(json.dumps(run_child(n, rep, pols, pools=sys.argv[4:] == ["pools"])))
