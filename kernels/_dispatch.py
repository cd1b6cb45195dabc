"""Op dispatch: dedicated, else generic, else host; every call recorded; strict mode.

Routes, in order of preference:

- ``dedicated``: an implementation a plugin registered for (op, backend, dtype) through
  the ``hal_register_kernels`` hook (or :func:`register` in-process).
- ``generic``: hal.kernels' implementation in the portable kernel language, on any device
  with ``capabilities.kernels`` (and fp64/fp16 for those dtypes).
- ``host``: copy to the host, compute with NumPy, copy back (backends without kernels).

``generic`` and ``host`` are *fallbacks*: each call is recorded, a summary line is logged
at exit when a run used any (``HAL_KERNELS_SUMMARY=0`` silences it), and
``HAL_KERNELS_STRICT=1`` turns them into :class:`KernelFallbackError`.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, final

import numpy as np

import hal
from hal.kernels import _options as _kopts
from hal.spi import setting_at_import

__all__ = [
    "IMPLEMENTATIONS",
    "DispatchRecord",
    "KernelFallbackError",
    "KernelRegistry",
    "OpCall",
    "internal",
    "is_internal",
    "register",
    "registry",
    "route",
    "strict",
    "trace",
]

_log = logging.getLogger("hal.kernels")
IMPLEMENTATIONS = ("dedicated", "generic", "host")


class KernelFallbackError(hal.HalError):
    """An op would run a fallback (generic or host) while ``HAL_KERNELS_STRICT=1``.

    Attributes:
        op, backend, dtype, implementation: what would have run.
    """

    def __init__(self, op: str, backend: str, dtype: str, implementation: str) -> None:
        super().__init__(
            f"op {op!r} ({dtype}) on backend {backend!r} has no dedicated implementation and would run "
            f"the {implementation} fallback; HAL_KERNELS_STRICT=1 forbids it (see `hal kernels plan`)"
        )
        self.op = op
        self.backend = backend
        self.dtype = dtype
        self.implementation = implementation


@final
@dataclasses.dataclass
class OpCall:
    """One op invocation, validated, as handed to an implementation.

    Attributes:
        op: op name (``"matmul"``).
        inputs: the input arrays, in the op's order.
        out: the output array (already allocated, same device); implementations write it.
        params: op parameters (``alpha``, ``axis``, ``eps``, ``op`` ...).
        stream: the stream to enqueue on; implementations must not block on it.
        dtype: the dtype that selects the implementation (the inputs' dtype).
    """

    op: str
    inputs: tuple[hal.Array, ...]
    out: hal.Array
    params: dict[str, Any]
    stream: hal.Stream
    dtype: np.dtype[Any]

    @property
    def device(self) -> hal.Device:
        """The device the op runs on."""
        return self.stream.device


Impl = Callable[[OpCall], None]
#: A prepared call of one kind: ``run(stream, inputs, out, scalars)`` (see :meth:`KernelRegistry.add`)
Run = Callable[[hal.Stream, tuple[hal.Array, ...], hal.Array, tuple[Any, ...]], None]
#: ``prepare(call) -> Run | None``: makes a dedicated implementation's prepared call
Prepare = Callable[[OpCall], Run | None]


@final
@dataclasses.dataclass(frozen=True)
class DispatchRecord:
    """What one op call ran.

    Attributes:
        op: op name. dtype: selecting dtype name. backend/device: where it ran.
        implementation: ``dedicated``, ``generic`` or ``host``.
        kernel: the implementation's name (``generic:sum_partial+sum_final``, ``cpu:numpy.matmul``).
        kernel_hash: 16 hex digits of the compiled program's cache key (generic), else "".
    """

    op: str
    dtype: str
    backend: str
    device: str
    implementation: str
    kernel: str
    kernel_hash: str

    def to_dict(self) -> dict[str, str]:
        """Return a JSON-friendly dict."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class _Entry:
    dtypes: frozenset[str] | None
    name: str
    impl: Impl
    plugin: str
    when: Callable[[OpCall], bool] | None
    when_text: str
    devices: Callable[[Any], bool] | None = None
    prepare: Prepare | None = None


@final
class KernelRegistry:
    """Dedicated op implementations by (op, backend); handed to ``hal_register_kernels`` hooks."""

    def __init__(self) -> None:
        self._impls: dict[tuple[str, str], list[_Entry]] = {}
        self._lock = threading.Lock()
        self.plugin = ""
        #: ``(op, backend, dtype) -> (name, impl) | None`` for registrations without a ``when``
        #: predicate (the launch fast path); cleared by every :meth:`add`.
        self.static: dict[tuple[str, str, str], tuple[str, Impl] | None] = {}
        #: incremented by every :meth:`add`: routes cached by the op layer are valid while it holds
        self.generation = 0

    def add(
        self,
        op: str,
        backend: str,
        impl: Impl,
        *,
        dtypes: Iterable[Any] | None = None,
        name: str | None = None,
        when: Callable[[OpCall], bool] | None = None,
        when_text: str = "",
        devices: Callable[[Any], bool] | None = None,
        prepare: Prepare | None = None,
    ) -> None:
        """Register ``impl(call: OpCall) -> None`` as the dedicated ``op`` on ``backend``.

        Args:
            op: an op name of ``hal.kernels.spi.OPS`` (``"matmul"``).
            backend: the backend name (``"cpu"``).
            impl: enqueues the work on ``call.stream`` writing ``call.out``; must not block.
            dtypes: the dtypes it handles (default: every dtype of the op).
            name: shown in records and plans (default: the plugin and the function name).
            when: optional predicate on the call (e.g. ``lambda c: c.params["axis"] is None``);
                calls it rejects take the next route. ``when_text`` describes it in plans.
            devices: optional predicate on the ``hal.Device``: the devices of ``backend`` the
                implementation runs on at all (e.g. not CPU devices). Plans (``hal kernels
                plan``) show the route each device really takes; calls on other devices take
                the next route.
            prepare: optional ``prepare(call) -> run | None``, asked once when the launch cache
                learns a kind of call that ``impl`` just ran (same op, key parameters, dtypes,
                shapes, device, stream and aliasing; see :mod:`hal.kernels._fast`). The
                returned ``run(stream, inputs, out, scalars)`` then runs each later call of that
                kind instead of ``impl`` (no :class:`OpCall`): ``inputs`` and ``out`` are that
                call's arrays (already checked: open buffers of the learned signatures),
                ``scalars`` its per-call numbers (``alpha``), in the op's order. ``run`` must
                enqueue what ``impl`` would, without blocking, and raise the same errors (e.g.
                memory freed since the check). None: later calls run ``impl`` as usual. Like
                ``when``, it may depend only on what the kind fixes.

        A later registration for the same (op, backend, dtype) takes precedence.
        """
        from hal.kernels._ops import OPS

        if op not in OPS:
            raise ValueError(f"op={op!r} is not a hal.kernels op (known: {', '.join(sorted(OPS))})")
        if not isinstance(backend, str) or not backend:
            raise ValueError(f"backend={backend!r} must be a backend name")
        if not callable(impl):
            raise TypeError(f"impl={impl!r} is not callable")
        if when is not None and not callable(when):
            raise TypeError(f"when={when!r} is not callable")
        if devices is not None and not callable(devices):
            raise TypeError(f"devices={devices!r} is not callable")
        # the name "bfloat16" is taken as is: np.dtype knows it only once ml_dtypes is imported
        dts = (
            None
            if dtypes is None
            else frozenset(d if d == "bfloat16" else np.dtype(d).name for d in dtypes)
        )
        if dts is not None:
            bad = dts - set(OPS[op].dtypes)
            if bad:
                raise ValueError(
                    f"op {op!r} does not take dtypes {sorted(bad)} (takes {', '.join(OPS[op].dtypes)})"
                )
        label = name or f"{self.plugin or 'user'}:{getattr(impl, '__qualname__', repr(impl))}"
        if prepare is not None and not callable(prepare):
            raise TypeError(f"prepare={prepare!r} is not callable")
        entry = _Entry(dts, label, impl, self.plugin, when, when_text, devices, prepare)
        with self._lock:
            self._impls.setdefault((op, backend), []).insert(0, entry)
            self.static.clear()
            self.generation += 1
        bump_epoch()

    @staticmethod
    def compile(
        source: str,
        device: Any,
        *,
        defines: Mapping[str, str] | None = None,
        options: Sequence[str] = (),
    ) -> Any:
        """Compile portable kernel ``source`` for ``device``: :func:`hal.kernels.compile` for plugins.

        A backend's dedicated implementation that runs a kernel written in the portable language
        compiles it through the registry it was handed, so that the backend package never
        imports ``hal.kernels`` (backends sit below it; ``nox -s layers``). Returns a
        :class:`hal.kernels.Program`; arguments and errors as :func:`hal.kernels.compile`.
        """
        from hal.kernels._program import compile as compile_program

        return compile_program(source, device, defines=defines, options=options)

    def lookup_static(
        self, op: str, backend: str, dtype: str
    ) -> tuple[str, Impl] | Literal[False] | None:
        """Return :meth:`lookup`'s answer when it cannot depend on the call, else False (memoised)."""
        key = (op, backend, dtype)
        try:
            return self.static[key]
        except KeyError:
            pass
        entries = self._impls.get((op, backend), ())
        for e in entries:
            if e.dtypes is not None and dtype not in e.dtypes:
                continue
            if e.when is not None or e.devices is not None:
                return False  # the first matching entry has a predicate: decide per call
            break
        found = self.lookup(op, backend, dtype)
        with self._lock:
            self.static[key] = found
        return found

    def lookup(
        self, op: str, backend: str, dtype: str, call: OpCall | None = None, device: Any = None
    ) -> tuple[str, Impl] | None:
        """Return ``(name, impl)`` of the dedicated implementation, or None.

        Without ``call`` (plans), an entry with a ``when`` predicate matches and its name
        carries the ``when_text`` condition. ``device`` (default: the call's stream's device)
        is checked against each entry's ``devices`` predicate.
        """
        if device is None and call is not None:
            device = call.stream.device
        for e in self._impls.get((op, backend), ()):
            if e.dtypes is not None and dtype not in e.dtypes:
                continue
            if e.devices is not None and device is not None and not e.devices(device):
                continue
            if e.when is not None:
                if call is None:
                    return f"{e.name} (when {e.when_text or 'its condition holds'})", e.impl
                if not e.when(call):
                    continue
            return e.name, e.impl
        return None

    def preparer(self, op: str, backend: str, impl: Impl) -> Prepare | None:
        """Return the ``prepare`` registered with ``impl`` for (op, backend), or None (the launch cache)."""
        for e in self._impls.get((op, backend), ()):
            if e.impl is impl:
                return e.prepare
        return None

    def entries(self) -> list[dict[str, Any]]:
        """Return every registration (op, backend, dtypes, name, plugin, when), for reports."""
        out = []
        for (op, backend), items in sorted(self._impls.items()):
            for e in items:
                out.append(
                    {
                        "op": op,
                        "backend": backend,
                        "dtypes": sorted(e.dtypes) if e.dtypes else None,
                        "name": e.name,
                        "plugin": e.plugin,
                        "when": e.when_text,
                    }
                )
        return out


#: ``EPOCH[0]`` changes with every registration, registry reset and kernel option change: the
#: launch cache (:mod:`hal.kernels._fast`) holds answers made at one epoch and rebuilds them at another
EPOCH = [0]
#: ``HOT[0]``: the epoch a launch-cache entry must hold to be served: ``EPOCH[0]``, or -1 (no
#: entry holds it) while a :func:`route` block is open in any thread. The launch cache's hit tests
#: this one integer for registration, registry reset, option changes and forced routes.
HOT = [0]
_forcing = [0]  # route() blocks open, all threads
_hot_lock = threading.Lock()


def bump_epoch() -> None:
    """Invalidate every cached launch answer (the next call of each kind takes the full dispatch)."""
    with _hot_lock:  # one writer at a time: HOT never goes back to an older epoch
        EPOCH[0] += 1
        HOT[0] = -1 if _forcing[0] else EPOCH[0]


def _forcing_add(n: int) -> None:
    with _hot_lock:
        _forcing[0] += n
        HOT[0] = -1 if _forcing[0] else EPOCH[0]


_kopts.on_change.append(bump_epoch)

_registry: KernelRegistry | None = None
_registry_lock = threading.Lock()
_hook_failures: dict[str, str] = {}


def registry() -> KernelRegistry:
    """Return the process-wide registry, calling every plugin's ``hal_register_kernels`` once."""
    global _registry
    reg0 = _registry
    if reg0 is not None:  # the hot path: no lock
        return reg0
    with _registry_lock:
        if _registry is None:
            reg = KernelRegistry()
            from hal.plugins import get_system

            def label(name: str) -> None:
                reg.plugin = name

            _hook_failures.update(
                get_system().call_plugin_hook("hal_register_kernels", on_plugin=label, registry=reg)
            )
            reg.plugin = ""
            _registry = reg
        return _registry


def hook_failures() -> dict[str, str]:
    """Return ``{plugin: reason}`` for plugins whose ``hal_register_kernels`` raised."""
    registry()
    return dict(_hook_failures)


def register(
    op: str,
    backend: str,
    impl: Impl,
    *,
    dtypes: Iterable[Any] | None = None,
    name: str | None = None,
    when: Callable[[OpCall], bool] | None = None,
    when_text: str = "",
    devices: Callable[[Any], bool] | None = None,
    prepare: Prepare | None = None,
) -> None:
    """Register a dedicated implementation in-process (same as a plugin's ``registry.add``)."""
    label = name or f"user:{getattr(impl, '__qualname__', repr(impl))}"
    registry().add(
        op,
        backend,
        impl,
        dtypes=dtypes,
        name=label,
        when=when,
        when_text=when_text,
        devices=devices,
        prepare=prepare,
    )


def _reset_registry() -> None:
    """Forget registrations (tests; the hooks run again on next use)."""
    global _registry
    with _registry_lock:
        _registry = None
        _hook_failures.clear()
    bump_epoch()


hal.runtime().register_cache("hal.kernels.registry", _reset_registry)


# -- strict mode, forced routes ------------------------------------------------------------
_ENV_BYTES: Any = getattr(os.environ, "_data", None)  # CPython/POSIX: os.environ's bytes dict


def strict() -> bool:
    """Return True when ``HAL_KERNELS_STRICT`` forbids generic and host fallbacks."""
    if (
        _kopts.given.strict is None
        and type(_ENV_BYTES) is dict
        and b"HAL_KERNELS_STRICT" not in _ENV_BYTES
    ):
        return False  # the launch path: unset, answered without decoding the environment
    return bool(_kopts.options().strict)  # configure() wins; hal.ConfigError names a bad value


class _Forced(threading.local):
    value: str | None = None  # read as a plain attribute on the launch path


_forced = _Forced()


@contextlib.contextmanager
def route(implementation: str) -> Iterator[None]:
    """Prefer ``implementation`` (``dedicated``/``generic``/``host``) for ops in this thread.

    For benchmarks and accuracy reports that compare routes. A call that has no such
    route takes the usual one (records say what ran). Strict mode does not apply inside.
    While a block is open, in any thread, the launch cache serves and learns nothing: every
    op call takes the full dispatch (same results, slower).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation={implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}"
        )
    prev = getattr(_forced, "value", None)
    _forced.value = implementation
    _forcing_add(1)  # the launch cache's hits stop (every thread) until the block ends
    try:
        yield
    finally:
        _forced.value = prev
        _forcing_add(-1)


def forced() -> str | None:
    """Return the route forced by :func:`route` in this thread, or None."""
    return getattr(_forced, "value", None)


class _Internal(threading.local):
    depth = 0  # read as a plain attribute on the launch path


_internal = _Internal()
#: ``INSIDE[0]``: :func:`internal` blocks open in all threads (0: no thread's ``depth`` need be read)
INSIDE = [0]
_inside_lock = threading.Lock()


def _inside_add(n: int) -> None:
    with _inside_lock:
        INSIDE[0] += n


@contextlib.contextmanager
def internal() -> Iterator[None]:
    """Mark the op calls of this thread inside the block as a library's own (hal.comm's reductions).

    They run and are recorded in :func:`trace` as usual, but a fallback among them is not
    counted in the exit summary ("op call(s) ran without a dedicated kernel") and
    ``HAL_KERNELS_STRICT=1`` does not refuse them: the user did not call them and cannot
    change their route. Libraries built on hal.kernels use it for their internal steps.
    """
    depth = getattr(_internal, "depth", 0)
    _inside_add(1)  # before depth: a hit that sees INSIDE[0] == 0 needs no depth
    _internal.depth = depth + 1
    try:
        yield
    finally:
        _internal.depth = depth
        _inside_add(-1)


def is_internal() -> bool:
    """Return True inside :func:`internal` (in this thread)."""
    return bool(getattr(_internal, "depth", 0))


# -- records -------------------------------------------------------------------------------
_tracers: list[list[DispatchRecord]] = []
_tracers_lock = threading.Lock()
_fallbacks: collections.Counter[tuple[str, str, str, str]] = collections.Counter()


@contextlib.contextmanager
def trace() -> Iterator[list[DispatchRecord]]:
    """Collect a :class:`DispatchRecord` for every op call (any thread) inside the block.

    Example::

        with hal.kernels.trace() as records:
            hal.kernels.matmul(a, b, stream=s)
        print(records[0].implementation)
    """
    records: list[DispatchRecord] = []
    with _tracers_lock:
        _tracers.append(records)
    try:
        yield records
    finally:
        with _tracers_lock:
            for i, t in enumerate(_tracers):
                if t is records:  # identity: two traces may hold equal lists
                    del _tracers[i]
                    break


def record(rec: DispatchRecord) -> None:
    """Deliver ``rec`` to active traces and count fallbacks for the exit summary."""
    fallback = None
    if rec.implementation != "dedicated":
        fallback = (rec.op, rec.dtype, rec.backend, rec.implementation)
    deliver(rec, fallback)


def deliver(rec: DispatchRecord, fallback: tuple[str, str, str, str] | None) -> None:
    """:func:`record` with the summary key precomputed (``None`` for a dedicated call): the launch path."""
    if fallback is not None and not getattr(_internal, "depth", 0):
        _fallbacks[fallback] += 1
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("dispatch %s", rec)
    if _tracers:  # tracing off: one truth test
        with _tracers_lock:
            for t in _tracers:
                t.append(rec)


def fallback_counts() -> Mapping[tuple[str, str, str, str], int]:
    """Return ``{(op, dtype, backend, implementation): calls}`` of fallbacks so far."""
    return dict(_fallbacks)


def summary_line() -> str | None:
    """Return the exit summary of fallbacks used in this process, or None if none were."""
    if not _fallbacks:
        return None
    by_route: dict[str, int] = collections.Counter()
    ops: dict[str, set[str]] = collections.defaultdict(set)
    for (op, dtype, backend, impl), n in _fallbacks.items():
        by_route[impl] += n
        ops[f"{impl} on {backend}"].add(f"{op}[{dtype}]")

    def few(names: set[str]) -> str:
        shown = sorted(names)
        more = f" and {len(shown) - 6} more" if len(shown) > 6 else ""
        return ", ".join(shown[:6]) + more

    parts = "; ".join(f"{k}: {few(v)}" for k, v in sorted(ops.items()))
    counts = ", ".join(f"{n} {k}" for k, n in sorted(by_route.items()))
    return (
        f"hal.kernels: {counts} op call(s) ran without a dedicated kernel ({parts}). "
        "`hal kernels plan` shows coverage; HAL_KERNELS_STRICT=1 makes this an error."
    )


def _exit_summary() -> None:
    given = _kopts.given.summary  # configure() wins; a bad HAL_KERNELS_SUMMARY warns
    if not (given if given is not None else setting_at_import("HAL_KERNELS_SUMMARY")):
        return
    line = summary_line()
    if line:
        _log.warning("%s", line)


atexit.register(_exit_summary)
