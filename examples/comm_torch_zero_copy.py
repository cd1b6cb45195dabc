"""Reduce torch CPU tensors with hal.comm, zero-copy: bfloat16 gradients averaged in place.

    python examples/comm_torch_zero_copy.py

Two CPU-emulator devices in one process (``hal.comm.create``). The tensors go straight into
the collective: hal adopts their memory through DLPack (``hal.from_dlpack``), so the result
lands in the tensors themselves; ``data_ptr()`` does not change and nothing is copied in or
out. bfloat16 is reduced in float32 and rounded once. The same call works across processes
with ``hal.comm.init()`` under ``hal run -n 2`` (one tensor per rank).
"""

from __future__ import annotations

import sys

import hal
import hal.comm


def main() -> int:
    """Average two ranks' bfloat16 gradients in place and check the result against float64."""
    try:
        import torch
    except ImportError:
        print("torch is not installed: pip install torch (CPU) to run this example")
        return 0
    devices = hal.devices("cpu")[:2]  # host memory is CPU-emulator memory: zero-copy
    torch.manual_seed(0)
    grads = [torch.randn(1 << 16).to(torch.bfloat16) for _ in devices]
    want = ((grads[0].double() + grads[1].double()) / 2).to(torch.bfloat16)
    pointers = [g.data_ptr() for g in grads]

    with hal.comm.create(devices) as comm:
        streams = [d.create_stream() for d in devices]
        comm.all_reduce(grads, op="avg", streams=streams).wait()

    assert [g.data_ptr() for g in grads] == pointers, "the tensors were replaced"
    assert all(torch.equal(g, want) for g in grads), "not the float64 average rounded once"
    print(
        f"all_reduce(avg) of {len(grads)} bfloat16 tensors of {grads[0].numel()} elements, in place:"
    )
    print(f"  data_ptr unchanged: {[hex(p) for p in pointers]}")
    print("  result == float64 average rounded once to bfloat16: True")

    # the same adoption by hand: a hal.Array over the tensor's memory, and back to torch
    t = torch.arange(4, dtype=torch.float32)
    with hal.from_dlpack(t) as arr:
        back = torch.from_dlpack(arr)
        print(
            f"hal.from_dlpack(t) -> {arr!r}; torch.from_dlpack(arr) shares memory: {back.data_ptr() == t.data_ptr()}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
