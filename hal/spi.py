"""The backend SPI, public for vendors: subclass these to write a backend.

See docs/write-a-backend.md. ``compile_cache`` is the verified on-disk cache of compiled
native code (``cache_key``, ``load``, ``store``; settings ``HAL_CACHE_DIR``,
``HAL_CACHE_MAX_BYTES``) for backends that compile code of their own; ``native`` builds a C
source into a native module kept there (``build``, ``load``, ``c_compiler``,
``compiler_version``: a CPython extension, a cffi API-mode module or a cffi ABI-mode library).
Everything here is re-exported from private modules, except :func:`impl_of`, which sits here,
above the SPI classes and the public objects it unwraps (so that ``hal._spi`` imports none of
them: core has no import cycle, ``nox -s layers``).

Fast-path views: code that runs per call (hal.kernels' launch cache) reads core objects through
these, each as cheap as the private attribute it names (no property call), all read-only (never
assign them):

- ``array.signature``: an int naming the array's (dtype, shape, device), equal for arrays of one
  kind (a cache key);
- ``array.spi_buffer``, ``array.spi_offset``: its :class:`hal.Buffer` and byte offset;
- ``buffer.spi_memory``: the :class:`MemoryImpl` behind a buffer, None once it is closed;
- :func:`stream_impl`: the :class:`StreamImpl` to enqueue on, as :func:`impl_of` gives it for
  a stream, without its type check;
- ``open_tracers``: a list, empty while no :func:`hal.trace` is open (then :func:`hal.tracer`
  returns None): a truth test instead of that call.
"""

from typing import Any

from hal import _cache as compile_cache
from hal import _native as native
from hal._capabilities import Capabilities
from hal._device import Device
from hal._errors import ConfigError
from hal._memory import Buffer
from hal._settings import (
    SETTINGS,
    MemoryOptions,
    Options,
    PluginOptions,
    Setting,
    env_field,
    parse_bool,
    parse_choice,
    parse_float,
    parse_int,
    parse_list,
    parse_port,
    parse_size,
    parse_str,
    setting,
    setting_at_import,
)
from hal._spi import (
    TRANSFER_DIRECTIONS,
    BackendImpl,
    BufferArg,
    DeviceImpl,
    EventImpl,
    HostRegion,
    HostSignalImpl,
    KernelBuildError,
    KernelParam,
    KernelSignature,
    MemoryAccount,
    MemoryImpl,
    ProgramImpl,
    StreamImpl,
    check_baseline_args,
)
from hal._stream import Event, Stream
from hal._trace import _open as _trace_open
from hal._version import API_VERSION, moved_names

__all__ = [
    "API_VERSION",
    "SETTINGS",
    "TRANSFER_DIRECTIONS",
    "BackendImpl",
    "BufferArg",
    "Capabilities",
    "ConfigError",
    "DeviceImpl",
    "EventImpl",
    "HostRegion",
    "HostSignalImpl",
    "KernelBuildError",
    "KernelParam",
    "KernelSignature",
    "MemoryAccount",
    "MemoryImpl",
    "MemoryOptions",
    "Options",
    "PluginOptions",
    "ProgramImpl",
    "Setting",
    "StreamImpl",
    "check_baseline_args",
    "compile_cache",
    "env_field",
    "impl_of",
    "moved_names",
    "native",
    "open_tracers",
    "parse_bool",
    "parse_choice",
    "parse_float",
    "parse_int",
    "parse_list",
    "parse_port",
    "parse_size",
    "parse_str",
    "setting",
    "setting_at_import",
    "stream_impl",
]

#: ``stream_impl(stream)``: the :class:`StreamImpl` to enqueue on next for a :class:`hal.Stream`
#: (after any fallback host wait was released; counted in ``stream.enqueue_count``), as
#: :func:`impl_of` returns it, at the cost of a method call; raises :class:`hal.InvalidBufferError`
#: once the stream is closed. Only for streams (no type check: that is :func:`impl_of`).
stream_impl = Stream._live

#: The open tracers (the same list core keeps; read only, never modify it): empty while nothing
#: is traced, when :func:`hal.tracer` returns None. Non-empty: ask :func:`hal.tracer`.
open_tracers: list[Any] = _trace_open


def impl_of(obj: Any) -> Any:
    """Return the SPI object behind a public hal object (for backend plugins and hal.kernels).

    ``Device`` -> :class:`DeviceImpl`, ``Buffer`` -> :class:`MemoryImpl`,
    ``Stream`` -> :class:`StreamImpl`, ``Event`` -> :class:`EventImpl`.

    Raises:
        hal.InvalidBufferError: the buffer, stream or event is closed.
        TypeError: ``obj`` is none of these.
    """
    cls = type(obj)
    if cls is Device:
        return obj._impl
    if cls is Buffer or cls is Stream or cls is Event:
        return obj._live()
    raise TypeError(f"obj={obj!r} is not a hal Device, Buffer, Stream or Event")
