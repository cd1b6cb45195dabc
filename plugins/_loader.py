"""Load backend plugins from the ``hal.backends`` entry-point group, one at a time.

A plugin that fails to import, fails validation or raises in its hook is quarantined
(status ``failed``, with the reason) and the others load. Plugins named in
``HAL_DISABLE_BACKENDS`` or left out of ``HAL_BACKENDS`` are never imported (``blocked``).
A distribution whose ``hal-sdk`` requirement excludes the running version is refused
from its metadata alone, before import.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pluggy
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from hal._errors import BackendUnavailableError, PluginError
from hal._spi import BackendImpl
from hal._version import API_VERSION, __version__
from hal.plugins import _hookspec
from hal.plugins._registry import BackendRegistry

__all__ = ["ENTRY_POINT_GROUP", "BackendRecord", "PluginRecord", "PluginSystem", "get_system", "reload"]

ENTRY_POINT_GROUP = "hal.backends"
_log = logging.getLogger("hal.plugins")


@dataclasses.dataclass
class PluginRecord:
    """One entry point of the ``hal.backends`` group and what became of it."""

    name: str
    value: str
    dist: str | None
    dist_version: str | None
    status: str  # loaded | failed | blocked
    reason: str = ""
    backends: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class BackendRecord:
    """One backend registered by a plugin; probed lazily."""

    name: str
    plugin: str
    dist: str | None
    dist_version: str | None
    cls: type[BackendImpl] | None
    status: str  # available | unavailable | failed | blocked | unprobed
    reason: str = ""
    api_version: str = ""
    impl: BackendImpl | None = None
    versions: dict[str, str] = dataclasses.field(default_factory=dict)


def _env_list(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return [part.strip() for part in raw.split(",") if part.strip()]


def _strict() -> bool:
    return os.environ.get("HAL_STRICT_PLUGINS", "").strip().lower() in {"1", "true", "yes", "on"}


def _is_builtin(ep: md.EntryPoint) -> bool:
    dist = ep.dist
    return dist is not None and canonicalize_name(dist.metadata["Name"] or "") == "hal-sdk"


def _hal_requirement_mismatch(dist: md.Distribution | None) -> str | None:
    """Return why ``dist`` cannot run with this hal-sdk, judging by its metadata, or None."""
    if dist is None:
        return None
    if canonicalize_name(dist.metadata["Name"] or "") == "hal-sdk":
        return None
    for raw in dist.requires or ():
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != "hal-sdk":
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue
        if req.specifier and not req.specifier.contains(__version__, prereleases=True):
            return (
                f"distribution {dist.metadata['Name']} {dist.version} requires hal-sdk{req.specifier}, "
                f"but hal-sdk {__version__} is installed"
            )
    return None


class PluginSystem:
    """The loaded plugins and the backends they registered (one per process; see :func:`get_system`)."""

    def __init__(self, entry_points: Iterable[md.EntryPoint] | None = None) -> None:
        self.manager = pluggy.PluginManager("hal")
        self.manager.add_hookspecs(_hookspec)
        self.plugins: list[PluginRecord] = []
        self.backends: dict[str, BackendRecord] = {}
        self._lock = threading.RLock()
        allow = _env_list("HAL_BACKENDS")
        deny = set(_env_list("HAL_DISABLE_BACKENDS") or [])
        eps = list(entry_points if entry_points is not None else md.entry_points(group=ENTRY_POINT_GROUP))
        seen: set[str] = set()
        # Built-in backends first, so a third-party plugin cannot take their names.
        for ep in sorted(eps, key=lambda e: (not _is_builtin(e), e.name)):
            if ep.name in seen:  # the same dist visible twice on sys.path
                continue
            seen.add(ep.name)
            self._load_one(ep, allow, deny)
        self._order = self._priority(allow)

    # -- loading ------------------------------------------------------------------------
    def _load_one(self, ep: md.EntryPoint, allow: list[str] | None, deny: set[str]) -> None:
        dist = ep.dist
        rec = PluginRecord(
            name=ep.name,
            value=ep.value,
            dist=dist.metadata["Name"] if dist is not None else None,
            dist_version=dist.version if dist is not None else None,
            status="loaded",
        )
        self.plugins.append(rec)
        if ep.name in deny:
            rec.status, rec.reason = "blocked", "listed in HAL_DISABLE_BACKENDS"
        elif allow is not None and ep.name not in allow:
            rec.status, rec.reason = "blocked", f"not listed in HAL_BACKENDS={','.join(allow)}"
        if rec.status == "blocked":
            self._add_backend(BackendRecord(ep.name, ep.name, rec.dist, rec.dist_version, None, "blocked", rec.reason))
            _log.info("plugin %s blocked: %s", ep.name, rec.reason)
            return
        mismatch = _hal_requirement_mismatch(dist)
        if mismatch:
            self._fail(rec, mismatch)
            return
        try:
            obj = ep.load()
        except BaseException as exc:  # noqa: BLE001 - quarantine anything a plugin raises
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            self._fail(rec, f"import of {ep.value} failed: {type(exc).__name__}: {exc}")
            return
        try:
            self.manager.register(obj, name=ep.name)
            self.manager.check_pending()
        except Exception as exc:
            if self.manager.is_registered(obj):
                self.manager.unregister(obj)
            self._fail(rec, f"invalid plugin: {type(exc).__name__}: {exc}")
            return
        registry = BackendRegistry(ep.name)
        others = [p for p in self.manager.get_plugins() if p is not obj]
        caller = self.manager.subset_hook_caller("hal_register_backends", remove_plugins=others)
        try:
            caller(registry=registry)
        except Exception as exc:
            self.manager.unregister(obj)
            self._fail(rec, f"hal_register_backends raised {type(exc).__name__}: {exc}")
            return
        for cls in registry.classes:
            self._register_backend(rec, cls)

    def _register_backend(self, rec: PluginRecord, cls: type[BackendImpl]) -> None:
        api = getattr(cls, "api_version", None)
        api_str = ".".join(map(str, api)) if isinstance(api, tuple) else repr(api)
        brec = BackendRecord(cls.name, rec.name, rec.dist, rec.dist_version, cls, "unprobed", api_version=api_str)
        rec.backends.append(cls.name)
        if not (isinstance(api, tuple) and len(api) == 2 and api[0] == API_VERSION[0]):
            brec.status = "failed"
            brec.reason = (
                f"backend {cls.name!r} declares HAL API {api_str}; this hal-sdk {__version__} "
                f"speaks API {API_VERSION[0]}.x"
            )
            self._maybe_raise(rec.name, brec.reason)
        elif cls.name in self.backends and self.backends[cls.name].status != "blocked":
            brec.status = "failed"
            brec.reason = f"backend name {cls.name!r} already registered by plugin {self.backends[cls.name].plugin!r}"
            rec.backends.remove(cls.name)
            rec.status, rec.reason = "failed", brec.reason  # never swallow the refusal
            _log.warning("plugin %s quarantined: %s", rec.name, brec.reason)
            self._maybe_raise(rec.name, brec.reason)
            return
        self._add_backend(brec)

    def _add_backend(self, brec: BackendRecord) -> None:
        self.backends[brec.name] = brec

    def _fail(self, rec: PluginRecord, reason: str) -> None:
        rec.status, rec.reason = "failed", reason
        self._add_backend(BackendRecord(rec.name, rec.name, rec.dist, rec.dist_version, None, "failed", reason))
        _log.warning("plugin %s quarantined: %s", rec.name, reason)
        self._maybe_raise(rec.name, reason)

    @staticmethod
    def _maybe_raise(plugin: str, reason: str) -> None:
        if _strict():
            raise PluginError(plugin, reason + " (HAL_STRICT_PLUGINS=1)")

    def _priority(self, allow: list[str] | None) -> list[str]:
        names = list(self.backends)
        if allow is not None:
            rank = {n: i for i, n in enumerate(allow)}
            return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))
        return sorted(names, key=lambda n: (n != "cpu", n))

    # -- probing ------------------------------------------------------------------------
    def probe(self, name: str) -> BackendRecord:
        """Instantiate backend ``name`` once and record whether it is available."""
        with self._lock:
            brec = self.backends[name]
            if brec.status != "unprobed":
                return brec
            assert brec.cls is not None
            try:
                impl = brec.cls()
                devs = impl.devices()
                if not devs:
                    raise BackendUnavailableError(name, "the backend found no device")
            except BackendUnavailableError as exc:
                brec.status, brec.reason = "unavailable", exc.reason
                _log.info("backend %s unavailable: %s", name, exc.reason)
                return brec
            except Exception as exc:
                brec.status, brec.reason = "failed", f"probe raised {type(exc).__name__}: {exc}"
                _log.warning("backend %s failed: %s", name, brec.reason)
                self._maybe_raise(brec.plugin, brec.reason)
                return brec
            brec.impl, brec.status, brec.reason = impl, "available", ""
            try:
                brec.versions = dict(impl.version_info())
            except Exception as exc:  # version strings are informative only
                brec.versions = {"error": f"{type(exc).__name__}: {exc}"}
            return brec

    def call_plugin_hook(
        self, hook: str, *, on_plugin: Callable[[str], None] | None = None, **kwargs: Any
    ) -> dict[str, str]:
        """Call optional hook ``hook`` on each loaded plugin separately; return ``{plugin: error}``.

        ``on_plugin(name)`` runs before each plugin's call (e.g. to label registrations).
        A plugin that raises is skipped (logged; raised under ``HAL_STRICT_PLUGINS=1``) and
        the other plugins still run. Used by hal.kernels for ``hal_register_kernels``.
        """
        failures: dict[str, str] = {}
        for name, obj in list(self.manager.list_name_plugin()):
            if obj is None:
                continue
            if on_plugin is not None:
                on_plugin(name)
            others = [p for p in self.manager.get_plugins() if p is not obj]
            caller = self.manager.subset_hook_caller(hook, remove_plugins=others)
            try:
                caller(**kwargs)
            except Exception as exc:
                reason = f"{hook} raised {type(exc).__name__}: {exc}"
                failures[name] = reason
                _log.warning("plugin %s: %s", name, reason)
                self._maybe_raise(name, reason)
        return failures

    def probe_all(self) -> list[BackendRecord]:
        """Probe every backend, in priority order."""
        return [self.probe(n) for n in self._order]

    @property
    def order(self) -> list[str]:
        """Backend names in priority order (``HAL_BACKENDS`` order when set)."""
        return list(self._order)

    def close(self) -> None:
        """Close every probed backend."""
        for brec in self.backends.values():
            if brec.impl is not None:
                try:
                    brec.impl.close()
                except Exception as exc:  # pragma: no cover - best effort at exit
                    _log.warning("closing backend %s failed: %s", brec.name, exc)


_system: PluginSystem | None = None
_system_lock = threading.Lock()


def get_system() -> PluginSystem:
    """Return the process-wide plugin system, loading plugins on first use."""
    global _system
    with _system_lock:
        if _system is None:
            _system = PluginSystem()
        return _system


def reload() -> PluginSystem:
    """Drop the loaded plugins and load them again (re-reading the environment).

    Devices, buffers and streams from before the reload stay valid but belong to the old backends.
    """
    global _system
    with _system_lock:
        _system = PluginSystem()
        return _system
