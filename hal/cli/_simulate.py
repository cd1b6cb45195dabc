"""``hal simulate``: the cost model's predicted time and busbw per algorithm on a described cluster."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

#: nccl-tests bus-bandwidth factors (busbw = algbw x factor) for p ranks.
BUS_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}


def add_commands(sub: Any) -> None:
    """Add ``simulate`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "simulate",
        help="predict each algorithm's time and busbw on a topology file (the planner of real runs)",
        description="Run hal.comm's planner (hal/comm/_plan.py) on a described cluster: one rank per device "
        "(or the file's 'ranks'), the transport a real run would use, the slowest link between hosts.",
    )
    p.add_argument(
        "--topology", required=True, metavar="FILE", help="topology JSON (docs/topology.md)"
    )
    p.add_argument("--op", default="all_reduce", choices=sorted(BUS_FACTOR))
    p.add_argument(
        "--size", default="1G", help="message size in bytes (1G, 256M, 4096 ...; default 1G)"
    )
    p.add_argument(
        "--transport",
        default=None,
        choices=["shm", "tcp", "mpi", "ucx"],
        help="transport whose α, β to use (default: shm on one host, tcp on several)",
    )
    p.add_argument(
        "--provider",
        default=None,
        metavar="NAME",
        help="a collective provider every rank supports (nccl, mpi, a plugin's): its row, and the path "
        "a real run takes (default: generic only)",
    )
    p.add_argument(
        "--sizes",
        default=None,
        metavar="LIST",
        help="comma-separated sizes (4K,1M,1G): one line per size with the path taken and why",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_simulate)


def simulate(
    topo: Any, op: str, nbytes: int, transport: str | None = None, provider: str | None = None
) -> dict[str, Any]:
    """Return the prediction of every algorithm of ``op`` for ``nbytes`` on ``topo`` (a dict).

    With ``provider`` (a registered collective provider, assumed usable on every rank), its
    prediction is a row too (its α, β; across hosts no better than the slowest link) and it is
    the path taken, as in a real run (a provider every rank supports takes the call; it is not
    cost-compared with hal's algorithms: ``HAL_COMM_PROVIDER=generic`` chooses those).
    """
    import math

    from hal.comm import _plan
    from hal.comm._config import ALGORITHMS
    from hal.comm._init import transports
    from hal.comm._topo import host_groups

    if topo.ranks:
        rank_hosts = list(topo.ranks)
    else:
        rank_hosts = [h for h in topo.hosts for _ in range(max(1, len(topo.devices.get(h, ()))))]
    groups = host_groups(rank_hosts)
    p, hosts = len(rank_hosts), len(groups)
    sizes = {len(g) for g in groups}
    per_host = sizes.pop() if len(sizes) == 1 else 0
    name = transport or ("shm" if hosts == 1 else "tcp")
    cls = transports().get(name)
    chunk_default = {"shm": 4 << 20, "tcp": 1 << 20}.get(name, 1 << 20)
    chunk = min(chunk_default, max(nbytes, 64)) // 64 * 64 or 64
    inter = topo.inter_host()
    rows: list[dict[str, Any]] = []
    for algo in ALGORITHMS[op]:
        t = _plan.predict(
            op,
            algo,
            nbytes,
            p,
            cls.alpha_s,
            cls.beta_s_per_byte,
            chunk,
            hosts=hosts,
            per_host=per_host,
            inter=inter,
        )
        if math.isinf(t):
            rows.append(
                {"algorithm": algo, "time_us": None, "algbw_gbps": None, "busbw_gbps": None}
            )
            continue
        algbw = nbytes / t / 1e9 if t > 0 else math.inf
        rows.append(
            {
                "algorithm": algo,
                "time_us": round(t * 1e6, 1),
                "algbw_gbps": round(algbw, 3),
                "busbw_gbps": round(algbw * BUS_FACTOR[op](p), 3),
            }
        )
    plan = _plan.choose(
        op,
        nbytes=nbytes,
        ranks=p,
        hosts=hosts,
        transport=cls,
        chunk_bytes=chunk,
        path=cls.path,
        override=None,
        per_host=per_host,
        inter=inter,
    )
    path, why = plan.algorithm, f"cost model: the cheapest of hal's {op} algorithms over {name}"
    if plan.chosen_by == "only choice":
        why = f"the only {op} algorithm over {name}"
    if provider is not None and provider != "generic":
        from hal.comm._providers import providers

        pcls = providers().get(provider)
        pa, pb = pcls.alpha_s, pcls.beta_s_per_byte
        t = _plan.predict_provider(
            op, nbytes, p, pa, pb, hosts=hosts, per_host=per_host, inter=inter
        )
        algbw = nbytes / t / 1e9 if t > 0 else math.inf
        rows.append(
            {
                "algorithm": f"provider {provider}",
                "time_us": round(t * 1e6, 1),
                "algbw_gbps": round(algbw, 3),
                "busbw_gbps": round(algbw * BUS_FACTOR[op](p), 3),
            }
        )
        path = f"provider {provider}"
        why = (
            f"provider {provider} serves every rank and takes {op} whole "
            f"(α {pa * 1e6:.1f} us, {1 / pb / 1e9:.2f} GB/s within a host); hal's best: {plan.algorithm}, "
            f"{plan.predicted_us:.1f} us"
        )
    return {
        "path": path,
        "why": why,
        "op": op,
        "bytes": nbytes,
        "ranks": p,
        "hosts": hosts,
        "ranks_per_host": per_host,
        "transport": name,
        "alpha_us": cls.alpha_s * 1e6,
        "beta_gbps": 1 / cls.beta_s_per_byte / 1e9,
        "inter_host": None
        if inter is None
        else {"latency_us": inter[0] * 1e6, "bandwidth_gbps": 1 / inter[1] / 1e9},
        "chunk_bytes": chunk,
        "chosen": plan.algorithm,
        "algorithms": rows,
    }


def cmd_simulate(args: argparse.Namespace) -> int:
    """Print the predictions."""
    from hal.comm._config import parse_size
    from hal.comm._topo import load

    try:
        nbytes = parse_size(args.size, "--size")
    except ValueError as exc:
        print(f"hal simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.provider is not None and args.provider != "generic":
        from hal.comm._providers import providers

        if args.provider not in providers().names:
            print(
                f"hal simulate: error: --provider {args.provider!r} is not a collective provider; known: "
                + ", ".join(["generic", *providers().names]),
                file=sys.stderr,
            )
            return 2
    topo = load(args.topology)
    if args.sizes:
        try:
            sizes = [parse_size(x, "--sizes") for x in args.sizes.split(",") if x.strip()]
        except ValueError as exc:
            print(f"hal simulate: error: {exc}", file=sys.stderr)
            return 2
        runs = [simulate(topo, args.op, n, args.transport, args.provider) for n in sizes]
        if args.json:
            print(json.dumps(runs, indent=1))
            return 0
        first = runs[0]
        print(
            f"{first['op']} on {first['ranks']} ranks, {first['hosts']} host(s), transport {first['transport']}"
            + (
                f", provider {args.provider}"
                if args.provider and args.provider != "generic"
                else ""
            )
        )
        print(f"{'bytes':>12}  {'path':<22} {'time (us)':>14}  why")
        for r in runs:
            t = next(x["time_us"] for x in r["algorithms"] if x["algorithm"] == r["path"])
            print(f"{r['bytes']:>12}  {r['path']:<22} {t:>14.1f}  {r['why']}")
        return 0
    out = simulate(topo, args.op, nbytes, args.transport, args.provider)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    link = out["inter_host"]
    print(
        f"{out['op']} of {nbytes} bytes on {out['ranks']} ranks, {out['hosts']} host(s) "
        f"({out['ranks_per_host'] or 'uneven'} per host), transport {out['transport']} "
        f"(α {out['alpha_us']:.0f} us, {out['beta_gbps']:.2f} GB/s)"
        + (
            f", slowest link {link['bandwidth_gbps']:.2f} GB/s / {link['latency_us']:.0f} us"
            if link
            else ""
        )
    )
    print(f"{'algorithm':<20} {'time (us)':>14} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for r in out["algorithms"]:
        mark = "  <- chosen" if r["algorithm"] == out["path"] else ""
        if r["time_us"] is None:
            print(f"{r['algorithm']:<20} {'cannot run':>14}")
        else:
            print(
                f"{r['algorithm']:<20} {r['time_us']:>14.1f} {r['algbw_gbps']:>11.3f} {r['busbw_gbps']:>11.3f}{mark}"
            )
    return 0
