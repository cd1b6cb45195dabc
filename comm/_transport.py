"""The transport interface, its registry, and the chunked progress loop staged transports share.

A transport moves bytes between the ranks of one communicator. Collectives are written once
over one primitive, :meth:`Transport.exchange`: a batch of sends and receives that progress
together (so a ring step's send and receive never deadlock), each receive optionally reducing
into its destination. Host-staged transports (shared memory, TCP, MPI) only implement four
piece-level calls; :class:`StagedTransport` splits messages into pieces, pipelines them,
watches progress and raises :class:`hal.CommError` on a timeout or a dead peer.
"""

from __future__ import annotations

import abc
import dataclasses
import selectors
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, final

import numpy as np

import hal
from hal.comm._ops import accumulate
from hal.spi import setting

if TYPE_CHECKING:
    from hal.comm._p2p import P2PPort

__all__ = [
    "CallContext",
    "Endpoint",
    "Recv",
    "Send",
    "StagedTransport",
    "Transport",
    "TransportRegistry",
    "World",
    "wait_fds",
]

Payload = Any  # hal.Array (device memory) or a NumPy array (host bytes, e.g. signatures)


def wait_fds(
    readable: Sequence[Any], writable: Sequence[Any] = (), timeout: float | None = None
) -> tuple[list[Any], list[Any]]:
    """``select.select(readable, writable, [], timeout)[:2]`` through ``poll(2)``.

    Objects with ``fileno()`` or descriptors, as ``select.select`` takes them, but with no
    limit on the descriptors' numbers: ``select`` refuses descriptors of 1024 and more
    (``ValueError: filedescriptor out of range in select()``), which a process with many files
    open (a training job, a data loader) hands out. A descriptor that hung up or failed counts
    as ready both ways, as with ``select`` (its next read or write reports it).
    """
    with selectors.PollSelector() as sel:
        for obj in {*readable, *writable}:
            sel.register(
                obj,
                (selectors.EVENT_READ if obj in readable else 0)
                | (selectors.EVENT_WRITE if obj in writable else 0),
            )
        ready = sel.select(timeout)
    r = [key.fileobj for key, ev in ready if ev & selectors.EVENT_READ]
    w = [key.fileobj for key, ev in ready if ev & selectors.EVENT_WRITE]
    return r, w


@dataclasses.dataclass
class Send:
    """Send all bytes of ``data`` to rank ``peer``."""

    peer: int
    data: Payload


@dataclasses.dataclass
class Recv:
    """Receive ``data.nbytes`` bytes from rank ``peer`` into ``data``; reduce with ``op`` if given.

    With ``op`` and ``base`` (an array like ``data``), ``data = op(base, received)``: the
    received bytes land in ``data`` directly and ``base`` is folded in, which saves copying
    ``base`` into ``data`` first (out-of-place collectives) and the scratch copy.
    """

    peer: int
    data: Payload
    op: str | None = None
    base: Payload | None = None
    after_sends: bool = False  # start only once every send of the exchange is out (it overlaps one)


@dataclasses.dataclass
class Endpoint:
    """What a rank publishes at rendezvous (JSON-friendly)."""

    rank: int
    host: str
    pid: int
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class World:
    """The ranks of a communicator as the transports see them at set-up."""

    rank: int
    size: int
    endpoints: list[Endpoint]
    bootstrap: Any  # hal.comm._bootstrap.Bootstrap
    timeout_s: float
    #: this rank's device (None where the caller does not say), e.g. to choose a memory path
    device: Any = None
    #: seconds each wait of the transport's set-up may take (the rendezvous timeout,
    #: ``HAL_COMM_INIT_TIMEOUT_MS``); None: ``timeout_s``. ``timeout_s`` bounds every call after.
    init_timeout_s: float | None = None

    @property
    def setup_timeout_s(self) -> float:
        """Seconds a wait of the transport's set-up (connecting to the peers) may take."""
        return self.timeout_s if self.init_timeout_s is None else self.init_timeout_s

    @property
    def hosts(self) -> list[str]:
        """Distinct host names, in rank order of first appearance."""
        return list(dict.fromkeys(e.host for e in self.endpoints))


class CallContext:
    """Per-call state handed to the transport: the stream, scratch space and progress clock."""

    def __init__(
        self,
        *,
        collective: str,
        seq: int,
        stream: hal.Stream,
        timeout_s: float,
        scratch: Callable[[int], hal.Buffer],
        chunk_bytes: int,
    ) -> None:
        self.collective = collective
        self.seq = seq
        self.stream = stream
        self.timeout_s = timeout_s
        self.scratch = scratch
        self.chunk_bytes = chunk_bytes
        self.last_progress = time.monotonic()
        self.aborted: Any = None  # a threading.Event set by comm.abort()

    def progressed(self) -> None:
        """Note that bytes moved (resets the timeout clock)."""
        self.last_progress = time.monotonic()

    def stalled(self) -> bool:
        """True when nothing moved for longer than the timeout, or the communicator was aborted."""
        if self.aborted is not None and self.aborted.is_set():
            return True
        return time.monotonic() - self.last_progress > self.timeout_s

    def timeout_error(self, peers: Sequence[int]) -> hal.CommError:
        """Return the error for a stall, naming the ranks not heard from."""
        ranks = tuple(sorted(set(peers)))
        if self.aborted is not None and self.aborted.is_set():
            return hal.CommError(
                f"{self.collective} (seq {self.seq}): aborted by comm.abort()",
                op=self.collective,
                ranks=ranks,
            )
        return hal.CommError(
            f"{self.collective} (seq {self.seq}): no progress for {self.timeout_s * 1e3:.0f} ms "
            f"(HAL_COMM_TIMEOUT_MS); not heard from rank(s) {', '.join(map(str, ranks))}",
            op=self.collective,
            ranks=ranks,
        )


class Transport(abc.ABC):
    """Moves bytes between the ranks of one communicator (one instance per rank).

    Subclasses set ``name``, implement :meth:`exchange` and :meth:`close`, and may override
    :meth:`unusable` and the cost-model constants. Register them through the pluggy hook
    ``hal_register_transports(registry)``.
    """

    #: Unique transport name (``HAL_COMM_TRANSPORT`` selects by it).
    name: ClassVar[str] = ""
    #: Cost model: seconds per message (latency) and per byte (inverse bandwidth).
    alpha_s: ClassVar[float] = 50e-6
    beta_s_per_byte: ClassVar[float] = 1 / 2e9
    #: True if the transport only works between ranks of one host.
    single_host: ClassVar[bool] = False
    #: How a byte travels, for the plan (``host-shm``, ``host-tcp`` ...); a transport may set
    #: it per instance once it knows its memory (ucx: ``host-ucx``, ``staged-ucx`` ...).
    path: str = "host"
    #: Which engine runs the exchanges, for ``work.plan.engine``: ``"python"``, or ``"native"``
    #: for a transport whose pieces move in compiled code (the shm transport's native engine).
    engine: str = "python"

    @classmethod
    def unusable(cls, world: World) -> str | None:
        """Return why this transport cannot connect ``world``, or None if it can."""
        if cls.single_host and len(world.hosts) > 1:
            return f"{cls.name} needs every rank on one host; ranks span {len(world.hosts)} hosts"
        return None

    @classmethod
    def missing(cls) -> str | None:
        """Return why this transport cannot run on this host at all (a library not installed), or None.

        ``hal doctor`` lists it; :meth:`unusable` is the check at init. Default: None.
        """
        return None

    @property
    def chunk_bytes(self) -> int:
        """Bytes per pipelined piece."""
        return 1 << 20

    @abc.abstractmethod
    def exchange(self, sends: Sequence[Send], recvs: Sequence[Recv], ctx: CallContext) -> None:
        """Complete all ``sends`` and ``recvs`` (in list order per peer), or raise CommError."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release sockets, segments and threads. Idempotent."""

    def p2p_port(self, rank: int) -> P2PPort:
        """Return this rank's point-to-point port (made on first use, kept as long as the transport).

        The default runs messages one at a time over :meth:`exchange`
        (:class:`~hal.comm._p2p.BlockingPort`); :class:`StagedTransport` and the in-process
        transport progress them together.
        """
        port = self.__dict__.get("_hal_p2p_port")
        if port is None:
            port = self.__dict__["_hal_p2p_port"] = self._make_p2p_port(rank)
        return port

    def _make_p2p_port(self, rank: int) -> P2PPort:
        from hal.comm._p2p import BlockingPort

        return BlockingPort(self, rank)

    def wake(self) -> None:
        """Interrupt :meth:`StagedTransport.idle` of this rank's engine (a call was queued). Default: nothing."""
        return None


@final
class TransportRegistry:
    """Collects transport classes from the ``hal_register_transports`` hooks."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Transport]] = {}
        #: the plugin that registered each transport (``hal.comm.builtin`` for hal's own)
        self.owners: dict[str, str] = {}
        self._plugin = ""

    def add(self, transport_cls: type[Transport]) -> None:
        """Register ``transport_cls`` (a subclass of :class:`hal.comm.spi.Transport` with a ``name``)."""
        if not (isinstance(transport_cls, type) and issubclass(transport_cls, Transport)):
            raise TypeError(
                f"transport_cls={transport_cls!r} is not a subclass of hal.comm.spi.Transport"
            )
        name = transport_cls.name
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(
                f"{transport_cls.__qualname__}.name={name!r} must be an identifier string"
            )
        if name in self._classes and self._classes[name] is not transport_cls:
            raise ValueError(
                f"transport {name!r} is already registered by {self._classes[name].__module__}"
            )
        self._classes[name] = transport_cls
        self.owners.setdefault(name, self._plugin)

    def get(self, name: str) -> type[Transport]:
        """Return the transport class called ``name``."""
        try:
            return self._classes[name]
        except KeyError:
            raise ValueError(
                f"transport {name!r} is not registered; known: {', '.join(self.names)}"
            ) from None

    @property
    def names(self) -> list[str]:
        """Registered transport names."""
        return sorted(self._classes)


def _host_bytes(data: Payload) -> np.ndarray[Any, Any] | None:
    if isinstance(data, hal.Array):
        return None
    arr = np.asarray(data)
    return arr.reshape(-1).view(np.uint8)


class _Op:
    __slots__ = ("after", "base", "data", "done", "host", "nbytes", "op", "peer")

    def __init__(
        self,
        peer: int,
        data: Payload,
        op: str | None,
        base: Payload | None = None,
        after: bool = False,
    ) -> None:
        self.after = after
        self.peer = peer
        self.data = data
        self.op = op
        self.base = base
        self.host = _host_bytes(data)
        self.nbytes = int(data.nbytes)
        self.done = 0


def _host_view(
    arr: hal.Array, cache: weakref.WeakKeyDictionary[hal.Buffer, Any] | None = None
) -> np.ndarray[Any, Any] | None:
    """Return a zero-copy host view of ``arr``'s bytes if the host can reach its memory.

    Views of whole buffers are cached in ``cache`` (keyed by the buffer, dropped with it): the
    caller orders device work before host access itself (it synchronizes its stream).
    """
    if not setting("HAL_COMM_DLPACK"):
        return None
    buf = arr.buffer
    base: Any = cache.get(buf) if cache is not None else None
    if base is None or buf.closed:
        try:
            whole = buf.view(np.uint8)
            if whole.__dlpack_device__()[0] != 1:  # kDLCPU
                return None
            base = np.from_dlpack(whole).reshape(-1)
        except (BufferError, TypeError, ValueError, AttributeError, NotImplementedError):
            base = False
        if cache is not None and not buf.closed:
            cache[buf] = base
    if base is False:
        return None
    view: np.ndarray[Any, Any] = base[arr.offset : arr.offset + arr.nbytes]
    return view


class _Mover:
    """Moves pieces between device memory and transport memory for one exchange."""

    def __init__(
        self,
        stream: hal.Stream,
        chunk: int,
        ctx: CallContext,
        ops: list[_Op],
        owner: StagedTransport,
    ) -> None:
        self.stream = stream
        self.chunk = chunk
        self.ctx = ctx
        self.owner = owner
        cache = owner._view_cache
        self.views: dict[int, np.ndarray[Any, Any] | None] = {}
        for op in ops:
            if op.host is None:
                self.views[id(op)] = _host_view(op.data, cache)
                if op.base is not None:
                    self.views[id(op.base)] = _host_view(op.base, cache)
        self.dirty = False
        self.scratch: hal.Buffer | None = None
        self.scratch_view: np.ndarray[Any, Any] | None = None
        self.half = 0
        self.half_done: list[hal.Event | None] = [None, None]

    def sync(self) -> None:
        if self.dirty:
            self.stream.synchronize()
            self.dirty = False

    def finish(self) -> None:
        """Wait for the reductions still queued."""
        self.sync()

    def out(self, op: _Op, space: memoryview, n: int) -> None:
        """Copy the next ``n`` bytes of a send into ``space``."""
        lo = op.done
        if op.host is not None:
            np.frombuffer(space, np.uint8, n)[:] = op.host[lo : lo + n]
            return
        hv = self.views.get(id(op))
        if hv is not None:
            np.copyto(np.frombuffer(space, np.uint8, n), hv[lo : lo + n])
        else:
            hal.copy(space, op.data, stream=self.stream, nbytes=n, src_offset=lo)
            self.stream.synchronize()
            self.dirty = False

    def into(self, op: _Op, piece: memoryview, n: int) -> None:
        """Deliver ``n`` received bytes: copy, or reduce into the destination."""
        lo = op.done
        src = np.frombuffer(piece, np.uint8, n)
        if op.host is not None:
            op.host[lo : lo + n] = src
            return
        arr: hal.Array = op.data
        hv = self.views.get(id(op))
        item = arr.dtype.itemsize
        if op.op is None:
            if hv is not None:
                np.copyto(hv[lo : lo + n], src)
            else:
                hal.copy(arr, piece[:n], stream=self.stream, dst_offset=lo)
                self.stream.synchronize()
                self.dirty = False
            return
        dst = arr.buffer.view(arr.dtype, n // item, offset=arr.offset + lo)
        if op.base is not None:
            if hv is not None:
                np.copyto(hv[lo : lo + n], src)
            else:
                hal.copy(dst, piece[:n], stream=self.stream)
            base = op.base.buffer.view(arr.dtype, n // item, offset=op.base.offset + lo)
            accumulate(dst, base, op.op, self.stream)
        else:
            if self.scratch is None:
                self.scratch = self.ctx.scratch(2 * self.chunk)
                self.scratch_view = _host_view(
                    self.scratch.view(np.uint8, 2 * self.chunk), self.owner._view_cache
                )
            half = self.half
            self.half ^= 1
            if self.scratch_view is not None:
                ev = self.half_done[half]
                if ev is not None:  # the reduction two pieces ago may still read this half
                    ev.synchronize()
                np.copyto(self.scratch_view[half * self.chunk : half * self.chunk + n], src)
            else:
                hal.copy(self.scratch, piece[:n], stream=self.stream, dst_offset=half * self.chunk)
            tmp = self.scratch.view(arr.dtype, n // item, offset=half * self.chunk)
            accumulate(dst, tmp, op.op, self.stream)
            if self.scratch_view is not None and lo + n < op.nbytes:  # another piece will follow
                ev = self.half_done[half]
                if ev is None:
                    ev = self.half_done[half] = self.owner._event(self.stream, half)
                ev.record(self.stream)
        if hv is None:
            self.stream.synchronize()  # the piece's memory goes back to the transport
        else:
            self.dirty = True


class _Rounds:
    """The rounds of a staged exchange's progress loop (:meth:`StagedTransport.exchange`, UCX's direct path).

    After each round, :meth:`after` resets the timeout clock if bytes moved; otherwise it looks
    for dead peers every 50 ms (a stall raises their ``CommError``) and waits a little
    (``transport.idle``).
    """

    __slots__ = ("ctx", "idle", "last_check", "transport")

    def __init__(self, transport: StagedTransport, ctx: CallContext) -> None:
        self.transport = transport
        self.ctx = ctx
        self.idle = 0  # rounds in a row without progress
        self.last_check = time.monotonic()

    def after(self, moved: bool, waiting: Iterable[int]) -> None:
        """End a round that left the messages of the peers ``waiting`` for pending; ``moved``: bytes moved."""
        if moved:
            self.ctx.progressed()
            self.idle = 0
            return
        self.idle += 1
        now = time.monotonic()
        if now - self.last_check > 0.05:
            self.last_check = now
            peers = list(waiting)
            self.transport.check_peers(peers, self.ctx)
            if self.ctx.stalled():
                raise self.ctx.timeout_error(peers)
        self.transport.idle(self.idle)


class StagedTransport(Transport):
    """A transport whose bytes pass through host memory in pieces of :attr:`chunk_bytes`.

    Subclasses implement the piece calls; this class runs the progress loop, copies between
    device memory and the pieces with ``hal.copy``, and reduces with ``hal.kernels``.
    """

    @abc.abstractmethod
    def send_space(self, peer: int) -> memoryview | None:
        """Return writable host memory for the next piece to ``peer``, or None if none is free yet."""

    @abc.abstractmethod
    def send_commit(self, peer: int, nbytes: int) -> None:
        """Publish the first ``nbytes`` of the space returned by :meth:`send_space`."""

    @abc.abstractmethod
    def recv_data(self, peer: int, nbytes: int) -> memoryview | None:
        """Return the next piece (``nbytes`` bytes) from ``peer`` if it has arrived, else None."""

    @abc.abstractmethod
    def recv_release(self, peer: int) -> None:
        """Hand the piece returned by :meth:`recv_data` back to the transport."""

    def poll(self) -> bool:
        """Advance background I/O; return True if bytes moved. Default: nothing to do."""
        return False

    def unsent(self, peer: int) -> int:
        """Return how many committed pieces to ``peer`` this rank still holds (not yet handed on).

        A point-to-point send completes once its pieces are handed on. Default: 0 (a commit
        hands the piece on, as the shared-memory ring does).
        """
        return 0

    def _make_p2p_port(self, rank: int) -> P2PPort:
        from hal.comm._p2p import StagedPort

        return StagedPort(self, rank)

    @property
    def _pushback(self) -> dict[int, bytes]:
        """Pieces read ahead by the point-to-point port (a peer's next call signature), per peer."""
        pb = self.__dict__.get("_hal_pushback")
        if pb is None:
            pb = self.__dict__["_hal_pushback"] = {}
        return pb

    @property
    def _view_cache(self) -> weakref.WeakKeyDictionary[hal.Buffer, Any]:
        cache = self.__dict__.get("_hal_view_cache")
        if cache is None:
            cache = self.__dict__["_hal_view_cache"] = weakref.WeakKeyDictionary()
        return cache

    def _event(self, stream: hal.Stream, slot: int) -> hal.Event:
        """Return a reusable event of ``stream``'s device (one per ``slot``)."""
        events: dict[tuple[hal.Device, int], hal.Event] = self.__dict__.setdefault(
            "_hal_events", {}
        )
        key = (stream.device, slot)
        if key not in events:
            events[key] = stream.device.create_event()
        return events[key]

    def check_peers(self, peers: Sequence[int], ctx: CallContext) -> None:
        """Raise CommError if one of ``peers`` is known dead. Default: no liveness information."""

    def idle(self, rounds: int) -> None:
        """Wait a little for a peer after ``rounds`` rounds without progress (default: yield, then sleep)."""
        if rounds < 64:
            time.sleep(0)
        else:
            time.sleep(min(2e-4, 2e-6 * rounds))

    def post(self, sends: Sequence[Send], ctx: CallContext) -> list[Send]:
        """Place one-piece ``sends`` whose peer has room right now; return the others (never waits)."""
        left: list[Send] = []
        ops = [_Op(x.peer, x.data, None) for x in sends]
        if not ops:
            return left
        ctx.stream.synchronize()
        mv = _Mover(ctx.stream, ctx.chunk_bytes, ctx, ops, self)
        self.poll()
        for x, op in zip(sends, ops, strict=True):
            if op.nbytes == 0:
                continue
            space = self.send_space(op.peer) if op.nbytes <= ctx.chunk_bytes else None
            if space is None:
                left.append(x)
                continue
            mv.out(op, space, op.nbytes)
            self.send_commit(op.peer, op.nbytes)
        return left

    def exchange(self, sends: Sequence[Send], recvs: Sequence[Recv], ctx: CallContext) -> None:
        """Run sends and receives piece by piece until all complete (see :class:`Transport`).

        Device memory the host can reach (DLPack ``kDLCPU``, e.g. the CPU emulator) is copied
        to and from the pieces by the host directly, and reductions are enqueued without
        waiting (a double-buffered scratch keeps them pipelined); other memory moves with
        ``hal.copy`` and a synchronization per piece. ``HAL_COMM_DLPACK=0`` forces the latter.
        """
        # Sizes are agreed before any exchange, so zero-byte messages need no piece at all.
        send_ops = [_Op(s.peer, s.data, None) for s in sends if s.data.nbytes]
        recv_ops = [
            _Op(r.peer, r.data, r.op, r.base, r.after_sends) for r in recvs if r.data.nbytes
        ]
        chunk = ctx.chunk_bytes
        stream = ctx.stream
        stream.synchronize()  # earlier steps' work is done: host views may read and write
        mv = _Mover(stream, chunk, ctx, [*send_ops, *recv_ops], self)
        pushback = self.__dict__.get("_hal_pushback")
        rounds = _Rounds(self, ctx)
        try:
            while True:
                moved = self.poll()
                busy: set[int] = set()
                for op in send_ops:
                    if op.done >= op.nbytes or op.peer in busy:
                        continue
                    busy.add(op.peer)  # one message per peer at a time, in list order
                    while op.done < op.nbytes:
                        space = self.send_space(op.peer)
                        if space is None:
                            break
                        n = min(chunk, op.nbytes - op.done)
                        mv.out(op, space, n)
                        self.send_commit(op.peer, n)
                        op.done += n
                        moved = True
                busy.clear()
                sends_out = all(o.done >= o.nbytes for o in send_ops)
                for op in recv_ops:
                    if op.done >= op.nbytes or op.peer in busy or (op.after and not sends_out):
                        continue
                    busy.add(op.peer)
                    while op.done < op.nbytes:
                        n = min(chunk, op.nbytes - op.done)
                        ahead = pushback.pop(op.peer, None) if pushback else None
                        if (
                            ahead is not None
                        ):  # read by the point-to-point port: this call's signature
                            if len(ahead) != n:
                                raise hal.CommError(
                                    f"rank {op.peer} sent a call signature of {len(ahead)} bytes where a piece of "
                                    f"{n} was expected (the ranks disagree on the calls)",
                                    ranks=(op.peer,),
                                )
                            mv.into(op, memoryview(ahead), n)
                            op.done += n
                            moved = True
                            continue
                        piece = self.recv_data(op.peer, n)
                        if piece is None:
                            break
                        mv.into(op, piece, n)
                        self.recv_release(op.peer)
                        op.done += n
                        moved = True
                pending = [o for o in (*send_ops, *recv_ops) if o.done < o.nbytes]
                if not pending:
                    return
                rounds.after(moved, (o.peer for o in pending))
        finally:
            mv.finish()
