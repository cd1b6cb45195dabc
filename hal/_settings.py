"""Settings from the environment, parsed and bounded in one place.

Every ``HAL_*`` variable with a number, a size, a duration, a port, a switch or a choice is
declared in :data:`SETTINGS` with its kind, default and allowed range, and read with
:func:`setting`. There is one parser per kind (:func:`parse_int`, :func:`parse_size`,
:func:`parse_float`, :func:`parse_bool`, :func:`parse_port`, :func:`parse_choice`); each bad
value raises :class:`hal.ConfigError` (a ``HalError`` and a ``ValueError``) naming the variable,
the value and what is allowed, e.g.::

    HAL_CPU_DEVICES='1000000000' is out of range; allowed: an integer in 1..1024

Backends, ``hal.comm`` and ``hal.kernels`` reach these through ``hal.spi`` (``setting``,
``parse_*``, ``SETTINGS``). docs/architecture.md lists the variables.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hal._errors import ConfigError

__all__ = [
    "SETTINGS",
    "Setting",
    "describe",
    "parse_bool",
    "parse_choice",
    "parse_float",
    "parse_int",
    "parse_port",
    "parse_size",
    "setting",
]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_INT = re.compile(r"[+-]?\d+")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _fmt_size(n: int) -> str:
    for unit in ("P", "T", "G", "M", "K"):
        if n and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def parse_int(raw: object, name: str, *, lo: int, hi: int) -> int:
    """Parse a decimal integer in ``lo..hi``; raise :class:`hal.ConfigError` naming ``name``."""
    allowed = f"an integer in {lo}..{hi}"
    text = str(raw).strip()
    if not _INT.fullmatch(text) or len(text) > 40:
        raise ConfigError(name, raw, allowed, "is not an integer")
    value = int(text)
    if not lo <= value <= hi:
        raise ConfigError(name, raw, allowed)
    return value


def parse_size(raw: object, name: str, *, lo: int = 0, hi: int = 1 << 60) -> int:
    """Parse bytes (``1048576``, ``64K``, ``512M``, ``1.5G``, ``64KiB``, ``100B``) in ``lo..hi``.

    Raises:
        hal.ConfigError: not a size, not a whole number of bytes, or out of range.
    """
    allowed = f"a size in bytes, {_fmt_size(lo)}..{_fmt_size(hi)} (e.g. 4096, 64K, 512M, 4G)"
    text = str(raw).strip().upper().removesuffix("IB").removesuffix("B").strip()
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    number = text[: len(text) - len(unit)].strip()
    try:
        if len(number) > 40 or not re.fullmatch(r"\d+(\.\d*)?|\.\d+", number):
            raise ValueError
        value = float(number) * _UNITS[unit]
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        if str(raw).strip().startswith("-"):
            raise ConfigError(name, raw, allowed, "must be >= 0")
        raise ConfigError(name, raw, allowed, "is not a size")
    if value != int(value):
        raise ConfigError(name, raw, allowed, "is not a whole number of bytes")
    if not lo <= value <= hi:
        raise ConfigError(name, raw, allowed)
    return int(value)


def parse_float(
    raw: object, name: str, *, lo: float, hi: float, unit: str = "", lo_open: bool = True
) -> float:
    """Parse a finite number in ``(lo, hi]`` (``[lo, hi]`` when ``lo_open`` is False).

    ``inf``, ``nan`` and numbers too large for a float are refused.

    Raises:
        hal.ConfigError: not a finite number, or out of range.
    """
    suffix = f" {unit}" if unit else ""
    left = "(" if lo_open else "["
    allowed = f"a finite number in {left}{_num(lo)}, {_num(hi)}]{suffix}"
    try:
        value = (
            float(raw)
            if isinstance(raw, (int, float)) and not isinstance(raw, bool)
            else float(str(raw).strip())
        )
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(name, raw, allowed, "is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(name, raw, allowed, "is not a finite number")
    if value > hi or value < lo or (lo_open and value == lo):
        raise ConfigError(name, raw, allowed)
    return value


def parse_bool(raw: object, name: str) -> bool:
    """Parse a switch: ``1/true/yes/on`` or ``0/false/no/off`` (any case)."""
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(name, raw, "1, true, yes, on, 0, false, no or off", "is not a switch")


def parse_port(raw: object, name: str) -> int:
    """Parse a TCP/UDP port number, 1..65535."""
    return parse_int(raw, name, lo=1, hi=65535)


def parse_choice(raw: object, name: str, choices: Sequence[str]) -> str:
    """Parse one of ``choices`` (case-insensitive); return it in lower case."""
    text = str(raw).strip().lower()
    if text not in choices:
        raise ConfigError(name, raw, "one of " + ", ".join(choices), "is not a known choice")
    return text


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable: its kind, default and bounds.

    Attributes:
        name: the variable.
        kind: ``int``, ``size``, ``float``, ``bool``, ``port`` or ``choice``.
        default: the value when the variable is unset or empty.
        lo, hi: the bounds (``int``, ``size``, ``float``; for ``float`` ``lo`` is excluded).
        unit: the unit of a ``float`` (``s``, ``ms``), for messages.
        choices: the values of a ``choice``.
        doc: what it sets.
    """

    name: str
    kind: str
    default: Any
    lo: float = 0
    hi: float = 0
    unit: str = ""
    choices: tuple[str, ...] = ()
    doc: str = ""

    def parse(self, raw: object) -> Any:
        """Parse ``raw`` as this setting; raise :class:`hal.ConfigError` when it does not fit."""
        if self.kind == "int":
            return parse_int(raw, self.name, lo=int(self.lo), hi=int(self.hi))
        if self.kind == "size":
            return parse_size(raw, self.name, lo=int(self.lo), hi=int(self.hi))
        if self.kind == "float":
            return parse_float(raw, self.name, lo=self.lo, hi=self.hi, unit=self.unit)
        if self.kind == "bool":
            return parse_bool(raw, self.name)
        if self.kind == "port":
            return parse_port(raw, self.name)
        if self.kind == "choice":
            return parse_choice(raw, self.name, self.choices)
        raise AssertionError(f"unknown setting kind {self.kind!r}")  # pragma: no cover

    def allowed(self) -> str:
        """Return the allowed values in words (as ConfigError messages say them)."""
        try:
            self.parse("\x00")
        except ConfigError as exc:
            return exc.allowed
        return ""  # pragma: no cover


_DAY_MS = 86_400_000.0

#: Every bounded setting, by variable name.
SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("HAL_CPU_DEVICES", "int", 2, 1, 1024, doc="number of CPU-emulator devices"),
        Setting(
            "HAL_CPU_MEMORY",
            "size",
            4 << 30,
            0,
            1 << 50,
            doc="capacity of each CPU-emulator device",
        ),
        Setting(
            "HAL_CPU_IPC",
            "bool",
            False,
            doc="CPU-emulator memory in shared memory (memfd) so other processes can map it (ipc)",
        ),
        Setting(
            "HAL_COMM_TIMEOUT_MS",
            "float",
            None,
            0,
            7 * _DAY_MS,
            unit="ms",
            doc="progress timeout of collectives (default 10 minutes)",
        ),
        Setting(
            "HAL_COMM_INLINE_BYTES",
            "size",
            64 << 10,
            0,
            1 << 30,
            doc="messages up to this size travel inline with the control message",
        ),
        Setting(
            "HAL_COMM_CHUNK_BYTES", "size", 4 << 20, 4096, 1 << 30, doc="shared-memory slot size"
        ),
        Setting("HAL_COMM_SHM_SLOTS", "int", 4, 2, 1024, doc="shared-memory slots per peer"),
        Setting(
            "HAL_COMM_SHM_FALLBACK",
            "choice",
            None,
            choices=("none", "tcp"),
            doc="what hal.comm uses when /dev/shm is too small for its rings (none: an error)",
        ),
        Setting(
            "HAL_COMM_SPIN_US", "int", 0, 0, 10_000_000, doc="microseconds a waiting rank spins"
        ),
        Setting(
            "HAL_COMM_NATIVE",
            "bool",
            True,
            doc="shared-memory collectives run in hal.comm's native engine (0: the Python path)",
        ),
        Setting(
            "HAL_MEMORY_POOL",
            "bool",
            True,
            doc="device allocations go through hal's memory pool (0: straight to the backend)",
        ),
        Setting(
            "HAL_MEMORY_LIMIT",
            "size",
            0,
            0,
            1 << 50,
            doc="most bytes the pool of each device takes from it (0: no limit)",
        ),
        Setting(
            "HAL_MEMORY_RESERVE",
            "size",
            0,
            0,
            1 << 50,
            doc="bytes each device's pool pre-allocates at its first allocation",
        ),
        Setting(
            "HAL_CACHE_MAX_BYTES",
            "size",
            512 << 20,
            0,
            1 << 50,
            doc="cap of the on-disk compile cache (0 disables it)",
        ),
        Setting(
            "HAL_PLUGIN_TIMEOUT_S",
            "float",
            10.0,
            0,
            3600.0,
            unit="s",
            doc="time limit of a plugin's import, hook and probe",
        ),
        Setting(
            "HAL_STRICT_PLUGINS",
            "bool",
            False,
            doc="a failed plugin raises instead of being quarantined",
        ),
        Setting(
            "HAL_LOG_LEVEL",
            "choice",
            None,
            choices=("debug", "info", "warning", "error", "critical"),
            doc="level of the hal logger",
        ),
        Setting("HAL_RANK", "int", 0, 0, 1 << 20, doc="this rank (hal run)"),
        Setting("HAL_WORLD_SIZE", "int", 1, 1, 1 << 20, doc="number of ranks (hal run)"),
        Setting("HAL_LOCAL_RANK", "int", 0, 0, 1 << 20, doc="this rank on its host (hal run)"),
        Setting("RANK", "int", 0, 0, 1 << 20, doc="this rank (torchrun)"),
        Setting("WORLD_SIZE", "int", 1, 1, 1 << 20, doc="number of ranks (torchrun)"),
        Setting("LOCAL_RANK", "int", 0, 0, 1 << 20, doc="this rank on its host (torchrun)"),
        Setting("MASTER_PORT", "port", None, doc="rendezvous port (torchrun)"),
        Setting("PMI_RANK", "int", 0, 0, 1 << 20, doc="this rank (MPICH mpiexec)"),
        Setting("PMI_SIZE", "int", 1, 1, 1 << 20, doc="number of ranks (MPICH mpiexec)"),
        Setting("OMPI_COMM_WORLD_RANK", "int", 0, 0, 1 << 20, doc="this rank (Open MPI mpiexec)"),
        Setting(
            "OMPI_COMM_WORLD_SIZE", "int", 1, 1, 1 << 20, doc="number of ranks (Open MPI mpiexec)"
        ),
    )
}


def setting(name: str, env: Mapping[str, str] | None = None) -> Any:
    """Return the value of setting ``name`` from ``env`` (default ``os.environ``), parsed and checked.

    An unset or blank variable gives the declared default.

    Raises:
        hal.ConfigError: the value does not fit (the message names variable, value and range).
        KeyError: ``name`` is not declared in :data:`SETTINGS`.
    """
    spec = SETTINGS[name]
    raw = (os.environ if env is None else env).get(name)
    if raw is None or not raw.strip():
        return spec.default
    return spec.parse(raw)


def describe() -> list[dict[str, Any]]:
    """Return every declared setting as a dict (name, kind, default, allowed, doc)."""
    return [
        {"name": s.name, "kind": s.kind, "default": s.default, "allowed": s.allowed(), "doc": s.doc}
        for s in SETTINGS.values()
    ]
