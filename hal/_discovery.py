"""Discovery: which backends exist, what state they are in, and their devices."""

from __future__ import annotations

import dataclasses
import threading
import warnings
import weakref
from typing import Any, final

from hal._device import Device, _make_device
from hal._errors import BackendUnavailableError
from hal._runtime import runtime
from hal._spi import BackendImpl

__all__ = ["BackendInfo", "backends", "device", "devices"]

_handles: weakref.WeakKeyDictionary[BackendImpl, list[Device]] = weakref.WeakKeyDictionary()
_handles_lock = threading.Lock()
runtime().register_cache("hal.device_handles", lambda: _forget_handles())


@final
@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """What hal knows about one backend.

    Attributes:
        name: backend name (``"cpu"``).
        status: ``available``, ``unavailable`` (cannot run here: ``reason`` says why),
            ``failed`` (plugin broken or incompatible) or ``blocked`` (disabled by env).
        reason: why the backend is not available ("" when it is).
        plugin: the entry-point name that registered it.
        dist: the distribution that ships it, and ``version`` its version.
        api_version: the HAL API version the backend declares ("" if never loaded).
        device_count: number of devices (0 unless available).
        versions: versions of the vendor stack (SDK, driver), when available.
    """

    name: str
    status: str
    reason: str
    plugin: str
    dist: str | None
    version: str | None
    api_version: str
    device_count: int
    versions: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict."""
        return dataclasses.asdict(self)


def _system() -> Any:
    return runtime().plugins


def _forget_handles() -> None:
    with _handles_lock:
        _handles.clear()


def _device_handles(name: str, impl: BackendImpl) -> list[Device]:
    with _handles_lock:
        handles = _handles.get(impl)
        if handles is None:
            handles = [_make_device(name, i, d) for i, d in enumerate(impl.devices())]
            _handles[impl] = handles
        return handles


def list_backends() -> list[BackendInfo]:
    """Return every known backend with its status, in priority order (probing each once)."""
    system = _system()
    out = []
    for rec in system.probe_all():
        count = len(_device_handles(rec.name, rec.impl)) if rec.impl is not None else 0
        out.append(
            BackendInfo(
                name=rec.name,
                status=rec.status,
                reason=rec.reason,
                plugin=rec.plugin,
                dist=rec.dist,
                version=rec.dist_version,
                api_version=rec.api_version,
                device_count=count,
                versions=dict(rec.versions),
            )
        )
    return out


def backends() -> list[BackendInfo]:
    """Deprecated name of :func:`list_backends` (kept for hal-sdk 1.x; removed in 2.0).

    ``hal.backends`` is also the package of the built-in backends (``hal.backends.cpu``);
    one name for two things is why the function was renamed.
    """
    warnings.warn(
        "hal.backends() is deprecated; use hal.list_backends() (hal.backends is the package of the "
        "built-in backends)",
        DeprecationWarning,
        stacklevel=2,
    )
    return list_backends()


def devices(backend: str | None = None) -> list[Device]:
    """Return the available devices, of one backend or of all (in priority order).

    Raises:
        ValueError: ``backend`` names no known backend.
        hal.BackendUnavailableError: ``backend`` is known but not available (the reason says why).
    """
    system = _system()
    if backend is None:
        out: list[Device] = []
        for rec in system.probe_all():
            if rec.impl is not None:
                out.extend(_device_handles(rec.name, rec.impl))
        return out
    if not isinstance(backend, str):
        raise TypeError(f"backend={backend!r} must be a string")
    if backend not in system.backends:
        known = ", ".join(system.order) or "none"
        raise ValueError(f"backend={backend!r} is not a known backend (known: {known})")
    rec = system.probe(backend)
    if rec.impl is None:
        raise BackendUnavailableError(backend, f"{rec.status}: {rec.reason}")
    return list(_device_handles(rec.name, rec.impl))


def device(spec: str) -> Device:
    """Return the device named ``"backend:index"`` (``"cpu:1"``); ``"backend"`` alone means index 0.

    Raises:
        ValueError: malformed spec, unknown backend or index out of range.
        hal.BackendUnavailableError: the backend is not available.
    """
    if not isinstance(spec, str):
        raise TypeError(f"spec={spec!r} must be a string like 'cpu:0'")
    name, sep, idx = spec.partition(":")
    if not name or (sep and not idx.isdigit()):
        raise ValueError(f"spec={spec!r} must look like 'backend:index', e.g. 'cpu:0'")
    index = int(idx) if sep else 0
    devs = devices(name)
    if index >= len(devs):
        raise ValueError(f"spec={spec!r}: backend {name!r} has {len(devs)} device(s)")
    return devs[index]
