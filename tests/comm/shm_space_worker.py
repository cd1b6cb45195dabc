"""One rank of the /dev/shm space test: all_reduce ``N`` float32 values, print the transport and ``OK``.

Usage: ``hal run -n R shm_space_worker.py [N]`` (default 8 Mi values, 32 MiB).
"""

from __future__ import annotations

import sys

import numpy as np

import hal
import hal.comm


def main() -> int:
    """All-reduce ``sum`` on this rank's device; print the transport and ``OK`` when right."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8 << 20
    comm = hal.comm.init()
    s = comm.device.create_stream()
    with hal.asarray(np.full(n, comm.rank + 1, np.float32), device=comm.device) as x:
        comm.all_reduce(x, stream=s).wait()
        ok = bool(np.all(x.to_host() == comm.size * (comm.size + 1) / 2))
    print(f"{'OK' if ok else 'WRONG'} rank={comm.rank} transport={comm.transport}", flush=True)
    comm.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
