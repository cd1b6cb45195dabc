"""The timeline of everything: Chrome Trace Event / Perfetto JSON written by ``hal.trace``.

``HAL_TRACE=trace.json`` traces a whole process (written at exit; under ``hal run`` each
rank writes ``trace.rank<N>.json``); :func:`trace` traces a block of code. hal core
records copies; ``hal.kernels``, ``hal.comm`` and ``hal.sched`` record their own events
through the active :class:`Tracer` (:func:`tracer`), so core never imports them.

Tracks (Chrome "threads") are named: one per device stream (``cpu:0 stream1``), one per
scheduler device (``cpu:0 sched``) and so on. Work enqueued on a stream is timed with
timing events when the device has them (:meth:`Tracer.stream_span`), so a stream's
track shows when the device ran it, not when the host enqueued it.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import json
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

from hal._runtime import runtime
from hal._settings import setting_at_import

if TYPE_CHECKING:
    from hal._stream import Event, Stream

__all__ = ["Tracer", "rank_path", "trace", "tracer"]

_EPOCH = time.time() - time.perf_counter()  # perf_counter -> wall-clock seconds (merges ranks)


def _us(t: float) -> float:
    """Return perf_counter time ``t`` as microseconds since the Unix epoch."""
    return round((t + _EPOCH) * 1e6, 3)


def rank_path(path: str | os.PathLike[str], rank: int | None) -> Path:
    """Return the per-rank file name of ``path``: ``trace.json`` -> ``trace.rank3.json``."""
    p = Path(path)
    if rank is None:
        return p
    return p.with_name(f"{p.stem}.rank{rank}{p.suffix or '.json'}")


def _env_rank() -> int | None:
    """Return the launcher's rank (``HAL_RANK``, ``RANK``, ``PMI_RANK``, ...), or None; a bad one warns."""
    for name in ("HAL_RANK", "RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        value = setting_at_import(name, default=None)
        if value is not None:
            return int(value)
    return None


class _DeviceClock:
    """Maps a device's timing events to host time through one reference event."""

    __slots__ = ("host", "ref")

    def __init__(self, ref: Event, host: float) -> None:
        self.ref = ref
        self.host = host


_stream_names: weakref.WeakKeyDictionary[Stream, str] = weakref.WeakKeyDictionary()
_ordinals: dict[str, itertools.count[int]] = {}
_names_lock = threading.Lock()
_clocks: dict[object, _DeviceClock] = {}  # by the device's backend object (plugins may reload)
_clocks_lock = threading.Lock()


def _forget_clocks() -> None:
    with _clocks_lock:
        _clocks.clear()


runtime().register_cache("hal.trace.device_clocks", _forget_clocks)


def _clock(stream: Stream) -> _DeviceClock:
    dev = stream.device
    key = dev._impl
    with _clocks_lock:
        clk = _clocks.get(key)
    if clk is None:  # the reference completes between record and synchronize: take the
        best = None  # tightest of a few tries and its midpoint, on an idle stream of hal's
        own = dev._internal_stream()
        for _ in range(3):
            ref = dev.create_event(timing=True)
            own.synchronize()
            t0 = time.perf_counter()
            ref.record(own)
            ref.synchronize()
            t1 = time.perf_counter()
            if best is None or t1 - t0 < best[1] - best[0]:
                best = (t0, t1, ref)
        assert best is not None
        clk = _DeviceClock(best[2], (best[0] + best[1]) / 2)
        with _clocks_lock:
            clk = _clocks.setdefault(key, clk)
    return clk


@final
class Tracer:
    """Collects timeline events and writes them as Chrome Trace Event JSON.

    Obtain the active one with :func:`hal.tracer` (None when nothing traces) and record
    with :meth:`complete`, :meth:`span`, :meth:`stream_span`, :meth:`counter`,
    :meth:`flow` and :meth:`instant`. Times are ``time.perf_counter()`` seconds.
    Events of a nested :func:`hal.trace` also reach the enclosing tracers.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, rank: int | None = None
    ) -> None:
        self.path = None if path is None else Path(path)
        self.rank = rank
        self.events: list[dict[str, Any]] = []
        self._pending: list[tuple[str, str, str, dict[str, Any], Event, Event]] = []
        self._lock = threading.Lock()
        self._parent: Tracer | None = None
        self._flow_ids = itertools.count(1)
        self.closed = False

    # -- recording ---------------------------------------------------------------------
    def _emit(self, event: dict[str, Any]) -> None:
        t: Tracer | None = self
        while t is not None:
            with t._lock:
                t.events.append(event)
            t = t._parent

    def complete(
        self,
        track: str,
        name: str,
        cat: str,
        start: float,
        end: float,
        args: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a slice ``[start, end]`` (perf_counter seconds) named ``name`` on ``track``."""
        ev = {
            "ph": "X",
            "name": name,
            "cat": cat,
            "ts": _us(start),
            "dur": round(max(end - start, 0.0) * 1e6, 3),
            "track": track,
        }
        if args:
            ev["args"] = dict(args)
        self._emit(ev)

    @contextlib.contextmanager
    def span(
        self, track: str, name: str, cat: str, args: dict[str, Any] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Time the block on the host and record it as a slice; yields ``args`` to extend."""
        args = {} if args is None else args
        t0 = time.perf_counter()
        try:
            yield args
        finally:
            self.complete(track, name, cat, t0, time.perf_counter(), args)

    def instant(
        self, track: str, name: str, cat: str, args: Mapping[str, Any] | None = None
    ) -> None:
        """Record an instant event now on ``track``."""
        ev = {
            "ph": "i",
            "s": "t",
            "name": name,
            "cat": cat,
            "ts": _us(time.perf_counter()),
            "track": track,
        }
        if args:
            ev["args"] = dict(args)
        self._emit(ev)

    def counter(self, name: str, values: Mapping[str, float], when: float | None = None) -> None:
        """Record counter values (e.g. ``{"cpu:0": 3}`` for a queue depth) at ``when`` (now)."""
        t = time.perf_counter() if when is None else when
        self._emit({"ph": "C", "name": name, "ts": _us(t), "args": dict(values)})

    def new_flow_id(self) -> int:
        """Return a fresh id for :meth:`flow`."""
        return next(self._flow_ids)

    def flow(self, flow_id: int, track: str, when: float, *, end: bool, name: str = "dep") -> None:
        """Record one end of a flow arrow: its start (``end=False``) or its finish, at ``when``.

        Each end binds to the slice enclosing ``when`` on ``track``.
        """
        ev = {
            "ph": "f" if end else "s",
            "id": flow_id,
            "name": name,
            "cat": "flow",
            "ts": _us(when),
            "track": track,
        }
        if end:
            ev["bp"] = "e"
        self._emit(ev)

    def stream_track(self, stream: Stream) -> str:
        """Return the track name of ``stream``: ``"<device> stream<N>"``.

        N counts the streams of a device in the order tracing first met them (stable for
        the life of the process, shared by all tracers so nested traces agree).
        """
        with _names_lock:
            name = _stream_names.get(stream)
            if name is None:
                dev = str(stream.device)
                n = next(_ordinals.setdefault(dev, itertools.count()))
                name = _stream_names[stream] = f"{dev} stream{n}"
            return name

    @contextlib.contextmanager
    def stream_span(
        self, stream: Stream, name: str, cat: str, args: dict[str, Any] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Record the work the block enqueues on ``stream`` as a slice on the stream's track.

        Timed on the device with timing events when it has them (resolved when the
        trace is written); otherwise the host time of the block, marked ``"host_timed"``.
        """
        args = {} if args is None else args
        track = self.stream_track(stream)
        if not stream.device.capabilities.timing_events:
            args["host_timed"] = True
            with self.span(track, name, cat, args):
                yield args
            return
        _clock(stream)
        e0 = stream.device.create_event(timing=True)
        e1 = stream.device.create_event(timing=True)
        e0.record(stream)
        try:
            yield args
        finally:
            e1.record(stream)
            with self._lock:
                self._pending.append((track, name, cat, args, e0, e1))
                many = len(self._pending) > 4096
            if many:
                self._resolve(wait=False)

    def _resolve(self, wait: bool) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        keep = []
        for item in pending:
            track, name, cat, args, e0, e1 = item
            if not wait and not e1.query():
                keep.append(item)
                continue
            try:
                clk = _clocks[e0.device._impl]
                start = clk.host + e0.elapsed_ms(clk.ref) / 1e3
                end = clk.host + e1.elapsed_ms(clk.ref) / 1e3
            except Exception as exc:  # noqa: BLE001 - a failed stream still gets its slice
                args = {**args, "error": f"{type(exc).__name__}: {exc}"}
                start = end = time.perf_counter()
            self.complete(track, name, cat, start, end, args)
            e0.close()
            e1.close()
        if keep:
            with self._lock:
                self._pending[:0] = keep

    @staticmethod
    @contextlib.contextmanager
    def muted() -> Iterator[None]:
        """Record nothing from this thread (this context) inside the block (e.g. health probes)."""
        token = _muted.set(True)
        try:
            yield
        finally:
            _muted.reset(token)

    # -- output ------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """Resolve pending stream slices and return the trace as a JSON-ready dict."""
        self._resolve(wait=True)
        with self._lock:
            events = list(self.events)
        pid = 0 if self.rank is None else self.rank
        tids: dict[str, int] = {}
        out: list[dict[str, Any]] = []
        pname = f"rank {self.rank}" if self.rank is not None else f"hal (pid {os.getpid()})"
        out.append(
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": pname}}
        )
        body = []
        for ev in events:
            ev = dict(ev)
            track = ev.pop("track", None)
            ev["pid"] = pid
            if track is not None:
                tid = tids.get(track)
                if tid is None:
                    tid = tids[track] = len(tids) + 1
                ev["tid"] = tid
            else:
                ev["tid"] = 0
            body.append(ev)
        for track, tid in sorted(tids.items()):
            out.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}}
            )
            out.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        body.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
        out.extend(body)
        return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"hal_rank": self.rank}}

    def write(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the trace to ``path`` (default: the tracer's path); return the path written."""
        target = Path(path) if path is not None else self.path
        if target is None:
            raise ValueError("path=None and the tracer has no path to write to")
        data = self.to_json()
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps(data, separators=(",", ":")))
        tmp.replace(target)
        return target


# Which tracer is active follows the context (contextvars, as OpenTelemetry's context does):
# each thread, and each asyncio task, has its own innermost tracer, and a tracer's parent is the
# one active where it was opened, so two threads tracing at once each get their own events.
# A thread that opened no trace of its own (hal's worker threads: the comm engine, the
# scheduler, a backend's stream workers) records into the most recently opened tracer of the
# process, as before; the process tracer of ``HAL_TRACE`` is the root of every other.
_current: contextvars.ContextVar[Tracer | None] = contextvars.ContextVar("hal_tracer", default=None)
_muted: contextvars.ContextVar[bool] = contextvars.ContextVar("hal_trace_muted", default=False)
_open: list[Tracer] = []  # every open tracer, oldest first
_root: list[Tracer] = []  # the HAL_TRACE tracer, when one runs
_open_lock = threading.Lock()


def tracer() -> Tracer | None:
    """Return the active :class:`Tracer`, or None when nothing is being traced
    (or this thread is inside :meth:`Tracer.muted`).

    The active tracer is the innermost :func:`trace` of this thread (or asyncio task); in a
    thread that opened none, the most recently opened one of the process (``HAL_TRACE``'s
    at least). Instrumented code checks this first, so tracing costs nothing when it is off.
    """
    if not _open or _muted.get():
        return None
    t = _current.get()
    if t is not None:
        return t
    try:
        return _open[-1]
    except IndexError:  # closed meanwhile by another thread
        return None


def _push(t: Tracer) -> contextvars.Token[Tracer | None]:
    with _open_lock:
        parent = _current.get()
        t._parent = parent if parent is not None else (_root[0] if _root else None)
        _open.append(t)
    return _current.set(t)


def _pop(t: Tracer, token: contextvars.Token[Tracer | None] | None) -> None:
    with _open_lock:
        if t in _open:
            _open.remove(t)
    if token is not None:
        try:
            _current.reset(token)
        except ValueError:  # closed from another context (a generator finalized elsewhere)
            _current.set(t._parent if t._parent in _open else None)
    t._resolve(wait=True)  # resolved slices reach the parents too
    t.closed = True


@contextlib.contextmanager
def trace(
    path: str | os.PathLike[str] | None = None, *, rank: int | None = None
) -> Iterator[Tracer]:
    """Trace the block: copies, kernels, collectives, scheduler tasks; write ``path`` at the end.

    Args:
        path: the JSON file to write (Chrome Trace Event format; open it in
            https://ui.perfetto.dev or chrome://tracing). None: only collect
            (``tracer.to_json()``).
        rank: the process id in the trace; the default is the rank of a ``hal run`` /
            torchrun / MPI job if there is one (then ``path`` gets ``.rank<N>`` added).

    Example::

        with hal.trace("step.json"):
            hal.kernels.matmul(a, b, stream=s)
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path={path!r} must be a file path or None")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError(f"rank={rank!r} must be a non-negative integer")
    r = _env_rank() if rank is None else rank
    target = None if path is None else (rank_path(path, r) if rank is None else Path(path))
    t = Tracer(target, rank=r)
    token = _push(t)
    try:
        yield t
    finally:
        _pop(t, token)
        if target is not None:
            t.write()


def _start_from_env() -> None:
    """Start a process-wide tracer when ``HAL_TRACE`` names a file (written at exit)."""
    raw = str(setting_at_import("HAL_TRACE") or "")
    if not raw or raw.lower() in {"0", "off", "no", "false"}:
        return
    import atexit

    r = _env_rank()
    t = Tracer(rank_path(raw, r), rank=r)
    with _open_lock:
        _open.insert(0, t)
        _root[:] = [t]

    def finish() -> None:
        with _open_lock:
            _root[:] = [x for x in _root if x is not t]
        _pop(t, None)
        if not t.events:  # nothing traced (e.g. the `hal run` launcher itself): no file
            return
        try:
            t.write()
        except Exception as exc:  # noqa: BLE001 - never fail an exiting process over its trace
            import logging

            logging.getLogger("hal.trace").warning("HAL_TRACE: could not write %s: %s", t.path, exc)

    atexit.register(finish)
