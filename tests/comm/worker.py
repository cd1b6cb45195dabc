"""One rank of the multi-process collective tests (started by ``hal run`` or mpiexec).

Usage: ``hal run -n N worker.py [--sizes 0,1,13] [--algos all_reduce:ring,...]``. Runs the
matrix (tests/comm/matrix.py) once per HAL_COMM_ALGO setting given, prints ``OK <checks>``
on success, the failures and exit code 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import matrix

import hal.comm


def main() -> int:
    """Run the matrix on this rank."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="0,1,13")
    ap.add_argument("--dtypes", default=",".join(matrix.DTYPES))
    ap.add_argument(
        "--algos", default="", help="';'-separated HAL_COMM_ALGO settings to run in turn"
    )
    args = ap.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    total, failures = 0, []
    for setting in args.algos.split(";") if args.algos else [""]:
        os.environ["HAL_COMM_ALGO"] = setting
        comm = hal.comm.init()
        try:
            n, f = matrix.run(comm, sizes=sizes, dtypes=tuple(args.dtypes.split(",")))
        finally:
            comm.close()
        total += n
        failures += [f"[HAL_COMM_ALGO={setting}] {x}" for x in f]
    if failures:
        print("\n".join(failures[:40]), file=sys.stderr)
        return 1
    print(f"OK {total} transport={comm.transport} rank={comm.rank}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
