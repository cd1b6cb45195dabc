"""Run the matrix on every device of one process at once (one thread per rank).

``python inprocess.py [--backend cpu] [--sizes 0,1,13]``: prints ``OK <checks>`` or the failures
(exit 1). The tests start it in a subprocess to set HAL_CPU_DEVICES / HAL_CPU_JITTER first.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import matrix

import hal
import hal.comm


def run_all(devices: list[hal.Device], **kwargs: object) -> tuple[int, list[str]]:
    """Run the matrix on every rank of a DeviceCommunicator over ``devices``; return (checks, failures)."""
    comm = hal.comm.create(devices, timeout_ms=60_000)
    results: list[tuple[int, list[str]]] = [(0, [])] * len(devices)
    errors: list[str] = []

    def one(r: int) -> None:
        try:
            results[r] = matrix.run(comm.ranks[r], **kwargs)  # type: ignore[arg-type]
        except Exception as exc:  # reported below
            errors.append(f"rank {r}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(devices))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    comm.close()
    return sum(n for n, _ in results), errors + [f for _, fs in results for f in fs]


def main() -> int:
    """Parse arguments, run, report."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default=None)
    ap.add_argument("--sizes", default="0,1,13")
    args = ap.parse_args()
    devs = hal.devices(args.backend)
    checks, failures = run_all(devs, sizes=tuple(int(s) for s in args.sizes.split(",")))
    if failures:
        print("\n".join(failures[:40]), file=sys.stderr)
        return 1
    print(f"OK {checks} devices={len(devs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
