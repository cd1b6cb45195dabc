"""One rank of the fallback-warning test: all_reduce ``avg`` (hal.comm's own kernels), then exit.

Usage: ``hal run -n 2 fallback_worker.py [--user-op]``. ``--user-op`` also calls
``hal.kernels.scale`` directly (a user op with no dedicated kernel on the CPU emulator), so the
exit summary must then appear: the control that shows the test can fail.
"""

from __future__ import annotations

import sys

import numpy as np

import hal
import hal.comm
import hal.kernels


def main() -> int:
    """All-reduce with avg on this rank's device; print ``OK`` when the result is right."""
    comm = hal.comm.init()
    dev = comm.device
    s = dev.create_stream()
    with hal.asarray(np.full(1000, comm.rank + 1, np.float32), device=dev) as x:
        comm.all_reduce(x, op="avg", stream=s).wait()
        comm.all_reduce(x, op="sum", stream=s).wait()
        expect = (comm.size + 1) / 2 * comm.size
        ok = bool(np.all(x.to_host() == expect))
        if "--user-op" in sys.argv:
            hal.kernels.scale(x, 0.5, out=x, stream=s)
            s.synchronize()
    comm.close()
    print(f"OK rank={comm.rank} device={dev}" if ok else "WRONG", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
