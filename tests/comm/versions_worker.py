"""One rank for tests/comm/test_versions.py: init, one all_reduce, print ``OK <rank> <transport> <sum>``."""

from __future__ import annotations

import os

import numpy as np

import hal
import hal.comm


def main() -> None:
    """Run on this rank."""
    comm = hal.comm.init()
    try:
        s = comm.device.create_stream()
        x = hal.asarray(np.full(4, comm.rank + 1, np.float32), device=comm.device)
        work = comm.all_reduce(x, stream=s)
        work.wait()
        line = f"OK {comm.rank} {comm.transport} {float(x.to_host()[0]):g} {work.plan.algorithm}\n"
        os.write(1, line.encode())  # one write: the ranks share stdout (print writes the end apart)
        x.close()
    finally:
        comm.close()


if __name__ == "__main__":
    main()
