"""Settings of hal.kernels as an options object: :class:`KernelOptions`, :func:`configure`."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import final

import hal
from hal.spi import Options, env_field

__all__ = ["KernelOptions", "configure", "options"]


@final
@dataclasses.dataclass(frozen=True)
class KernelOptions(Options):
    """Settings of ``hal.kernels``; a field left None takes its environment variable, then the default.

    Pass one to :func:`hal.kernels.configure` (code wins over the environment, field by field).

    Attributes:
        strict: generic and host fallbacks raise :class:`hal.kernels.KernelFallbackError`
            (``HAL_KERNELS_STRICT``, default off).
        summary: log the fallback summary at exit (``HAL_KERNELS_SUMMARY``, default on).
        program_cache: compiled programs kept in memory, least recently used dropped first
            (``HAL_KERNELS_PROGRAM_CACHE``, default 256).
        cache_dir: root of the on-disk compile cache (``HAL_CACHE_DIR``; default
            ``$XDG_CACHE_HOME/hal-sdk``).
        cache_max_bytes: cap of the on-disk compile cache, 0 disables it
            (``HAL_CACHE_MAX_BYTES``, default 512M).
    """

    strict: bool | None = env_field("HAL_KERNELS_STRICT")
    summary: bool | None = env_field("HAL_KERNELS_SUMMARY")
    program_cache: int | None = env_field("HAL_KERNELS_PROGRAM_CACHE")
    cache_dir: str | None = env_field("HAL_CACHE_DIR")
    cache_max_bytes: int | None = env_field("HAL_CACHE_MAX_BYTES")


#: the options given to :func:`configure` (fields None: not given)
given = KernelOptions()
_lock = threading.Lock()
#: called after every change of the options (hal.kernels' launch cache drops its answers)
on_change: list[Callable[[], None]] = []


def configure(options: KernelOptions | None = None) -> KernelOptions:
    """Set this process's kernel options given in code; return them resolved.

    Fields given here win over the environment; None (or a field left None) goes back to the
    environment. ``hal.runtime().reset()`` forgets them.

    Raises:
        TypeError: ``options`` is not a :class:`KernelOptions`.
        hal.ConfigError: a field's value does not fit (named ``KernelOptions.field``).
    """
    global given
    if options is None:
        options = KernelOptions()
    if not isinstance(options, KernelOptions):
        raise TypeError(f"options={options!r} is not a hal.kernels.KernelOptions")
    resolved = options.resolved()  # checks before anything changes
    with _lock:
        given = options
    for fn in on_change:
        fn()
    return resolved


def options(env: Mapping[str, str] | None = None) -> KernelOptions:
    """Return the options in force: those given to :func:`configure`, the environment, the defaults."""
    return given.resolved(env)


def _forget() -> None:
    global given
    with _lock:
        given = KernelOptions()
    for fn in on_change:
        fn()


hal.runtime().register_cache("hal.kernels.options", _forget)
