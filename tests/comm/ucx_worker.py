"""One rank of tests/comm/test_ucx.py: ``hal run -n N ucx_worker.py CASE``.

``plan``: one all_reduce and one all_gather, then
``OK rank=R transport=T path=P ucx=VERSION sum=S direct=PIECES`` (pieces UCX moved without a host piece);
``refused``: ``REFUSED OP MESSAGE`` when ``hal.comm.init()`` raises CommError.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import hal
import hal.comm


def say(line: str) -> None:
    """Print ``line`` with one write (ranks share the launcher's stdout)."""
    os.write(1, (line + "\n").encode())


def main(case: str) -> int:
    """Run ``case`` on this rank."""
    try:
        comm = hal.comm.init()
    except hal.CommError as exc:
        say(f"REFUSED {exc.op} {exc}")
        return 0
    if case == "plan":
        from hal.comm._ucx import ucx_version

        s = comm.device.create_stream()
        x = hal.asarray(np.full(8, comm.rank + 1, np.float32), device=comm.device)
        work = comm.all_reduce(x, stream=s)
        work.wait()
        p = work.plan
        g = hal.asarray(np.zeros(8 * comm.size, np.float32), device=comm.device)
        comm.all_gather(
            x, g, stream=s
        ).wait()  # no reduction: straight from/into the arrays where UCX can
        assert np.all(g.to_host() == sum(range(1, comm.size + 1))), g.to_host()
        direct = comm._engines[0].transport.direct_pieces
        say(
            f"OK rank={comm.rank} transport={p.transport} path={p.path} ucx={ucx_version()} "
            f"sum={float(x.to_host()[0]):g} direct={direct}"
        )
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
