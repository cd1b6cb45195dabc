"""Compile portable kernels for a device and launch them on a stream."""

from __future__ import annotations

import collections
import logging
import operator
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import numpy as np

import hal
from hal.kernels import _cache
from hal.kernels._language import parse_kernels, translate
from hal.kernels._options import options as kernel_options
from hal.spi import BufferArg, KernelBuildError, KernelSignature, ProgramImpl, impl_of

__all__ = ["CacheStats", "Program", "cache_stats", "compile", "dialect_of"]

_log = logging.getLogger("hal.kernels")


class CacheStats:
    """Counters of this process's compile-cache traffic (``hits``, ``misses``, ``memory_hits``)."""

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.memory_hits = 0

    def as_dict(self) -> dict[str, int]:
        """Return the counters as a dict."""
        return {"hits": self.hits, "misses": self.misses, "memory_hits": self.memory_hits}


_stats = CacheStats()
# compiled programs by (device, cache key), least recently used first; bounded by
# KernelOptions.program_cache (HAL_KERNELS_PROGRAM_CACHE, default 256)
_programs: collections.OrderedDict[tuple[hal.Device, str], Program] = collections.OrderedDict()
_programs_lock = threading.Lock()


def cache_stats() -> CacheStats:
    """Return this process's compile-cache counters (disk hits, misses, in-memory hits)."""
    return _stats


_dialects: dict[hal.Device, str] = {}


def dialect_of(device: hal.Device) -> str:
    """Return the kernel dialect ``device`` compiles ("" if it has no kernel capability)."""
    d = _dialects.get(device)
    if d is None:
        d = ""
        if device.capabilities.kernels:
            d = str(getattr(impl_of(device), "kernel_dialect", "") or "")
        _dialects[device] = d
    return d


@final
class Program:
    """Kernels compiled for one device. Create with :func:`hal.kernels.compile`.

    Attributes:
        device: the device the program runs on.
        key: the compile-cache key (hex SHA-256); its first 16 digits are the kernel hash
            shown in dispatch records.
        source: the translated code that was compiled (``hal kernels translate`` prints it).
        build_log: the compiler's output.
        kernels: entry-point signatures by name.
    """

    __slots__ = ("_dtypes", "_impl", "_specs", "build_log", "device", "kernels", "key", "source")
    device: hal.Device
    key: str
    source: str
    build_log: str
    kernels: dict[str, KernelSignature]
    _impl: ProgramImpl
    _dtypes: dict[str, tuple[np.dtype[Any], ...]]
    #: per kernel, built once: its signature and ``(is pointer, dtype)`` per parameter
    _specs: dict[str, tuple[KernelSignature, tuple[tuple[bool, np.dtype[Any]], ...]]]

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Programs come from hal.kernels.compile(source, device)")

    @classmethod
    def _make(
        cls,
        device: hal.Device,
        impl: ProgramImpl,
        key: str,
        source: str,
        sigs: list[KernelSignature],
    ) -> Program:
        self = object.__new__(cls)
        self.device = device
        self._impl = impl
        self.key = key
        self.source = source
        self.build_log = impl.build_log
        self.kernels = {s.name: s for s in sigs}
        self._dtypes = {s.name: tuple(np.dtype(p.dtype) for p in s.params) for s in sigs}
        self._specs = {
            s.name: (
                s,
                tuple(zip((p.pointer for p in s.params), self._dtypes[s.name], strict=True)),
            )
            for s in sigs
        }
        return self

    @property
    def hash(self) -> str:
        """The short kernel hash (16 hex digits of :attr:`key`)."""
        return self.key[:16]

    def launch(
        self,
        kernel: str,
        global_size: int | Sequence[int],
        args: Sequence[Any],
        *,
        stream: hal.Stream,
        work: int | None = None,
    ) -> None:
        """Enqueue ``kernel`` over ``global_size`` work items on ``stream``.

        Args:
            kernel: the entry point's name.
            global_size: 1 to 3 non-negative sizes (dimension 0 varies fastest); an empty
                range enqueues nothing.
            args: one per kernel parameter: a :class:`hal.Array` (or :class:`hal.Buffer`)
                of this device for each ``HAL_GLOBAL`` pointer (an Array's dtype must match),
                a number for each scalar (converted to the parameter's type).
            stream: a stream of :attr:`device`.
            work: optional estimate of elementary operations, a hint for backends that
                split work across cores (the CPU emulator uses it for OpenMP).

        Raises:
            ValueError / TypeError: unknown kernel, bad size, wrong argument count or type.
            hal.DeviceMismatchError: a stream or array of another device.
        """
        spec = self._specs.get(kernel) if type(kernel) is str else None
        if spec is None:
            raise ValueError(
                f"kernel={kernel!r} is not in this program (has: {', '.join(self.kernels)})"
            )
        if type(global_size) is int and global_size > 0:  # the hot path: a 1-d range
            gs: tuple[int, int, int] = (global_size, 1, 1)
        else:
            gs = _global_size(global_size)
        if type(stream) is not hal.Stream and not isinstance(stream, hal.Stream):
            raise TypeError(f"stream={stream!r} is not a hal.Stream")
        dev = self.device
        sdev = stream.device
        if sdev is not dev and sdev != dev:
            raise hal.DeviceMismatchError(
                f"stream belongs to {stream.device}, the program to {self.device}"
            )
        sig, params = spec
        if len(args) != len(params):
            raise TypeError(
                f"kernel {sig.name!r} takes {len(sig.params)} arguments, got {len(args)}"
            )
        # the hot path, inlined: an Array of the parameter's dtype on this device, a Python number
        out: list[Any] = []
        append = out.append
        for (pointer, dt), a in zip(params, args, strict=True):  # lengths checked above
            ta = type(a)
            if pointer:
                if ta is _Array:
                    # hal.Array's and hal.Buffer's slots read directly (no property calls): an open
                    # buffer of this device and an array of the parameter's dtype; else the
                    # checking path below names what is wrong
                    buf = a._buffer
                    adt = a._dtype
                    mem = buf._impl
                    if (
                        (adt is dt or adt == dt)
                        and buf._device is dev
                        and buf._nbytes
                        and mem is not None
                    ):
                        # BufferArg(mem, offset) without the frozen dataclass's __init__ (two
                        # object.__setattr__ calls, the costliest step of a launch): the same object
                        barg = _new_arg(BufferArg)
                        barg.__dict__.update(memory=mem, offset=a._offset)
                        append(barg)
                        continue
            elif ta is float or ta is int:
                append(dt.type(a))
                continue
            break
        if len(out) != len(params):
            out = self._convert(sig, args)
        if gs[0] == 0 or gs[1] == 0 or gs[2] == 0:
            return
        simpl = stream._live()  # impl_of(stream): open, past any fallback host wait, counted
        if work:
            simpl.launch(self._impl, kernel, gs, out, work=work)
        else:
            simpl.launch(self._impl, kernel, gs, out)

    def launcher(
        self,
        kernel: str,
        global_size: int | Sequence[int],
        *,
        stream: hal.Stream,
        work: int | None = None,
    ) -> Callable[..., None] | None:
        """Return the backend's prepared launch of ``kernel`` on ``stream``, or None (it has none).

        For a dedicated implementation's ``prepare`` (:meth:`KernelRegistry.add`): the stream's
        ``StreamImpl.launcher`` (SPI 1.2), asked once. The returned function takes, per
        ``HAL_GLOBAL`` pointer, the buffer's SPI memory (``array.spi_buffer.spi_memory``) and
        the byte offset (``array.spi_offset``), and per scalar a number, in the kernel's order;
        it checks only that the memory was not freed (``hal.StreamError``): dtypes, device and
        sizes are the caller's to guarantee, as :meth:`launch` checks them. Call
        ``hal.spi.stream_impl(stream)`` before each launch (it raises once the stream is closed).
        None: the backend prepares nothing (use :meth:`launch`).

        Raises:
            ValueError / TypeError / hal.DeviceMismatchError: as :meth:`launch`.
        """
        if (self._specs.get(kernel) if type(kernel) is str else None) is None:
            raise ValueError(
                f"kernel={kernel!r} is not in this program (has: {', '.join(self.kernels)})"
            )
        gs = _global_size(global_size)
        if not isinstance(stream, hal.Stream):
            raise TypeError(f"stream={stream!r} is not a hal.Stream")
        if stream.device != self.device:
            raise hal.DeviceMismatchError(
                f"stream belongs to {stream.device}, the program to {self.device}"
            )
        if gs[0] == 0 or gs[1] == 0 or gs[2] == 0:
            return None
        make = getattr(impl_of(stream), "launcher", None)  # a backend not subclassing StreamImpl
        bound: Callable[..., None] | None = (
            None if make is None else make(self._impl, kernel, gs, work=work)
        )
        return bound

    def _convert(self, sig: KernelSignature, args: Sequence[Any]) -> list[Any]:
        """Check and convert every argument (the slow path: it names what is wrong)."""
        if len(args) != len(sig.params):
            raise TypeError(
                f"kernel {sig.name!r} takes {len(sig.params)} arguments, got {len(args)}"
            )
        out: list[Any] = []
        dev = self.device
        for p, dt, a in zip(sig.params, self._dtypes[sig.name], args, strict=True):
            if p.pointer:
                ta = type(a)
                if ta is hal.Array:
                    if a.dtype != dt:
                        raise TypeError(
                            f"kernel {sig.name!r}: argument {p.name!r} wants {p.dtype}, got an array of {a.dtype}"
                        )
                    buf, off = a.buffer, a.offset
                elif type(a) is hal.Buffer:
                    buf, off = a, 0
                else:
                    raise TypeError(
                        f"kernel {sig.name!r}: argument {p.name!r}={a!r} must be a hal.Array or hal.Buffer"
                    )
                bdev = buf.device
                if bdev is not dev and bdev != dev:
                    raise hal.DeviceMismatchError(
                        f"kernel {sig.name!r}: argument {p.name!r} lives on {bdev}, the program on {dev}"
                    )
                if buf.nbytes == 0:
                    raise ValueError(f"kernel {sig.name!r}: argument {p.name!r} is an empty buffer")
                out.append(BufferArg(impl_of(buf), off))
            else:
                ta = type(a)
                if ta is int or ta is float:
                    out.append(dt.type(a))
                    continue
                if isinstance(a, bool) or not isinstance(a, (int, float, np.integer, np.floating)):
                    raise TypeError(
                        f"kernel {sig.name!r}: argument {p.name!r}={a!r} must be a number ({p.dtype})"
                    )
                out.append(dt.type(a))
        return out

    def __repr__(self) -> str:
        return f"<hal.kernels.Program {', '.join(self.kernels)} on {self.device} hash={self.hash}>"


_Array = hal.Array
_new_arg = object.__new__


def _global_size(value: int | Sequence[int]) -> tuple[int, int, int]:
    dims = [value] if not isinstance(value, Sequence) else list(value)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"global_size={value!r} must have 1 to 3 dimensions")
    out = []
    for d in dims:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError(f"global_size={value!r} must hold integers")
        n = operator.index(d)
        if n < 0:
            raise ValueError(f"global_size={value!r} must be >= 0 in every dimension")
        out.append(n)
    while len(out) < 3:
        out.append(1)
    return (out[0], out[1], out[2])


def compile(
    source: str,
    device: hal.Device,
    *,
    defines: Mapping[str, str] | None = None,
    options: Sequence[str] = (),
) -> Program:
    """Compile portable kernel ``source`` for ``device`` (through the compile cache).

    Args:
        source: kernels in the portable language (docs/kernels.md).
        device: a device whose backend declares ``capabilities.kernels``.
        defines: ``#define`` values put before the source (``{"T": "hal_f32"}``).
        options: extra compiler options, passed to the backend as they are.

    Raises:
        hal.HalError: the device has no kernel capability (the reason says why).
        hal.spi.KernelBuildError: the backend compiler rejected the source; ``build_log`` has its output.
        ValueError: the source breaks a rule of the language.
    """
    if not isinstance(device, hal.Device):
        raise TypeError(f"device={device!r} is not a hal.Device")
    if isinstance(options, str) or not all(isinstance(o, str) for o in options):
        raise TypeError(f"options={options!r} must be a sequence of strings")
    dialect = dialect_of(device)
    if not dialect:
        why = device.capabilities.reason_absent("kernels") or "no kernel dialect declared"
        raise hal.HalError(f"{device} cannot compile kernels: {why}")
    defs = dict(defines or {})
    translated = translate(source, dialect, defines=defs)
    sigs = parse_kernels(source, defs)
    dimpl = impl_of(device)
    compiler = dict(dimpl.compiler_info())
    key = _cache.cache_key(
        source=translated,
        options=options,
        backend=device.backend,
        device=compiler.get("device", device.name),
        compiler=compiler,
    )
    with _programs_lock:
        hit = _programs.get((device, key))
        if hit is not None:
            _programs.move_to_end((device, key))
    if hit is not None:
        _stats.memory_hits += 1
        return hit
    impl: ProgramImpl | None = None
    binary = _cache.load(key)
    if binary is not None:
        try:
            impl = dimpl.load_program(
                binary, source=translated, options=list(options), kernels=sigs
            )
            _stats.hits += 1
        except Exception as exc:  # a stale or foreign binary: rebuild it
            _log.info("compile cache entry %s unusable (%s); recompiling", key[:16], exc)
            impl = None
    if impl is None:
        _stats.misses += 1
        try:
            impl = dimpl.compile(translated, options=list(options), kernels=sigs)
        except KernelBuildError:
            raise
        except NotImplementedError as exc:
            raise hal.HalError(f"{device} cannot compile kernels: {exc}") from exc
        blob = impl.binary()
        if blob is not None:
            _cache.store(
                key,
                blob,
                {
                    "backend": device.backend,
                    "device": compiler.get("device", device.name),
                    "kernels": [s.name for s in sigs],
                },
            )
    program = Program._make(device, impl, key, translated, sigs)
    limit = int(kernel_options().program_cache or 1)
    with _programs_lock:
        program = _programs.setdefault((device, key), program)
        _programs.move_to_end((device, key))
        while len(_programs) > limit:  # the least recently used go; their users keep them alive
            _programs.popitem(last=False)
    return program


def program_cache_keys() -> list[tuple[hal.Device, str]]:
    """Return the keys of the in-memory programs, least recently used first."""
    with _programs_lock:
        return list(_programs)


def _forget_programs() -> None:
    """Drop in-process programs and dialects (``hal.runtime().reset()``; tests of the disk cache)."""
    with _programs_lock:
        _programs.clear()
    _dialects.clear()


hal.runtime().register_cache("hal.kernels.programs", _forget_programs)
