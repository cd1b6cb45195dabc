"""Load backend plugins from the ``hal.backends`` entry-point group, one at a time.

A plugin that fails to import, fails validation or raises in its hook is quarantined
(status ``failed``, with the reason) and the others load. Plugins named in
``HAL_DISABLE_BACKENDS`` or left out of ``HAL_BACKENDS`` are never imported (``blocked``).
A distribution whose ``hal-sdk`` requirement excludes the running version is refused
from its metadata alone, before import.

Plugin code runs under a time limit, ``HAL_PLUGIN_TIMEOUT_S`` (default 10 s): the import,
the ``hal_register_backends`` hook and each backend's probe run in a worker thread, and a
plugin that does not finish in time is quarantined ("timed out after N s
(HAL_PLUGIN_TIMEOUT_S)"). Python cannot kill a thread: the hung one is abandoned as a daemon
thread (it ends with the process). ``SystemExit`` and ``KeyboardInterrupt`` raised by a
plugin quarantine it like any other exception; a Ctrl-C of the user still interrupts.
A plugin may not serve a backend under a name that is disabled (a built-in blocked by
``HAL_DISABLE_BACKENDS``) or an entry-point name another distribution already uses: it is
refused with a :class:`hal.HalWarning`.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import logging
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import pluggy

from hal._capabilities import Capabilities
from hal._errors import BackendUnavailableError, ConfigError, HalWarning, PluginError
from hal._runtime import runtime
from hal._settings import PluginOptions, setting
from hal._spi import BackendImpl
from hal._version import API_VERSION, __version__
from hal.plugins import _hookspec
from hal.plugins._registry import BackendRegistry

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendRecord",
    "PluginRecord",
    "PluginSystem",
    "get_system",
    "reload",
]

ENTRY_POINT_GROUP = "hal.backends"
_log = logging.getLogger("hal.plugins")
_T = TypeVar("_T")


class _PluginTimeout(Exception):
    """Plugin code did not return within ``HAL_PLUGIN_TIMEOUT_S``."""


def _limited(
    fn: Callable[[], _T], limit: float, label: str
) -> tuple[_T | None, BaseException | None]:
    """Run ``fn`` in a daemon thread for at most ``limit`` s; return ``(value, exception it raised)``.

    Raises:
        _PluginTimeout: ``fn`` did not return in time (its thread is abandoned).
    """
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt of a plugin too
            box["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=run, name=f"hal-plugin-{label}", daemon=True)
    worker.start()
    if not done.wait(limit):
        raise _PluginTimeout(f"timed out after {limit:g} s (HAL_PLUGIN_TIMEOUT_S)")
    return box.get("value"), box.get("error")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}) (a plugin may not end the application)"
    if isinstance(exc, KeyboardInterrupt):
        return "KeyboardInterrupt raised by the plugin itself"
    return f"{type(exc).__name__}: {exc}"


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
    #: the exception that failed the probe (a :class:`hal.ConfigError` for a bad setting), or None
    error: BaseException | None = None
    #: ``BackendImpl.close()`` was called (by ``hal.runtime().reset()`` or at exit)
    closed: bool = False


def _strict() -> bool:
    return bool(setting("HAL_STRICT_PLUGINS"))


def _canonical(name: str) -> str:
    """A distribution name normalized as PEP 503 says (``packaging.utils.canonicalize_name``).

    Written out here: importing ``packaging`` would cost every process that loads the plugins
    about 20 ms, although only third-party plugins need its requirement parser.
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_builtin(ep: md.EntryPoint) -> bool:
    dist = ep.dist
    return dist is not None and _canonical(dist.metadata["Name"] or "") == "hal-sdk"


def _hal_requirement_mismatch(dist: md.Distribution | None) -> str | None:
    """Return why ``dist`` cannot run with this hal-sdk, judging by its metadata, or None."""
    if dist is None:
        return None
    if _canonical(dist.metadata["Name"] or "") == "hal-sdk":
        return None
    from packaging.requirements import InvalidRequirement, Requirement  # third-party plugins only

    for raw in dist.requires or ():
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if _canonical(req.name) != "hal-sdk":
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue
        if req.specifier and not req.specifier.contains(__version__, prereleases=True):
            return (
                f"distribution {dist.metadata['Name']} {dist.version} requires hal-sdk{req.specifier}, "
                f"but hal-sdk {__version__} is installed"
            )
    return None


def _unknown_names(allow: list[str] | None, eps: Sequence[md.EntryPoint]) -> str:
    """Say which names of ``HAL_BACKENDS`` no installed plugin has (warned once), or ''."""
    names = sorted({e.name for e in eps})
    unknown = [n for n in allow or () if n not in names]
    if not unknown:
        return ""
    said = (
        f"HAL_BACKENDS names {', '.join(map(repr, unknown))}, which no installed plugin provides "
        f"(installed: {', '.join(names) or 'none'})"
    )
    warnings.warn(f"hal: {said}", HalWarning, stacklevel=4)
    return said


class PluginSystem:
    """The loaded plugins and the backends they registered (one per process; see :func:`get_system`)."""

    def __init__(self, entry_points: Iterable[md.EntryPoint] | None = None) -> None:
        self.manager = pluggy.PluginManager("hal")
        self.manager.add_hookspecs(_hookspec)
        self.plugins: list[PluginRecord] = []
        self.backends: dict[str, BackendRecord] = {}
        self._lock = threading.RLock()
        opts = PluginOptions.from_env()
        self.timeout_s: float = float(opts.timeout_s or 0)
        allow = list(opts.backends) if opts.backends else None
        deny = set(opts.disable_backends or ())
        eps = list(
            entry_points if entry_points is not None else md.entry_points(group=ENTRY_POINT_GROUP)
        )
        self._unknown = _unknown_names(allow, eps)
        seen: dict[str, str | None] = {}
        # Built-in backends first, so a third-party plugin cannot take their names.
        for ep in sorted(eps, key=lambda e: (not _is_builtin(e), e.name)):
            dist_name = ep.dist.metadata["Name"] if ep.dist is not None else None
            if ep.name in seen:
                if seen[ep.name] != dist_name:  # another distribution claims a name already taken
                    self._refuse_shadow(ep, dist_name, seen[ep.name])
                continue  # else: the same dist visible twice on sys.path
            seen[ep.name] = dist_name
            self._load_one(ep, allow, deny)
        self._order = self._priority(allow)

    # -- loading ------------------------------------------------------------------------
    def _refuse_shadow(self, ep: md.EntryPoint, dist_name: str | None, owner: str | None) -> None:
        reason = (
            f"entry point name {ep.name!r} is already taken by distribution {owner}; "
            f"{dist_name or 'this plugin'} may not shadow it"
        )
        rec = PluginRecord(
            ep.name,
            ep.value,
            dist_name,
            ep.dist.version if ep.dist is not None else None,
            "failed",
            reason,
        )
        self.plugins.append(rec)
        warnings.warn(
            f"hal: plugin {ep.name!r} of {dist_name} refused: {reason}", HalWarning, stacklevel=4
        )
        self._maybe_raise(ep.name, reason)

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
            if self._unknown:
                rec.reason += f" ({self._unknown})"
        if rec.status == "blocked":
            self._add_backend(
                BackendRecord(
                    ep.name, ep.name, rec.dist, rec.dist_version, None, "blocked", rec.reason
                )
            )
            _log.info("plugin %s blocked: %s", ep.name, rec.reason)
            return
        mismatch = _hal_requirement_mismatch(dist)
        if mismatch:
            self._fail(rec, mismatch)
            return
        try:
            obj, error = _limited(ep.load, self.timeout_s, ep.name)
        except _PluginTimeout as exc:
            self._fail(rec, f"import of {ep.value} {exc}")
            return
        if error is not None:
            self._fail(rec, f"import of {ep.value} failed: {_describe(error)}")
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
            _, error = _limited(lambda: caller(registry=registry), self.timeout_s, ep.name)
        except _PluginTimeout as exc:
            error = exc
        if error is not None:
            self.manager.unregister(obj)
            verb = "" if isinstance(error, _PluginTimeout) else "raised "
            self._fail(rec, f"hal_register_backends {verb}{_describe(error) if verb else error}")
            return
        classes = list(registry.classes)  # a snapshot: nothing added later counts
        for cls in classes:
            self._register_backend(rec, cls)

    def _register_backend(self, rec: PluginRecord, cls: type[BackendImpl]) -> None:
        api = getattr(cls, "api_version", None)
        api_str = ".".join(map(str, api)) if isinstance(api, tuple) else repr(api)
        brec = BackendRecord(
            cls.name, rec.name, rec.dist, rec.dist_version, cls, "unprobed", api_version=api_str
        )
        rec.backends.append(cls.name)
        if not (isinstance(api, tuple) and len(api) == 2 and api[0] == API_VERSION[0]):
            brec.status = "failed"
            brec.reason = (
                f"backend {cls.name!r} declares HAL API {api_str}; this hal-sdk {__version__} "
                f"speaks API {API_VERSION[0]}.x"
            )
            self._maybe_raise(rec.name, brec.reason)
        elif cls.name in self.backends and self.backends[cls.name].status == "blocked":
            held = self.backends[cls.name]
            brec.status = "failed"
            brec.reason = (
                f"backend name {cls.name!r} belongs to plugin {held.plugin!r} ({held.dist}), "
                f"which is blocked ({held.reason}); plugin {rec.name!r} may not serve it"
            )
            rec.backends.remove(cls.name)
            rec.status, rec.reason = "failed", brec.reason
            warnings.warn(
                f"hal: plugin {rec.name!r} refused: {brec.reason}", HalWarning, stacklevel=5
            )
            _log.warning("plugin %s quarantined: %s", rec.name, brec.reason)
            self._maybe_raise(rec.name, brec.reason)
            return
        elif cls.name in self.backends:
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
        self._add_backend(
            BackendRecord(rec.name, rec.name, rec.dist, rec.dist_version, None, "failed", reason)
        )
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

        # real devices first (issue #11): backends in name order, emulators
        # (``BackendImpl.emulator``: the CPU emulator) after them, backends that did not
        # load (blocked, failed: no class) last
        def tier(n: str) -> int:
            cls = self.backends[n].cls
            return 2 if cls is None else int(bool(getattr(cls, "emulator", False)))

        return sorted(names, key=lambda n: (tier(n), n))

    # -- probing ------------------------------------------------------------------------
    def probe(self, name: str) -> BackendRecord:
        """Instantiate backend ``name`` once and record whether it is available."""
        with self._lock:
            brec = self.backends[name]
            if brec.status != "unprobed":
                return brec
            cls = brec.cls
            assert cls is not None

            def create() -> tuple[BackendImpl, dict[str, str]]:
                impl = cls()
                devices = impl.devices()
                if not devices:
                    raise BackendUnavailableError(name, "the backend found no device")
                for i, dev in enumerate(devices):
                    _check_device(name, i, dev)
                try:
                    versions = dict(impl.version_info())
                except Exception as exc:  # version strings are informative only
                    versions = {"error": f"{type(exc).__name__}: {exc}"}
                return impl, versions

            try:
                made, error = _limited(create, self.timeout_s, name)
            except _PluginTimeout as exc:
                made, error = None, exc
            if isinstance(error, BackendUnavailableError):
                brec.status, brec.reason = "unavailable", error.reason
                _log.info("backend %s unavailable: %s", name, error.reason)
                return brec
            if error is not None or made is None:
                brec.error = error
                if isinstance(error, ConfigError):  # a bad setting: say it plainly
                    brec.reason = str(error)
                elif isinstance(error, _PluginTimeout):
                    brec.reason = f"probe {error}"
                else:
                    brec.reason = f"probe raised {_describe(error) if error else 'nothing and returned nothing'}"
                brec.status = "failed"
                if isinstance(error, _PluginTimeout):  # quarantine the plugin that hung
                    for prec in self.plugins:
                        if prec.name == brec.plugin and prec.status == "loaded":
                            prec.status, prec.reason = "failed", f"backend {name!r}: {brec.reason}"
                _log.warning("backend %s failed: %s", name, brec.reason)
                self._maybe_raise(brec.plugin, brec.reason)
                return brec
            impl, brec.versions = made
            brec.impl, brec.status, brec.reason = impl, "available", ""
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
                _, error = _limited(lambda: caller(**kwargs), self.timeout_s, name)  # noqa: B023 - called at once
            except _PluginTimeout as exc:
                error = exc
            if error is not None:
                reason = (
                    f"{hook} {error}"
                    if isinstance(error, _PluginTimeout)
                    else f"{hook} raised {_describe(error)}"
                )
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
        """Close every probed backend (``BackendImpl.close()``, once per backend)."""
        for brec in self.backends.values():
            if brec.impl is not None and not brec.closed:
                brec.closed = True
                try:
                    brec.impl.close()
                except Exception as exc:  # pragma: no cover - best effort at exit
                    _log.warning("closing backend %s failed: %s", brec.name, exc)


def get_system() -> PluginSystem:
    """Return the process-wide plugin system, loading plugins on first use.

    The system belongs to the runtime (:func:`hal.runtime`): the same as ``hal.runtime().plugins``.
    """
    return runtime().plugins


def reload() -> PluginSystem:
    """Load the plugins again (re-reading the environment): ``hal.runtime().reset()``, then load.

    The reset closes the backends (``BackendImpl.close()``) and drops every registry and cache
    of hal and the upper layers. Devices, buffers and streams from before belong to the closed
    backends (the built-in backends keep them working).
    """
    rt = runtime()
    rt.reset()
    return rt.plugins


_MISSING = object()


def _check_device(backend: str, index: int, dev: object) -> None:
    """Refuse (``TypeError``) a ``DeviceImpl`` without what hal core reads from every device.

    Checked once, when the backend is probed: a device lacking ``name`` or carrying a
    ``capabilities`` that is not a ``hal.Capabilities`` fails its backend with this reason,
    instead of breaking ``hal info`` or ``hal.comm.init()`` later, for every backend.
    """
    for attr in ("name", "vendor", "total_memory", "capabilities"):
        value = getattr(dev, attr, _MISSING)
        if value is _MISSING:
            problem = "is missing"
        elif attr in ("name", "vendor") and not isinstance(value, str):
            problem = f"is {value!r}, not a str"
        elif attr == "capabilities" and not isinstance(value, Capabilities):
            problem = f"is {type(value).__name__}, not a hal.spi.Capabilities"
        elif attr == "total_memory" and (
            isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 0
        ):
            problem = f"is {value!r}, not an int of bytes"
        else:
            continue
        raise TypeError(
            f"device {backend}:{index}: DeviceImpl.{attr} {problem} (docs/write-a-backend.md, "
            "'The SPI in one page')"
        )
