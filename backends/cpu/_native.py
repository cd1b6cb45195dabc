"""The CPU emulator's native stream runtime: C worker threads behind cffi (``HAL_CPU_NATIVE``).

``_runtime.c`` (beside this file) is compiled with the host C compiler at first use, stored
in hal.kernels' verified compile cache (reused by later processes) and loaded with cffi's
ABI mode. Each stream is a native queue served by a pthread that runs copies, memsets,
event records and waits, host-signal waits and compiled kernels without the GIL; Python
validates and enqueues with one cffi call per operation. Python callables (the emulator's
NumPy ops, faulted operations, tests' callables) are queued too and run through a cffi
callback that takes the GIL, in stream order.

Without a C compiler or cffi, or when the build fails, :func:`runtime` returns None, the
reason is logged once (logger ``hal.backends.cpu``) and kept in :func:`unavailable_reason`,
and the streams use the Python worker threads (:mod:`hal.backends.cpu._worker`).
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from hal import StreamError
from hal.spi import EventImpl, HostSignalImpl

__all__ = [
    "CDEF",
    "NativeEvent",
    "NativeHostSignal",
    "NativeWorker",
    "Runtime",
    "runtime",
    "unavailable_reason",
]

_log = logging.getLogger("hal.backends.cpu")

CDEF = """
typedef struct hal_stream hal_stream;
typedef struct hal_mark hal_mark;
double hal_rt_now(void);
void hal_rt_set_callback(void (*cb)(int64_t));
void hal_rt_finalizing(void);
hal_mark *hal_rt_mark_new(void);
void hal_rt_mark_release(hal_mark *);
void hal_rt_mark_fire(hal_mark *);
int hal_rt_mark_done(hal_mark *);
double hal_rt_mark_time(hal_mark *);
void hal_rt_mark_wait(hal_mark *);
hal_stream *hal_rt_stream_new(int, uint64_t);
int64_t hal_rt_copy(hal_stream *, uintptr_t, uintptr_t, size_t, int);
int64_t hal_rt_copy_h2d(hal_stream *, uintptr_t, const char *, size_t, int);
int64_t hal_rt_copy_d2h(hal_stream *, char *, uintptr_t, size_t, int);
int64_t hal_rt_memset(hal_stream *, uintptr_t, int, size_t, int);
int64_t hal_rt_record(hal_stream *, hal_mark *);
int64_t hal_rt_wait(hal_stream *, hal_mark *);
int64_t hal_rt_wait_host(hal_stream *, hal_mark *);
int64_t hal_rt_kernel(hal_stream *, uintptr_t, const char *, size_t, int);
int64_t hal_rt_call(hal_stream *, int64_t);
int hal_rt_begin_inline(hal_stream *);
void hal_rt_end_inline(hal_stream *);
void hal_rt_synchronize(hal_stream *);
void hal_rt_settle(hal_stream *);
int hal_rt_idle(hal_stream *);
uint64_t hal_rt_completed(hal_stream *);
int hal_rt_alive(hal_stream *);
void hal_rt_stream_close(hal_stream *, int);
int hal_rt_on_worker(hal_stream *);
"""

#: How the runtime is compiled (with the compiler of the emulator's kernels, HAL_CPU_CC).
RUNTIME_CFLAGS = ("-O2", "-fPIC", "-shared", "-std=gnu11", "-pthread")
_SOURCE = Path(__file__).with_name("_runtime.c")
_PIN_PRUNE = 64  # prune the pins of completed work once this many are held


class Runtime:
    """The loaded runtime: ``ffi``, ``lib`` and the callback that runs queued Python callables."""

    def __init__(self, library: bytes) -> None:
        import cffi

        from hal.backends.cpu._kernels import _private_dir

        fd, path = tempfile.mkstemp(suffix=".so", dir=_private_dir())
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(library)
            self.ffi = ffi = cffi.FFI()
            ffi.cdef(CDEF)
            self.lib = lib = ffi.dlopen(path)
        finally:
            os.unlink(path)
        self.calls: dict[int, tuple[NativeWorker, Any]] = {}
        self.tokens = itertools.count(1)
        calls = self.calls

        def on_call(token: int) -> None:
            entry = calls.pop(token, None)
            if entry is None:
                return
            worker, op = entry
            try:
                op()
            except BaseException as exc:  # noqa: BLE001 - surfaced at synchronize
                worker._fail(exc)

        self._callback = ffi.callback("void(int64_t)", on_call)  # kept alive with the runtime
        lib.hal_rt_set_callback(self._callback)
        atexit.register(lib.hal_rt_finalizing)  # no callbacks into a finalizing interpreter
        self.from_buffer = ffi.from_buffer
        self.NULL = ffi.NULL


_lock = threading.Lock()
_runtime: Runtime | None = None
_reason: str | None = None
_tried = False


def _build() -> bytes:
    """Compile ``_runtime.c`` (or take it from the compile cache); raise OSError/RuntimeError."""
    from hal.backends.cpu import _kernels

    source = _SOURCE.read_text(encoding="utf-8")
    cc = _kernels._compiler()
    info = {**_kernels.compiler_info(), "cflags": " ".join(RUNTIME_CFLAGS)}
    cache: Any = None
    key = ""
    try:
        from hal.kernels import _cache as cache

        key = cache.cache_key(
            source=source, options=[], backend="cpu", device="native-runtime", compiler=info
        )
        hit = cache.load(key)
        if hit is not None:
            return hit
    except ImportError:  # pragma: no cover - hal.kernels is part of the distribution
        cache = None
    with tempfile.TemporaryDirectory(prefix="hal-rt-", dir=_kernels._private_dir()) as tmp:
        lib = os.path.join(tmp, "runtime.so")
        cmd = [cc, *RUNTIME_CFLAGS, str(_SOURCE), "-o", lib]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            first = next(
                (ln for ln in (proc.stderr + proc.stdout).splitlines() if "error" in ln),
                proc.stderr.strip()[:200],
            )
            raise RuntimeError(f"{os.path.basename(cc)} failed on _runtime.c: {first.strip()}")
        data = Path(lib).read_bytes()
    if cache is not None:
        cache.store(key, data, {"what": "cpu native runtime", "kernels": []})
    return data


def runtime() -> Runtime | None:
    """Return the native runtime, building it at first use; None where it cannot run (logged once)."""
    global _runtime, _reason, _tried
    if _tried:
        return _runtime
    with _lock:
        if _tried:
            return _runtime
        from hal.backends.cpu import _kernels

        why = _kernels.unavailable_reason()
        if why is None:
            try:
                _runtime = Runtime(_build())
            except Exception as exc:  # noqa: BLE001 - any failure: the Python streams
                why = f"{type(exc).__name__}: {exc}"
        if why is not None:
            _reason = (
                f"the native stream runtime is unavailable ({why}); using Python worker threads"
            )
            _log.warning("%s", _reason)
        _tried = True
        return _runtime


def unavailable_reason() -> str | None:
    """Why the native runtime is not in use (after :func:`runtime` was asked), or None."""
    return _reason


class _ThreadView:
    """``is_alive``/``join`` of a native worker, like the ``threading.Thread`` of a Python one."""

    __slots__ = ("_worker",)

    def __init__(self, worker: NativeWorker) -> None:
        self._worker = worker

    def is_alive(self) -> bool:
        w = self._worker
        return not w._joined and bool(w._lib.hal_rt_alive(w._s))

    def join(self, timeout: float | None = None) -> None:
        w = self._worker
        if w._closed and not w._joined:
            w.close()


class NativeWorker:
    """A native stream: the same interface as :class:`hal.backends.cpu._worker.Worker`.

    Failures of queued Python callables are sticky until the next :meth:`synchronize`, which
    raises the first one as :class:`hal.StreamError` (native operations cannot fail). The
    Python objects whose memory queued operations use are pinned until those complete.
    """

    def __init__(self, rt: Runtime, label: str, jitter_seed: int | None) -> None:
        self.label = label
        self.device = label.partition("/")[0]
        self._rt = rt
        self._lib = lib = rt.lib
        seed = 0 if jitter_seed is None else jitter_seed & 0xFFFFFFFFFFFFFFFF
        s = lib.hal_rt_stream_new(int(jitter_seed is not None), seed)
        if s == rt.NULL:
            raise StreamError(f"{label}: cannot start a native worker thread", device=self.device)
        self._s = s
        self._error: BaseException | None = None
        self._err_lock = threading.Lock()
        self._pins: collections.deque[tuple[int, object]] = collections.deque()
        self._closed = False
        self._joined = False
        self._thread = _ThreadView(self)
        self._kernel = lib.hal_rt_kernel

    # -- results of the submit calls ---------------------------------------------------------
    def _queued(self, seq: int, pin: object) -> None:
        """Keep ``pin`` alive until queued operation ``seq`` completed; raise for seq < 0 (refused)."""
        if seq < 0:
            self._refused(seq)
        pins = self._pins
        pins.append((seq, pin))
        if len(pins) > _PIN_PRUNE:
            done = self._lib.hal_rt_completed(self._s)
            while pins and pins[0][0] <= done:
                pins.popleft()

    def _refused(self, seq: int) -> None:
        if seq == -1:
            raise StreamError(f"{self.label} is closed", device=self.device)
        raise MemoryError(f"{self.label}: no memory to queue an operation")

    # -- native operations (copies and memsets are called by CpuStream directly) -------------
    def kernel(self, fn: int, block: bytes, inline: bool, pin: object) -> None:
        """Queue the kernel trampoline at address ``fn`` with a copy of its argument ``block``."""
        seq = self._kernel(self._s, fn, block, len(block), inline)
        if seq:
            self._queued(seq, pin)

    def record(self, mark: Any) -> None:
        """Queue the firing of ``mark`` (a native mark: timestamp, then done)."""
        seq = self._lib.hal_rt_record(self._s, mark)
        if seq < 0:
            self._refused(seq)

    def wait_mark(self, mark: Any) -> None:
        """Make later work wait until ``mark`` fired (it may belong to any stream)."""
        seq = self._lib.hal_rt_wait(self._s, mark)
        if seq < 0:
            self._refused(seq)

    def wait_host(self, mark: Any) -> None:
        """Make later work wait until the host fires ``mark`` (a host signal)."""
        seq = self._lib.hal_rt_wait_host(self._s, mark)
        if seq < 0:
            self._refused(seq)

    # -- the Worker interface ----------------------------------------------------------------
    def submit(self, op: Any, *, inline: bool = False) -> None:
        """Queue the Python callable ``op``; it runs after everything submitted before it.

        With ``inline=True`` it runs right here when the stream is idle and has no jitter
        (see :meth:`hal.backends.cpu._worker.Worker.submit`).
        """
        lib = self._lib
        if inline:
            rc = lib.hal_rt_begin_inline(self._s)
            if rc == 1:
                try:
                    op()
                except BaseException as exc:  # noqa: BLE001 - surfaced at synchronize
                    self._fail(exc)
                finally:
                    lib.hal_rt_end_inline(self._s)
                return
            if rc < 0:
                self._refused(-1)
        rt = self._rt
        token = next(rt.tokens)
        rt.calls[token] = (self, op)
        seq = lib.hal_rt_call(self._s, token)
        if seq < 0:
            rt.calls.pop(token, None)
            self._refused(seq)

    def _fail(self, exc: BaseException) -> None:
        with self._err_lock:
            if self._error is None:
                self._error = exc

    def idle(self) -> bool:
        """True when every submitted operation has completed."""
        return bool(self._lib.hal_rt_idle(self._s))

    def settle(self) -> None:
        """Wait until every submitted operation completed, or the worker waits for a host signal."""
        self._lib.hal_rt_settle(self._s)

    def synchronize(self) -> None:
        """Wait for all submitted operations; raise the first failure since the last call."""
        self._lib.hal_rt_synchronize(self._s)
        if self._pins:
            done = self._lib.hal_rt_completed(self._s)
            pins = self._pins
            while pins and pins[0][0] <= done:
                pins.popleft()
        if self._error is None:
            return
        with self._err_lock:
            err, self._error = self._error, None
        if err is not None:
            if isinstance(err, StreamError):
                raise err
            raise StreamError(
                f"{type(err).__name__}: {err} (on {self.label})", device=self.device
            ) from err

    def close(self) -> None:
        """Finish queued work and stop the thread. Idempotent."""
        if self._joined:
            return
        lib = self._lib
        on_worker = bool(lib.hal_rt_on_worker(self._s))
        self._closed = True
        self._joined = True
        lib.hal_rt_stream_close(self._s, int(not on_worker))
        if not on_worker:
            self._pins.clear()


class NativeEvent(EventImpl):
    """An event of a native device: the native mark of its last record (CLOCK_MONOTONIC time)."""

    __slots__ = ("_lib", "mark", "timing")

    def __init__(self, rt: Runtime, timing: bool) -> None:
        self.timing = timing
        self._lib = rt.lib
        self.mark: Any = None

    def synchronize(self) -> None:
        mark = self.mark
        if mark is not None:
            self._lib.hal_rt_mark_wait(mark)

    def query(self) -> bool:
        mark = self.mark
        return mark is None or bool(self._lib.hal_rt_mark_done(mark))

    def elapsed_ms(self, start: EventImpl) -> float:
        assert isinstance(start, NativeEvent) and start.mark is not None and self.mark is not None
        lib = self._lib
        return (lib.hal_rt_mark_time(self.mark) - lib.hal_rt_mark_time(start.mark)) * 1e3

    def close(self) -> None:
        """Nothing to release now (the mark is freed with its last reference)."""


def new_mark(rt: Runtime) -> Any:
    """Return a fresh native mark, released when garbage-collected (and by the ops holding it)."""
    m = rt.lib.hal_rt_mark_new()
    if m == rt.NULL:
        raise MemoryError("no memory for an event mark")
    return rt.ffi.gc(m, rt.lib.hal_rt_mark_release)


class NativeHostSignal(HostSignalImpl):
    """A host signal of a native stream: :meth:`set` fires the mark the worker waits on."""

    __slots__ = ("_lib", "mark")

    def __init__(self, rt: Runtime, mark: Any) -> None:
        self._lib = rt.lib
        self.mark = mark

    def set(self) -> None:
        self._lib.hal_rt_mark_fire(self.mark)
