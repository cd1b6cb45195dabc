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
from hal.comm._ops import accumulate
from hal.comm._transport import CallContext, Recv, Send, Transport

__all__ = ["LocalFabric", "LocalTransport"]


class _Msg:
    __slots__ = ("data", "done", "src_stream")

    def __init__(self, data: Any, src_stream: hal.Stream) -> None:
        self.data = data
        self.src_stream = src_stream
        self.done = threading.Event()


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
        box = self.fabric.boxes[(peer, self.rank)]
        while True:
            try:
                return box.get(timeout=0.05)
            except queue.Empty:
                self._check(peer, ctx)

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
        if not isinstance(src, hal.Array) or not isinstance(dst, hal.Array):
            np.asarray(dst).reshape(-1).view(np.uint8)[:] = np.asarray(src).reshape(-1).view(np.uint8)
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


