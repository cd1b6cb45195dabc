"""hal.comm between two emulated hosts: tcp, ucx, mpi and MPICH side by side in one run.

    sudo python scripts/bench_comm_netns.py [--op all_reduce] [--min 4K] [--max 16M] [-f 16]
                                            [--batches 3] [--ucx-tls tcp] [--json]

Makes two network namespaces joined by veth pairs to a bridge (as tests/multihost does; needs
root and iproute2), puts one rank in each, and times the same collective with ``hal bench
comm``'s worker (hal.cli.bench._comm_worker) three times:

- ``tcp``: hal's algorithms over hal's TCP transport (ranks started as ``hal run`` would, with
  a rendezvous at host 0's address and a fresh job secret);
- ``ucx``: hal's algorithms over the UCX transport (``UCX_TLS`` from ``--ucx-tls``, default
  ``tcp``: the emulated hosts have no RDMA; the interface through ``HAL_COMM_IFNAME``);
- ``mpi`` and ``MPICH``: one MPICH ``mpiexec`` job across the two namespaces (hydra's ssh
  launcher replaced by ``ip netns exec``), hal's algorithms over the MPI transport beside
  mpi4py's own collective on the same data (``--baseline mpi``); ``MPIR_CVAR_NOLOCAL=1`` and
  MPICH's ch4:ucx netmod with the same ``UCX_TLS``, so that MPICH too goes over the veths (the
  namespaces share /dev/shm: MPICH and UCX would otherwise take shared memory).

Prints one table: per size, each engine's out-of-place time (µs) and busbw (GB/s); ``--json``
prints ``{"rows": [...], "runs": {engine: worker JSON}}``. Every namespace is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ENGINES = ("tcp", "ucx", "mpi", "MPICH")


def _size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        return int(float(num) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (4K, 16M ...)") from None


def ip(*args: str) -> None:
    """Run ``ip ARGS``; raise with its stderr on failure."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


class Hosts:
    """Two namespaces ``{tag}h0``, ``{tag}h1`` on a bridge in ``{tag}sw``; :meth:`down` deletes them."""

    def __init__(self) -> None:
        self.tag = f"hb{random.randrange(16**4):04x}"
        net = f"10.{random.randrange(100, 250)}.{random.randrange(0, 250)}"
        self.ns = [f"{self.tag}h{i}" for i in range(2)]
        self.dev = [f"{self.tag}v{i}" for i in range(2)]
        self.addr = [f"{net}.{i + 1}" for i in range(2)]
        self.made: list[str] = []

    def up(self) -> None:
        sw = f"{self.tag}sw"
        ip("netns", "add", sw)
        self.made.append(sw)
        ip("-n", sw, "link", "add", "br0", "type", "bridge")
        ip("-n", sw, "link", "set", "br0", "up")
        for i, ns in enumerate(self.ns):
            ip("netns", "add", ns)
            self.made.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
            peer = f"{self.tag}s{i}"
            ip(
                "link",
                "add",
                self.dev[i],
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                peer,
                "netns",
                sw,
            )
            ip("-n", sw, "link", "set", peer, "master", "br0")
            ip("-n", sw, "link", "set", peer, "up")
            ip("-n", ns, "addr", "add", f"{self.addr[i]}/24", "dev", self.dev[i])
            ip("-n", ns, "link", "set", self.dev[i], "up")

    def down(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def _worker(args: argparse.Namespace, out: str) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "hal.cli.bench._comm_worker",
        "--op",
        args.op,
        "--min",
        str(args.min),
    ]
    cmd += ["--max-bytes", str(args.max), "--batches", str(args.batches), "--out", out]
    import hal.cli.bench._comm_worker as w

    if (
        "--factor" in Path(w.__file__).read_text()
    ):  # rows at x factor steps where the worker has them
        cmd += ["--factor", str(args.factor)]
    return cmd


def _base_env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HAL_", "UCX_", "PMI_", "OMPI_"))
    }
    env.update(
        HAL_BACKENDS="cpu", HAL_CPU_DEVICES="1", HAL_COMM_PROVIDER="generic", PYTHONUNBUFFERED="1"
    )
    return env


def run_hal(h: Hosts, args: argparse.Namespace, transport: str, tmp: str) -> dict[str, Any]:
    """Run the worker on both hosts with hal's own launcher variables; return rank 0's JSON."""
    out = os.path.join(tmp, f"{transport}.json")
    env = _base_env()
    env.update(
        HAL_COMM_TRANSPORT=transport,
        HAL_WORLD_SIZE="2",
        HAL_STORE_ADDR=f"{h.addr[0]}:{random.randrange(20000, 30000)}",
        HAL_COMM_SECRET=secrets.token_hex(32),
        HAL_COMM_IFNAME=h.tag,  # both veths start with the tag (UCX: UCX_NET_DEVICES)
    )
    if transport == "ucx":
        env["UCX_TLS"] = args.ucx_tls
    procs = [
        subprocess.Popen(
            ["ip", "netns", "exec", h.ns[i], *_worker(args, out)],
            env=dict(env, HAL_RANK=str(i), HAL_LOCAL_RANK="0"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    errs = []
    for i, p in enumerate(procs):
        o, e = p.communicate(timeout=args.timeout)
        if p.returncode:
            errs.append(f"rank {i} ({transport}) exited with {p.returncode}: {(o + e)[-2000:]}")
    if errs:
        raise RuntimeError("\n".join(errs))
    return dict(json.loads(Path(out).read_text()))


def run_mpich(h: Hosts, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """One mpiexec job across both namespaces: hal over the mpi transport beside mpi4py + MPICH."""
    mpiexec = shutil.which(
        "mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    )
    if mpiexec is None:
        raise RuntimeError("mpiexec not found: pip install 'hal-sdk[mpi]'")
    launcher = Path(tmp) / "netns-ssh"
    cases = "\n".join(f"  {a}) ns={n};;" for a, n in zip(h.addr, h.ns, strict=True))
    launcher.write_text(
        "#!/bin/sh\n# hydra's ssh launcher, replaced: [options] HOST COMMAND... runs COMMAND in HOST's namespace\n"
        'while [ "${1#-}" != "$1" ]; do shift; done\nhost="$1"; shift\n'
        f'case "$host" in\n{cases}\n  *) echo "unknown host $host" >&2; exit 1;;\nesac\n'
        'exec ip netns exec "$ns" sh -c "$*"\n'
    )
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    out = os.path.join(tmp, "mpi.json")
    env = _base_env()
    env["HAL_COMM_TRANSPORT"] = "mpi"
    # The namespaces share /dev/shm and the host's identity: without these MPICH (and the UCX
    # under its ch4:ucx netmod) would see one node and move the bytes through shared memory.
    env.update(MPIR_CVAR_NOLOCAL="1", MPIR_CVAR_CH4_NETMOD="ucx", UCX_TLS=args.ucx_tls)
    cmd = [
        "ip",
        "netns",
        "exec",
        h.ns[0],
        mpiexec,
        "-launcher",
        "ssh",
        "-launcher-exec",
        str(launcher),
    ]
    cmd += ["-hosts", ",".join(h.addr), "-localhost", h.addr[0], "-n", "2", "-ppn", "1"]
    cmd += [*_worker(args, out), "--baseline", "mpi"]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=args.timeout, check=False
    )
    if proc.returncode:
        raise RuntimeError(
            f"mpiexec exited with {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}"
        )
    return dict(json.loads(Path(out).read_text()))


def table(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Return one row per size: each engine's out-of-place time (us) and busbw (GB/s)."""
    rows: dict[int, dict[str, Any]] = {}
    for engine, res in runs.items():
        for r in res.get("rows", []):
            row = rows.setdefault(r["size"], {"size": r["size"]})
            if engine == "mpi":  # hal over the mpi transport, and mpi4py + MPICH in the same job
                row["mpi_us"], row["mpi_busbw"] = r["oop_time_us"], r["oop_busbw"]
                if "mpi_time_us" in r:
                    row["MPICH_us"], row["MPICH_busbw"] = r["mpi_time_us"], r["mpi_busbw"]
            else:
                row[f"{engine}_us"], row[f"{engine}_busbw"] = r["oop_time_us"], r["oop_busbw"]
    return [rows[k] for k in sorted(rows)]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0, or 2 when the machine cannot make namespaces."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="all_reduce")
    ap.add_argument("--min", type=_size, default=_size("4K"))
    ap.add_argument("--max", type=_size, default=_size("16M"))
    ap.add_argument("-f", "--factor", type=int, default=16)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--ucx-tls", default="tcp", help="UCX_TLS of the ucx run (default tcp)")
    ap.add_argument(
        "--engines", default=",".join(("tcp", "ucx", "mpi")), help="tcp,ucx,mpi (mpi adds MPICH)"
    )
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("bench_comm_netns: needs root and iproute2 (ip netns)", file=sys.stderr)
        return 2
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    h = Hosts()
    runs: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    try:
        h.up()
        with tempfile.TemporaryDirectory(prefix="hal-bench-netns-") as tmp:
            for engine in engines:
                try:
                    runs[engine] = (
                        run_mpich(h, args, tmp)
                        if engine == "mpi"
                        else run_hal(h, args, engine, tmp)
                    )
                except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as exc:
                    failed[engine] = str(exc)
    finally:
        h.down()
    rows = table(runs)
    if args.json:
        print(json.dumps({"rows": rows, "runs": runs, "failed": failed}, indent=2))
    else:
        cols = [e for e in ENGINES if any(f"{e}_us" in r for r in rows)]
        print(
            f"# {args.op} between 2 namespace hosts (veth + bridge), 1 rank each, CPU emulator; out of place"
        )
        print("# time (us) / busbw (GB/s) per engine; ucx with UCX_TLS=" + args.ucx_tls)
        print(f"{'size':>10} " + " ".join(f"{c:>18}" for c in cols))
        for r in rows:
            cells = [
                f"{r[c + '_us']:>9.1f} / {r[c + '_busbw']:>6.3f}"
                if c + "_us" in r
                else f"{'-':>18}"
                for c in cols
            ]
            print(f"{r['size']:>10} " + " ".join(cells))
        for engine, why in failed.items():
            print(f"# {engine}: failed: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
