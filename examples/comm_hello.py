"""hal.comm.init() under any launcher: the same script with ``hal run``, torchrun or mpiexec.

    hal run -n 2 examples/comm_hello.py
    torchrun --standalone --nproc_per_node=2 examples/comm_hello.py
    mpiexec -n 2 python examples/comm_hello.py

``hal.comm.init()`` reads the launcher's environment (docs/comm.md, "Launchers"); run plainly
(``python examples/comm_hello.py``) it is a world of one rank. Each rank all-reduces
``rank + 1`` and checks the sum, ``size * (size + 1) / 2``.
"""

from __future__ import annotations

import sys

import numpy as np

import hal
import hal.comm


def main() -> int:
    comm = hal.comm.init()
    launcher, _ = hal.comm.detect_launcher()
    stream = comm.device.create_stream()
    x = hal.asarray(np.full(1024, comm.rank + 1, np.float32), device=comm.device)
    comm.all_reduce(x, op="sum", stream=stream).wait()
    got, want = float(x.to_host()[0]), comm.size * (comm.size + 1) / 2
    ok = bool((x.to_host() == want).all())
    line = (
        f"rank {comm.rank}/{comm.size} launcher={launcher} transport={comm.transport}: "
        f"all_reduce sum = {got:g} (expected {want:g}) {'OK' if ok else 'WRONG'}\n"
    )
    sys.stdout.write(line)  # one write per line: the ranks share the launcher's stdout
    sys.stdout.flush()
    x.close()
    comm.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
