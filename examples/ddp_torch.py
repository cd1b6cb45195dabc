"""PyTorch DistributedDataParallel with hal.comm doing the gradient reductions (backend "hal").

    torchrun --standalone --nproc_per_node=2 examples/ddp_torch.py
    torchrun --standalone --nproc_per_node=2 examples/ddp_torch.py --backend gloo   # the reference

``import hal.torch`` registers the backend; ``init_process_group("hal")`` then meets the other
ranks through torchrun's store, and DDP's bucketed all_reduce runs on hal.comm (shared memory
between the processes of one host, TCP across hosts), on the gradient tensors themselves
(zero-copy). Run plainly (``python examples/ddp_torch.py``) it is a world of one rank.
Rank 0 prints the loss and the mean time of a training step (after 5 warm-up steps).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError:  # torch is an optional extra
    print("examples/ddp_torch.py needs PyTorch: pip install 'hal-sdk[torch]' (nothing run)")
    sys.exit(0)

import hal.torch  # registers backend "hal"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default=hal.torch.BACKEND, choices=[hal.torch.BACKEND, "gloo"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=256)
    a = ap.parse_args()
    if "RANK" not in os.environ:  # not started by a launcher: a world of one rank
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
    dist.init_process_group(a.backend)
    rank, size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, a.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(a.hidden, a.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(a.hidden, 10),
    )
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)  # each rank its own shard of the data
    w_true = torch.randn(64, 10, generator=torch.Generator().manual_seed(42))
    losses, times = [], []
    for step in range(a.steps):
        x = torch.randn(32, 64, generator=gen)
        y = x @ w_true
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients here, on backend a.backend
        opt.step()
        if step >= 5:
            times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    step_ms = sum(times) / max(len(times), 1) * 1e3
    if rank == 0:
        print(
            f"backend {a.backend}: {size} rank(s), {a.steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
            f"{step_ms:.2f} ms/step",
            flush=True,
        )
    dist.destroy_process_group()
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
