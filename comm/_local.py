"""In-process transport: the ranks are devices of one process, each driven by its own thread.

A send posts its source region in the receiver's mailbox and waits; the receiver copies it
straight from the sender's device memory with ``hal.copy`` (``peer`` when the devices have a
peer path, ``staged`` through the host otherwise), reduces it if asked, then releases the
sender. Nothing is copied twice when the path is ``peer``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

import hal
from hal.comm._ops import Signature, accumulate
from hal.comm._p2p import P2PMessage, P2PPort, header, mismatch, moved_on
from hal.comm._transport import CallContext, Recv, Send, Transport

__all__ = ["LocalFabric", "LocalTransport"]


class _Msg:
    __slots__ = ("call", "cancelled", "data", "done", "header", "src_stream")

    def __init__(self, data: Any, src_stream: hal.Stream, header: Signature | None = None) -> None:
        self.data = data
        self.src_stream = src_stream
        self.done = threading.Event()
        self.header = header  # point-to-point messages: what was sent (None: a collective's piece)
        self.cancelled = False  # a point-to-point send withdrawn by its sender (timeout)
        self.call = ("", 0)  # the collective and sequence number of a collective's piece


class LocalFabric:
    """The mailboxes shared by the ranks of one in-process communicator."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.boxes: dict[tuple[int, int], queue.SimpleQueue[_Msg]] = {
            (a, b): queue.SimpleQueue() for a in range(size) for b in range(size) if a != b
        }
        self.failed: dict[int, str] = {}


class LocalTransport(Transport):
    """One rank's end of a :class:`LocalFabric` (not registered: built by ``hal.comm.create``)."""

    name = "local"
    alpha_s = 100e-6
    beta_s_per_byte = 1 / 8e9
    single_host = True
    path = "peer"

    def __init__(self, fabric: LocalFabric, rank: int, *, path: str = "peer") -> None:
        self.fabric = fabric
        self.rank = rank
        object.__setattr__(self, "path", path)  # per instance: ``path`` is a class-level default

    @property
    def chunk_bytes(self) -> int:
        """Messages move whole (no pieces)."""
        return 1 << 62

    def exchange(self, sends: Sequence[Send], recvs: Sequence[Recv], ctx: CallContext) -> None:
        """Post every send, serve every receive, then wait until the peers took the sends."""
        stream = ctx.stream
        posted: list[tuple[int, _Msg]] = []
        if any(isinstance(s.data, hal.Array) for s in sends):
            stream.synchronize()  # the regions must hold their final bytes before a peer reads them
        for s in sends:
            if not s.data.nbytes:
                continue
            msg = _Msg(s.data, stream)
            msg.call = (ctx.collective, ctx.seq)
            self.fabric.boxes[(self.rank, s.peer)].put(msg)
            posted.append((s.peer, msg))
        for r in recvs:
            if not r.data.nbytes:
                continue
            msg = self._get(r.peer, ctx)
            if msg.data.nbytes != r.data.nbytes:
                raise hal.CommError(
                    f"{ctx.collective}: rank {r.peer} sent {msg.data.nbytes} bytes, rank {self.rank} "
                    f"expected {r.data.nbytes}",
                    op=ctx.collective,
                    ranks=(r.peer, self.rank),
                )
            try:
                self._deliver(msg, r, ctx)
            finally:
                msg.done.set()
            ctx.progressed()
        for peer, msg in posted:
            while not msg.done.wait(0.05):
                self._check(peer, ctx)

    def _get(self, peer: int, ctx: CallContext) -> _Msg:
        ahead = self._pushback.pop(peer, None)
        if ahead is not None:
            return ahead
        box = self.fabric.boxes[(peer, self.rank)]
        while True:
            try:
                msg = box.get(timeout=0.05)
            except queue.Empty:
                self._check(peer, ctx)
                continue
            if msg.cancelled:
                msg.done.set()
                continue
            if msg.header is not None:
                msg.done.set()
                raise hal.CommError(
                    f"{ctx.collective} mismatch: rank {peer} sent a point-to-point message "
                    f"(tag {msg.header.root}, {msg.header.count} x {msg.header.dtype}) that rank {self.rank} "
                    f"never received before this {ctx.collective}",
                    op=ctx.collective,
                    ranks=(self.rank, peer),
                )
            return msg

    @property
    def _pushback(self) -> dict[int, _Msg]:
        pb: dict[int, _Msg] = self.__dict__.setdefault("_hal_pushback", {})
        return pb

    def _make_p2p_port(self, rank: int) -> P2PPort:
        return LocalPort(self, rank)

    def _check(self, peer: int, ctx: CallContext) -> None:
        if peer in self.fabric.failed:
            raise hal.CommError(
                f"{ctx.collective} (seq {ctx.seq}): rank {peer} failed: {self.fabric.failed[peer]}",
                op=ctx.collective,
                ranks=(peer,),
            )
        if ctx.stalled():
            raise ctx.timeout_error([peer])

    def _deliver(self, msg: _Msg, r: Recv, ctx: CallContext) -> None:
        stream = ctx.stream
        src, dst = msg.data, r.data
        if isinstance(src, hal.Array) and not isinstance(
            dst, hal.Array
        ):  # into host bytes (a drained message)
            np.asarray(dst).reshape(-1).view(np.uint8)[:] = src.to_host().reshape(-1).view(np.uint8)
            return
        if not isinstance(src, hal.Array) or not isinstance(dst, hal.Array):
            np.asarray(dst).reshape(-1).view(np.uint8)[:] = (
                np.asarray(src).reshape(-1).view(np.uint8)
            )
            return
        if r.op is None:
            hal.copy(dst, src, stream=stream)
        elif r.base is not None:
            hal.copy(dst, src, stream=stream)
            accumulate(dst, r.base, r.op, stream)
        else:
            scratch = ctx.scratch(dst.nbytes).view(dst.dtype, dst.size)
            hal.copy(scratch, src, stream=stream)
            accumulate(dst, scratch, r.op, stream)
        stream.synchronize()

    def close(self) -> None:
        """Nothing to release (the fabric is garbage once every rank is closed)."""


class LocalPort(P2PPort):
    """Point-to-point messages between the devices of one process.

    A send posts its region (with a header) in the receiver's mailbox at once and completes
    when the receiver has copied it; a receive takes messages from its peer's mailbox while
    it waits, keeping those whose tag no posted receive wants.
    """

    transport: LocalTransport

    def __init__(self, transport: LocalTransport, rank: int) -> None:
        super().__init__(transport, rank)
        self.seq: dict[int, int] = {}
        self.sent: list[tuple[P2PMessage, _Msg]] = []
        self.posted: dict[int, list[P2PMessage]] = {}
        self.kept: dict[int, list[_Msg]] = {}

    def post(self, msg: P2PMessage, ctx: CallContext) -> None:
        """Mail a send; match a receive with a kept message or post it."""
        if msg.kind == "send":
            self.seq[msg.peer] = self.seq.get(msg.peer, 0) + 1
            sig = Signature.unpack(header(msg, self.seq[msg.peer]))
            wire = _Msg(msg.data, ctx.stream, sig)
            msg.header_done = True
            if msg.nbytes == 0:
                wire.done.set()
            self.transport.fabric.boxes[(self.rank, msg.peer)].put(wire)
            self.sent.append((msg, wire))
            return
        kept = self.kept.get(msg.peer, [])
        for wire in kept:
            assert wire.header is not None
            if wire.header.root == msg.tag:
                kept.remove(wire)
                self._take(msg, wire, ctx)
                return
        self.posted.setdefault(msg.peer, []).append(msg)

    def _take(self, msg: P2PMessage, wire: _Msg, ctx: CallContext) -> None:
        assert wire.header is not None
        msg.header_done = True
        try:
            err = mismatch(msg, wire.header)
            if err is not None:
                msg.fail(err, local=True)
                return
            if msg.nbytes:
                self.transport._deliver(wire, Recv(msg.peer, msg.data), ctx)
            msg.done = True
        finally:
            wire.done.set()

    def cancel(self, msg: P2PMessage) -> bool:
        """Withdraw ``msg`` (a send stays in the mailbox, marked so that its receiver skips it)."""
        if msg.kind == "send":
            for m, wire in self.sent:
                if m is msg:
                    wire.cancelled = True
                    self.sent.remove((m, wire))
                    return True
            return False
        lst = self.posted.get(msg.peer, [])
        if msg in lst:
            lst.remove(msg)
            return True
        return False

    def progress(self, ctx: CallContext) -> bool:
        """Complete the sends their receivers took; serve the posted receives from the mailboxes."""
        moved = False
        if self.sent:
            left = []
            for m, wire in self.sent:
                if wire.done.is_set():
                    m.done = moved = True
                else:
                    left.append((m, wire))
            self.sent = left
        pushback = self.transport._pushback
        for peer, lst in self.posted.items():
            box = self.transport.fabric.boxes[(peer, self.rank)]
            while lst:
                if peer in pushback:
                    collective, seq = pushback[peer].call
                    sig = Signature(seq, collective, "", "", 0, 0, 0)
                    for m in lst:
                        m.fail(moved_on(m, sig), local=True)
                    lst.clear()
                    moved = True
                    break
                try:
                    wire = box.get_nowait()
                except queue.Empty:
                    break
                moved = True
                if wire.cancelled:
                    wire.done.set()
                    continue
                if wire.header is None:
                    pushback[peer] = wire
                    continue
                for m in lst:
                    if m.tag == wire.header.root:
                        lst.remove(m)
                        self._take(m, wire, ctx)
                        break
                else:
                    self.kept.setdefault(peer, []).append(wire)
        return moved

    def check_peers(self, peers: Sequence[int], ctx: CallContext) -> None:
        """Raise CommError if one of ``peers`` failed."""
        for p in peers:
            if p in self.transport.fabric.failed:
                self.transport._check(p, ctx)
