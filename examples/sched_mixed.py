"""Schedule one training step across mixed CPU-emulator and OpenCL devices, and trace it.

A least-squares model ``y = x @ w`` trained by SGD: the batch is split into micro-batches;
for each, ``hal.sched`` runs forward (matmul), error (sub) and gradient (matmul) tasks on
whichever device the earliest-finish-time policy picks; the gradients are summed where
they are (data stays where it was produced, copies move it when needed) and the update
(axpy) runs last. The whole step is written as a Chrome/Perfetto timeline and checked
against NumPy.

    python examples/sched_mixed.py [trace.json]

Without OpenCL (no PyOpenCL or no platform) it says so and runs on the CPU emulator only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import hal
import hal.kernels
from hal.sched import Scheduler


def pool() -> list[hal.Device]:
    """Return two CPU-emulator devices and up to two OpenCL devices."""
    devices = hal.devices("cpu")[:2]
    info = {b.name: b for b in hal.list_backends()}
    ocl = info.get("opencl")
    if ocl is not None and ocl.status == "available" and ocl.device_count:
        devices += hal.devices("opencl")[:2]
    else:
        reason = ocl.reason if ocl is not None else "backend not installed"
        print(f"OpenCL unavailable ({reason}): scheduling on the CPU emulator only")
    return devices


def main() -> int:
    trace_path = Path(sys.argv[1] if len(sys.argv) > 1 else "sched_mixed_trace.json")
    rng = np.random.default_rng(0)
    micro, batch, features, outputs, lr = 4, 64, 32, 8, 0.01
    xs = [rng.standard_normal((batch, features)).astype(np.float32) for _ in range(micro)]
    ts = [rng.standard_normal((batch, outputs)).astype(np.float32) for _ in range(micro)]
    w0 = (rng.standard_normal((features, outputs)) * 0.1).astype(np.float32)

    devices = pool()
    home = devices[0]
    print(f"pool: {', '.join(str(d) for d in devices)}")
    # the inputs arrive on the first device; the scheduler moves what it places elsewhere
    w = hal.asarray(w0, device=home)
    x_dev = [hal.asarray(x, device=home) for x in xs]
    xt_dev = [hal.asarray(np.ascontiguousarray(x.T), device=home) for x in xs]
    t_dev = [hal.asarray(t, device=home) for t in ts]

    with hal.trace(trace_path, rank=0), Scheduler(devices, policy="eft") as sched:
        grads = []
        for i in range(micro):
            y = sched.submit(hal.kernels.matmul, x_dev[i], w, name=f"forward{i}", tags=("fwd",))
            err = sched.submit(hal.kernels.sub, y, t_dev[i], name=f"error{i}", tags=("fwd",))
            grads.append(
                sched.submit(hal.kernels.matmul, xt_dev[i], err, name=f"grad{i}", tags=("bwd",))
            )
        while len(grads) > 1:  # a reduction tree: sums run where the gradients already are
            grads = [
                sched.submit(
                    hal.kernels.add,
                    grads[j],
                    grads[j + 1],
                    name=f"sum{len(grads)}.{j}",
                    tags=("reduce",),
                )
                for j in range(0, len(grads), 2)
            ]
        # w_new = w - lr/batch * grad (axpy: out = alpha * x + y)
        new_w = sched.submit(
            hal.kernels.axpy,
            -lr / batch,
            grads[0],
            w,
            name="update",
            tags=("update",),
            idempotent=False,
        )  # in place on w: not safe to re-run
        result = new_w.result().to_host()
        stats = sched.stats()

    g = sum(x.T @ (x @ w0 - t) for x, t in zip(xs, ts, strict=True))
    expected = w0 - lr / batch * g
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-5)

    used = {name: s["tasks"] for name, s in stats["devices"].items() if s["tasks"]}
    print(
        f"step: {sum(used.values())} tasks on {len(used)} device(s) {used}; "
        f"makespan {stats['makespan_s'] * 1e3:.1f} ms, mean wait {stats['mean_wait_s'] * 1e3:.2f} ms"
    )
    for name, s in stats["devices"].items():
        print(
            f"  {name}: utilization {s['utilization']:.0%}, bytes moved {s['bytes_moved']}, "
            f"communication share {s['communication_share']:.0%}"
        )

    data = json.loads(trace_path.read_text())  # the timeline is valid JSON with every task on it
    tasks = [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "task"]
    flows = [e for e in data["traceEvents"] if e.get("ph") in ("s", "f")]
    assert {e["name"] for e in tasks} >= {"update", "forward0", "grad3"}, (
        "tasks missing from the trace"
    )
    assert flows, "dependency arrows missing from the trace"
    print(
        f"trace: {trace_path} ({len(data['traceEvents'])} events; open in https://ui.perfetto.dev)"
    )
    print("updated weights match NumPy: all correct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
