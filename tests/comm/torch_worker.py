"""One rank of the torch zero-copy test: all_reduce torch CPU tensors in place through hal.comm.

Usage: ``hal run -n N torch_worker.py`` (CPU emulator, one device per rank). Checks that the
result lands in the tensors' own memory (``data_ptr`` unchanged, nothing copied back) for
float32, bfloat16 and int8, and prints ``OK``.
"""

from __future__ import annotations

import sys

import torch

import hal
import hal.comm


def main() -> int:
    """Reduce three tensors in place; report any mismatch."""
    comm = hal.comm.init()
    s = comm.device.create_stream()
    n, r = comm.size, comm.rank
    errors = []
    cases = [
        (torch.full((1 << 16,), float(r + 1)), "avg", (n + 1) / 2),
        (torch.full((1000,), 0.5 * (r + 1), dtype=torch.bfloat16), "sum", 0.5 * n * (n + 1) / 2),
        (
            torch.full((77,), 100, dtype=torch.int8),
            "sum",
            torch.tensor(100 * n, dtype=torch.int32).to(torch.int8).item(),
        ),
    ]
    for t, op, want in cases:
        ptr = t.data_ptr()
        comm.all_reduce(t, op=op, stream=s).wait()
        if t.data_ptr() != ptr or not bool((t == want).all()):
            errors.append(
                f"{t.dtype} {op}: data_ptr {t.data_ptr():#x} (was {ptr:#x}), values {t[:3].tolist()} != {want}"
            )
    # reduce_scatter (bfloat16, into a recv tensor) and reduce (float16 avg, in place on the root)
    x = torch.arange(2 * n + 1, dtype=torch.bfloat16) * (r + 1)
    start = sum(len(c) for c in torch.arange(2 * n + 1).tensor_split(n)[:r])
    mine = torch.zeros(len(torch.arange(2 * n + 1).tensor_split(n)[r]), dtype=torch.bfloat16)
    comm.reduce_scatter(x, mine, op="sum", stream=s).wait()
    seg = (torch.arange(2 * n + 1, dtype=torch.float64) * (n * (n + 1) / 2))[
        start : start + len(mine)
    ]
    if not torch.equal(mine, seg.to(torch.bfloat16)):
        errors.append(f"reduce_scatter bfloat16: {mine.tolist()} != {seg.tolist()}")
    h = torch.full((33,), float(r + 1), dtype=torch.float16)
    comm.reduce(h, op="avg", root=n - 1, stream=s).wait()
    if not bool((h == ((n + 1) / 2 if r == n - 1 else r + 1)).all()):
        errors.append(f"reduce float16 avg on rank {r}: {h[:3].tolist()}")
    # out of place: recv is another tensor; send keeps its values
    send, recv = torch.arange(10, dtype=torch.float32), torch.zeros(10)
    comm.all_reduce(send, recv, op="sum", stream=s).wait()
    if not torch.equal(recv, torch.arange(10, dtype=torch.float32) * n) or not torch.equal(
        send, torch.arange(10.0)
    ):
        errors.append(f"out of place: {recv[:3].tolist()}")
    comm.close()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    print(f"OK rank={r} device={comm.device} transport={comm.transport}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
