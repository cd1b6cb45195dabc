"""One rank of a torchrun job for tests/torch and tests/launchers (run by the real ``torchrun``).

``job.py OUTDIR [--parts init,calls,ddp]`` writes ``OUTDIR/rank<R>.json``:

- ``init``: ``hal.comm.init()`` under torchrun (launcher, bootstrap, a hash of the shared
  secret, transport) and three collectives on it, with their outputs;
- ``calls``: every ``torch.distributed`` call on backend "hal" and on a gloo group, on the
  same inputs (NumPy generators seeded by rank, so that the test can recompute them);
- ``ddp``: a small MLP trained 50 steps with DistributedDataParallel on "hal" and on gloo
  from the same initial parameters and data; the final parameters of both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

import hal
import hal.comm

N = 24  # elements per rank in the collective calls (divisible by 2 and 3)
BIG = 1 << 18  # elements of the isend/irecv exchange (1 MiB of float32)


def inputs(rank: int, n: int = N, dtype: Any = np.float32) -> np.ndarray[Any, Any]:
    """This rank's input of the collective calls (the test recomputes it)."""
    return np.random.default_rng(rank).standard_normal(n).astype(dtype)


def part_init() -> dict[str, Any]:
    comm = hal.comm.init()
    launcher, env = hal.comm.detect_launcher()
    stream = comm.device.create_stream()
    x = hal.asarray(inputs(comm.rank), device=comm.device)
    comm.all_reduce(x, op="sum", stream=stream).wait()
    gathered = hal.asarray(np.zeros(comm.size, np.int64), device=comm.device)
    mine = hal.asarray(np.array([comm.rank * 10], np.int64), device=comm.device)
    comm.all_gather(mine, gathered, stream=stream).wait()
    b = hal.asarray(np.full(4, comm.rank, np.float64), device=comm.device)
    comm.broadcast(b, root=comm.size - 1, stream=stream).wait()
    boot = comm._bootstrap
    out = {
        "rank": comm.rank,
        "size": comm.size,
        "launcher": launcher,
        "store": env.get("store"),
        "bootstrap": type(boot).__name__,
        "transport": comm.transport,
        "secret": hashlib.sha256(boot.secret).hexdigest()
        if getattr(boot, "secret", None)
        else None,
        "all_reduce": x.to_host().tolist(),
        "all_gather": gathered.to_host().tolist(),
        "broadcast": b.to_host().tolist(),
    }
    if (
        comm.rank < comm.size - 1
    ):  # the others leave the last rank out; they meet again on torchrun's store
        new = comm.shrink(exclude=[comm.size - 1])
        y = hal.asarray(np.full(3, comm.rank + 1.0), device=new.device)
        new.all_reduce(y, op="sum", stream=new.device.create_stream()).wait()
        out["shrink"] = {
            "rank": new.rank,
            "size": new.size,
            "sum": y.to_host().tolist(),
            "bootstrap": type(new._bootstrap).__name__,
        }
        new.close()
    else:
        out["shrink"] = None
    comm.close()
    return out


def part_calls(gloo: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    r, n = dist.get_rank(), dist.get_world_size()
    res: dict[str, Any] = {}

    def t(a: np.ndarray[Any, Any]) -> torch.Tensor:
        return torch.from_numpy(a.copy())

    def both(name: str, fn: Any) -> None:
        res[name] = {"hal": fn(None), "gloo": fn(gloo)}

    def all_reduce(group: Any, op: Any = dist.ReduceOp.SUM, dtype: Any = np.float32) -> Any:
        x = t(
            inputs(r, dtype=dtype) if dtype != np.int64 else np.arange(N, dtype=np.int64) * (r + 1)
        )
        dist.all_reduce(x, op=op, group=group)
        return x.tolist()

    both("all_reduce", all_reduce)
    both("all_reduce_max", lambda g: all_reduce(g, dist.ReduceOp.MAX))
    both("all_reduce_f64", lambda g: all_reduce(g, dtype=np.float64))
    both("all_reduce_i64", lambda g: all_reduce(g, dtype=np.int64))
    res["all_reduce_avg"] = {"hal": all_reduce(None, dist.ReduceOp.AVG)}  # gloo has no AVG

    def all_gather(group: Any) -> Any:
        outs = [torch.empty(N) for _ in range(n)]
        dist.all_gather(outs, t(inputs(r)), group=group)
        return [o.tolist() for o in outs]

    def all_gather_into_tensor(group: Any) -> Any:
        out = torch.empty(N * n)
        dist.all_gather_into_tensor(out, t(inputs(r)), group=group)
        return out.tolist()

    def reduce_scatter(group: Any) -> Any:
        out = torch.empty(N // n)
        dist.reduce_scatter(out, list(t(inputs(r)).chunk(n)), group=group)
        return out.tolist()

    def reduce_scatter_tensor(group: Any) -> Any:
        out = torch.empty(N // n)
        dist.reduce_scatter_tensor(out, t(inputs(r)), group=group)
        return out.tolist()

    def broadcast(group: Any) -> Any:
        x = t(inputs(r))
        dist.broadcast(x, src=n - 1, group=group)
        return x.tolist()

    def reduce(group: Any) -> Any:
        x = t(inputs(r))
        dist.reduce(x, dst=0, group=group)
        return x.tolist()

    def all_to_all_single(group: Any) -> Any:
        y = torch.empty(N)
        dist.all_to_all_single(y, t(inputs(r)), group=group)
        return y.tolist()

    def all_to_all_uneven(group: Any) -> Any:
        # rank r sends (r + i + 1) elements to rank i; receives (i + r + 1) from rank i
        ins = [r + i + 1 for i in range(n)]
        outs = [i + r + 1 for i in range(n)]
        y = torch.empty(sum(outs))
        dist.all_to_all_single(y, t(inputs(r, sum(ins))), outs, ins, group=group)
        return y.tolist()

    def all_to_all(group: Any) -> Any:
        outs = [torch.empty(N // n) for _ in range(n)]
        dist.all_to_all(outs, list(t(inputs(r)).chunk(n)), group=group)
        return [o.tolist() for o in outs]

    def gather(group: Any) -> Any:
        outs = [torch.empty(N) for _ in range(n)] if r == 0 else None
        dist.gather(t(inputs(r)), outs, dst=0, group=group)
        return [o.tolist() for o in outs] if outs else None

    def scatter(group: Any) -> Any:
        y = torch.empty(N // n)
        dist.scatter(y, list(t(inputs(100)).chunk(n)) if r == 0 else None, src=0, group=group)
        return y.tolist()

    def barrier(group: Any) -> Any:
        dist.barrier(group=group)
        return True

    def send_recv(group: Any) -> Any:  # a ring: rank r sends its input to r+1, receives r-1's
        x, y = t(inputs(r)), torch.empty(N)
        if r == 0:
            dist.send(x, (r + 1) % n, group=group)
            dist.recv(y, (r - 1) % n, group=group)
        else:
            dist.recv(y, (r - 1) % n, group=group)
            dist.send(x, (r + 1) % n, group=group)
        return y.tolist()

    def isend_irecv(group: Any) -> Any:  # every rank posts both before waiting: 1 MiB each way
        x, y = t(inputs(r, BIG)), torch.empty(BIG)
        works = [dist.isend(x, (r + 1) % n, group=group), dist.irecv(y, (r - 1) % n, group=group)]
        for w in works:
            w.wait()
        return [*y[:N].tolist(), float(y.double().sum())]

    def batch_isend_irecv(group: Any) -> Any:
        x, y = t(inputs(r)), torch.empty(N)
        ops = [
            dist.P2POp(dist.isend, x, (r + 1) % n, group=group),
            dist.P2POp(dist.irecv, y, (r - 1) % n, group=group),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return y.tolist()

    def error(fn: Any) -> Any:
        try:
            fn()
        except Exception as exc:  # what the bad call raised, for the test to judge
            return [type(exc).__name__, str(exc)]
        return None

    res["errors"] = {
        "bool": error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool))),
        "strided": error(lambda: dist.broadcast(torch.ones(4, 4).t(), src=0)),
        "bxor": error(
            lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BXOR)
        ),
        "gather_list": error(lambda: dist.all_gather([torch.empty(3)], torch.ones(3))),
    }
    dist.barrier()  # every rank raised before anything moved: the group still works

    sub = dist.new_group([0, 1], backend="hal")  # a subgroup on "hal" (every rank calls new_group)
    x = t(inputs(r))
    if r < 2:
        dist.all_reduce(x, group=sub)
    res["subgroup_all_reduce"] = {"hal": x.tolist()}

    for name, fn in [
        ("isend_irecv", isend_irecv),
        ("batch_isend_irecv", batch_isend_irecv),
        ("all_gather", all_gather),
        ("all_gather_into_tensor", all_gather_into_tensor),
        ("reduce_scatter", reduce_scatter),
        ("reduce_scatter_tensor", reduce_scatter_tensor),
        ("broadcast", broadcast),
        ("reduce", reduce),
        ("all_to_all_single", all_to_all_single),
        ("all_to_all_uneven", all_to_all_uneven),
        ("all_to_all", all_to_all),
        ("gather", gather),
        ("scatter", scatter),
        ("barrier", barrier),
        ("send_recv", send_recv),
    ]:
        both(name, fn)
    return res


def part_ddp(gloo: Any, steps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    r = dist.get_rank()
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    out: dict[str, Any] = {
        "initial": torch.cat([p.detach().reshape(-1) for p in base.parameters()]).tolist()
    }
    for name, group, dtype in (
        ("hal", None, torch.float32),
        ("gloo", gloo, torch.float32),
        ("hal_f64", None, torch.float64),
        ("gloo_f64", gloo, torch.float64),
    ):
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
        )
        model.load_state_dict(base.state_dict())
        model.to(dtype)
        ddp = DDP(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(1000 + r)
        t0 = time.perf_counter()
        for _ in range(steps):
            x = torch.randn(8, 16, generator=gen).to(dtype)
            y = torch.randn(8, 4, generator=gen).to(dtype)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        out[name] = {
            "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist(),
            "step_ms": (time.perf_counter() - t0) / steps * 1e3,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--parts", default="init,calls,ddp")
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()
    parts = a.parts.split(",")
    res: dict[str, Any] = {
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")}
    }
    if "init" in parts:
        res["init"] = part_init()
    if "calls" in parts or "ddp" in parts:
        import torch.distributed as dist

        import hal.torch

        dist.init_process_group(hal.torch.BACKEND)
        assert dist.get_backend() == "hal", dist.get_backend()
        res["communicator"] = {
            "transport": hal.torch.communicator().transport,
            "group_name": dist.group.WORLD.group_name,
            "name": dist.group.WORLD.name(),
        }
        gloo = dist.new_group(backend="gloo")
        if "calls" in parts:
            res["calls"] = part_calls(gloo)
        if "ddp" in parts:
            res["ddp"] = part_ddp(gloo, a.steps)
        dist.destroy_process_group()
    rank = os.environ["RANK"]
    Path(a.outdir, f"rank{rank}.json").write_text(json.dumps(res))
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
