"""The hal error tree: one root, one subclass per domain, context carried as attributes."""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "CommError",
    "ConfigError",
    "DeviceError",
    "DeviceMismatchError",
    "HalError",
    "HalWarning",
    "InvalidBufferError",
    "OutOfMemoryError",
    "PluginError",
    "StreamError",
]


class HalError(Exception):
    """Root of every error raised by hal-sdk."""


class HalWarning(UserWarning):
    """Root of every warning issued by hal-sdk."""


class PluginError(HalError):
    """A plugin failed to load, register or validate.

    Attributes:
        plugin: the entry-point (plugin) name.
    """

    def __init__(self, plugin: str, message: str) -> None:
        super().__init__(f"plugin {plugin!r}: {message}")
        self.plugin = plugin


class BackendUnavailableError(HalError):
    """A backend cannot be used on this machine (missing SDK, driver or device).

    Attributes:
        backend: the backend name.
        reason: a human-readable reason a user can act on.
    """

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"backend {backend!r} unavailable: {reason}")
        self.backend = backend
        self.reason = reason


class DeviceError(HalError):
    """A device reported an error (vendor status codes are translated into this family).

    Attributes:
        device: a ``backend:index`` string naming the device, or ``None``.
        code: the vendor's status code or name, or ``None``.
    """

    def __init__(self, message: str, *, device: str | None = None, code: object = None) -> None:
        prefix = f"{device}: " if device else ""
        super().__init__(prefix + message)
        self.device = device
        self.code = code


class OutOfMemoryError(DeviceError):
    """An allocation did not fit in the device's memory."""


class InvalidBufferError(HalError):
    """A buffer, stream or event was used after ``close()``."""


class DeviceMismatchError(HalError, ValueError):
    """Objects of devices that cannot work together were combined (e.g. a stream of another device)."""


class StreamError(DeviceError):
    """Work enqueued on a stream failed; raised at the next synchronization point."""


class ConfigError(HalError, ValueError):
    """A setting (an environment variable) has a value hal cannot use.

    Attributes:
        variable: the variable's name (``"HAL_CPU_DEVICES"``).
        value: the raw value as found.
        allowed: the values it accepts, in words (``"an integer in 1..1024"``).
    """

    def __init__(self, variable: str, value: object, allowed: str, problem: str = "") -> None:
        what = f" {problem}" if problem else " is out of range"
        super().__init__(f"{variable}={value!r}{what}; allowed: {allowed}")
        self.variable = variable
        self.value = value
        self.allowed = allowed


class CommError(HalError):
    """A collective failed: mismatch, timeout or a lost rank.

    Attributes:
        op: the collective name.
        ranks: the ranks concerned (not heard from, mismatched, dead).
    """

    def __init__(self, message: str, *, op: str | None = None, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.op = op
        self.ranks = ranks
