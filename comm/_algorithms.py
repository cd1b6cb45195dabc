"""The collective algorithms, written once per rank over :meth:`Transport.exchange`.

Every function runs on one rank and sees only its own device buffers; the same code serves
devices of one process (in-process transport) and ranks of many processes (shm, tcp, mpi).
Buffers are 1-D ``hal.Array`` views; ``op`` reductions run in ``hal.kernels``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import hal
from hal.comm._ops import sub
from hal.comm._transport import CallContext, Recv, Send, StagedTransport, Transport

__all__ = ["Run", "split"]


def split(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``parts`` (start, length) pieces, the first ``count % parts`` one longer."""
    base, extra = divmod(count, parts)
    out, start = [], 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append((start, n))
        start += n
    return out


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


class Run:
    """One rank's view of one collective call: who it is, how to move bytes, where to stage."""

    def __init__(
        self,
        rank: int,
        size: int,
        transport: Transport,
        ctx: CallContext,
        temp: Callable[[Any, int], hal.Array],
    ) -> None:
        self.rank = rank
        self.size = size
        self.transport = transport
        self.ctx = ctx
        self.stream = ctx.stream
        self.temp = temp
        self.agreement: Any = None  # hal.comm._engine._Agreement when ranks check each other
        self.host_groups: list[list[int]] = [list(range(size))]  # the ranks of each host

    def exchange(self, sends: Sequence[Send] = (), recvs: Sequence[Recv] = ()) -> None:
        """Move the bytes of ``sends`` and ``recvs`` (see :meth:`Transport.exchange`).

        A peer's call signature is checked before the first of its bytes is received.
        """
        if self.agreement is not None and recvs and self.agreement.pending:
            if isinstance(self.transport, StagedTransport) and len({x.peer for x in sends}) == len(
                sends
            ):
                # place what fits at once (a mismatched peer reads our signature before these
                # bytes and stops), then check the peers' signatures, then finish the exchange
                sends = self.transport.post(sends, self.ctx)
            self.agreement.check(self, [r.peer for r in recvs])
        self.transport.exchange(sends, recvs, self.ctx)

    def copy(self, dst: hal.Array, src: hal.Array) -> None:
        """Enqueue a device copy ``dst <- src`` on the call's stream."""
        if dst.nbytes:
            hal.copy(dst, src, stream=self.stream)

    def snapshot(self, buf: hal.Array) -> hal.Array:
        """Return a temporary copy of ``buf`` (what a rank sends while it reduces into ``buf``)."""
        tmp = self.temp(buf.dtype, buf.size)
        self.copy(tmp, buf)
        return tmp

    # -- all_reduce ---------------------------------------------------------------------
    def all_reduce(
        self, buf: hal.Array, op: str, algorithm: str, src: hal.Array | None = None
    ) -> None:
        """Reduce across ranks into ``buf``: in place, or from ``src`` (out-of-place; ``src`` unchanged)."""
        if src is not None and (algorithm != "ring" or self.size == 1):
            self.copy(buf, src)  # algorithms other than the ring start from a copy
            src = None
        if self.size == 1:
            return
        if algorithm == "ring":
            segs = split(buf.size, self.size)
            self._ring_reduce_scatter(buf, segs, op, src)
            self._ring_all_gather(buf, segs)
        elif algorithm == "recursive_doubling":
            self._fold(buf, op, self._rd_all_reduce)
        elif algorithm == "rabenseifner":
            self._fold(buf, op, self._rabenseifner)
        elif algorithm == "hierarchical":
            self._hierarchical(buf, op)
        else:  # pragma: no cover - the planner validated the name
            raise ValueError(f"all_reduce has no algorithm {algorithm!r}")

    def _ring_reduce_scatter(
        self, buf: hal.Array, segs: list[tuple[int, int]], op: str, src: hal.Array | None = None
    ) -> None:
        """Ring reduce-scatter: afterwards rank r holds segment r fully reduced.

        With ``src`` (out-of-place), every segment this rank reduces is reduced exactly once,
        as ``buf[seg] = src[seg] op received``, and the first send reads ``src``: no copy of
        ``src`` into ``buf`` is needed.
        """
        p, r = self.size, self.rank
        nxt, prv = (r + 1) % p, (r - 1) % p
        for s in range(p - 1):
            si, ri = (r - s - 1) % p, (r - s - 2) % p
            out = sub(src if (src is not None and s == 0) else buf, *segs[si])
            base = sub(src, *segs[ri]) if src is not None else None
            self.exchange([Send(nxt, out)], [Recv(prv, sub(buf, *segs[ri]), op, base)])

    def _ring_all_gather(self, buf: hal.Array, segs: list[tuple[int, int]]) -> None:
        """Ring all-gather: rank r starts with segment r and ends with all of them."""
        p, r = self.size, self.rank
        nxt, prv = (r + 1) % p, (r - 1) % p
        for s in range(p - 1):
            si, ri = (r - s) % p, (r - s - 1) % p
            self.exchange([Send(nxt, sub(buf, *segs[si]))], [Recv(prv, sub(buf, *segs[ri]))])

    def _group_ring_reduce_scatter(
        self, buf: hal.Array, segs: list[tuple[int, int]], op: str, group: list[int]
    ) -> None:
        """Ring reduce-scatter among ``group`` (global ranks): member i ends with ``segs[i]`` reduced."""
        p, i = len(group), group.index(self.rank)
        nxt, prv = group[(i + 1) % p], group[(i - 1) % p]
        for s in range(p - 1):
            si, ri = (i - s - 1) % p, (i - s - 2) % p
            self.exchange([Send(nxt, sub(buf, *segs[si]))], [Recv(prv, sub(buf, *segs[ri]), op)])

    def _group_ring_all_gather(
        self, buf: hal.Array, segs: list[tuple[int, int]], group: list[int]
    ) -> None:
        """Ring all-gather among ``group``: member i starts with ``segs[i]`` and ends with all."""
        p, i = len(group), group.index(self.rank)
        nxt, prv = group[(i + 1) % p], group[(i - 1) % p]
        for s in range(p - 1):
            si, ri = (i - s) % p, (i - s - 1) % p
            self.exchange([Send(nxt, sub(buf, *segs[si]))], [Recv(prv, sub(buf, *segs[ri]))])

    def _hierarchical(self, buf: hal.Array, op: str) -> None:
        """Intra-host reduce-scatter, inter-host ring all_reduce of this rank's shard, intra-host all-gather.

        Needs the same number of ranks on every host (the planner checks it).
        """
        groups = self.host_groups
        local = next(g for g in groups if self.rank in g)
        li = local.index(self.rank)
        cross = [g[li] for g in groups]  # the ranks holding the same shard on every host
        segs = split(buf.size, len(local))
        if len(local) > 1:
            self._group_ring_reduce_scatter(buf, segs, op, local)
        start, length = segs[li]
        if len(cross) > 1:
            sub_segs = [(start + a, n) for a, n in split(length, len(cross))]
            self._group_ring_reduce_scatter(buf, sub_segs, op, cross)
            self._group_ring_all_gather(buf, sub_segs, cross)
        if len(local) > 1:
            self._group_ring_all_gather(buf, segs, local)

    def _fold(self, buf: hal.Array, op: str, core: Callable[[hal.Array, str, int], None]) -> None:
        """Run a power-of-two algorithm on ``p2`` ranks: the others fold in first and get the result last."""
        p, r = self.size, self.rank
        p2 = _pow2_floor(p)
        if r >= p2:
            self.exchange([Send(r - p2, buf)])
            self.exchange((), [Recv(r - p2, buf)])
            return
        if r + p2 < p:
            self.exchange((), [Recv(r + p2, buf, op)])
        core(buf, op, p2)
        if r + p2 < p:
            self.exchange([Send(r + p2, buf)])

    def _rd_all_reduce(self, buf: hal.Array, op: str, p2: int) -> None:
        # A one-piece message of a staged transport is copied out when sent, so the receive
        # may reduce into ``buf`` once the send is out; otherwise send a snapshot.
        one_piece = (
            isinstance(self.transport, StagedTransport) and buf.nbytes <= self.ctx.chunk_bytes
        )
        mask = 1
        while mask < p2:
            partner = self.rank ^ mask
            if one_piece:
                self.exchange([Send(partner, buf)], [Recv(partner, buf, op, after_sends=True)])
            else:
                self.exchange([Send(partner, self.snapshot(buf))], [Recv(partner, buf, op)])
            mask <<= 1

    def _rabenseifner(self, buf: hal.Array, op: str, p2: int) -> None:
        r = self.rank
        segs = split(buf.size, p2)

        def region(lo: int, hi: int) -> hal.Array:
            start = segs[lo][0]
            end = segs[hi - 1][0] + segs[hi - 1][1] if hi > lo else start
            return sub(buf, start, end - start)

        lo, hi = 0, p2
        mask = p2 // 2
        while mask >= 1:  # recursive halving
            partner = r ^ mask
            mid = (lo + hi) // 2
            if r & mask:
                keep, give = (mid, hi), (lo, mid)
            else:
                keep, give = (lo, mid), (mid, hi)
            self.exchange([Send(partner, region(*give))], [Recv(partner, region(*keep), op)])
            lo, hi = keep
            mask //= 2
        mask = 1
        while mask < p2:  # recursive doubling all-gather
            partner = r ^ mask
            mine = (r & ~(mask - 1), (r & ~(mask - 1)) + mask)
            theirs = (partner & ~(mask - 1), (partner & ~(mask - 1)) + mask)
            self.exchange([Send(partner, region(*mine))], [Recv(partner, region(*theirs))])
            mask <<= 1

    # -- all_gather / reduce_scatter -----------------------------------------------------
    def all_gather(self, out: hal.Array, count: int, algorithm: str) -> None:
        """Gather every rank's ``count`` elements (already at ``out[rank*count:]``) into ``out``."""
        if self.size == 1:
            return
        segs = [(i * count, count) for i in range(self.size)]
        if algorithm == "ring":
            self._ring_all_gather(out, segs)
        else:
            mask = 1
            r = self.rank
            while mask < self.size:
                partner = r ^ mask
                a, b = r & ~(mask - 1), partner & ~(mask - 1)
                self.exchange(
                    [Send(partner, sub(out, a * count, mask * count))],
                    [Recv(partner, sub(out, b * count, mask * count))],
                )
                mask <<= 1

    def reduce_scatter(
        self, work: hal.Array, op: str, algorithm: str, src: hal.Array | None = None
    ) -> tuple[int, int]:
        """Reduce ``work`` (or ``src`` into ``work``) so that this rank's segment holds the result.

        Returns this rank's segment (start, length). With ``src``, ``work`` may start uninitialized.
        """
        segs = split(work.size, self.size)
        if self.size > 1:
            self._ring_reduce_scatter(work, segs, op, src)
        elif src is not None:
            self.copy(work, src)
        return segs[self.rank]

    # -- rooted ---------------------------------------------------------------------------
    def broadcast(self, buf: hal.Array, root: int, algorithm: str) -> None:
        """Copy root's ``buf`` into every rank's ``buf``."""
        p, r = self.size, self.rank
        if p == 1:
            return
        vr = (r - root) % p
        if algorithm == "scatter_allgather":
            segs = split(buf.size, p)
            # rank with virtual index i receives segment i, then a ring all-gather in virtual order
            if vr == 0:
                self.exchange([Send((i + root) % p, sub(buf, *segs[i])) for i in range(1, p)])
            else:
                self.exchange((), [Recv(root, sub(buf, *segs[vr]))])
            nxt, prv = (r + 1) % p, (r - 1) % p
            for s in range(p - 1):
                si, ri = (vr - s) % p, (vr - s - 1) % p
                self.exchange([Send(nxt, sub(buf, *segs[si]))], [Recv(prv, sub(buf, *segs[ri]))])
            return
        mask = 1
        while mask < p:
            if vr & mask:
                self.exchange((), [Recv((vr - mask + root) % p, buf)])
                break
            mask <<= 1
        mask >>= 1
        sends = []
        while mask > 0:
            if vr + mask < p:
                sends.append(Send((vr + mask + root) % p, buf))
            mask >>= 1
        if sends:
            self.exchange(sends)

    def reduce(self, work: hal.Array, op: str, root: int, algorithm: str) -> None:
        """Reduce every rank's ``work`` into root's ``work`` (others' ``work`` is clobbered)."""
        p, r = self.size, self.rank
        if p == 1:
            return
        vr = (r - root) % p
        if algorithm == "reduce_scatter_gather":
            segs = split(work.size, p)
            self._ring_reduce_scatter(work, segs, op)
            if r == root:
                self.exchange((), [Recv(i, sub(work, *segs[i])) for i in range(p) if i != root])
            else:
                self.exchange([Send(root, sub(work, *segs[r]))])
            return
        mask = 1
        while mask < p:
            if vr & mask:
                self.exchange([Send((vr - mask + root) % p, work)])
                return
            if vr + mask < p:
                self.exchange((), [Recv((vr + mask + root) % p, work, op)])
            mask <<= 1

    def all_to_all(self, send: hal.Array, recv: hal.Array, count: int) -> None:
        """Send block i of ``send`` to rank i; receive rank i's block into block i of ``recv``."""
        p, r = self.size, self.rank
        self.copy(sub(recv, r * count, count), sub(send, r * count, count))
        for s in range(1, p):
            to, frm = (r + s) % p, (r - s) % p
            self.exchange(
                [Send(to, sub(send, to * count, count))], [Recv(frm, sub(recv, frm * count, count))]
            )
