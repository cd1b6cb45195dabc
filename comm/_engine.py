"""One rank's engine: a thread that runs this rank's calls in order on its own stream.

A call is validated and planned on the caller's thread; the engine thread then waits for the
work the caller enqueued before it (an event on the caller's stream), checks that every
rank called the same thing, runs the algorithm, and completes the :class:`Work` handle.
Point-to-point calls queued back to back run together in one phase (hal.comm._p2p.Phase),
which absorbs those queued while it runs; the next collective waits for it (issue order).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import hal
from hal.comm._algorithms import Run
from hal.comm._flight import FlightRecorder
from hal.comm._ops import SIGNATURE_BYTES, Signature, finish_avg, sub, widen
from hal.comm._plan import Plan
from hal.comm._transport import CallContext, Recv, Send, Transport

__all__ = ["Call", "Engine", "Rerun", "SharedEvent", "Work"]

_log = logging.getLogger("hal.comm")


class Work:
    """The handle of an asynchronous call: :meth:`wait` for its result.

    A call made with ``stream=s`` also occupies ``s`` (as on NCCL): work enqueued on ``s``
    after the call starts once the call's output is in place, without any host wait.

    Attributes:
        plan: how the call runs (algorithm, transport, chunk size, path); a list of plans
            (one per device) for calls of an in-process communicator.
    """

    def __init__(self, plan: Any, *, done: bool = False) -> None:
        self.plan = plan
        self._done = _DONE if done else threading.Event()
        self._error: BaseException | None = None
        self._parts: list[Work] = []
        self._callbacks: list[Callable[[BaseException | None], None]] | None = None
        self._reported = False  # wait() raised the error: streams need not raise it again
        self._failed_signals: list[hal.HostSignal] = []  # failed with the error, not yet reported

    @classmethod
    def _group(cls, parts: list[Work]) -> Work:
        w = cls([p.plan for p in parts])
        w._parts = parts
        return w

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        with _CALLBACKS_LOCK:
            if self._done is not _DONE:
                self._done.set()
            callbacks, self._callbacks = self._callbacks, None
        for fn in callbacks or ():
            try:
                fn(error)
            except Exception:  # a callback must not take the engine thread down
                _log.exception("a completion callback of a hal.comm call failed")

    def _on_done(self, fn: Callable[[BaseException | None], None]) -> None:
        """Call ``fn(error)`` once the call completed (at once if it has); ``error`` is None on success."""
        if self._parts:
            for p in self._parts:
                p._on_done(fn)
            return
        with _CALLBACKS_LOCK:
            if not self._done.is_set():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self._error)

    def _release_on_done(self, stream: hal.Stream) -> None:
        """Make ``stream`` wait (a host signal) until the call completed; a failure fails the signal."""
        for p in self._parts or [self]:
            if p._done.is_set() and p._error is None:
                continue  # already in place: nothing to wait for
            p._on_done(p._releaser(stream.wait_host()))

    def _releaser(self, signal: hal.HostSignal) -> Callable[[BaseException | None], None]:
        """Return the completion callback that sets ``signal``, or fails it with the call's error.

        A failure is raised once: by ``wait()`` or by the stream's ``synchronize()``, whichever
        reports it first (``HostSignal.acknowledge`` withdraws it from the stream).
        """

        def release(error: BaseException | None) -> None:
            if error is None:
                signal.set()
                return
            with _CALLBACKS_LOCK:
                reported = self._reported
                if not reported:
                    self._failed_signals.append(signal)
            if reported:
                signal.set()  # wait() already raised it
            else:
                signal.fail(error)

        return release

    def _report(self) -> None:
        """Note that ``wait()`` raises the error: the streams that waited need not raise it."""
        with _CALLBACKS_LOCK:
            self._reported = True
            signals, self._failed_signals = self._failed_signals, []
        for sig in signals:
            sig.acknowledge()

    def done(self) -> bool:
        """Return True when the call has completed (successfully or not); never blocks."""
        if self._parts:
            return all(p.done() for p in self._parts)
        return self._done.is_set()

    def wait(self, timeout: float | None = None, *, stream: hal.Stream | None = None) -> None:
        """Block until the call completed and its output is in place; raise its error if it failed.

        With ``stream``, block nothing: make work enqueued on ``stream`` (any stream, of any
        device) after this call wait until the call completed, and return at once. A failure
        of the call releases the stream too and is raised once: by ``wait()``, or, if no
        ``wait()`` raised it first, by ``stream.synchronize()`` as :class:`hal.StreamError`
        caused by the call's error (``wait()`` always raises it). On a backend without
        host signals (``Capabilities.host_signal``), the next call that enqueues on
        ``stream`` blocks the host until the call completed instead.

        Args:
            timeout: seconds to wait at most (``None``: until done; a stalled collective still ends
                with :class:`hal.CommError` after ``HAL_COMM_TIMEOUT_MS``). Host waits only.
            stream: a stream to order after the call instead of blocking the host.

        Raises:
            hal.CommError: a mismatch, a timeout or a lost rank.
            TimeoutError: ``timeout`` passed first (the call goes on).
            TypeError: ``stream`` is not a hal.Stream.
            ValueError: both ``timeout`` and ``stream`` were given.
        """
        if self._done is _DONE and stream is None and self._error is None and not self._parts:
            return  # an inline call that completed: nothing to wait for
        if stream is not None:
            if not isinstance(stream, hal.Stream):
                raise TypeError(f"stream={stream!r} is not a hal.Stream")
            if timeout is not None:
                raise ValueError(
                    f"timeout={timeout!r} applies to host waits; wait(stream=...) never blocks"
                )
            self._release_on_done(stream)
            return
        parts = self._parts or [self]
        for p in parts:
            if not p._done.wait(timeout):
                raise TimeoutError(f"the call is still running after {timeout} s")
        errors = [p._error for p in parts if p._error is not None]
        if errors:
            for p in parts:
                p._report()
            raise errors[0]

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"<hal.comm.Work {state}>"


_CALLBACKS_LOCK = (
    threading.Lock()
)  # Work._finish against Work._on_done (one lock: rarely contended)
_DONE = threading.Event()
_DONE.set()  # shared by handles created complete (inline calls): no Event per call


class _LazyPlan:
    """``_Repeated.plan``: the plan made the first time it is read, then kept on the handle."""

    def __get__(self, work: Any, owner: type | None = None) -> Any:
        if work is None:
            return self
        plan = work.__dict__["plan"] = work._base.with_seq(work._seq)
        return plan


class _Repeated(Work):
    """The handle of a call :meth:`Engine.rerun` ran: complete, its :class:`Plan` made when read.

    The same handle as ``Work(base.with_seq(seq), done=True)``, without making the plan or
    setting the fields every call: they start as the class's until a call sets its own.
    The engine's plan log keeps it in the plan's place (:meth:`Engine.recent_plans`).
    """

    plan = _LazyPlan()
    _done = _DONE
    _error: BaseException | None = None
    _parts: list[Work] = []  # never appended to: a group's handle gets a list of its own
    _callbacks = None
    _reported = False
    #: appended to only after a failure (Work._releaser), when rerun gives the handle a list
    _failed_signals: list[hal.HostSignal] = ()  # type: ignore[assignment]

    def __init__(self, base: Plan, seq: int) -> None:
        self._base = base
        self._seq = seq


class SharedEvent:
    """An event recorded once on a caller's stream and shared by back-to-back point-to-point calls.

    Each call that holds it calls :meth:`close` once when it ends; the event itself is closed
    with the last. ``count`` is the stream's :attr:`hal.Stream.enqueue_count` after the
    calls' host signals: a later call may share the event only if nothing was enqueued since.
    """

    __slots__ = ("_lock", "_refs", "count", "event")

    def __init__(self, event: hal.Event) -> None:
        self.event = event
        self.count = -1
        self._refs = 1
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        """Take another reference; False if the event was already closed."""
        with self._lock:
            if self._refs <= 0:
                return False
            self._refs += 1
            return True

    def query(self) -> bool:
        """Return True once the stream reached the event."""
        return self.event.query()

    def close(self) -> None:
        """Drop one reference; the last closes the event."""
        with self._lock:
            self._refs -= 1
            last = self._refs == 0
        if last:
            self.event.close()


@dataclasses.dataclass
class Call:
    """A validated call, as the engine runs it (arrays are flat 1-D views)."""

    collective: str
    op: str
    dtype: str
    count: int
    root: int
    send: hal.Array | None
    recv: hal.Array | None
    plan: Plan
    event: hal.Event | None
    peer: int = -1
    stream: hal.Stream | None = None  # the caller's stream (inline calls wait for it directly)
    inline: bool = False  # run on the caller's thread
    flight: Any = None  # this call's flight-recorder entry (FlightRecorder.add or again)
    tag: int = 0  # point-to-point: the message tag (FIFO per peer and tag)
    group: Any = (
        None  # point-to-point: its group (hal.comm._p2p.Group; the calls complete together)
    )


@dataclasses.dataclass(eq=False)
class Rerun:
    """A call prepared to run again, on the caller's thread, with the same arguments (:meth:`Engine.rerun`).

    It holds no array: only the facts of the call, its plan (any sequence number), its flight
    entry's fields and the transport's prepared form (addresses of buffers the caller keeps
    checking for being open, ``hal.comm.Communicator.all_reduce``).
    """

    collective: str
    op: str
    dtype: str
    count: int
    root: int
    plan: Plan
    entry: dict[str, Any]  # the fields of its flight-recorder entries
    prep: Any  # the transport's prepared call (NativeShmTransport.prepare_call)
    #: the transport dropped what it prepared (a compiled program evicted): prepare it again
    stale: bool = False

    def call(self, plan: Plan, stream: hal.Stream, flight: Any) -> Call:
        """Return the :class:`Call` it stands for (for its errors; no arrays)."""
        return Call(
            self.collective, self.op, self.dtype, self.count, self.root, None, None, plan, None,
            stream=stream, inline=True, flight=flight,
        )  # fmt: skip


#: The point-to-point calls: they run in phases (hal.comm._p2p.Phase), not one by one.
P2P_CALLS = frozenset({"send", "recv"})
_NOTHING: Any = object()  # no call held back by a point-to-point phase


def _whole(
    transport: Transport, sends: Sequence[Send], recvs: Sequence[Recv], ctx: CallContext
) -> None:
    """Exchange signatures as one piece each (whatever the call's chunk size), so that a
    point-to-point receive that meets one reads it whole (hal.comm._p2p)."""
    chunk = ctx.chunk_bytes
    ctx.chunk_bytes = max(chunk, SIGNATURE_BYTES)
    try:
        transport.exchange(sends, recvs, ctx)
    finally:
        ctx.chunk_bytes = chunk


class _Agreement:
    """Every rank checks that the others called the same thing, before it uses their data.

    Each rank sends its call's signature to every peer first thing (it is buffered, nothing
    waits), then starts the algorithm; the first receive from a peer waits for that peer's
    signature (FIFO: it precedes the peer's data) and compares it; the call ends by checking
    the peers it never received from. A mismatch raises CommError naming the ranks and fields,
    before any of the mismatched peer's data has been used. One round trip saved per call.
    """

    def __init__(self, engine: Engine, run: Run, call: Call) -> None:
        self.rank = engine.rank
        self.call = call
        self.mine = engine._signature(call)
        peers = [p for p in range(engine.size) if p != engine.rank]
        self.pending = set(peers)
        self.packed = self.mine.pack()
        if peers:
            out = np.frombuffer(self.packed, dtype=np.uint8).copy()
            _whole(run.transport, [Send(p, out) for p in peers], (), run.ctx)

    def check(self, run: Run, peers: Sequence[int]) -> None:
        """Receive and compare the signatures of ``peers`` not checked yet."""
        todo = sorted({p for p in peers if p in self.pending})
        if not todo:
            return
        got = {p: np.zeros(SIGNATURE_BYTES, dtype=np.uint8) for p in todo}
        _whole(run.transport, (), [Recv(p, got[p]) for p in todo], run.ctx)
        self.pending.difference_update(todo)
        mine, call = self.mine, self.call
        problems: list[str] = []
        bad: list[int] = []
        for p in todo:
            raw = got[p].tobytes()
            if raw == self.packed:  # the same call (the common case): nothing to parse
                continue
            theirs = Signature.unpack(raw)
            if theirs.collective == "p2p":  # a point-to-point message this rank never received
                bad.append(p)
                problems.append(
                    f"rank {p} sent it a point-to-point message first (message {theirs.seq} of the pair, "
                    f"tag {theirs.root}, {theirs.count} x {theirs.dtype}) that rank {self.rank} never received"
                )
                continue
            diffs = mine.differences(theirs)
            if diffs:
                bad.append(p)
                problems.append(f"rank {p} called {theirs.describe()} ({'; '.join(diffs)})")
        if problems:
            what = call.collective
            raise hal.CommError(
                f"{what} mismatch: rank {self.rank} called {mine.describe()}, but "
                + "; ".join(problems)
                + " -- every rank must call the same collectives in the same order",
                op=call.collective,
                ranks=(self.rank, *bad),
            )

    def finish(self, run: Run) -> None:
        """Check the peers this rank never received from."""
        self.check(run, list(self.pending))


def signature_mismatch(
    rank: int, collective: str, mine: Signature, theirs: dict[int, Signature]
) -> None:
    """Raise the CommError of :class:`_Agreement` if any peer's signature differs from ``mine``."""
    problems: list[str] = []
    bad: list[int] = []
    for p, sig in sorted(theirs.items()):
        diffs = mine.differences(sig)
        if diffs:
            bad.append(p)
            problems.append(f"rank {p} called {sig.describe()} ({'; '.join(diffs)})")
    if problems:
        raise hal.CommError(
            f"{collective} mismatch: rank {rank} called {mine.describe()}, but "
            + "; ".join(problems)
            + " -- every rank must call the same collectives in the same order",
            op=collective,
            ranks=(rank, *bad),
        )


class Engine:
    """Runs one rank's calls in order on a thread of its own, on a stream of its own.

    Both are made on first use: the stream with the first call, the thread with the first call
    queued to it (inline calls run on the caller's thread); :meth:`close` releases what was made.
    """

    def __init__(
        self,
        *,
        rank: int,
        size: int,
        device: hal.Device,
        transport: Transport,
        timeout_s: float,
        check_agreement: bool,
        label: str,
        inline_bytes: int = 0,
    ) -> None:
        self.rank = rank
        self.size = size
        self.device = device
        self.transport = transport
        self.timeout_s = timeout_s
        self.check_agreement = check_agreement
        self.inline_bytes = inline_bytes
        self._pending = 0
        self._pending_lock = threading.Lock()
        # the engine's stream and thread are made on the first call that needs them (below):
        # a communicator never called, or called inline only, starts neither
        self._start_lock = threading.Lock()
        self._label = label
        self.seq = 0
        #: the plans of the last calls (:meth:`recent_plans`); a call :meth:`rerun` ran is kept
        #: as its handle (``_Repeated``), whose plan is made when read
        self.plans: collections.deque[Plan | Work] = collections.deque(maxlen=256)
        self.host_groups: list[list[int]] = [list(range(size))]  # the ranks of each host (topology)
        self.recorder = FlightRecorder(rank)
        self.aborted = threading.Event()
        #: per caller stream, the ordering point back-to-back point-to-point calls share
        self.p2p_points: weakref.WeakKeyDictionary[hal.Stream, SharedEvent] = (
            weakref.WeakKeyDictionary()
        )
        self.failure: BaseException | None = None
        #: the direct intra-host path (hal.comm._ipc.IpcState), set by hal.comm.init; None: none
        self.ipc: Any = None
        self._held: Any = _NOTHING  # the call after a point-to-point phase (taken from the queue)
        self.provider: Any = (
            None  # the collective provider serving this rank (hal.comm._providers), if any
        )
        self._grouping = 0  # depth of comm.group() blocks
        self._group_calls: list[tuple[Call, Work]] = []
        self.in_p2p = False  # a point-to-point phase runs (a queued call wakes the transport)
        self._scratch: hal.Buffer | None = None
        self._temps: list[hal.Buffer] = []
        self._queue: queue.SimpleQueue[tuple[Call, Work] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False  # no new calls (stop)
        self._released = False  # everything released (close)

    # -- resources, made on first use ------------------------------------------------------
    #: the rank's stream (its copies and reductions run there); made on first use
    stream: hal.Stream

    def __getattr__(self, name: str) -> Any:
        if name != "stream":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self._make_stream()

    def _make_stream(self) -> hal.Stream:
        """Create the rank's stream (once; the first call made on the communicator does)."""
        with self._start_lock:
            stream = self.__dict__.get("stream")
            if stream is None:
                if self._closed:
                    raise hal.CommError("the communicator is closed", op="stream")
                stream = self.__dict__["stream"] = self.device.create_stream()
            return stream

    def prepare(self) -> None:
        """Make the stream and start the thread now, if not yet (nothing once closed).

        A communicator over several devices prepares every device's engine before it submits a
        call to any: a failure to make them is then the call's error, with nothing queued.
        """
        if self._closed:
            return
        if "stream" not in self.__dict__:
            self._make_stream()
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        """Start the engine thread (once: the first call queued to it does; inline calls need none)."""
        with self._start_lock:
            if self._thread is not None or self._closed:
                return
            thread = threading.Thread(
                target=self._loop, name=f"hal-comm-{self._label}-rank{self.rank}", daemon=True
            )
            thread.start()
            self._thread = thread

    # -- submission -----------------------------------------------------------------------
    def next_seq(self) -> int:
        """Return the sequence number of the next collective (called at submission)."""
        self.seq += 1
        return self.seq

    def wants_inline(self, nbytes: int) -> bool:
        """True if a call of ``nbytes`` runs on the caller's thread (small, nothing queued)."""
        return (
            nbytes <= self.inline_bytes
            and self._pending == 0
            and not self._closed
            and not self._grouping
        )

    def submit(self, call: Call) -> Work:
        """Queue ``call`` (or run it now when ``call.event`` is None); return its handle."""
        if self._closed:
            raise hal.CommError("the communicator is closed", op=call.collective)
        if "stream" not in self.__dict__:
            self._make_stream()  # here, so that a failure is the caller's error
        if call.collective in P2P_CALLS:
            return self._submit_p2p(call)
        if self._grouping:
            if call.event is not None:
                call.event.close()
            raise hal.CommError(
                f"{call.collective} inside comm.group(): only point-to-point calls (send, recv, isend, irecv) "
                "may be grouped",
                op=call.collective,
            )
        work = Work(call.plan, done=call.inline)
        self._track(call, running=call.inline)
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("rank %d plan: %s", self.rank, call.plan)
        if call.inline:
            self._execute(call, work)  # small and nothing queued: order is kept
            if isinstance(work._error, (KeyboardInterrupt, SystemExit)):
                raise work._error
            return work
        if self._thread is None:
            self._start()
        with self._pending_lock:
            self._pending += 1
        self._queue.put((call, work))
        return work

    def prepare_rerun(self, call: Call) -> Rerun | None:
        """Return ``call`` prepared for :meth:`rerun`, or None where only :meth:`submit` runs it.

        Prepared: a collective that runs inline (``nbytes`` up to ``inline_bytes``) as one whole
        native call of the transport (``prepare_call``: one-piece actions or a compiled program),
        on the generic algorithms, without ``avg``'s device work. Nothing is run or recorded.
        """
        prepare = getattr(self.transport, "prepare_call", None)
        plan = call.plan
        if (
            prepare is None
            or call.collective in P2P_CALLS
            or plan.provider != "generic"
            or plan.nbytes > self.inline_bytes
            or call.op == "avg"
            or call.stream is None
        ):
            return None
        prep = prepare(call, plan.chunk_bytes, self)
        if prep is None:
            return None
        entry = self._flight_entry(call, running=True)
        return Rerun(call.collective, call.op, call.dtype, call.count, call.root, plan, entry, prep)

    def rerun(self, again: Rerun, stream: hal.Stream) -> Work | None:
        """Run the prepared call ``again`` now on this thread, after ``stream``'s earlier work.

        What :meth:`submit` and :meth:`_execute` do for the same inline call (a sequence number,
        the plan, a flight entry, the caller's stream synchronized first, every rank's signature
        checked, a failure failing the communicator), without planning or allocating per call:
        the transport starts it with one native call. Returns None (nothing done) when the call
        cannot run inline now (calls queued, a group open, the communicator closed or failed, a
        tracer on, the transport holding a message read ahead, or no longer holding what it
        prepared: ``again.stale``): :meth:`submit` runs it then.
        """
        # a Rerun is made only by the native shm transport (prepare_call), which has these
        tr: Any = self.transport
        if (
            self._pending
            or self._grouping
            or self._closed
            or self.failure is not None
            or hal.tracer() is not None
            or tr.__dict__.get("_hal_pushback")
        ):
            return None
        if not tr.prepared_live(again.prep):
            again.stale = True
            return None
        self.seq = seq = self.seq + 1
        work = _Repeated(again.plan, seq)  # its plan (with seq) is made only when read
        self.plans.append(work)
        flight = self.recorder.again(again.entry, seq)
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("rank %d plan: %s", self.rank, work.plan)
        try:
            stream.synchronize()  # the caller's earlier work is done
            rc = tr.run_prepared(again.prep, seq, self)
            if rc:  # not done at once (a peer late, a mismatch): the transport's waits and errors
                call = again.call(work.plan, stream, flight)
                ctx = self._context(call)
                # the progress clock starts with the call (when its flight record was made)
                ctx.last_progress = time.monotonic() - max(0.0, time.time() - flight[2])
                tr.finish_prepared(again.prep, rc, call, ctx, self)
        except BaseException as exc:  # noqa: BLE001 - handed to Work.wait(), as _execute does
            work._failed_signals = []  # its own: a stream released by the failed call keeps it
            self._fail(again.call(work.plan, stream, flight), work, exc)
            if isinstance(work._error, (KeyboardInterrupt, SystemExit)):
                raise work._error from None
            return work
        self.recorder.done(flight)
        return work

    def recent_plans(self) -> list[Plan]:
        """Return the plans of the most recent calls (up to 256), oldest first."""
        return [p.plan if isinstance(p, Work) else p for p in list(self.plans)]

    def last_plan(self) -> Plan | None:
        """Return the plan of the most recent call, or None."""
        try:
            p = self.plans[-1]
        except IndexError:
            return None
        return p.plan if isinstance(p, Work) else p

    def _submit_p2p(self, call: Call) -> Work:
        if self._thread is None:
            self._start()
        if call.inline:  # never on the caller's thread: a receive would wait there for its peer
            call.inline = False
            if call.stream is not None:
                call.event = self.device.create_event()
                call.event.record(call.stream)
        work = Work(call.plan)
        if self._grouping:
            self._group_calls.append((call, work))
        else:
            self._enqueue(call, work)
        return work

    def _flight_entry(self, call: Call, *, running: bool) -> dict[str, Any]:
        """Return the flight recorder's entry of ``call``, not recorded (``running``: it starts now)."""
        plan = call.plan
        return self.recorder.entry(
            seq=plan.seq,
            op=call.collective,
            reduce_op=call.op,
            dtype=call.dtype,
            count=call.count,
            nbytes=plan.nbytes,
            algorithm=plan.algorithm,
            peer=call.peer,
            running=running,
        )

    def _track(self, call: Call, *, running: bool) -> None:
        """Keep the plan of ``call`` and record its flight entry (``call.flight``)."""
        self.plans.append(call.plan)
        call.flight = self.recorder.keep(self._flight_entry(call, running=running))

    def _enqueue(self, call: Call, work: Work) -> None:
        self._track(call, running=False)
        with self._pending_lock:
            self._pending += 1
        self._queue.put((call, work))
        if self.in_p2p:
            self.transport.wake()

    def group_start(self) -> None:
        """Start collecting point-to-point calls (``comm.group()``; nests)."""
        self._grouping += 1

    def group_end(self, *, discard: bool = False) -> None:
        """Queue the collected calls together (or fail them unstarted with ``discard``)."""
        self._grouping -= 1
        if self._grouping:
            return
        calls, self._group_calls = self._group_calls, []
        if discard or self._closed:
            for call, work in calls:
                if call.event is not None:
                    call.event.close()
                work._finish(
                    hal.CommError(
                        f"{call.collective} (peer {call.peer}, tag {call.tag}) was not started: its comm.group() "
                        "block "
                        + ("raised" if discard else "ended after the communicator was closed"),
                        op=call.collective,
                    )
                )
            return
        if calls:
            from hal.comm._p2p import Group

            group = Group(len(calls))
            for call, work in calls:
                call.group = group
                self._enqueue(call, work)

    def pending_done(self) -> None:
        """Count one queued call as finished."""
        with self._pending_lock:
            self._pending -= 1

    def _loop(self) -> None:
        from hal.comm._p2p import Phase

        while True:
            if self._held is not _NOTHING:
                item, self._held = self._held, _NOTHING
            else:
                item = self._queue.get()
            if item is None:
                return
            call, work = item
            if call.collective in P2P_CALLS:
                Phase(self).run(call, work)
                continue
            try:
                self._execute(call, work)
            finally:
                self.pending_done()

    def take_queued(self) -> tuple[Call, Work] | None:
        """Return the next queued point-to-point call without waiting, or None (a phase absorbs them).

        The first other call (or the close marker) is held back: it runs after the phase.
        """
        if self._held is not _NOTHING:
            return None
        try:
            item = self._queue.get_nowait()
        except queue.Empty:
            return None
        if item is None or item[0].collective not in P2P_CALLS:
            self._held = item
            return None
        return item

    def _execute(self, call: Call, work: Work) -> None:
        """Run ``call`` on this thread and complete ``work``."""
        flight = call.flight
        if self.failure is not None:
            err = hal.CommError(
                f"{call.collective}: the communicator failed earlier ({self.failure}); create a new one",
                op=call.collective,
                ranks=getattr(self.failure, "ranks", ()),
            )
            if flight is not None:
                self.recorder.state(flight, "aborted" if self.aborted.is_set() else "failed", err)
            work._finish(err)
            return
        if flight is not None and not call.inline:  # an inline call's entry starts running
            self.recorder.state(flight, "running")
        try:
            tr = hal.tracer()
            if tr is None:
                self._run(call)
            else:  # the timeline: one slice per collective on this device's comm track
                p = call.plan
                info = {
                    "algorithm": p.algorithm,
                    "bytes": p.nbytes,
                    "transport": p.transport,
                    "path": p.path,
                    "seq": p.seq,
                    "rank": self.rank,
                    "provider": p.provider,
                }
                if p.fallback:
                    info["fallback"] = p.fallback
                with tr.span(f"{self.device} comm", call.collective, "collective", info):
                    self._run(call)
        except BaseException as exc:  # noqa: BLE001 - handed to Work.wait()
            self._fail(call, work, exc)
        else:
            if flight is not None:
                self.recorder.state(flight, "done")
            work.plan = call.plan  # the IPC path may have fallen back to the slots (plan.fallback)
            work._finish()
        finally:
            self._free_temps()

    def _fail(self, call: Call, work: Work, exc: BaseException) -> None:
        """Complete ``work`` with ``exc``, the failure of ``call`` (it fails the communicator)."""
        flight = call.flight
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            self.failure = hal.CommError(
                f"{call.collective} interrupted on rank {self.rank}", op=call.collective
            )
            if flight is not None:
                self.recorder.state(flight, "failed", self.failure)
            work._finish(exc)
            return
        if not isinstance(exc, hal.HalError):
            exc = hal.CommError(
                f"{call.collective} failed on rank {self.rank}: {type(exc).__name__}: {exc}",
                op=call.collective,
            )
        elif isinstance(exc, hal.CommError) and exc.op is None:  # a transport error: say which call
            exc = hal.CommError(
                f"{call.collective} (seq {call.plan.seq}): {exc}",
                op=call.collective,
                ranks=exc.ranks,
            )
        self.failure = exc
        _log.debug("rank %d: %s failed: %s", self.rank, call.collective, exc)
        if flight is not None:
            self.recorder.state(flight, "aborted" if self.aborted.is_set() else "failed", exc)
        if not self.aborted.is_set():
            self.recorder.dump(f"{call.collective} seq {call.plan.seq} failed: {exc}")
        work._finish(exc)

    # -- buffers --------------------------------------------------------------------------
    def _scratch_for(self, nbytes: int) -> hal.Buffer:
        if self._scratch is None or self._scratch.nbytes < nbytes:
            if self._scratch is not None:
                self.stream.synchronize()
                self._scratch.close()
            self._scratch = self.device.alloc(max(nbytes, 4096))
        return self._scratch

    def _temp(self, dtype: Any, n: int) -> hal.Array:
        buf = self.device.alloc(n * np.dtype(dtype).itemsize)
        self._temps.append(buf)
        return buf.view(dtype, n)

    def _free_temps(self) -> None:
        if self._temps:
            try:
                self.stream.synchronize()
            except hal.HalError:
                pass
            for b in self._temps:
                b.close()
            self._temps.clear()

    # -- execution ------------------------------------------------------------------------
    def _run(self, call: Call) -> None:
        plan = call.plan
        if call.event is not None:
            self.stream.wait(call.event)
        elif call.stream is not None:
            call.stream.synchronize()  # inline: the caller's earlier work is done
        ctx = self._context(call)
        whole = getattr(self.transport, "run_whole", None)  # a whole small call in one native step
        if whole is not None and plan.provider == "generic" and whole(call, ctx, self):
            if call.event is not None:
                call.event.close()
            return
        run = Run(self.rank, self.size, self.transport, ctx, self._temp)
        run.host_groups = self.host_groups
        provided = plan.provider != "generic" and self.provider is not None
        if self.check_agreement and not (provided and hasattr(self.provider, "agree")):
            run.agreement = _Agreement(self, run, call)
        if provided:
            self._run_provider(run, call, ctx)
            return
        work_call, narrow = widen(
            call, self.rank, self.size, run.temp, self.stream
        )  # float16/bfloat16
        if call.plan.algorithm == "ipc":  # the direct intra-host path (hal.comm._ipc)
            from hal.comm import _ipc

            ran = _ipc.run(self, run, work_call)
            if ran is not None:
                call.plan = ran
        else:
            getattr(self, "_do_" + call.collective)(run, work_call)
        if narrow is not None:
            narrow()
        if run.agreement is not None:
            run.agreement.finish(run)
        self.stream.synchronize()
        if call.event is not None:
            call.event.close()

    def _context(self, call: Call) -> CallContext:
        """Return the transport's context of ``call`` (its stream, scratch space, progress clock)."""
        ctx = CallContext(
            collective=call.collective,
            seq=call.plan.seq,
            stream=self.stream,
            timeout_s=self.timeout_s,
            scratch=self._scratch_for,
            chunk_bytes=call.plan.chunk_bytes,
        )
        ctx.aborted = self.aborted
        return ctx

    def _run_provider(self, run: Run, call: Call, ctx: CallContext) -> None:
        """Run ``call`` whole on the collective provider, once every rank agreed it called the same."""
        if run.agreement is not None:
            run.agreement.finish(
                run
            )  # a mismatch is named here, before the library could hang on it
        elif (
            self.check_agreement
        ):  # the provider exchanges the signatures itself (one library call)
            mine = self._signature(call)
            theirs = self.provider.agree(mine.pack(), call, ctx)
            signature_mismatch(
                self.rank,
                call.collective,
                mine,
                {p: Signature.unpack(b) for p, b in enumerate(theirs) if p != self.rank},
            )
        self.stream.synchronize()  # the caller's earlier work (waited for above) is complete
        out = self.provider.run(call, ctx)
        if out is not None:
            self._avg(out, call)
        self.stream.synchronize()
        if call.event is not None:
            call.event.close()

    def _signature(self, call: Call) -> Signature:
        return Signature(
            call.plan.seq,
            call.collective,
            call.op,
            call.dtype,
            call.count,
            call.root,
            call.plan.chunk_bytes,
            call.plan.algorithm,
        )

    def _avg(self, arr: hal.Array, call: Call) -> None:
        if call.op == "avg":
            finish_avg(arr, self.size, self.stream)

    def move(self, run: Run, call: Call) -> hal.Array | None:
        """Make ``call``'s algorithm steps on ``run``, without ``avg``'s division; return what it divides.

        The native shm engine records these steps (``run`` then only records) and runs them
        whole in one C call (``NativeShmTransport.run_whole``); ``_do_*`` run them here.
        """
        if call.collective == "all_reduce":
            return self._move_all_reduce(run, call)
        if call.collective == "reduce_scatter":
            return self._move_reduce_scatter(run, call)
        if call.collective == "reduce":
            return self._move_reduce(run, call)
        getattr(self, "_do_" + call.collective)(run, call)
        return None

    def _move_all_reduce(self, run: Run, call: Call) -> hal.Array:
        assert call.send is not None and call.recv is not None
        src = None if call.recv is call.send else call.send
        run.all_reduce(call.recv, call.op, call.plan.algorithm, src)
        return call.recv

    def _do_all_reduce(self, run: Run, call: Call) -> None:
        self._avg(self._move_all_reduce(run, call), call)

    def _do_all_gather(self, run: Run, call: Call) -> None:
        assert call.recv is not None
        if call.send is not None:
            run.copy(sub(call.recv, self.rank * call.count, call.count), call.send)
        run.all_gather(call.recv, call.count, call.plan.algorithm)

    def _do_reduce_scatter(self, run: Run, call: Call) -> None:
        self._avg(self._move_reduce_scatter(run, call), call)

    def _move_reduce_scatter(self, run: Run, call: Call) -> hal.Array:
        assert call.send is not None
        if call.recv is None:
            work, src = call.send, None
        else:  # out of place: the ring reads the input once and reduces into scratch space
            work, src = run.temp(call.send.dtype, call.send.size), call.send
        start, n = run.reduce_scatter(work, call.op, call.plan.algorithm, src)
        out = sub(work, start, n)
        if call.recv is not None:
            run.copy(call.recv, out)
            out = call.recv
        return out

    def _do_broadcast(self, run: Run, call: Call) -> None:
        assert call.send is not None
        if call.recv is not None and self.rank == call.root and call.plan.algorithm == "tree":
            # out of place, the root of a tree only sends: from its input, then it copies the
            # input to its output (the native shm engine runs that copy beside the sends)
            run.broadcast(call.send, call.root, "tree")
            run.copy(call.recv, call.send)
            return
        buf = call.send if call.recv is None else call.recv
        if call.recv is not None and self.rank == call.root:
            run.copy(call.recv, call.send)
        run.broadcast(buf, call.root, call.plan.algorithm)

    def _do_reduce(self, run: Run, call: Call) -> None:
        out = self._move_reduce(run, call)
        if out is not None:
            self._avg(out, call)

    def _move_reduce(self, run: Run, call: Call) -> hal.Array | None:
        assert call.send is not None
        if self.rank == call.root:
            buf = call.send if call.recv is None else call.recv
            if call.recv is not None:
                run.copy(call.recv, call.send)
        else:
            buf = run.snapshot(call.send)
        run.reduce(buf, call.op, call.root, call.plan.algorithm)
        return buf if self.rank == call.root else None

    def _do_all_to_all(self, run: Run, call: Call) -> None:
        assert call.send is not None
        if call.recv is None:
            run.all_to_all(run.snapshot(call.send), call.send, call.count)
        else:
            run.all_to_all(call.send, call.recv, call.count)

    def _do_barrier(self, run: Run, call: Call) -> None:
        pass

    # -- lifetime -------------------------------------------------------------------------
    def abort(self) -> None:
        """Fail the running call (within ~50 ms) and every queued one, then release everything."""
        if self._released:
            return
        self.aborted.set()
        if self.failure is None:
            self.failure = hal.CommError(
                f"the communicator was aborted on rank {self.rank}", op="abort"
            )
        self.close()

    def stop(self) -> None:
        """Refuse new calls and tell the thread to end after the queued ones; :meth:`close` waits for it.

        Several engines stopped first and closed after end their threads together
        (``DeviceCommunicator.close``). Idempotent.
        """
        with self._start_lock:  # no stream or thread is made from now on
            if self._closed:
                return
            self._closed = True
        if self._thread is not None:
            self._queue.put(None)

    def close(self) -> None:
        """Finish queued calls, stop the thread, release buffers and the transport. Idempotent."""
        if self._released:
            return
        self._released = True
        self.stop()
        thread = self._thread
        if thread is not None and threading.current_thread() is not thread:
            thread.join()
        if self._scratch is not None:
            self._scratch.close()
        self.transport.close()
        if self.ipc is not None:
            self.ipc.close()
        if self.provider is not None:
            self.provider.close()
        stream = self.__dict__.get("stream")
        if stream is not None:
            stream.close()
