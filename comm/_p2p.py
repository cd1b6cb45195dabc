"""Point-to-point messages: headers, matching by (peer, tag), and ports that progress them.

A point-to-point message travels in the pair's FIFO byte stream as a header (a
:class:`~hal.comm._ops.Signature` with ``collective="p2p"``: the pair's message number, the
tag, dtype, element count and byte count) followed by its payload in pieces of the
transport's chunk size. The receiver reads a peer's stream only while it has a receive from
that peer posted; a message whose tag no posted receive wants is kept in host memory until
one does (MPI's unexpected-message queue). Receives of one (peer, tag) match sends of that
(peer, tag) in order. A header whose dtype or count differ from the receive's is reported on
the receiving rank, naming both ranks and values; its payload is drained so the stream stays
in step and the communicator stays usable.

A :class:`P2PPort` belongs to one rank's transport and lives as long as it; the engine posts
messages on it and calls :meth:`P2PPort.progress` until they complete.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import hal
from hal.comm._ops import SIGNATURE_BYTES, Signature

if TYPE_CHECKING:
    from hal.comm._engine import Call, Engine, Work
    from hal.comm._transport import CallContext, StagedTransport, Transport, _Mover, _Op

_log = logging.getLogger("hal.comm")

__all__ = [
    "COLLECTIVES",
    "HEADER_BYTES",
    "BlockingPort",
    "Group",
    "P2PMessage",
    "P2PPort",
    "Phase",
    "StagedPort",
    "header",
    "mismatch",
    "moved_on",
    "parse_header",
]

#: Bytes of a message header (the size of a collective's signature, so either side can tell them apart).
HEADER_BYTES = SIGNATURE_BYTES
#: The calls whose signatures may follow a peer's last message (a peer that moved on).
COLLECTIVES = frozenset(
    {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "barrier"}
)


class P2PMessage:
    """One send or receive of a point-to-point call, as a port progresses it.

    Attributes:
        kind: ``"send"`` or ``"recv"``.
        rank, peer, tag: this rank, the other rank, the message tag.
        data: the call's flat ``hal.Array`` (or a NumPy array of host bytes).
        done: set once the message completed (``error`` then tells how).
        local: False when a failure left the pair's byte stream out of step (the communicator
            must not be used any more); True when only this call failed.
    """

    __slots__ = (
        "count",
        "data",
        "done",
        "dtype",
        "end_piece",
        "error",
        "header_done",
        "kind",
        "local",
        "mover",
        "nbytes",
        "op",
        "peer",
        "pos",
        "rank",
        "tag",
    )

    def __init__(self, kind: str, rank: int, peer: int, tag: int, data: Any) -> None:
        self.kind = kind
        self.rank = rank
        self.peer = peer
        self.tag = tag
        self.data = data
        self.dtype = np.dtype(data.dtype).name
        self.count = int(data.size)
        self.nbytes = int(data.nbytes)
        self.done = False
        self.error: hal.CommError | None = None
        self.local = True
        self.header_done = False
        self.pos = 0  # payload bytes moved
        self.end_piece = 0  # sends: the pair's piece count once this message is committed
        self.op: _Op | None = None
        self.mover: _Mover | None = None

    @property
    def started(self) -> bool:
        """True once a byte of this message (header included) has moved."""
        return self.header_done

    def describe(self) -> str:
        """Return ``send(to rank 1, tag 0, 10 x float32)``-style text."""
        where = f"to rank {self.peer}" if self.kind == "send" else f"from rank {self.peer}"
        return f"{self.kind}({where}, tag {self.tag}, {self.count} x {self.dtype})"

    def fail(self, error: hal.CommError, *, local: bool) -> None:
        """Complete the message with ``error``."""
        if not self.done:
            self.error = error
            self.local = local
            self.done = True

    def __repr__(self) -> str:
        return (
            f"<P2PMessage rank {self.rank} {self.describe()} {'done' if self.done else 'pending'}>"
        )


def header(msg: P2PMessage, seq: int) -> bytes:
    """Return the wire header of ``msg`` (a send), the pair's ``seq``-th message."""
    return Signature(seq, "p2p", "send", msg.dtype, msg.count, msg.tag, msg.nbytes).pack()


def parse_header(raw: bytes) -> Signature:
    """Parse a header (or a collective's signature: see ``.collective``)."""
    return Signature.unpack(raw)


def mismatch(msg: P2PMessage, sig: Signature) -> hal.CommError | None:
    """Return the error of receive ``msg`` matched with the message of header ``sig``, if they differ."""
    if sig.dtype == msg.dtype and sig.count == msg.count:
        return None
    diffs = []
    if sig.dtype != msg.dtype:
        diffs.append(f"dtype {sig.dtype} vs {msg.dtype}")
    if sig.count != msg.count:
        diffs.append(f"count {sig.count} vs {msg.count}")
    return hal.CommError(
        f"send/recv mismatch: rank {msg.peer} sent {sig.count} x {sig.dtype} ({sig.chunk} bytes) with tag {msg.tag}, "
        f"but rank {msg.rank} called {msg.describe()} ({msg.nbytes} bytes): {'; '.join(diffs)} "
        "(the message was dropped; the communicator stays usable)",
        op="recv",
        ranks=(msg.rank, msg.peer),
    )


def moved_on(msg: P2PMessage, sig: Signature) -> hal.CommError:
    return hal.CommError(
        f"{msg.describe()} on rank {msg.rank}: no matching send; rank {msg.peer} moved on to "
        f"{sig.collective} (seq {sig.seq}) without sending a message with tag {msg.tag} "
        "(calls are ordered per communicator: a send must come before the sender's next collective)",
        op="recv",
        ranks=(msg.rank, msg.peer),
    )


class P2PPort:
    """One rank's point-to-point state over its transport (posted receives, unexpected messages).

    Subclasses implement :meth:`post`, :meth:`progress` and :meth:`cancel`; the engine calls
    them from its thread only.
    """

    def __init__(self, transport: Transport, rank: int) -> None:
        self.transport = transport
        self.rank = rank

    def post(self, msg: P2PMessage, ctx: CallContext) -> None:
        """Start ``msg`` (never waits); a receive may complete at once from a kept message."""
        raise NotImplementedError

    def progress(self, ctx: CallContext) -> bool:
        """Move what can move now without waiting; return True if bytes moved.

        Completes messages (``msg.done``); raises :class:`hal.CommError` when the transport
        fails (the communicator is then unusable).
        """
        raise NotImplementedError

    def cancel(self, msg: P2PMessage) -> bool:
        """Withdraw ``msg`` (a timeout); return True if none of its bytes moved (the stream is intact)."""
        raise NotImplementedError

    def idle(self, rounds: int) -> None:
        """Wait a little after ``rounds`` rounds without progress."""
        if rounds < 32:
            time.sleep(0)
        else:
            time.sleep(min(1e-3, 2e-5 * rounds))

    def check_peers(self, peers: Sequence[int], ctx: CallContext) -> None:
        """Raise CommError if one of ``peers`` is known dead."""


class _Kept:
    """A message that arrived before a receive wanted it (host bytes)."""

    __slots__ = ("complete", "data", "discard", "sig", "waiter")

    def __init__(self, sig: Signature) -> None:
        self.sig = sig
        self.data = np.empty(max(0, sig.chunk), dtype=np.uint8)
        self.complete = False
        self.waiter: P2PMessage | None = None  # a receive matched while the bytes still arrive
        self.discard = False


class _Incoming:
    """The message being read from a peer: into a receive, into a kept buffer, or drained."""

    __slots__ = ("error", "kept", "msg", "nbytes", "pos")

    def __init__(
        self, nbytes: int, msg: P2PMessage | None, kept: _Kept | None, error: hal.CommError | None
    ) -> None:
        self.nbytes = nbytes
        self.msg = msg
        self.kept = kept
        self.error = error
        self.pos = 0


def _deliver_host(
    msg: P2PMessage, data: np.ndarray[Any, Any], stream: hal.Stream, cache: Any
) -> None:
    """Copy kept host bytes into receive ``msg``'s array."""
    from hal.comm._transport import _host_view

    if not msg.nbytes:
        return
    dst = msg.data
    if not isinstance(dst, hal.Array):
        np.asarray(dst).reshape(-1).view(np.uint8)[:] = data
        return
    hv = _host_view(dst, cache)
    if hv is not None:
        np.copyto(hv, data)
    else:
        hal.copy(dst, memoryview(data.data), stream=stream)
        stream.synchronize()


class StagedPort(P2PPort):
    """The port of a :class:`~hal.comm.spi.StagedTransport`: headers and pieces over its piece calls."""

    transport: StagedTransport

    def __init__(self, transport: StagedTransport, rank: int) -> None:
        super().__init__(transport, rank)
        self.chunk = transport.chunk_bytes
        self.send_seq: dict[int, int] = collections.defaultdict(int)
        self.recv_seq: dict[int, int] = collections.defaultdict(int)
        self.pieces: dict[int, int] = collections.defaultdict(int)  # pieces committed per peer
        self.sendq: dict[int, collections.deque[P2PMessage]] = collections.defaultdict(
            collections.deque
        )
        self.sent: list[P2PMessage] = []  # committed, waiting for the transport to hand them out
        self.posted: dict[int, list[P2PMessage]] = collections.defaultdict(list)
        self.kept: dict[int, list[_Kept]] = collections.defaultdict(list)
        self.incoming: dict[int, _Incoming] = {}

    # -- posting ----------------------------------------------------------------------------
    def _prepare(self, msg: P2PMessage, ctx: CallContext) -> None:
        from hal.comm._transport import _Mover, _Op

        msg.op = _Op(msg.peer, msg.data, None)
        msg.mover = _Mover(ctx.stream, self.chunk, ctx, [msg.op], self.transport)

    def post(self, msg: P2PMessage, ctx: CallContext) -> None:
        """Queue a send behind the pair's earlier ones, or match a receive with a kept message."""
        self._prepare(msg, ctx)
        if msg.kind == "send":
            self.sendq[msg.peer].append(msg)
            return
        for k in self.kept[msg.peer]:
            if k.sig.root == msg.tag and k.waiter is None and not k.discard:
                msg.header_done = True
                err = mismatch(msg, k.sig)
                if err is not None:
                    msg.fail(err, local=True)
                    k.discard = True
                    if k.complete:
                        self.kept[msg.peer].remove(k)
                elif k.complete:
                    self.kept[msg.peer].remove(k)
                    _deliver_host(msg, k.data, ctx.stream, self.transport._view_cache)
                    msg.pos = msg.nbytes
                    msg.done = True
                else:
                    k.waiter = msg
                return
        self.posted[msg.peer].append(msg)

    def cancel(self, msg: P2PMessage) -> bool:
        """Withdraw ``msg``; True if its pair's stream is still in step."""
        if msg.kind == "send":
            q = self.sendq[msg.peer]
            if msg in q and not msg.header_done:
                q.remove(msg)
                return True
            if msg in self.sent:
                self.sent.remove(msg)
                return True  # every byte is committed; only the transport still holds some
            return not msg.header_done
        if msg in self.posted[msg.peer]:
            self.posted[msg.peer].remove(msg)
            return msg.peer not in self.incoming  # no other message of the peer half read
        return False

    # -- progress ---------------------------------------------------------------------------
    def progress(self, ctx: CallContext) -> bool:
        """Place send pieces where there is room, read pieces that arrived; complete messages."""
        tr = self.transport
        moved = tr.poll()
        for peer, q in self.sendq.items():
            if q and self._send(peer, q):
                moved = True
        if self.sent:
            self._retire_sent()
        for peer in list(self.posted) + [p for p in self.incoming if p not in self.posted]:
            if self._receive(peer, ctx):
                moved = True
        return moved

    def _retire_sent(self) -> None:
        tr = self.transport
        left = []
        for m in self.sent:
            if self.pieces[m.peer] - tr.unsent(m.peer) >= m.end_piece:
                m.done = True
            else:
                left.append(m)
        self.sent = left

    def _send(self, peer: int, q: collections.deque[P2PMessage]) -> bool:
        tr = self.transport
        moved = False
        while q:
            m = q[0]
            if not m.header_done:
                space = tr.send_space(peer)
                if space is None:
                    return moved
                self.send_seq[peer] += 1
                space[:HEADER_BYTES] = header(m, self.send_seq[peer])
                tr.send_commit(peer, HEADER_BYTES)
                self.pieces[peer] += 1
                m.header_done = moved = True
            assert m.op is not None and m.mover is not None
            while m.pos < m.nbytes:
                space = tr.send_space(peer)
                if space is None:
                    return moved
                n = min(self.chunk, m.nbytes - m.pos)
                m.op.done = m.pos
                m.mover.out(m.op, space, n)
                tr.send_commit(peer, n)
                self.pieces[peer] += 1
                m.pos += n
                moved = True
            q.popleft()
            m.mover.finish()
            m.end_piece = self.pieces[peer]
            self.sent.append(m)
        return moved

    def _receive(self, peer: int, ctx: CallContext) -> bool:
        tr = self.transport
        moved = False
        while True:
            inc = self.incoming.get(peer)
            if inc is None:
                if not self.posted.get(peer):
                    return moved
                if peer in tr._pushback:  # the peer's next call is a collective: nothing will match
                    sig = parse_header(tr._pushback[peer])
                    for m in self.posted.pop(peer):
                        m.fail(moved_on(m, sig), local=True)
                    return moved
                piece = tr.recv_data(peer, HEADER_BYTES)
                if piece is None:
                    return moved
                raw = bytes(piece[:HEADER_BYTES])
                tr.recv_release(peer)
                moved = True
                inc = self._header(peer, raw)
                if inc is None:
                    return moved
                self.incoming[peer] = inc
            if inc.pos < inc.nbytes:
                n = min(self.chunk, inc.nbytes - inc.pos)
                piece = tr.recv_data(peer, n)
                if piece is None:
                    return moved
                if inc.kept is not None:
                    inc.kept.data[inc.pos : inc.pos + n] = np.frombuffer(piece, np.uint8, n)
                elif inc.msg is not None and inc.error is None:
                    assert inc.msg.op is not None and inc.msg.mover is not None
                    inc.msg.op.done = inc.pos
                    inc.msg.mover.into(inc.msg.op, piece, n)
                    inc.msg.pos = inc.pos + n
                tr.recv_release(peer)
                inc.pos += n
                moved = True
                if inc.pos < inc.nbytes:
                    continue
            del self.incoming[peer]
            self._complete(peer, inc, ctx)

    def _header(self, peer: int, raw: bytes) -> _Incoming | None:
        """Match the header just read from ``peer``; return how to read its payload."""
        tr = self.transport
        sig = parse_header(raw)
        if sig.collective != "p2p":
            if (
                sig.collective in COLLECTIVES
            ):  # the peer moved on: leave its signature for that call
                tr._pushback[peer] = raw
                for m in self.posted.pop(peer, []):
                    m.fail(moved_on(m, sig), local=True)
                return None
            raise hal.CommError(
                f"rank {self.rank} expected a point-to-point message from rank {peer} but read bytes that are "
                f"neither a message header nor a call signature ({sig.describe()!r}): the ranks' calls are out of step",
                op="recv",
                ranks=(self.rank, peer),
            )
        want = self.recv_seq[peer] + 1
        if sig.seq != want or sig.op != "send" or sig.chunk < 0:
            raise hal.CommError(
                f"rank {self.rank} read message {sig.seq} from rank {peer} where message {want} was due: "
                "the byte stream is out of step",
                op="recv",
                ranks=(self.rank, peer),
            )
        self.recv_seq[peer] = want
        posted = self.posted[peer]
        for m in posted:
            if m.tag == sig.root:
                posted.remove(m)
                m.header_done = True
                return _Incoming(sig.chunk, m, None, mismatch(m, sig))
        k = _Kept(sig)
        self.kept[peer].append(k)
        return _Incoming(sig.chunk, None, k, None)

    def _complete(self, peer: int, inc: _Incoming, ctx: CallContext) -> None:
        if inc.msg is not None:
            m = inc.msg
            if inc.error is not None:
                m.fail(inc.error, local=True)
                return
            assert m.mover is not None
            m.mover.finish()
            m.done = True
            return
        k = inc.kept
        assert k is not None
        k.complete = True
        if k.discard:
            self.kept[peer].remove(k)
        elif k.waiter is not None:
            self.kept[peer].remove(k)
            _deliver_host(k.waiter, k.data, ctx.stream, self.transport._view_cache)
            k.waiter.pos = k.waiter.nbytes
            k.waiter.done = True

    def idle(self, rounds: int) -> None:
        """Wait as the transport does between collective pieces (but never spin).

        A transport's wait can return at once when a peer's bytes wait unread (a message for
        a receive not posted yet, the peer's next collective): then sleep a little instead.
        """
        t0 = time.monotonic()
        self.transport.idle(rounds)
        if rounds > 64 and time.monotonic() - t0 < 5e-5:
            time.sleep(min(1e-3, 1e-5 * rounds))

    def check_peers(self, peers: Sequence[int], ctx: CallContext) -> None:
        """Ask the transport whether ``peers`` live."""
        self.transport.check_peers(peers, ctx)


class BlockingPort(P2PPort):
    """The port of a transport that only implements :meth:`~hal.comm.spi.Transport.exchange`.

    Messages run one at a time in post order, each as blocking exchanges (header, then
    payload): ranks that post both directions before waiting need a transport with a port.
    """

    def __init__(self, transport: Transport, rank: int) -> None:
        super().__init__(transport, rank)
        self.queue: list[P2PMessage] = []
        self.seq: dict[tuple[str, int], int] = collections.defaultdict(int)

    def post(self, msg: P2PMessage, ctx: CallContext) -> None:
        """Queue ``msg``."""
        self.queue.append(msg)

    def cancel(self, msg: P2PMessage) -> bool:
        """Drop ``msg`` if it has not started."""
        if msg in self.queue and not msg.header_done:
            self.queue.remove(msg)
            return True
        return False

    def progress(self, ctx: CallContext) -> bool:
        """Run the oldest message to completion."""
        from hal.comm._transport import Recv, Send

        if not self.queue:
            return False
        m = self.queue.pop(0)
        key = (m.kind, m.peer)
        self.seq[key] += 1
        m.header_done = True
        if m.kind == "send":
            hdr = np.frombuffer(header(m, self.seq[key]), dtype=np.uint8).copy()
            self.transport.exchange([Send(m.peer, hdr)], (), ctx)
            if m.nbytes:
                self.transport.exchange([Send(m.peer, m.data)], (), ctx)
            m.done = True
            return True
        raw = np.zeros(HEADER_BYTES, dtype=np.uint8)
        self.transport.exchange((), [Recv(m.peer, raw)], ctx)
        sig = parse_header(raw.tobytes())
        if sig.collective != "p2p" or sig.root != m.tag:
            raise hal.CommError(
                f"{m.describe()} on rank {self.rank}: rank {m.peer} sent {sig.describe()} "
                f"(transport {self.transport.name} matches messages in order only)",
                op="recv",
                ranks=(self.rank, m.peer),
            )
        err = mismatch(m, sig)
        if err is not None:
            if sig.chunk:
                self.transport.exchange(
                    (), [Recv(m.peer, np.zeros(sig.chunk, dtype=np.uint8))], ctx
                )
            m.fail(err, local=True)
            return True
        if m.nbytes:
            self.transport.exchange((), [Recv(m.peer, m.data)], ctx)
        m.done = True
        return True


# -- the engine side ----------------------------------------------------------------------------
class Group:
    """The calls of one ``comm.group()`` block: their handles complete together."""

    __slots__ = ("left", "parts")

    def __init__(self, size: int) -> None:
        self.left = size
        self.parts: list[tuple[_Item, hal.CommError | None]] = []


class _Item:
    __slots__ = ("call", "msg", "work")

    def __init__(self, call: Call, work: Work) -> None:
        self.call = call
        self.work = work
        self.msg: P2PMessage | None = None


class Phase:
    """Runs the point-to-point calls queued back to back on one rank's engine, together.

    The phase starts with one call and absorbs every point-to-point call queued while it runs
    (up to the next collective, which waits for the phase to end: calls stay ordered per
    communicator, as NCCL's). A call is posted on the port once the work before it on its
    stream is done (posting keeps issue order); the port progresses every posted message at
    once, so sends and receives in both directions, rings and halos complete without
    deadlock. Failures that leave the byte streams in step (a mismatch, a receive nobody
    sends to, a timeout before any byte moved) fail only their call; others fail the
    communicator, as a failed collective does.
    """

    def __init__(self, engine: Engine) -> None:
        from hal.comm._transport import CallContext

        self.engine = engine
        self.port = engine.transport.p2p_port(engine.rank)
        self.ctx = CallContext(
            collective="send/recv",
            seq=0,
            stream=engine.stream,
            timeout_s=engine.timeout_s,
            scratch=engine._scratch_for,
            chunk_bytes=engine.transport.chunk_bytes,
        )
        self.ctx.aborted = engine.aborted
        self.items: list[_Item] = []
        self.count = 0

    def run(self, call: Call, work: Work) -> None:
        """Run ``call`` and every point-to-point call queued while it runs; return when all completed."""
        eng = self.engine
        eng.in_p2p = True
        try:
            tr = hal.tracer()
            if tr is None:
                self._run(call, work)
            else:
                with tr.span(
                    f"{eng.device} comm", "send/recv", "collective", {"rank": eng.rank}
                ) as info:
                    self._run(call, work)
                    info["calls"] = self.count
        finally:
            eng.in_p2p = False

    def _run(self, call: Call, work: Work) -> None:
        eng, port, ctx = self.engine, self.port, self.ctx
        self._add(call, work)
        rounds = 0
        last_check = time.monotonic()
        while True:
            while (nxt := eng.take_queued()) is not None:
                self._add(*nxt)
            moved = self._post_ready()
            try:
                if port.progress(ctx):
                    moved = True
            except BaseException as exc:  # noqa: BLE001 - handed to Work.wait()
                self._fatal(exc)
                return
            if self._reap():
                moved = True
            if not self.items:
                return
            if moved:
                ctx.progressed()
                rounds = 0
                continue
            rounds += 1
            waiting = [it.msg for it in self.items if it.msg is not None and not it.msg.done]
            now = time.monotonic()
            if now - last_check > 0.05:
                last_check = now
                if eng.aborted.is_set():
                    self._fatal(ctx.timeout_error(sorted({it.call.peer for it in self.items})))
                    return
                if not waiting:
                    ctx.progressed()  # only the callers' streams are awaited: not a stall
                else:
                    try:
                        port.check_peers(sorted({m.peer for m in waiting}), ctx)
                    except BaseException as exc:  # noqa: BLE001
                        self._fatal(exc)
                        return
                    if ctx.stalled():
                        self._timeout(waiting)
                        continue
            if len(waiting) < len(self.items):
                time.sleep(min(1e-3, 1e-5 * rounds))  # a call waits for its stream's work
            else:
                port.idle(rounds)

    # -- bookkeeping --------------------------------------------------------------------------
    def _add(self, call: Call, work: Work) -> None:
        eng = self.engine
        self.count += 1
        it = _Item(call, work)
        if eng.failure is not None:
            self._finish(
                it,
                hal.CommError(
                    f"{call.collective}: the communicator failed earlier ({eng.failure}); create a new one",
                    op=call.collective,
                    ranks=getattr(eng.failure, "ranks", ()),
                ),
            )
            return
        self.items.append(it)

    def _post_ready(self) -> bool:
        """Post, in issue order, the calls whose streams reached them."""
        eng = self.engine
        moved = False
        for it in self.items:
            if it.msg is not None:
                continue
            call = it.call
            try:
                if call.event is not None and not call.event.query():
                    return moved
            except hal.HalError as exc:
                data = call.send if call.collective == "send" else call.recv
                it.msg = P2PMessage(call.collective, eng.rank, call.peer, call.tag, data)
                it.msg.fail(
                    hal.CommError(
                        f"{it.msg.describe()} on rank {eng.rank}: the work before it on its stream failed: {exc}",
                        op=call.collective,
                    ),
                    local=True,
                )
                continue
            data = call.send if call.collective == "send" else call.recv
            it.msg = P2PMessage(call.collective, eng.rank, call.peer, call.tag, data)
            if call.flight is not None:
                eng.recorder.state(call.flight, "running")
            self.port.post(it.msg, self.ctx)
            moved = True
        return moved

    def _reap(self) -> bool:
        """Finish the calls whose messages completed."""
        done = [it for it in self.items if it.msg is not None and it.msg.done]
        if not done:
            return False
        self.items = [it for it in self.items if not (it.msg is not None and it.msg.done)]
        fatal = None
        for it in done:
            assert it.msg is not None
            if it.msg.error is not None and not it.msg.local and fatal is None:
                fatal = it.msg.error
            self._finish(it, it.msg.error)
        if fatal is not None:
            self._fatal(fatal)
        return True

    def _finish(self, it: _Item, error: hal.CommError | None) -> None:
        group = it.call.group
        if group is None:
            self._complete(it, error)
            return
        group.parts.append((it, error))
        group.left -= 1
        if group.left <= 0:
            for part, err in group.parts:
                self._complete(part, err)
            group.parts.clear()

    def _complete(self, it: _Item, error: hal.CommError | None) -> None:
        eng = self.engine
        call = it.call
        if call.flight is not None:
            state = "done" if error is None else ("aborted" if eng.aborted.is_set() else "failed")
            eng.recorder.state(call.flight, state, error)
        if error is not None:
            _log.debug("rank %d: %s failed: %s", eng.rank, call.collective, error)
        if call.event is not None:
            call.event.close()
        it.work._finish(error)
        eng.pending_done()

    def _timeout(self, waiting: list[P2PMessage]) -> None:
        """Fail the messages that made no progress for the timeout (their calls only, when nothing moved)."""
        eng, ctx = self.engine, self.ctx
        if eng.aborted.is_set():
            self._fatal(ctx.timeout_error([m.peer for m in waiting]))
            return
        for m in waiting:
            local = self.port.cancel(m)
            other = "recv" if m.kind == "send" else "send"
            m.fail(
                hal.CommError(
                    f"{m.describe()} on rank {m.rank}: no progress for {ctx.timeout_s * 1e3:.0f} ms "
                    f"(HAL_COMM_TIMEOUT_MS); not heard from rank {m.peer} (no matching {other} posted there?)"
                    + (
                        ""
                        if local
                        else "; part of the message had moved, so the communicator is unusable"
                    ),
                    op=m.kind,
                    ranks=(m.peer,),
                ),
                local=local,
            )
        ctx.progressed()
        self._reap()

    def _fatal(self, exc: BaseException) -> None:
        """Fail every call of the phase and the communicator (the byte streams are out of step)."""
        eng = self.engine
        if not isinstance(exc, hal.CommError):
            exc = hal.CommError(
                f"send/recv failed on rank {eng.rank}: {type(exc).__name__}: {exc}", op="send/recv"
            )
        elif exc.op is None or exc.op == "send/recv":
            what = ", ".join(
                it.msg.describe() for it in self.items if it.msg is not None and not it.msg.done
            )
            exc = hal.CommError(
                f"rank {eng.rank}: {what or 'send/recv'}: {exc}", op="send/recv", ranks=exc.ranks
            )
        if eng.failure is None:
            eng.failure = exc
            if not eng.aborted.is_set():
                eng.recorder.dump(f"send/recv failed: {exc}")
        items, self.items = self.items, []
        for it in items:
            self._finish(it, exc)
