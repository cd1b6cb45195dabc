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
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, final

import numpy as np

import hal
from hal.comm._ops import accumulate

__all__ = [
    "CallContext",
    "Endpoint",
    "Recv",
    "Send",
    "StagedTransport",
    "Transport",
    "TransportRegistry",
    "World",
]

Payload = Any  # hal.Array (device memory) or a NumPy array (host bytes, e.g. signatures)


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

    def progressed(self) -> None:
        """Note that bytes moved (resets the timeout clock)."""
        self.last_progress = time.monotonic()

    def stalled(self) -> bool:
        """True when nothing moved for longer than the timeout."""
        return time.monotonic() - self.last_progress > self.timeout_s

    def timeout_error(self, peers: Sequence[int]) -> hal.CommError:
        """Return the error for a stall, naming the ranks not heard from."""
        ranks = tuple(sorted(set(peers)))
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
    #: How a byte travels, for the plan (``host-shm``, ``host-tcp`` ...).
    path: ClassVar[str] = "host"

    @classmethod
    def unusable(cls, world: World) -> str | None:
        """Return why this transport cannot connect ``world``, or None if it can."""
        if cls.single_host and len(world.hosts) > 1:
            return f"{cls.name} needs every rank on one host; ranks span {len(world.hosts)} hosts"
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


@final
class TransportRegistry:
    """Collects transport classes from the ``hal_register_transports`` hooks."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Transport]] = {}

    def add(self, transport_cls: type[Transport]) -> None:
        """Register ``transport_cls`` (a subclass of :class:`hal.comm.Transport` with a ``name``)."""
        if not (isinstance(transport_cls, type) and issubclass(transport_cls, Transport)):
            raise TypeError(f"transport_cls={transport_cls!r} is not a subclass of hal.comm.Transport")
        name = transport_cls.name
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{transport_cls.__qualname__}.name={name!r} must be an identifier string")
        if name in self._classes and self._classes[name] is not transport_cls:
            raise ValueError(f"transport {name!r} is already registered by {self._classes[name].__module__}")
        self._classes[name] = transport_cls

    def get(self, name: str) -> type[Transport]:
        """Return the transport class called ``name``."""
        try:
            return self._classes[name]
        except KeyError:
            raise ValueError(f"transport {name!r} is not registered; known: {', '.join(self.names)}") from None

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
    __slots__ = ("base", "data", "done", "host", "nbytes", "op", "peer")

    def __init__(self, peer: int, data: Payload, op: str | None, base: Payload | None = None) -> None:
        self.peer = peer
        self.data = data
        self.op = op
        self.base = base
        self.host = _host_bytes(data)
        self.nbytes = int(data.nbytes)
        self.done = 0


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

    def check_peers(self, peers: Sequence[int], ctx: CallContext) -> None:
        """Raise CommError if one of ``peers`` is known dead. Default: no liveness information."""

    def exchange(self, sends: Sequence[Send], recvs: Sequence[Recv], ctx: CallContext) -> None:
        """Run sends and receives piece by piece until all complete (see :class:`Transport`)."""
        # Sizes are agreed before any exchange, so zero-byte messages need no piece at all.
        send_ops = [_Op(s.peer, s.data, None) for s in sends if s.data.nbytes]
        recv_ops = [_Op(r.peer, r.data, r.op, r.base) for r in recvs if r.data.nbytes]
        chunk = ctx.chunk_bytes
        stream = ctx.stream
        scratch: hal.Buffer | None = None
        idle = 0
        last_check = time.monotonic()
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
                    if op.host is not None:
                        np.frombuffer(space, np.uint8, n)[:] = op.host[op.done : op.done + n]
                    else:
                        hal.copy(space, op.data, stream=stream, nbytes=n, src_offset=op.done)
                        stream.synchronize()
                    self.send_commit(op.peer, n)
                    op.done += n
                    moved = True
            busy.clear()
            for op in recv_ops:
                if op.done >= op.nbytes or op.peer in busy:
                    continue
                busy.add(op.peer)
                while op.done < op.nbytes:
                    n = min(chunk, op.nbytes - op.done)
                    piece = self.recv_data(op.peer, n)
                    if piece is None:
                        break
                    if op.host is not None:
                        op.host[op.done : op.done + n] = np.frombuffer(piece, np.uint8, n)
                    elif op.op is None:
                        hal.copy(op.data, piece[:n], stream=stream, dst_offset=op.done)
                        stream.synchronize()
                    elif op.base is not None:
                        arr = op.data
                        item = arr.dtype.itemsize
                        dst = arr.buffer.view(arr.dtype, n // item, offset=arr.offset + op.done)
                        hal.copy(dst, piece[:n], stream=stream)
                        base = op.base.buffer.view(arr.dtype, n // item, offset=op.base.offset + op.done)
                        accumulate(dst, base, op.op, stream)
                        stream.synchronize()
                    else:
                        arr = op.data
                        if scratch is None:
                            scratch = ctx.scratch(chunk)
                        hal.copy(scratch, piece[:n], stream=stream)
                        item = arr.dtype.itemsize
                        dst = arr.buffer.view(arr.dtype, n // item, offset=arr.offset + op.done)
                        accumulate(dst, scratch.view(arr.dtype, n // item), op.op, stream)
                        stream.synchronize()
                    self.recv_release(op.peer)
                    op.done += n
                    moved = True
            pending = [o for o in (*send_ops, *recv_ops) if o.done < o.nbytes]
            if not pending:
                return
            if moved:
                ctx.progressed()
                idle = 0
                continue
            idle += 1
            now = time.monotonic()
            if now - last_check > 0.05:
                last_check = now
                self.check_peers([o.peer for o in pending], ctx)
                if ctx.stalled():
                    raise ctx.timeout_error([o.peer for o in pending])
            if idle < 64:
                time.sleep(0)
            else:
                time.sleep(min(1e-3, 2e-6 * idle))
