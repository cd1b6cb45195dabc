"""``hal doctor``: the versions every rank must agree on, for this host or for every rank of a job."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_commands(sub: Any) -> None:
    """Add ``doctor`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "doctor",
        help="versions the ranks must agree on (hal-sdk, plugins, MPI/NCCL/UCX, NumPy): this host, or every rank",
        description="Print the versions table hal.comm.init() compares across ranks: hal-sdk, the HAL API, "
        "plugins, the transport's library (MPI under mpiexec or HAL_COMM_TRANSPORT=mpi, NCCL on CUDA devices, "
        "UCX), NumPy, torch when imported. Under a launcher (hal run -n 2 -m hal doctor, mpiexec -n 2 hal doctor, "
        "torchrun ... -m hal doctor) every rank meets the others and rank 0 prints all the tables and the "
        "mismatches; exit code 1 when a mismatch would stop hal.comm.init().",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--local", action="store_true", help="this process only, even under a launcher")
    p.set_defaults(func=cmd_doctor)


def doctor_dict(local: bool = False) -> tuple[int, dict[str, Any]]:
    """Return ``(rank, report)``: what ``hal doctor --json`` prints (rank 0 prints it)."""
    from hal.comm import _versions
    from hal.comm._init import gather_versions

    rank, tables = gather_versions(local=local)
    errors, warns, bad = _versions.check(tables)
    errors = [*errors, *_bad_settings()]
    return rank, {
        "launcher": tables[0]["launcher"],
        "ranks": tables,
        "errors": errors,
        "warnings": warns,
        "ranks_at_fault": sorted(bad),
        "transports": _transports(),
    }


def _bad_settings() -> list[str]:
    """Return the error of every HAL_* variable set here whose value hal cannot use (read lazily
    elsewhere, so a bad HAL_MEMORY_LIMIT only failed at the first allocation)."""
    import os

    import hal
    from hal.spi import SETTINGS, setting

    out = []
    for name in sorted(SETTINGS):
        if name in os.environ:
            try:
                setting(name)
            except hal.ConfigError as exc:
                out.append(f"setting {exc}")
    return out


def _transports() -> dict[str, str | None]:
    """Return ``{transport: None (installed) or why it cannot run here}`` for this host."""
    from hal.comm._init import transports

    reg = transports()
    return {name: reg.get(name).missing() for name in reg.names}


def cmd_doctor(args: argparse.Namespace) -> int:
    """Print the versions table; return 1 when a mismatch would stop ``hal.comm.init()``."""
    from hal.comm import _versions

    rank, report = doctor_dict(local=args.local)
    if rank != 0:
        return 0  # rank 0 speaks for the job
    if args.json:
        print(json.dumps(report, indent=2))
        return 1 if report["errors"] else 0
    tables = report["ranks"]
    if len(tables) == 1:
        t = tables[0]
        print(
            f"hal doctor: host {t['host']}, device {t['device'] or 'none'} (launcher {t['launcher']})"
        )
    else:
        hosts = sorted({t["host"] for t in tables})
        print(
            f"hal doctor: {len(tables)} ranks on {len(hosts)} host(s) {', '.join(hosts)} "
            f"(launcher {report['launcher']})"
        )
    for line in _versions.format_table(tables):
        print("  " + line)
    for t in tables[:1] if len(tables) == 1 else tables:
        for name, why in (t.get("providers") or {}).items():
            who = "" if len(tables) == 1 else f"rank {t['rank']}: "
            print(
                f"  {who}collective provider {name}: "
                + ("usable" if why is None else f"unavailable: {why}")
            )
    for name, why in report["transports"].items():
        print(f"  transport {name}: " + ("installed" if why is None else f"unavailable: {why}"))
    for e in report["errors"]:
        print(f"ERROR   {e}")
    for w in report["warnings"]:
        print(f"warning {w}")
    if len(tables) > 1 and not report["errors"] and not report["warnings"]:
        print("all ranks agree")
    return 1 if report["errors"] else 0
