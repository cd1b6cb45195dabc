"""The launch fast path: a repeated op call is a dictionary hit plus the implementation's call.

The first call of each *kind* on a stream takes the full path (validation, dispatch, record)
and, when it succeeds, leaves an :class:`_Entry` in the stream's :class:`_State` under a key
of cheap facts: the op, its key parameters (``axis``, ``op``), each array's signature
(``hal.Array.signature``: dtype, shape and device, one int computed when the array is made) and
which inputs *are* the output. A later call with the same key checks per call only what can
change between calls of one kind, and takes the full path (which raises the same error as
before, or learns again) when any check fails:

- every array is a ``hal.Array`` and its buffer is open; the output shares no buffer with an
  input unless it *is* that input (as when the entry was made);
- the stream is the same object; the entry's epoch is current (``EPOCH`` changes with every
  registration, registry reset, :func:`hal.kernels.configure` and ``hal.runtime().reset()``);
- no route is forced in any thread (:func:`hal.kernels.route`): the epoch and the forced
  routes are folded into one integer, ``_dispatch.HOT`` (the epoch, or -1 while a ``route``
  block is open anywhere: calls neither hit nor learn), so a hit tests one integer for them;
- no hal trace is open (a truth test of ``hal.spi.open_tracers``, then :func:`hal.tracer`), and
  strict mode does not refuse the entry's fallback (``HAL_KERNELS_STRICT`` may change at any
  time: while neither it nor ``configure(strict=)`` is set, a dict test answers without a call).

A dedicated implementation's ``when`` predicate is asked on the first call of each kind and
its answer kept with the entry: a predicate may depend on what the key holds (op, dtypes,
shapes, device, ``axis``/``op`` parameters), not on float parameters (``alpha``, ``eps``),
array contents or outside state (a registration, which changes the epoch, re-asks it).
A dedicated implementation registered with ``prepare`` (:meth:`KernelRegistry.add`) is asked
once per kind for a prepared call, which then runs the later calls instead of the
implementation (no :class:`OpCall`): the CPU emulator's full reductions and softmax hand each
call's memory to the stream's prepared launch (``Program.launcher``).
Records, the fallback summary and ``hal.kernels.trace()`` see every call as before.

The hit in C (``_hit.c``, built by :mod:`._native`; ``HAL_KERNELS_NATIVE``, on by default):
after ``_NATIVE_AFTER`` Python hits in a process, :func:`use_native` replaces :func:`fast1` and
:func:`fast2` where the op functions call them by C functions making the same checks in the same
order with the same effects (the Python functions serve what they do not: an output the op
allocates). An entry whose run is a backend's prepared launch (:func:`_bound`) keeps that launch
in ``direct``: the C hit calls ``hal.spi.stream_impl(stream)`` and the launch itself, with each
array's memory and offset, where the Python run would (one Python frame per launch in all, the
stream's ``_live``, besides the op function).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, final

import numpy as np

import hal
from hal.kernels import _dispatch
from hal.kernels import _options as _kopts
from hal.kernels._dispatch import DispatchRecord, OpCall
from hal.spi import BufferArg, stream_impl
from hal.spi import open_tracers as _open_tracers
from hal.spi import setting as _setting

__all__ = [
    "COUNTS",
    "fast1",
    "fast2",
    "key1",
    "key2",
    "launch_counts",
    "learn",
    "native_active",
    "on_native",
    "use_native",
]

_Array = hal.Array
_internal = _dispatch._internal
_tracers = _dispatch._tracers
_tracers_lock = _dispatch._tracers_lock
_fallbacks = _dispatch._fallbacks
_strict = _dispatch.strict
_HOT = _dispatch.HOT
_ENV_BYTES: Any = _dispatch._ENV_BYTES
_env_fast = type(_ENV_BYTES) is dict  # else strict() is asked for every fallback call
_tracer = hal.tracer
#: ``[configure() set strict]``, kept by the options' change hook: strict() is asked per fallback
#: call only when it or ``HAL_KERNELS_STRICT`` is set (as strict() itself decides first)
_strict_given = [False]


def _strict_changed() -> None:
    _strict_given[0] = _kopts.given.strict is not None


_kopts.on_change.append(_strict_changed)
_strict_changed()
_log = logging.getLogger("hal.kernels")
_DEBUG = logging.DEBUG
# The logger's own answer cache (emptied, never replaced, when levels change): False there
# means debug is off without a call; anything else asks isEnabledFor (as hal.copy does).
_log_known = getattr(_log, "_cache", {}).get

#: ``[fast calls, full dispatches that learned an entry]`` of this process (tests, benchmarks)
COUNTS = [0, 0]
_ENTRIES_MAX = 1024  # kinds of call remembered per stream
_KEEP_CHECK = 8  # look at the stream every this many calls (a query takes a lock)
_KEEP_BATCH = 64  # arrays of this many calls are handed to an event when the stream is busy


def launch_counts() -> dict[str, int]:
    """Return ``{"fast": calls served by the launch cache, "learned": kinds of call learned}``."""
    return {"fast": COUNTS[0], "learned": COUNTS[1]}


Run = Callable[[hal.Stream, tuple[hal.Array, ...], hal.Array, tuple[Any, ...]], None]


@final
class _Entry:
    """What one kind of call runs: the prepared call, its record and summary key, its output."""

    __slots__ = (
        "direct",
        "dsc",
        "dtail",
        "epoch",
        "fallback",
        "keep",
        "odtype",
        "onbytes",
        "oshape",
        "rec",
        "run",
    )

    def __init__(
        self,
        run: Run,
        rec: DispatchRecord,
        fallback: tuple[str, str, str, str] | None,
        out: hal.Array,
        epoch: int,
    ) -> None:
        self.run = run
        self.rec = rec
        self.fallback = fallback
        self.oshape = out.shape
        self.odtype = out.dtype
        self.onbytes = out.nbytes
        self.epoch = epoch
        #: the arrays are kept alive until the stream is past the call (False: the backend's
        #: launch retains the memory itself, ``StreamImpl.launches_retain_memory``)
        self.keep = not getattr(run, "retains_memory", False)
        #: the backend's prepared launch that ``run`` calls, for the C hit (:func:`_bound`):
        #: ``direct(mem, offset per array (out first), *scalars if dsc, *dtail)``; None: ``run``
        direct: tuple[Any, bool, tuple[Any, ...]] = getattr(run, "direct", None) or (
            None,
            False,
            (),
        )
        self.direct: Any = direct[0]
        self.dsc: bool = direct[1]
        self.dtail: tuple[Any, ...] = direct[2]


@final
class _State:
    """Per stream: the learned entries and the arrays kept alive until the stream is past them."""

    __slots__ = ("batch", "entries", "held", "laste", "lastkey", "lock", "ref")

    def __init__(self, ref: weakref.ref[hal.Stream]) -> None:
        self.ref = ref
        self.entries: dict[tuple[Any, ...], _Entry] = {}
        #: the C hit's last lookup: ``entries[lastkey] is laste`` while ``laste`` is not None
        #: (every change of ``entries`` sets ``laste`` to None first)
        self.lastkey: tuple[Any, ...] | None = None
        self.laste: _Entry | None = None
        self.batch: list[tuple[Any, ...]] = []
        self.held: list[list[tuple[Any, ...]]] = []
        self.lock = threading.Lock()


_states: dict[int, _State] = {}
_states_lock = threading.Lock()


def _forget_stream(ref: weakref.ref[hal.Stream]) -> None:
    # runs in the garbage collector: no lock (the stream's work holds its own references)
    for k, st in list(_states.items()):
        if st.ref is ref:
            _states.pop(k, None)


def _state(stream: hal.Stream) -> _State:
    st = _states.get(id(stream))
    if st is None or st.ref() is not stream:
        with _states_lock:  # looked up again: a state another thread made is kept (its batch)
            st = _states.get(id(stream))
            if st is None or st.ref() is not stream:
                st = _states[id(stream)] = _State(weakref.ref(stream, _forget_stream))
    return st


def _forget_entries() -> None:
    """Drop every learned entry (``hal.runtime().reset()``); arrays kept alive stay kept."""
    _dispatch.bump_epoch()
    for st in list(_states.values()):
        st.laste = None
        st.entries.clear()


hal.runtime().register_cache("hal.kernels.launch_cache", _forget_entries)

_lazy: dict[str, Any] = {}


def _late() -> dict[str, Any]:
    if not _lazy:
        from hal.kernels import _generic

        _lazy.update(
            pending=_generic._pending, sweep=_generic._sweep, release=_generic._release_after
        )
    return _lazy


def _maintain(st: _State, stream: hal.Stream) -> None:
    """Drop the kept arrays once the stream is idle, or hand them to an event every ``_KEEP_BATCH`` calls.

    The batch is swapped out *before* the stream is asked: a call that appended to it did so
    after enqueuing its work, so the query (or the event recorded after it) covers that work.
    """
    with st.lock:
        old, st.batch = st.batch, []
        st.held.append(old)
        if stream.query():
            st.held = []
            return
        if sum(len(h) for h in st.held) < _KEEP_BATCH:
            return
        held, st.held = st.held, []
    _late()["release"](stream, held, close=False)


def _after(rec: DispatchRecord) -> None:
    """The end of a hit in C: the debug log line and the records of ``hal.kernels.trace()``."""
    if _log_known(_DEBUG) is not False and _log.isEnabledFor(_DEBUG):
        _log.debug("dispatch %s", rec)
    if _tracers:
        with _tracers_lock:
            for t in _tracers:
                t.append(rec)


#: the Python hits served in a process before the C hit is loaded (short processes never build it)
_NATIVE_AFTER = 64
#: ``[the C module, or None]`` while the op functions call its hits
_native: list[Any] = [None]
#: ``hook(fast1, fast2)``: called with the hits the op functions are to call (``hal.kernels._ops``)
on_native: list[Callable[[Any, Any], None]] = []


def use_native(on: bool = True) -> bool:
    """Let the op functions call the launch cache's hit in C (``on``), or the Python one; return whether C is in use.

    Builds or loads the extension module at first use (:mod:`hal.kernels._native`); with
    ``HAL_KERNELS_NATIVE=0`` (read here), or where it cannot be built, the Python hits stay.

    Raises:
        hal.ConfigError: ``HAL_KERNELS_NATIVE`` is not a switch.
    """
    mod = None
    if on and _setting("HAL_KERNELS_NATIVE"):
        from hal.kernels import _native as _nat

        mod = _nat.load()
        if mod is not None and _native[0] is not mod:
            try:
                mod.setup(
                    {
                        "states": _states,
                        "hot": _HOT,
                        "counts": COUNTS,
                        "fallbacks": _fallbacks,
                        "internal": _internal,
                        "inside": _dispatch.INSIDE,
                        "open_tracers": _open_tracers,
                        "tracers": _tracers,
                        "env": _ENV_BYTES if _env_fast else None,
                        "strict_given": _strict_given,
                        "strict": _strict,
                        "tracer": _tracer,
                        "lazy": _lazy,
                        "late": _late,
                        "stream_impl": stream_impl,
                        "maintain": _maintain,
                        "after": _after,
                        "keep_check": _KEEP_CHECK,
                        "logcache": getattr(_log, "_cache", {}),
                        "debug": _DEBUG,
                        "fast1": fast1,
                        "fast2": fast2,
                        "Array": _Array,
                        "Buffer": hal.Buffer,
                        "State": _State,
                        "Entry": _Entry,
                    }
                )
            except Exception as exc:  # noqa: BLE001 - objects unlike the ones it reads: Python
                _log.info("the native launch-cache hit refused this interpreter (%s)", exc)
                mod = None
    _native[0] = mod
    f1, f2 = (fast1, fast2) if mod is None else (mod.fast1, mod.fast2)
    for hook in on_native:
        hook(f1, f2)
    return mod is not None


def native_active() -> bool:
    """Return True while the op functions call the launch cache's hit in C."""
    return _native[0] is not None


def fast1(
    op: str, extra: object, stream: object, x: object, out: object, sc: tuple[Any, ...]
) -> hal.Array | None:
    """Run a learned one-input call and return its output, or None: take the full path."""
    st = _states.get(id(stream))
    if st is None or type(x) is not _Array:
        return None
    if out is None:
        key: tuple[Any, ...] = (op, extra, x.signature, 0, False)
    elif type(out) is _Array:
        key = (op, extra, x.signature, out.signature, x is out)
    else:
        return None
    e = st.entries.get(key)
    # one integer for registrations, resets, options and forced routes (_dispatch.HOT)
    if e is None or e.epoch != _HOT[0] or st.ref() is not stream:
        return None
    xb = x.spi_buffer
    if xb.spi_memory is None:
        return None
    if out is not None:
        ob = out.spi_buffer
        if ob.spi_memory is None or (xb is ob and x is not out):
            return None
    if _open_tracers and _tracer() is not None:
        return None
    fb = e.fallback
    if fb is not None and _internal.depth:
        fb = None  # a library's own call (hal.comm): strict mode allows it, it is not counted
    if fb is not None:
        if (not _env_fast or _strict_given[0] or b"HAL_KERNELS_STRICT" in _ENV_BYTES) and _strict():
            return None
    if COUNTS[0] == _NATIVE_AFTER:  # before the run: a bad HAL_KERNELS_NATIVE enqueues nothing
        use_native()
    # the run, inlined (_go: one Python frame less per launch)
    lazy = _lazy or _late()
    if lazy["pending"]:
        lazy["sweep"]()
    if out is None:  # the op allocates its output: same shape and dtype as when learned
        out = stream.device.alloc(e.onbytes).view(e.odtype, e.oshape)  # type: ignore[union-attr]
    e.run(stream, (x,), out, sc)  # type: ignore[arg-type]
    if e.keep:
        batch = st.batch
        batch.append((x, out))
        if len(batch) >= _KEEP_CHECK:
            _maintain(st, stream)  # type: ignore[arg-type]
    COUNTS[0] += 1
    if fb is not None:
        _fallbacks[fb] += 1
    if _log_known(_DEBUG) is not False and _log.isEnabledFor(_DEBUG):
        _log.debug("dispatch %s", e.rec)
    if _tracers:
        with _tracers_lock:
            for t in _tracers:
                t.append(e.rec)
    return out


def fast2(
    op: str, extra: object, stream: object, x: object, y: object, out: object, sc: tuple[Any, ...]
) -> hal.Array | None:
    """Run a learned two-input call and return its output, or None: take the full path."""
    st = _states.get(id(stream))
    if st is None or type(x) is not _Array or type(y) is not _Array:
        return None
    if out is None:
        key: tuple[Any, ...] = (op, extra, x.signature, y.signature, 0, False, False)
    elif type(out) is _Array:
        key = (op, extra, x.signature, y.signature, out.signature, x is out, y is out)
    else:
        return None
    e = st.entries.get(key)
    if e is None or e.epoch != _HOT[0] or st.ref() is not stream:
        return None
    xb, yb = x.spi_buffer, y.spi_buffer
    if xb.spi_memory is None or yb.spi_memory is None:
        return None
    if out is not None:
        ob = out.spi_buffer
        if ob.spi_memory is None or (xb is ob and x is not out) or (yb is ob and y is not out):
            return None
    if _open_tracers and _tracer() is not None:
        return None
    fb = e.fallback
    if fb is not None and _internal.depth:
        fb = None  # a library's own call (hal.comm): strict mode allows it, it is not counted
    if fb is not None:
        if (not _env_fast or _strict_given[0] or b"HAL_KERNELS_STRICT" in _ENV_BYTES) and _strict():
            return None
    if COUNTS[0] == _NATIVE_AFTER:  # before the run: a bad HAL_KERNELS_NATIVE enqueues nothing
        use_native()
    # the run, inlined (_go: one Python frame less per launch)
    lazy = _lazy or _late()
    if lazy["pending"]:
        lazy["sweep"]()
    if out is None:  # the op allocates its output: same shape and dtype as when learned
        out = stream.device.alloc(e.onbytes).view(e.odtype, e.oshape)  # type: ignore[union-attr]
    e.run(stream, (x, y), out, sc)  # type: ignore[arg-type]
    if e.keep:
        batch = st.batch
        batch.append((x, y, out))
        if len(batch) >= _KEEP_CHECK:
            _maintain(st, stream)  # type: ignore[arg-type]
    COUNTS[0] += 1
    if fb is not None:
        _fallbacks[fb] += 1
    if _log_known(_DEBUG) is not False and _log.isEnabledFor(_DEBUG):
        _log.debug("dispatch %s", e.rec)
    if _tracers:
        with _tracers_lock:
            for t in _tracers:
                t.append(e.rec)
    return out


def key1(op: str, extra: object, x: hal.Array, out: hal.Array | None) -> tuple[Any, ...]:
    """The key :func:`fast1` looks up, for a validated call (``out`` None: the op allocates it)."""
    if out is None:
        return (op, extra, x.signature, 0, False)
    return (op, extra, x.signature, out.signature, x is out)


def key2(
    op: str, extra: object, x: hal.Array, y: hal.Array, out: hal.Array | None
) -> tuple[Any, ...]:
    """The key :func:`fast2` looks up, for a validated call."""
    if out is None:
        return (op, extra, x.signature, y.signature, 0, False, False)
    return (op, extra, x.signature, y.signature, out.signature, x is out, y is out)


def learn(
    key: tuple[Any, ...],
    call: OpCall,
    names: tuple[str, ...],
    run_call: Callable[[OpCall], Any],
    rec: DispatchRecord,
    fallback: tuple[str, str, str, str] | None,
    epoch: int,
) -> None:
    """Remember how a call of kind ``key`` ran (after the full path ran it without error).

    ``run_call`` is the implementation the dispatch chose (dedicated, generic or host);
    ``names`` the names of the per-call scalars handed back as ``call.params``.
    """
    if _HOT[0] != epoch:  # a route forced in some thread, or the epoch moved: nothing to serve
        return
    op, dtype, params = call.op, call.dtype, call.params
    fixed = {k: v for k, v in params.items() if k not in names}
    prepared = _prepare(call, run_call, names)
    if prepared is None and fallback is None:  # dedicated: the implementation's own prepared call
        prepare = _dispatch.registry().preparer(op, rec.backend, run_call)
        if prepare is not None:
            prepared = prepare(call)
    if prepared is None:

        def prepared(
            stream: hal.Stream, ins: tuple[hal.Array, ...], out: hal.Array, sc: tuple[Any, ...]
        ) -> None:
            p = dict(fixed)
            for k, v in zip(names, sc, strict=True):
                p[k] = v
            run_call(OpCall(op, ins, out, p, stream, dtype))

    st = _state(call.stream)
    st.laste = None  # the C hit's last lookup (an entry under this key may be replaced)
    if len(st.entries) >= _ENTRIES_MAX:
        st.entries.clear()
    st.entries[key] = _Entry(prepared, rec, fallback, call.out, epoch)
    COUNTS[1] += 1


def _prepare(call: OpCall, run_call: Callable[[OpCall], Any], names: tuple[str, ...]) -> Run | None:
    """Return a direct launcher for the generic elementwise kernels (no OpCall per call), else None.

    The key guarantees what ``Program.launch`` would check (dtypes, device, sizes): the launcher
    hands the backend its arguments (a ``BufferArg`` per array, NumPy scalars of the parameters'
    types) and calls ``StreamImpl.launch``; a buffer closed since the fast path's check takes
    ``Program.launch``, which raises the usual error.
    """
    from hal.kernels import _generic

    if run_call is not _generic._elementwise:
        return None
    op = call.op
    prog = _generic.program_for(call.stream.device, "elementwise", call.dtype)
    kname = _generic._KERNEL_NAMES.get(op, op)
    n = call.out.size
    work = n * 8 if op in ("gelu", "exp") else n
    launch = prog.launch
    pimpl = prog._impl
    gs = (n, 1, 1)
    bound = _bound(call.stream, op, launch, pimpl, kname, gs, work)
    if bound is not None:
        return bound
    n64 = np.int64(n)
    new = object.__new__

    def arg(a: hal.Array) -> BufferArg | None:
        mem = a.spi_buffer.spi_memory
        if mem is None:
            return None
        b = new(BufferArg)  # BufferArg(mem, offset) without the frozen dataclass's __init__
        b.__dict__.update(memory=mem, offset=a.spi_offset)
        return b

    if op == "axpy":
        f64 = np.float64

        def run_axpy(
            stream: hal.Stream, ins: tuple[hal.Array, ...], out: hal.Array, sc: tuple[Any, ...]
        ) -> None:
            x, y = ins
            a0, a1, a2 = arg(out), arg(x), arg(y)
            if a0 is None or a1 is None or a2 is None:
                launch(kname, n, [out, x, y, float(sc[0]), n], stream=stream, work=work)
                return
            stream_impl(stream).launch(pimpl, kname, gs, [a0, a1, a2, f64(sc[0]), n64], work=work)

        return run_axpy

    def run(
        stream: hal.Stream, ins: tuple[hal.Array, ...], out: hal.Array, sc: tuple[Any, ...]
    ) -> None:
        args: list[Any] = [arg(out)]
        for a in ins:
            args.append(arg(a))
        if None in args:
            launch(kname, n, [out, *ins, n], stream=stream, work=work)
            return
        args.append(n64)
        stream_impl(stream).launch(pimpl, kname, gs, args, work=work)

    return run


def _bound(
    stream: hal.Stream,
    op: str,
    launch: Callable[..., None],
    pimpl: Any,
    kname: str,
    gs: tuple[int, int, int],
    work: int,
) -> Run | None:
    """Return a launcher through the backend's prepared launch (``StreamImpl.launcher``), else None.

    The backend prepares the launch once (its kernel object, sizes, argument conversion); per
    call this hands it each array's memory and byte offset and the scalars. A buffer closed
    since the fast path's check takes ``Program.launch``, which raises the usual error.
    """
    from hal.spi import impl_of

    simpl = impl_of(stream)
    make = getattr(simpl, "launcher", None)  # a backend not subclassing StreamImpl
    bound = None if make is None else make(pimpl, kname, gs, work=work)
    if bound is None:
        return None
    n = gs[0]
    # the backend's enqueued launches keep their memory alive (OpenCL retains its buffers):
    # no array need be kept by the fast path
    retains = bool(getattr(simpl, "launches_retain_memory", False))

    if op == "axpy":

        def run_axpy(
            stream: hal.Stream, ins: tuple[hal.Array, ...], out: hal.Array, sc: tuple[Any, ...]
        ) -> None:
            x, y = ins
            mo, mx, my = out.spi_buffer.spi_memory, x.spi_buffer.spi_memory, y.spi_buffer.spi_memory
            if mo is None or mx is None or my is None:
                launch(kname, n, [out, x, y, float(sc[0]), n], stream=stream, work=work)
                return
            stream_impl(stream)
            bound(mo, out.spi_offset, mx, x.spi_offset, my, y.spi_offset, sc[0], n)

        run_axpy.retains_memory = retains  # type: ignore[attr-defined]
        run_axpy.direct = (bound, True, (n,))  # type: ignore[attr-defined]  # the C hit's run
        return run_axpy

    def run(
        stream: hal.Stream, ins: tuple[hal.Array, ...], out: hal.Array, sc: tuple[Any, ...]
    ) -> None:
        if len(ins) == 1:
            (x,) = ins
            mo, mx = out.spi_buffer.spi_memory, x.spi_buffer.spi_memory
            if mo is not None and mx is not None:
                stream_impl(stream)
                bound(mo, out.spi_offset, mx, x.spi_offset, n)
                return
        else:
            x, y = ins
            mo, mx, my = out.spi_buffer.spi_memory, x.spi_buffer.spi_memory, y.spi_buffer.spi_memory
            if mo is not None and mx is not None and my is not None:
                stream_impl(stream)
                bound(mo, out.spi_offset, mx, x.spi_offset, my, y.spi_offset, n)
                return
        launch(kname, n, [out, *ins, n], stream=stream, work=work)

    run.retains_memory = retains  # type: ignore[attr-defined]
    run.direct = (bound, False, (n,))  # type: ignore[attr-defined]  # the C hit's run (no scalars)
    return run
