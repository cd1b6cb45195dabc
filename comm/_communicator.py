"""The public communicators: :class:`Communicator` (one device per process) and
:class:`DeviceCommunicator` (many devices in one process, one array per device per call).

Arguments are checked on the caller's thread, before anything is enqueued; the call is then
planned, an event is recorded on the caller's stream, and the rank engines run it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, final

import hal
from hal.comm._config import ALGORITHMS, Config
from hal.comm._engine import Call, Engine, SharedEvent, Work
from hal.comm._ops import check_array, check_op, dtype_name, flat
from hal.comm._plan import Plan, choose
from hal.comm._providers import provider_plan
from hal.comm._topo import host_groups

__all__ = ["Communicator", "DeviceCommunicator", "P2POp"]

#: Largest message tag (tags travel as signed 64-bit integers).
MAX_TAG = (1 << 63) - 1


def _check_tag(tag: object) -> int:
    if isinstance(tag, bool) or not isinstance(tag, int):
        raise TypeError(f"tag={tag!r} must be an int")
    if not 0 <= tag <= MAX_TAG:
        raise ValueError(f"tag={tag} must be in 0..2**63-1")
    return tag


def _check_stream(stream: object, device: hal.Device) -> None:
    if not isinstance(stream, hal.Stream):
        raise TypeError(f"stream={stream!r} is not a hal.Stream")
    if stream.device != device:
        raise hal.DeviceMismatchError(
            f"stream belongs to {stream.device}; this rank's device is {device}"
        )


def _with_context(exc: BaseException, where: str) -> BaseException:
    """Return ``exc`` again with ``where`` in front of its message (same type)."""
    try:
        new = type(exc)(f"{where}: {exc}")
    except TypeError:  # an exception type with other constructor arguments: keep it as it is
        return exc
    return new


@final
@dataclasses.dataclass(frozen=True)
class P2POp:
    """One call of :meth:`Communicator.batch_isend_irecv` (torch's ``dist.P2POp``).

    Args:
        op: ``"isend"`` or ``"irecv"``.
        array: the array to send or to fill.
        peer: the other rank.
        tag: the message tag (default 0).
    """

    op: str
    array: hal.Array
    peer: int
    tag: int = 0

    def __post_init__(self) -> None:
        if self.op not in ("isend", "irecv"):
            raise ValueError(f"op={self.op!r} must be 'isend' or 'irecv'")
        if isinstance(self.peer, bool) or not isinstance(self.peer, int):
            raise TypeError(f"peer={self.peer!r} must be a rank number (int)")
        _check_tag(self.tag)


def _check_root(root: object, size: int, name: str = "root") -> int:
    if isinstance(root, bool) or not isinstance(root, int):
        raise TypeError(f"{name}={root!r} must be a rank number (int)")
    if not 0 <= root < size:
        raise ValueError(f"{name}={root} is not a rank of this communicator (0..{size - 1})")
    return root


def _no_ref() -> None:
    """A dead weak reference: no stream was checked yet."""


def _check_recv_size(
    recv: hal.Array | None, send_size: int, *, segment: tuple[int, int] | None = None
) -> None:
    """Raise ValueError naming both sizes when ``recv`` (if given) does not hold what the call writes.

    By default ``recv`` must hold ``send_size`` elements; with ``segment=(rank, n)`` it must hold
    ``n``, that rank's segment of ``send`` (reduce_scatter).
    """
    if recv is None:
        return
    if segment is None:
        if recv.size != send_size:
            raise ValueError(f"recv has {recv.size} elements; send has {send_size}")
    elif recv.size != segment[1]:
        raise ValueError(
            f"recv has {recv.size} elements; rank {segment[0]}'s segment of {send_size} has {segment[1]}"
        )


def _check_avg(op: str, arr: hal.Array) -> None:
    """``avg`` is a sum scaled by 1/ranks (integers truncate toward zero, as NCCL's)."""


def _facts(
    tag: tuple[Any, ...], first: object, second: object
) -> tuple[tuple[Any, ...], hal.Buffer, hal.Buffer | None] | None:
    """Return the key of a call's arguments for the fast path of repeated calls, and their buffers.

    ``tag`` (the collective and its scalar arguments, each of its exact type) and each array's
    buffer, dtype, shape and offset; None when an argument is not a plain hal.Array (those
    always take the full checks).
    """
    if type(first) is not hal.Array or (second is not None and type(second) is not hal.Array):
        return None
    fb = first._buffer
    key: tuple[Any, ...] = (tag, id(fb), first._dtype, first._shape, first._offset)
    sb = None
    if second is not None:
        sb = second._buffer
        key = (*key, id(sb), second._dtype, second._shape, second._offset)
    return key, fb, sb  # the key Communicator._hit builds


def _flat1(arr: hal.Array) -> hal.Array:
    return arr if len(arr._shape) == 1 else flat(arr)


class _Base:
    """What both communicators share: the planner and the per-call bookkeeping."""

    size: int
    _config: Config
    _hosts: int
    _engines: list[Engine]
    _per_host: int = 0
    _inter: tuple[float, float] | None = None
    _topology: Any = None
    _topology_hash: str = ""
    _world: dict[str, Any] | None = None

    @property
    def topology(self) -> Any:
        """The :class:`hal.comm.Topology` the planner uses (None for ``hal.comm.create``)."""
        return self._topology

    @property
    def topology_hash(self) -> str:
        """The hash of the planner's inputs every rank agreed on at init (empty for ``create``)."""
        return self._topology_hash

    @property
    def plans(self) -> list[Plan]:
        """The plans of the most recent calls (oldest first, up to 256), of the first local rank."""
        return self._engines[0].recent_plans()

    @property
    def last_plan(self) -> Plan | None:
        """The plan of the most recent call, or None."""
        return self._engines[0].last_plan()

    def _plan(self, collective: str, nbytes: int, seq: int, engine: Engine) -> Plan:
        key = (collective, nbytes, id(engine))
        cache: dict[tuple[str, int, int], Plan] = self.__dict__.setdefault("_plan_cache", {})
        plan = cache.get(key)
        if plan is None:
            tr = engine.transport
            plan = choose(
                collective,
                nbytes=nbytes,
                ranks=self.size,
                hosts=self._hosts,
                transport=type(tr),
                # the transport's pipelining piece (the native shm engine's piece_for), at most a slot
                chunk_bytes=min(
                    tr.chunk_bytes,
                    getattr(tr, "piece_for", lambda _n, _c: tr.chunk_bytes)(nbytes, collective),
                    max(nbytes, 64),
                )
                // 64
                * 64
                or 64,
                path=tr.path,
                override=self._config.algo.get(collective) if collective in ALGORITHMS else None,
                per_host=self._per_host,
                inter=self._inter,
                ipc=engine.ipc,
            )
            if getattr(tr, "engine", "python") != "python" and plan.path == tr.path:
                plan = dataclasses.replace(plan, engine=tr.engine)
            if len(cache) > 1024:
                cache.clear()
            cache[key] = plan
        return plan.with_seq(seq)


class Communicator(_Base):
    """One rank of a communicator spanning processes (one device per process).

    Build with :func:`hal.comm.init`. Every call returns a :class:`Work`; ``work.wait()``
    returns when the output is in place. A large call is asynchronous: it is queued on the
    rank's engine thread and returns at once. A small collective (up to
    ``HAL_COMM_INLINE_BYTES``, default 64 KiB) issued while nothing is queued runs on the
    calling thread instead and returns a completed :class:`Work` (two thread hand-offs
    saved); point-to-point calls are never inline. With ``stream=`` the call is ordered after
    the work already enqueued on ``stream``. Every rank must call the same collectives in the
    same order with the same op, dtype and count (checked: a mismatch raises CommError).
    """

    #: repeated calls may be prepared to run again (Engine.rerun); not by a dry run's _Probe
    _rerun = True

    def __init__(
        self, engine: Engine, *, config: Config, hosts: int, bootstrap: Any = None
    ) -> None:
        self._engine = engine
        self._engines = [engine]
        self._config = config
        self._hosts = hosts
        self._bootstrap = bootstrap
        self.rank = engine.rank
        self.size = engine.size
        # safety net only: close() explicitly (or use the communicator as a context manager)
        self._finalizer = weakref.finalize(self, _release, engine, bootstrap)
        #: the fast path of repeated calls: the stream checked last, and the facts of the
        #: arguments checked before, with the call prepared to run again on a stream and the
        #: facts themselves (see :meth:`_repeat`)
        self._stream_ok: Any = _no_ref
        self._checked: dict[tuple[Any, ...], tuple[Any, Any, int, str, int, Any, Any]] = {}

    def _set_topology(self, topo: Any, rank_hosts: Sequence[str], digest: str) -> None:
        groups = host_groups(rank_hosts)
        sizes = {len(g) for g in groups}
        self._topology = topo
        self._topology_hash = digest
        self._hosts = len(groups)
        self._per_host = sizes.pop() if len(sizes) == 1 else 0
        self._inter = topo.inter_host()
        self._engine.host_groups = groups
        self.__dict__.pop("_plan_cache", None)
        self._checked.clear()  # the calls prepared to run again hold their plans

    @property
    def device(self) -> hal.Device:
        """This rank's device."""
        return self._engine.device

    @property
    def transport(self) -> str:
        """Name of the transport between the ranks (``shm``, ``tcp``, ``mpi``, ``local``)."""
        return self._engine.transport.name

    @property
    def provider(self) -> str:
        """The collective provider serving this communicator (``nccl``, ``mpi``, a plugin's) or ``generic``.

        A call the provider declines (a dtype or op it lacks, an ``HAL_COMM_ALGO`` override) runs
        the generic algorithms; ``work.plan.provider`` says which ran each call.
        """
        prov = self._engine.provider
        return "generic" if prov is None else str(prov.name)

    def _submit(
        self,
        collective: str,
        *,
        stream: hal.Stream | None,
        op: str = "",
        send: hal.Array | None = None,
        recv: hal.Array | None = None,
        count: int = 0,
        root: int = -1,
        peer: int = -1,
        dtype: str = "",
        nbytes: int = 0,
        tag: int = 0,
    ) -> Work:
        eng = self._engine
        # only barrier() goes without a stream; the stream checked last passes at once
        if stream is not None and self._stream_ok() is not stream:
            if not isinstance(stream, hal.Stream):
                raise TypeError(f"stream={stream!r} is not a hal.Stream")
            if stream.device != eng.device:
                raise hal.DeviceMismatchError(
                    f"stream belongs to {stream.device}; this rank's device is {eng.device}"
                )
            self._stream_ok = weakref.ref(stream)  # checked once: a stream's device never changes
        seq = eng.next_seq() if collective not in ("send", "recv") else -1
        plan = self._plan(collective, nbytes, seq, eng)
        if eng.provider is not None:
            plan = provider_plan(
                plan, eng.provider, collective, dtype, op, self._config.algo.get(collective)
            )
        inline = collective not in ("send", "recv") and eng.wants_inline(
            nbytes
        )  # p2p: never inline
        event: Any = None
        signal = None
        if stream is not None and not inline:
            p2p = collective in ("send", "recv")
            point = eng.p2p_points.get(stream) if p2p else None
            if point is not None and point.count == stream.enqueue_count and point.acquire():
                # Back-to-back point-to-point calls on one stream share the ordering point of
                # the first: each starts after the work enqueued before that point, not after
                # the previous call's completion, so a send and a receive posted one after the
                # other progress together although each occupies the stream.
                event = point
            else:
                event = eng.device.create_event()
                event.record(stream)  # the call starts after the stream's earlier work
                if p2p:
                    event = point = SharedEvent(event)
            # ... and occupies it: the stream's later work starts once the call's output is in
            # place (a host signal the engine sets when the call ends).
            signal = stream.wait_host()
            if point is not None:
                point.count = stream.enqueue_count
                eng.p2p_points[stream] = point
        call = Call(
            collective,
            op,
            dtype,
            count,
            root,
            send,
            recv,
            plan,
            event,
            peer,
            stream,
            inline,
            tag=tag,
        )
        try:
            work = eng.submit(call)
        except BaseException:
            if signal is not None:
                signal.set()  # nothing was queued: nothing to wait for
            raise
        if signal is not None:
            work._on_done(work._releaser(signal))
        return work

    def _arrays(self, send: object, recv: object) -> tuple[hal.Array, hal.Array | None]:
        s = check_array(send, "send", self.device, rank=self.rank)
        r = (
            None
            if recv is None or recv is send
            else check_array(recv, "recv", self.device, rank=self.rank)
        )
        if r is not None and r.dtype != s.dtype:
            raise TypeError(f"recv.dtype={r.dtype} differs from send.dtype={s.dtype}")
        return flat(s), (flat(r) if r is not None else None)

    def _repeat(
        self,
        collective: str,
        hit: tuple[Any, ...],
        stream: hal.Stream,
        send: hal.Array | None,
        recv: hal.Array | None,
        op: str = "",
        root: int = -1,
    ) -> Work:
        """Submit a repeated call whose arguments' facts were checked before (``hit``).

        hal.Arrays are immutable views, so arguments with the facts (buffer, dtype, shape,
        offset) of arguments checked before pass the same checks, except a buffer closed since,
        which the caller checks on every call (the full path names it). ``hit`` holds weak
        references to the buffers, the count, dtype name and size, the call prepared to run
        again on a stream (``(stream ref, Rerun or None)``, None before the first repeat) and
        the facts (the key). On that stream, a call that runs inline as one native call runs
        again at once (:meth:`Engine.rerun`: no planning, no Call, no context per call).
        ``send`` and ``recv`` are the caller's arrays (``recv is send``: in place), flattened
        only for the other calls.
        """
        again = hit[5]
        if again is None or again[0]() is not stream:
            prepare = True
        elif again[1] is None:  # prepared on this stream: it cannot run again (prepare_rerun)
            prepare = False
        else:
            work = self._engine.rerun(again[1], stream)
            if work is not None:
                return work
            prepare = again[1].stale  # what it ran was dropped (a program evicted): prepare anew
        s1 = None if send is None else (send if len(send._shape) == 1 else flat(send))
        r1 = s1 if recv is send else (None if recv is None else _flat1(recv))
        count, dtype, nbytes = hit[2], hit[3], hit[4]
        work = self._submit(
            collective, stream=stream, op=op, send=s1, recv=r1, count=count, root=root,
            dtype=dtype, nbytes=nbytes,
        )  # fmt: skip
        if prepare and self._rerun and work.done() and work._error is None:
            call = Call(collective, op, dtype, count, root, s1, r1, work.plan, None,
                        stream=stream, inline=True)  # fmt: skip
            self._checked[hit[6]] = (
                *hit[:5],
                (weakref.ref(stream), self._engine.prepare_rerun(call)),
                hit[6],
            )
        return work

    def _remember(
        self,
        key: tuple[Any, ...],
        first: hal.Array,
        second: hal.Array | None,
        facts: tuple[int, str, int],
    ) -> None:
        """Keep the facts (count, dtype name, bytes) of checked arguments for :meth:`_repeat`."""
        if len(self._checked) >= 256:
            self._checked.clear()
        self._checked[key] = (
            weakref.ref(first.buffer),
            None if second is None else weakref.ref(second.buffer),
            *facts,
            None,
            key,
        )

    def _hit(self, tag: tuple[Any, ...], first: object, second: object) -> tuple[Any, ...] | None:
        """Return what :meth:`_remember` kept for these arguments while both buffers are open, else None.

        The key is :func:`_facts`'s (``tag``, then each array's buffer, dtype, shape and
        offset), built here without its tuple of results: this runs on every repeated call.
        """
        if type(first) is not hal.Array or (second is not None and type(second) is not hal.Array):
            return None
        fb = first._buffer
        if second is None:
            hit = self._checked.get((tag, id(fb), first._dtype, first._shape, first._offset))
            if hit is not None and hit[0]() is fb and fb._impl is not None:
                return hit
            return None
        sb = second._buffer
        hit = self._checked.get(
            (tag, id(fb), first._dtype, first._shape, first._offset,
             id(sb), second._dtype, second._shape, second._offset)
        )  # fmt: skip
        if hit is not None and hit[0]() is fb and fb._impl is not None and hit[1]() is sb:
            return hit if sb._impl is not None else None
        return None

    def all_reduce(
        self, send: hal.Array, recv: hal.Array | None = None, *, op: str = "sum", stream: hal.Stream
    ) -> Work:
        """Reduce ``send`` across ranks with ``op``; every rank gets the result in ``recv`` (or ``send``).

        Args:
            send: this rank's input: a hal.Array, or any DLPack producer (a torch tensor) whose
                memory is this rank's device's, used zero-copy; a dtype of ``hal.comm.DTYPES``
                (float16/bfloat16 reduce in float32 and round once).
            recv: output of the same size and dtype; ``None`` (or ``send``) reduces in place.
            op: ``sum``, ``prod``, ``max``, ``min`` or ``avg`` (floating dtypes).
            stream: a stream of this rank's device; the call starts after its queued work.
        """
        # The fast path of a repeated call (see _repeat): the facts of the arguments as the key.
        key: tuple[Any, ...] | None = None
        same = recv is None or recv is send
        if type(send) is hal.Array and (same or type(recv) is hal.Array) and type(op) is str:
            sb = send._buffer
            key = (id(sb), send._dtype, send._shape, send._offset, op)
            rv: hal.Array | None = None if same else recv
            rb = None
            if rv is not None:
                rb = rv._buffer
                key += (id(rb), rv._dtype, rv._shape, rv._offset)
            hit = self._checked.get(key)
            if (
                hit is not None
                and hit[0]() is sb
                and sb._impl is not None
                and (rb is None or (hit[1]() is rb and rb._impl is not None))
            ):
                return self._repeat("all_reduce", hit, stream, send, send if rv is None else rv, op)
        check_op(op)
        s, r = self._arrays(send, recv)
        _check_recv_size(r, s.size)
        _check_avg(op, s)
        count, dtype, nbytes = s.size, dtype_name(s.dtype), s.nbytes
        if key is not None:
            self._remember(key, s, r, (count, dtype, nbytes))
        return self._submit(
            "all_reduce",
            stream=stream,
            op=op,
            send=s,
            recv=r if r is not None else s,
            count=count,
            dtype=dtype,
            nbytes=nbytes,
        )

    def all_gather(self, send: hal.Array | None, recv: hal.Array, *, stream: hal.Stream) -> Work:
        """Gather every rank's ``send`` (``count`` elements) into ``recv`` (``size * count``), in rank order.

        ``send=None`` works in place: this rank's input already sits at ``recv[rank*count:(rank+1)*count]``.
        """
        hit = self._hit(("all_gather",), recv, send)
        if hit is not None:
            return self._repeat("all_gather", hit, stream, send, recv)
        facts = _facts(("all_gather",), recv, send)
        r = flat(check_array(recv, "recv", self.device, rank=self.rank))
        if r.size % self.size:
            raise ValueError(f"recv has {r.size} elements, not a multiple of the {self.size} ranks")
        count = r.size // self.size
        s = None
        if send is not None:
            s = flat(check_array(send, "send", self.device, rank=self.rank))
            if s.dtype != r.dtype:
                raise TypeError(f"send.dtype={s.dtype} differs from recv.dtype={r.dtype}")
            if s.size != count:
                raise ValueError(
                    f"send has {s.size} elements; recv needs {self.size} x {s.size} = "
                    f"{self.size * s.size}, has {r.size}"
                )
        if facts is not None:
            self._remember(facts[0], r, s, (count, dtype_name(r.dtype), r.nbytes))
        return self._submit(
            "all_gather",
            stream=stream,
            send=s,
            recv=r,
            count=count,
            dtype=dtype_name(r.dtype),
            nbytes=r.nbytes,
        )

    def reduce_scatter(
        self, send: hal.Array, recv: hal.Array | None = None, *, op: str = "sum", stream: hal.Stream
    ) -> Work:
        """Reduce ``send`` across ranks and leave segment ``rank`` of the result in ``recv``.

        ``send`` (``n`` elements) is cut into ``size`` segments, the first ``n % size`` one
        element longer (``numpy.array_split``); ``recv`` has this rank's segment length.
        ``recv=None`` leaves the result in this rank's segment of ``send`` (the rest of
        ``send`` is then scratch space).
        """
        if type(op) is str:
            hit = self._hit(("reduce_scatter", op), send, recv)
            if hit is not None:
                return self._repeat("reduce_scatter", hit, stream, send, recv, op)
        facts = _facts(("reduce_scatter", op), send, recv) if type(op) is str else None
        check_op(op)
        s = flat(check_array(send, "send", self.device, rank=self.rank))
        _check_avg(op, s)
        from hal.comm._algorithms import split

        mine = split(s.size, self.size)[self.rank][1]
        r = None
        if recv is not None:
            r = flat(check_array(recv, "recv", self.device, rank=self.rank))
            if r.dtype != s.dtype:
                raise TypeError(f"recv.dtype={r.dtype} differs from send.dtype={s.dtype}")
            _check_recv_size(r, s.size, segment=(self.rank, mine))
        if facts is not None:
            self._remember(facts[0], s, r, (s.size, dtype_name(s.dtype), s.nbytes))
        return self._submit(
            "reduce_scatter",
            stream=stream,
            op=op,
            send=s,
            recv=r,
            count=s.size,
            dtype=dtype_name(s.dtype),
            nbytes=s.nbytes,
        )

    def broadcast(
        self, send: hal.Array, recv: hal.Array | None = None, *, root: int, stream: hal.Stream
    ) -> Work:
        """Copy ``root``'s ``send`` into every rank's ``recv`` (or ``send`` when ``recv`` is None)."""
        rv = None if recv is send else recv
        if type(root) is int:
            hit = self._hit(("broadcast", root), send, rv)
            if hit is not None:
                return self._repeat("broadcast", hit, stream, send, rv, root=root)
        facts = _facts(("broadcast", root), send, rv) if type(root) is int else None
        _check_root(root, self.size)
        s, r = self._arrays(send, recv)
        _check_recv_size(r, s.size)
        if facts is not None:
            self._remember(facts[0], s, r, (s.size, dtype_name(s.dtype), s.nbytes))
        return self._submit(
            "broadcast",
            stream=stream,
            send=s,
            recv=r,
            count=s.size,
            root=root,
            dtype=dtype_name(s.dtype),
            nbytes=s.nbytes,
        )

    def reduce(
        self,
        send: hal.Array,
        recv: hal.Array | None = None,
        *,
        op: str = "sum",
        root: int,
        stream: hal.Stream,
    ) -> Work:
        """Reduce ``send`` across ranks into ``root``'s ``recv`` (or ``send``); other ranks' buffers are unchanged."""
        rv = None if recv is send else recv
        ok = type(op) is str and type(root) is int
        if ok:
            hit = self._hit(("reduce", op, root), send, rv)
            if hit is not None:
                return self._repeat("reduce", hit, stream, send, rv, op, root)
        facts = _facts(("reduce", op, root), send, rv) if ok else None
        check_op(op)
        _check_root(root, self.size)
        s, r = self._arrays(send, recv)
        _check_recv_size(r, s.size)
        _check_avg(op, s)
        if facts is not None:
            self._remember(facts[0], s, r, (s.size, dtype_name(s.dtype), s.nbytes))
        return self._submit(
            "reduce",
            stream=stream,
            op=op,
            send=s,
            recv=r,
            count=s.size,
            root=root,
            dtype=dtype_name(s.dtype),
            nbytes=s.nbytes,
        )

    def all_to_all(
        self, send: hal.Array, recv: hal.Array | None = None, *, stream: hal.Stream
    ) -> Work:
        """Send block ``i`` of ``send`` to rank ``i`` and receive rank ``i``'s block into block ``i`` of ``recv``.

        ``send`` and ``recv`` hold ``size`` equal blocks; ``recv=None`` exchanges in place.
        """
        s, r = self._arrays(send, recv)
        if s.size % self.size:
            raise ValueError(f"send has {s.size} elements, not a multiple of the {self.size} ranks")
        _check_recv_size(r, s.size)
        return self._submit(
            "all_to_all",
            stream=stream,
            send=s,
            recv=r,
            count=s.size // self.size,
            dtype=dtype_name(s.dtype),
            nbytes=s.nbytes,
        )

    def _p2p_args(
        self, kind: str, data: object, peer: object, tag: object
    ) -> tuple[hal.Array, int, int]:
        """Check a point-to-point call's arguments; errors name this rank, the call and the value."""
        try:
            _check_root(peer, self.size, "peer")
            t = _check_tag(tag)
        except (TypeError, ValueError) as exc:
            raise _with_context(exc, f"rank {self.rank} {kind}") from None
        assert isinstance(peer, int)
        if peer == self.rank:
            raise ValueError(
                f"rank {self.rank} {kind}(peer={peer}): peer names this rank; {kind} needs another rank"
            )
        try:
            arr = check_array(data, "data", self.device, rank=self.rank)
        except (TypeError, ValueError, hal.HalError) as exc:
            raise _with_context(exc, f"{kind}(peer={peer}, tag={t})") from None
        return flat(arr), peer, t

    def _p2p(self, kind: str, data: hal.Array, peer: int, tag: int, stream: hal.Stream) -> Work:
        """Check and submit a point-to-point call: ``kind`` is ``"isend"`` or ``"irecv"``."""
        arr, peer, t = self._p2p_args(kind, data, peer, tag)
        sending = kind == "isend"
        return self._submit(
            "send" if sending else "recv",
            stream=stream,
            send=arr if sending else None,
            recv=None if sending else arr,
            count=arr.size,
            peer=peer,
            dtype=dtype_name(arr.dtype),
            nbytes=arr.nbytes,
            tag=t,
        )

    def isend(self, data: hal.Array, peer: int, *, tag: int = 0, stream: hal.Stream) -> Work:
        """Send ``data`` to rank ``peer``, which receives it with :meth:`irecv` (same tag, dtype and count).

        Returns at once; ``work.wait()`` returns once ``data`` may be reused. Sends and
        receives may be posted in any order on both sides before any wait: the rank's
        point-to-point calls progress together. Messages of one (peer, tag) arrive in order.

        Args:
            data: the array to send (this rank's device; any shape, sent as its flat elements).
            peer: the receiving rank (not this one).
            tag: a non-negative int; a receive takes the oldest message of its (peer, tag).
            stream: the send starts after the work already enqueued on it.
        """
        return self._p2p("isend", data, peer, tag, stream)

    def irecv(self, data: hal.Array, peer: int, *, tag: int = 0, stream: hal.Stream) -> Work:
        """Receive into ``data`` the oldest message rank ``peer`` sent with ``tag`` (see :meth:`isend`).

        A message of another dtype or element count fails this call only (``hal.CommError``
        naming both ranks and values); so does a timeout while nothing of the message moved.

        Args:
            data: the array to fill (this rank's device).
            peer: the sending rank (not this one).
            tag: the tag the sender used (default 0).
            stream: the receive starts after the work already enqueued on it.
        """
        return self._p2p("irecv", data, peer, tag, stream)

    def send(self, data: hal.Array, peer: int, *, tag: int = 0, stream: hal.Stream) -> Work:
        """Send ``data`` to rank ``peer``: the same call as :meth:`isend`."""
        return self.isend(data, peer, tag=tag, stream=stream)

    def recv(self, data: hal.Array, peer: int, *, tag: int = 0, stream: hal.Stream) -> Work:
        """Receive into ``data`` what rank ``peer`` sends: the same call as :meth:`irecv`."""
        return self.irecv(data, peer, tag=tag, stream=stream)

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Group point-to-point calls: they start together when the block ends, and complete together.

        NCCL's ``ncclGroupStart``/``ncclGroupEnd``: calls made inside return their ``Work`` at
        once but start at the end of the block (wait for them after it); every handle of the
        group completes when all its calls have. Groups nest. Collectives inside raise
        ``hal.CommError``. If the block raises, its calls are not started and their handles
        fail.
        """
        eng = self._engine
        eng.group_start()
        try:
            yield
        except BaseException:
            eng.group_end(discard=True)
            raise
        eng.group_end()

    def batch_isend_irecv(self, ops: Sequence[P2POp], *, stream: hal.Stream) -> list[Work]:
        """Post a list of :class:`P2POp` as one group; return their handles in order (torch's ``batch_isend_irecv``).

        Every op is checked before any is posted.
        """
        if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
            raise TypeError(f"ops={ops!r} must be a list of hal.comm.P2POp")
        for i, p in enumerate(ops):
            if not isinstance(p, P2POp):
                raise TypeError(f"ops[{i}]={p!r} is not a hal.comm.P2POp")
            self._p2p_args(p.op, p.array, p.peer, p.tag)
        _check_stream(stream, self.device)
        works: list[Work] = []
        with self.group():
            for p in ops:
                call = self.isend if p.op == "isend" else self.irecv
                works.append(call(p.array, p.peer, tag=p.tag, stream=stream))
        return works

    def barrier(self, *, stream: hal.Stream | None = None) -> Work:
        """Return a handle that completes once every rank has called ``barrier``.

        With ``stream``, the barrier starts after the stream's earlier work and occupies the
        stream like a collective: its later work starts once every rank got there.
        """
        return self._submit("barrier", stream=stream)

    def close(self) -> None:
        """Finish queued calls and release the transport. Idempotent."""
        self._finalizer()
        self._bootstrap = None

    def abort(self) -> None:
        """Abandon this communicator: fail the running and queued calls, release everything at once.

        Use it after a failure (or to stop a stuck job): peers waiting on this rank see it leave
        and fail too. Build a new communicator afterwards (:meth:`shrink` keeps the live ranks).
        Idempotent; the communicator is closed afterwards.
        """
        self._engine.abort()
        self.close()

    def shrink(
        self, exclude: Sequence[int] | None = None, *, timeout_ms: float | None = None
    ) -> Communicator:
        """Abort this communicator and return a new one of the live ranks (after a failure).

        Every surviving rank calls ``shrink`` with the same ``exclude`` (by default the ranks
        this rank's failure named, ``err.ranks``: survivors of a ring may name different ranks,
        so pass the set the application agreed on; a disagreement is a CommError at the
        rendezvous). Survivors keep their order: new rank = position among the live ranks. The
        rendezvous reuses rank 0's server when rank 0 lives, else the lowest live rank serves
        at its address, port = ``HAL_STORE_ADDR``'s port + the shrink count. Only for
        ``hal run``/torchrun communicators. The rendezvous waits this communicator's init timeout
        (``HAL_COMM_INIT_TIMEOUT_MS``); ``timeout_ms`` sets the new one's progress timeout.

        Raises:
            ValueError: ``exclude`` is empty, names this rank or a rank outside the communicator.
            hal.CommError: the survivors disagree on ``exclude`` or do not all arrive within the
                init timeout.
        """
        from hal.comm._init import shrink

        return shrink(self, exclude, timeout_ms=timeout_ms)

    def flight_record(self) -> list[dict[str, Any]]:
        """Return this rank's last calls (seq, op, bytes, algorithm, state ...), oldest first."""
        return self._engine.recorder.entries()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<hal.comm.Communicator rank {self.rank}/{self.size} on {self.device} via {self.transport}>"


def _release(engine: Engine, bootstrap: Any) -> None:
    engine.close()
    if bootstrap is not None:
        bootstrap.close()


class DeviceCommunicator(_Base):
    """A communicator over several devices of one process (NCCL's single-process mode).

    Build with :func:`hal.comm.create`. Each call takes one array (and one stream) per
    device, in the order of :attr:`devices`, and returns one :class:`Work` for all of them.
    Methods and semantics are those of :class:`Communicator`, with lists.
    """

    def __init__(self, ranks: list[Communicator], config: Config) -> None:
        self._ranks = ranks
        self._engines = [c._engine for c in ranks]
        self._config = config
        self._hosts = 1
        self.size = len(ranks)

    @property
    def devices(self) -> list[hal.Device]:
        """The devices, one per rank, in rank order."""
        return [c.device for c in self._ranks]

    @property
    def ranks(self) -> list[Communicator]:
        """One rank view per device (their calls must then be made for every device)."""
        return list(self._ranks)

    def _each(
        self,
        name: str,
        per_rank: Sequence[Sequence[Any]],
        streams: Sequence[hal.Stream],
        kwargs: dict[str, Any],
    ) -> Work:
        if not isinstance(streams, Sequence) or len(streams) != self.size:
            raise ValueError(
                f"streams must be a list of {self.size} streams (one per device); got {streams!r}"
            )
        for i, args in enumerate(per_rank):
            if len(args) != self.size:
                raise ValueError(
                    f"argument {i} must be a list of {self.size} arrays (one per device); got {len(args)}"
                )
        for i, args in enumerate(per_rank):
            shapes = {(a.dtype.name, a.size) for a in args if isinstance(a, hal.Array)}
            if len(shapes) > 1:
                raise ValueError(
                    f"argument {i}: the arrays differ between devices ({sorted(shapes)}); every "
                    "device needs the same dtype and size"
                )
        # validate every rank before anything is enqueued on any of them
        for r, c in enumerate(self._ranks):
            _dry_run(c, name, [a[r] for a in per_rank], streams[r], kwargs)
        for e in self._engines:  # each device's stream and thread, before any call is queued
            e.prepare()
        works = [
            getattr(c, name)(*[a[r] for a in per_rank], stream=streams[r], **kwargs)
            for r, c in enumerate(self._ranks)
        ]
        return Work._group(works)

    def all_reduce(
        self,
        send: Sequence[hal.Array],
        recv: Sequence[hal.Array] | None = None,
        *,
        op: str = "sum",
        streams: Sequence[hal.Stream],
    ) -> Work:
        """All-reduce one array per device (see :meth:`Communicator.all_reduce`)."""
        return self._each("all_reduce", [send, recv or [None] * self.size], streams, {"op": op})

    def all_gather(
        self,
        send: Sequence[hal.Array] | None,
        recv: Sequence[hal.Array],
        *,
        streams: Sequence[hal.Stream],
    ) -> Work:
        """All-gather one array per device (see :meth:`Communicator.all_gather`)."""
        return self._each("all_gather", [send or [None] * self.size, recv], streams, {})

    def reduce_scatter(
        self,
        send: Sequence[hal.Array],
        recv: Sequence[hal.Array] | None = None,
        *,
        op: str = "sum",
        streams: Sequence[hal.Stream],
    ) -> Work:
        """Reduce-scatter one array per device (see :meth:`Communicator.reduce_scatter`)."""
        return self._each("reduce_scatter", [send, recv or [None] * self.size], streams, {"op": op})

    def broadcast(
        self,
        send: Sequence[hal.Array],
        recv: Sequence[hal.Array] | None = None,
        *,
        root: int,
        streams: Sequence[hal.Stream],
    ) -> Work:
        """Broadcast from device ``root`` (see :meth:`Communicator.broadcast`)."""
        return self._each("broadcast", [send, recv or [None] * self.size], streams, {"root": root})

    def reduce(
        self,
        send: Sequence[hal.Array],
        recv: Sequence[hal.Array] | None = None,
        *,
        op: str = "sum",
        root: int,
        streams: Sequence[hal.Stream],
    ) -> Work:
        """Reduce to device ``root`` (see :meth:`Communicator.reduce`)."""
        return self._each(
            "reduce", [send, recv or [None] * self.size], streams, {"op": op, "root": root}
        )

    def all_to_all(
        self,
        send: Sequence[hal.Array],
        recv: Sequence[hal.Array] | None = None,
        *,
        streams: Sequence[hal.Stream],
    ) -> Work:
        """All-to-all between devices (see :meth:`Communicator.all_to_all`)."""
        return self._each("all_to_all", [send, recv or [None] * self.size], streams, {})

    def send(
        self, data: hal.Array, src: int, dst: int, *, tag: int = 0, stream: hal.Stream
    ) -> Work:
        """Copy ``data`` of device ``src`` to device ``dst`` (pair with :meth:`recv` on ``dst``).

        As :meth:`Communicator.isend`: returns at once, and sends and receives may be posted
        in any order before any wait.
        """
        _check_root(src, self.size, "src")
        return self._ranks[src].isend(data, dst, tag=tag, stream=stream)

    def recv(
        self, data: hal.Array, dst: int, src: int, *, tag: int = 0, stream: hal.Stream
    ) -> Work:
        """Receive into ``data`` of device ``dst`` what device ``src`` sends with ``tag``."""
        _check_root(dst, self.size, "dst")
        return self._ranks[dst].irecv(data, src, tag=tag, stream=stream)

    isend = send
    irecv = recv

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Group point-to-point calls of every device (see :meth:`Communicator.group`)."""
        with contextlib.ExitStack() as stack:
            for c in self._ranks:
                stack.enter_context(c.group())
            yield

    def barrier(self, *, streams: Sequence[hal.Stream] | None = None) -> Work:
        """Return a handle that completes when every device's queued calls have run.

        With ``streams`` (one per device), each device's barrier starts after its stream's
        earlier work and occupies the stream (see :meth:`Communicator.barrier`).
        """
        if streams is None:
            for e in self._engines:
                e.prepare()
            return Work._group([c.barrier() for c in self._ranks])
        return self._each("barrier", [], streams, {})

    def close(self) -> None:
        """Finish queued calls and stop the per-device threads. Idempotent."""
        for c in self._ranks:
            c._engine.stop()  # every thread ends at once, then each is joined
        for c in self._ranks:
            c.close()

    def __enter__(self) -> DeviceCommunicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<hal.comm.DeviceCommunicator over {', '.join(map(str, self.devices))}>"


def _dry_run(
    c: Communicator, name: str, args: list[Any], stream: object, kwargs: dict[str, Any]
) -> None:
    """Run a call's argument checks without enqueuing anything."""
    probe = _Probe(c)
    getattr(Communicator, name)(probe, *args, stream=stream, **kwargs)


class _Probe(Communicator):
    """A stand-in whose ``_submit`` only checks the stream: used to validate every rank first."""

    _rerun = False

    def __init__(self, real: Communicator) -> None:
        self._engine = real._engine
        self._engines = real._engines
        self._config = real._config
        self._hosts = real._hosts
        self.rank, self.size = real.rank, real.size
        self._stream_ok = _no_ref
        self._checked = {}

    def _submit(self, collective: str, *, stream: hal.Stream | None, **kwargs: Any) -> Work:
        if stream is None and collective == "barrier":
            return Work(None)
        if not isinstance(stream, hal.Stream):
            raise TypeError(f"stream={stream!r} is not a hal.Stream")
        if stream.device != self._engine.device:
            raise hal.DeviceMismatchError(
                f"stream belongs to {stream.device}; rank {self.rank}'s device is {self._engine.device}"
            )
        return Work(None)
