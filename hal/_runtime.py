"""The runtime: one owner for hal's process state (plugins, backends, devices, registries, caches).

``hal.runtime()`` returns the process's :class:`Runtime`. It owns the plugin system (and, through
it, the loaded backends and their devices) and knows every registry and cache of hal and of the
upper layers: ``hal.comm``, ``hal.kernels`` and ``hal.sched`` register theirs with
:meth:`Runtime.register_cache` when they are imported (core never imports them).
:meth:`Runtime.reset` closes the backends (``BackendImpl.close()``) and drops every cache, so
that the next call loads plugins again under the current environment; tests use it instead of
patching module globals. At interpreter exit the runtime closes the backends it loaded.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from hal.plugins._loader import PluginSystem

__all__ = ["Runtime", "runtime"]

_log = logging.getLogger("hal.runtime")


@final
class Runtime:
    """hal's process state. Get it with :func:`hal.runtime`; never construct it.

    Attributes:
        generation: how many times :meth:`reset` ran (caches keyed by it know they are stale).
    """

    def __init__(self) -> None:
        if "_runtime" in globals():  # one per process, like the state it owns
            raise TypeError("hal.Runtime is created once per process; use hal.runtime()")
        self._lock = threading.RLock()
        self._plugins: PluginSystem | None = None
        self._caches: dict[str, Callable[[], None]] = {}
        self._exit_hook = False
        self.generation = 0

    # -- the plugin system ------------------------------------------------------------------
    @property
    def plugins(self) -> PluginSystem:
        """The plugin system (loads the plugins on first use, under the current environment)."""
        with self._lock:
            if self._plugins is None:
                if _plugin_factory is None:  # pragma: no cover - hal/__init__.py installs it
                    from hal._errors import HalError

                    raise HalError("hal's plugin layer is not wired in (import hal first)")
                self._plugins = _plugin_factory()
                if not self._exit_hook:
                    atexit.register(self._close_at_exit)
                    self._exit_hook = True
            return self._plugins

    @property
    def loaded(self) -> bool:
        """Whether the plugins are loaded (a call that needs backends has run since the last reset)."""
        return self._plugins is not None

    # -- registries and caches --------------------------------------------------------------
    def register_cache(self, name: str, clear: Callable[[], None]) -> None:
        """Register a registry or cache that :meth:`reset` drops by calling ``clear()``.

        ``name`` says whose it is (``"hal.kernels.programs"``); registering a name again
        replaces its callback (a reloaded module).

        Raises:
            TypeError: ``clear`` is not callable or ``name`` is not a string.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"name={name!r} must be a non-empty string")
        if not callable(clear):
            raise TypeError(f"clear={clear!r} must be callable")
        with self._lock:
            self._caches[name] = clear

    def caches(self) -> list[str]:
        """Return the names of the registered registries and caches."""
        with self._lock:
            return sorted(self._caches)

    # -- reset and exit ---------------------------------------------------------------------
    def reset(self) -> None:
        """Close every loaded backend and drop every registry and cache.

        ``BackendImpl.close()`` runs on each backend that was probed; then each registered
        cache is cleared (the plugin registries of ``hal.comm`` and ``hal.kernels``, the
        compiled programs, device handles, ...). The next call that needs backends loads the
        plugins again, reading the environment afresh. Objects made before (devices, buffers,
        streams) belong to the closed backends: do not use them afterwards (the built-in
        backends keep them working; another backend's ``close()`` may not).

        Raises:
            hal.HalError: a cache's ``clear()`` raised (the backends are closed and every other
                cache is still cleared).
        """
        with self._lock:
            system, self._plugins = self._plugins, None
            self.generation += 1
        if system is not None:
            system.close()
        self.clear_caches()

    def clear_caches(self) -> None:
        """Drop every registered registry and cache, keeping the plugins and backends loaded.

        The registries filled by plugin hooks (transports, collective providers, kernels) are
        rebuilt from the hooks on next use: after registering a plugin object by hand
        (``hal.runtime().plugins.manager.register(obj)``), this makes its hooks count.

        Raises:
            hal.HalError: a cache's ``clear()`` raised (every other cache is still cleared).
        """
        with self._lock:
            clears = list(self._caches.items())
        failures = []
        for name, clear in clears:
            try:
                clear()
            except Exception as exc:  # noqa: BLE001 - every cache is cleared; the first error is raised
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
        if failures:
            from hal._errors import HalError

            raise HalError("hal.runtime().reset(): clearing failed for " + "; ".join(failures))

    def _close_at_exit(self) -> None:
        """Close the loaded backends (``BackendImpl.close()``) as the interpreter exits."""
        with self._lock:
            system = self._plugins
        if system is not None:
            system.close()

    def __repr__(self) -> str:
        state = "plugins loaded" if self._plugins is not None else "plugins not loaded"
        return f"<hal.Runtime {state}, {len(self._caches)} caches, generation {self.generation}>"


#: Builds the plugin system. Core never imports the plugin layer (hal.plugins sits above it,
#: ``nox -s layers``): the ``hal`` package, the composition root, installs the factory.
_plugin_factory: Callable[[], PluginSystem] | None = None


def _install_plugin_factory(factory: Callable[[], PluginSystem]) -> None:
    """Set how the runtime builds its plugin system (called once, by ``hal/__init__.py``)."""
    global _plugin_factory
    _plugin_factory = factory


_runtime = Runtime()


def runtime() -> Runtime:
    """Return the process's :class:`Runtime` (plugins, backends, registries and caches)."""
    return _runtime
