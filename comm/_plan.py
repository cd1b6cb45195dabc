"""The planner: an α-β(-γ) cost model picks each call's algorithm; ``HAL_COMM_ALGO`` overrides it.

Predicted time of one call, for ``p`` ranks, ``n`` bytes, a transport with latency ``α``
(seconds per message) and inverse bandwidth ``β`` (seconds per byte), and a reduction cost
``γ`` (seconds per byte reduced), following Thakur, Rabenseifner & Gropp (2005):

=====================  ====================================================================
all_reduce ring         2(p-1)α + 2(p-1)/p·nβ + (p-1)/p·nγ
recursive_doubling      kα + k·n(β+γ), k = ⌊log p⌋   (+ 2(α+nβ) + nγ to fold p ≠ 2^k ranks)
rabenseifner            2kα + 2(q-1)/q·nβ + (q-1)/q·nγ, q = 2^k   (+ the same fold)
hierarchical            RS(l, n; α, β) + AR_ring(h, n/l; αₑ, βₑ) + AG(l, n; α, β)
                        (h hosts of l ranks each: intra-host reduce-scatter, inter-host
                        ring all_reduce of the shard, intra-host all_gather)
all_gather ring         (p-1)α + (p-1)/p·nβ                (n = the gathered size)
recursive_doubling      log p·α + (p-1)/p·nβ               (p = 2^k only)
reduce_scatter ring     (p-1)α + (p-1)/p·n(β+γ)
broadcast tree          ⌈log p⌉(α + nβ)
scatter_allgather       p·α + 2(p-1)/p·nβ
reduce tree             ⌈log p⌉(α + n(β+γ))
reduce_scatter_gather   2(p-1)α + 2(p-1)/p·nβ + (p-1)/p·nγ
all_to_all pairwise     (p-1)(α + nβ/p)
=====================  ====================================================================

Each piece of a pipelined transport also pays a fixed per-piece cost. The topology enters
through the transport (one host: shared memory; several: TCP) and its α, β, and, with several
hosts, through the inter-host link (αₑ, βₑ: the slowest link the topology describes, else the
transport's own): a flat algorithm's ring or butterfly crosses that link, so it pays αₑ, βₑ. The constants are
calibrated on the CPU emulator here (2 ranks, shared memory: recursive doubling is faster up
to about 1 MiB, the ring from 2 MiB; `HAL_COMM_ALGO` forces either to compare).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import hal
from hal.comm._config import ALGORITHMS

__all__ = ["GAMMA_S_PER_BYTE", "Plan", "choose", "predict", "predict_provider"]

#: Seconds per byte reduced (hal.kernels.accumulate on the CPU emulator, ~2 GB/s as measured
#: inside a running collective here: memory-bound, sharing the cores with the copies).
GAMMA_S_PER_BYTE = 1 / 2e9
#: Fixed cost of one pipelined piece (a device<->host copy and its synchronization).
PIECE_S = 30e-6


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one call runs: inspect ``Work.plan`` or ``comm.plans``; logged at debug level."""

    collective: str
    algorithm: str
    transport: str
    chunk_bytes: int
    path: str
    nbytes: int
    ranks: int
    hosts: int
    predicted_us: float
    chosen_by: str  # "cost model" | "HAL_COMM_ALGO" | "only choice" | "provider ..."
    seq: int = -1
    #: who runs the call: ``generic`` (hal's algorithms over the transport) or a collective
    #: provider (``mpi``, ``nccl``, a plugin's); see hal.comm._providers
    provider: str = "generic"
    #: why a call a provider serves runs the generic algorithms instead ("" when it does not)
    fallback: str = ""
    #: what executes the plan's steps: ``python`` (the transport's Python progress loop) or
    #: ``native`` (the shared-memory transport's native engine, hal.comm._native)
    engine: str = "python"

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict."""
        return dataclasses.asdict(self)

    def with_seq(self, seq: int) -> Plan:
        """Return this plan for call number ``seq``."""
        # a field-for-field copy: dataclasses.replace costs ~10x more, on every call
        plan = object.__new__(Plan)
        plan.__dict__.update(self.__dict__)
        object.__setattr__(plan, "seq", seq)
        return plan

    def __str__(self) -> str:
        return (
            f"{self.collective} seq={self.seq} algorithm={self.algorithm} transport={self.transport} "
            f"path={self.path} chunk={self.chunk_bytes} bytes={self.nbytes} ranks={self.ranks} "
            f"hosts={self.hosts} predicted={self.predicted_us:.1f}us ({self.chosen_by})"
            + (f" provider={self.provider}" if self.provider != "generic" else "")
            + (f" fallback={self.fallback!r}" if self.fallback else "")
            + (f" engine={self.engine}" if self.engine != "python" else "")
        )


def _is_pow2(p: int) -> bool:
    return p > 0 and p & (p - 1) == 0


def predict(
    collective: str,
    algorithm: str,
    nbytes: int,
    p: int,
    alpha: float,
    beta: float,
    chunk: int,
    *,
    hosts: int = 1,
    per_host: int = 0,
    inter: tuple[float, float] | None = None,
) -> float:
    """Return the predicted seconds of ``algorithm`` (``inf`` where it cannot run).

    ``hosts`` and ``per_host`` (ranks on every host, 0 when the hosts hold different counts)
    describe the placement; ``inter`` is (α, β) of the link between hosts.
    """
    if p <= 1:
        return 0.0
    if algorithm == "hierarchical":
        return _predict_hierarchical(nbytes, p, alpha, beta, chunk, hosts, per_host, inter)
    if hosts > 1 and inter is not None:  # a flat algorithm crosses the slowest link
        alpha, beta = max(alpha, inter[0]), max(beta, inter[1])
    n, g = float(nbytes), GAMMA_S_PER_BYTE
    lg = math.ceil(math.log2(p))
    p2 = 1 << (p.bit_length() - 1)
    fold = 0.0 if p == p2 else 2 * (alpha + n * beta) + n * g
    frac = (p - 1) / p
    pieces = math.ceil(n / chunk) if chunk else 1
    piece_cost = PIECE_S * pieces
    t: float
    if collective == "all_reduce":
        core = p2.bit_length() - 1  # steps among the 2^k ranks left after the fold
        frac2 = (p2 - 1) / p2
        if algorithm == "ring":
            t = 2 * (p - 1) * alpha + 2 * frac * n * beta + frac * n * g + 2 * piece_cost
        elif algorithm == "recursive_doubling":
            t = core * alpha + core * n * (beta + g) + fold + core * piece_cost
        else:
            t = 2 * core * alpha + 2 * frac2 * n * beta + frac2 * n * g + fold + 2 * piece_cost
    elif collective == "all_gather":
        if algorithm == "recursive_doubling" and not _is_pow2(p):
            return math.inf
        steps = (p - 1) if algorithm == "ring" else lg
        t = steps * alpha + frac * n * beta + piece_cost
    elif collective == "reduce_scatter":
        t = (p - 1) * alpha + frac * n * (beta + g) + piece_cost
    elif collective == "broadcast":
        if algorithm == "tree":
            t = lg * (alpha + n * beta) + lg * piece_cost
        else:
            t = p * alpha + 2 * frac * n * beta + 2 * piece_cost
    elif collective == "reduce":
        if algorithm == "tree":
            t = lg * (alpha + n * (beta + g)) + lg * piece_cost
        else:
            t = 2 * (p - 1) * alpha + 2 * frac * n * beta + frac * n * g + 2 * piece_cost
    elif collective == "all_to_all":
        t = (p - 1) * (alpha + n * beta / p) + piece_cost
    else:
        t = (p - 1) * alpha
    return t


def predict_provider(
    collective: str,
    nbytes: int,
    p: int,
    alpha: float,
    beta: float,
    *,
    hosts: int = 1,
    per_host: int = 0,
    inter: tuple[float, float] | None = None,
) -> float:
    """Return the predicted seconds of a collective provider (its ``alpha_s``, ``beta_s_per_byte``).

    A provider chooses its own algorithm (NCCL: rings and trees, MPI: its tuned collectives), so
    it is modelled as the best of the same formulas with its α and β, unpiped (no per-piece
    cost), across hosts paying the slowest link like hal's own algorithms.
    """
    from hal.comm._config import ALGORITHMS

    return min(
        predict(
            collective, a, nbytes, p, alpha, beta, 0, hosts=hosts, per_host=per_host, inter=inter
        )
        for a in ALGORITHMS.get(collective, ("ring",))
    )


def _predict_hierarchical(
    nbytes: int,
    p: int,
    alpha: float,
    beta: float,
    chunk: int,
    hosts: int,
    per_host: int,
    inter: tuple[float, float] | None,
) -> float:
    if hosts <= 1 or per_host <= 0 or hosts * per_host != p:
        return math.inf
    n, g, lr = float(nbytes), GAMMA_S_PER_BYTE, per_host
    ae, be = inter if inter is not None else (alpha, beta)
    pieces = math.ceil(n / chunk) if chunk else 1
    t = 0.0
    if lr > 1:
        f = (lr - 1) / lr
        t += (lr - 1) * alpha + f * n * (beta + g) + PIECE_S * pieces  # reduce-scatter
        t += (lr - 1) * alpha + f * n * beta + PIECE_S * pieces  # all-gather
    shard = n / lr
    fh = (hosts - 1) / hosts
    shard_pieces = math.ceil(shard / chunk) if chunk else 1
    t += 2 * (hosts - 1) * ae + 2 * fh * shard * be + fh * shard * g + 2 * PIECE_S * shard_pieces
    return t


def choose(
    collective: str,
    *,
    nbytes: int,
    ranks: int,
    hosts: int,
    transport: type[Any] | Any,
    chunk_bytes: int,
    path: str,
    override: str | None,
    per_host: int = 0,
    inter: tuple[float, float] | None = None,
    ipc: Any = None,
) -> Plan:
    """Return the plan for one call: the override if possible, else the cheapest algorithm.

    ``per_host`` is the number of ranks on every host (0: hosts hold different counts) and
    ``inter`` the (α, β) of the link between hosts (None: the transport's). ``ipc`` is the
    communicator's :class:`hal.comm._ipc.IpcState` (None: no direct intra-host path); the
    path ``ipc`` is planned with one copy per byte (hal.comm._ipc.predict).

    Raises:
        hal.CommError: ``override`` names an algorithm that cannot run this call.
    """
    algos = ALGORITHMS[collective]
    alpha, beta = transport.alpha_s, transport.beta_s_per_byte
    name = transport.name

    def cost(a: str) -> float:
        t = predict(
            collective,
            a,
            nbytes,
            ranks,
            alpha,
            beta,
            chunk_bytes,
            hosts=hosts,
            per_host=per_host,
            inter=inter,
        )
        # a transport whose engine has costs of its own (the native shm engine) refines the model
        # of one host; across hosts the inter-host link's α-β above decides
        own = getattr(transport, "predict_cost", None)
        if own is None or hosts > 1:
            return t
        return float(own(collective, a, nbytes, ranks, chunk_bytes, t))

    t_ipc = math.inf if ipc is None else ipc.predict(collective, nbytes, ranks, alpha)
    forced = override == "ipc" or (override is None and ipc is not None and ipc.mode == "on")
    if forced and ranks > 1:
        from hal.comm._config import IPC_COLLECTIVES

        if collective in IPC_COLLECTIVES:
            if math.isinf(t_ipc):
                why = (
                    getattr(ipc, "reason", "") or "not a communicator of processes (hal.comm.init)"
                )
                raise hal.CommError(
                    f"HAL_COMM_ALGO asks {collective}:ipc, which cannot run here: {why}",
                    op=collective,
                )
            how = "HAL_COMM_ALGO" if override == "ipc" else "HAL_COMM_IPC"
            return Plan(
                collective, "ipc", name, chunk_bytes, "ipc", nbytes, ranks, hosts, t_ipc * 1e6, how
            )
    if override is not None:
        t = cost(override)
        if math.isinf(t):
            need = (
                "ranks on several hosts, the same number on each (HAL_TOPO_FILE can place them)"
                if override == "hierarchical"
                else "a power-of-two rank count"
            )
            raise hal.CommError(
                f"HAL_COMM_ALGO asks {collective}:{override}, which cannot run on {ranks} ranks "
                f"on {hosts} host(s) (it needs {need}); unset it or choose "
                + ", ".join(a for a in algos if not math.isinf(cost(a))),
                op=collective,
            )
        return Plan(
            collective,
            override,
            name,
            chunk_bytes,
            path,
            nbytes,
            ranks,
            hosts,
            t * 1e6,
            "HAL_COMM_ALGO",
        )
    costs = {a: cost(a) for a in algos}
    best = min(algos, key=lambda a: (costs[a], algos.index(a)))
    if t_ipc < costs[best]:  # the direct intra-host path (hal.comm._ipc): one copy per byte
        return Plan(
            collective,
            "ipc",
            name,
            chunk_bytes,
            "ipc",
            nbytes,
            ranks,
            hosts,
            t_ipc * 1e6,
            "cost model",
        )
    how = "only choice" if len(algos) == 1 else "cost model"
    return Plan(
        collective, best, name, chunk_bytes, path, nbytes, ranks, hosts, costs[best] * 1e6, how
    )
