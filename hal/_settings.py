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

Settings that code can also pass are grouped in frozen **options** dataclasses, one per area
(:class:`PluginOptions`, :class:`MemoryOptions` here; ``hal.comm.CommOptions``,
``hal.kernels.KernelOptions`` and the CPU emulator's ``CpuOptions`` in their packages). Each is a
subclass of :class:`Options` whose fields are declared with :func:`env_field`: a field given in
code wins, an unset field (None) takes its environment variable, and an unset variable the
declared default -- **code > environment > default**. :meth:`Options.resolved` fills and checks
them (a bad value given in code is a :class:`hal.ConfigError` naming ``Class.field``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from hal._errors import ConfigError

__all__ = [
    "SETTINGS",
    "MemoryOptions",
    "Options",
    "PluginOptions",
    "Setting",
    "describe",
    "env_field",
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


def parse_str(raw: object, name: str) -> str:
    """Parse free text (a path, a device filter, a name): stripped; control characters refused."""
    text = str(raw).strip()
    if any(ord(c) < 32 and c not in "\t" for c in text) or len(text) > 4096:
        raise ConfigError(name, raw, "text without control characters", "is not plain text")
    return text


def parse_list(raw: object, name: str) -> tuple[str, ...]:
    """Parse a comma-separated list (``cpu,opencl``), or a sequence given in code, into names."""
    if isinstance(raw, (list, tuple)):
        items = [parse_str(x, name) for x in raw]
    else:
        items = parse_str(raw, name).split(",")
    return tuple(x.strip() for x in items if x.strip())


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable: its kind, default and bounds.

    Attributes:
        name: the variable.
        kind: ``int``, ``size``, ``float``, ``bool``, ``port``, ``choice``, ``str`` (free
            text: a path, a filter) or ``list`` (comma-separated names).
        default: the value when the variable is unset or empty.
        lo, hi: the bounds (``int``, ``size``, ``float``; for ``float`` ``lo`` is excluded).
        unit: the unit of a ``float`` (``s``, ``ms``), for messages.
        choices: the values of a ``choice``; for an ``int``, words also allowed (``auto``).
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
            if self.choices and str(raw).strip().lower() in self.choices:
                return str(raw).strip().lower()
            try:
                return parse_int(raw, self.name, lo=int(self.lo), hi=int(self.hi))
            except ConfigError as exc:
                if not self.choices:
                    raise
                words = " or ".join(self.choices)
                raise ConfigError(self.name, raw, f"{exc.allowed}, or {words}") from None
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
        if self.kind == "str":
            return parse_str(raw, self.name)
        if self.kind == "list":
            return parse_list(raw, self.name)
        raise AssertionError(f"unknown setting kind {self.kind!r}")  # pragma: no cover

    def allowed(self) -> str:
        """Return the allowed values in words (as ConfigError messages say them)."""
        if self.kind == "str":
            return "text"
        if self.kind == "list":
            return "comma-separated names"
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
            "HAL_CPU_ARENA",
            "bool",
            True,
            doc="CPU-emulator memory of 64 KiB and more in one shared memfd arena that hal.comm "
            "peers map (collectives copy it with memcpy); 0 = private NumPy memory",
        ),
        Setting(
            "HAL_CPU_NATIVE",
            "bool",
            True,
            doc="CPU-emulator streams on the native runtime (C worker threads, no GIL); "
            "0 = the Python worker threads",
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
            "HAL_COMM_INIT_TIMEOUT_MS",
            "float",
            None,
            0,
            7 * _DAY_MS,
            unit="ms",
            doc="timeout of hal.comm's rendezvous and set-up (default: the larger of 60 s and "
            "HAL_COMM_TIMEOUT_MS)",
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
            "HAL_COMM_IPC",
            "choice",
            "auto",
            choices=("auto", "on", "off", "1", "0"),
            doc="hal.comm's direct intra-host path over IPC: auto (cost model), on/1 (always), off/0 (never)",
        ),
        Setting(
            "HAL_COMM_SPIN_US", "int", 0, 0, 10_000_000, doc="microseconds a waiting rank spins"
        ),
        Setting(
            "HAL_COMM_YIELD_US",
            "int",
            200,
            0,
            10_000_000,
            doc="the native shm engine: microseconds a waiting rank keeps polling, with sched_yield, "
            "while a peer it waits for is awake, before it sleeps on its futex (0: never)",
        ),
        Setting(
            "HAL_COMM_MAP_PEERS",
            "bool",
            True,
            doc="shm: map the peers' shared device memory (the CPU emulator's arena) where "
            "cross-memory attach may read it, and move by reference with memcpy; 0 = "
            "process_vm_readv/writev only",
        ),
        Setting(
            "HAL_COMM_CMA_BYTES",
            "size",
            1 << 20,
            0,
            1 << 40,
            doc="the native shm engine sends messages of at least this size by reference (process_vm_readv; 0: never)",
        ),
        Setting(
            "HAL_COMM_CMA_REDUCE_BYTES",
            "size",
            None,
            0,
            1 << 40,
            doc="the native shm engine sends messages that the receiver reduces by reference from this "
            "size (default 16M, or HAL_COMM_CMA_BYTES where that is set; 0: never)",
        ),
        Setting(
            "HAL_COMM_CELL_BYTES",
            "size",
            256 << 10,
            0,
            1 << 30,
            doc="the native shm engine's shared messages: while the receiver of a message sent by "
            "reference reads it from the back, its sender copies cells of this size from the front "
            "through the slots, or writes them into the destination of a receiver that copies "
            "(0: never)",
        ),
        Setting(
            "HAL_COMM_CMA_WHOLE",
            "bool",
            True,
            doc="a message sent by reference goes in one descriptor, read whole (0: one per piece)",
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
        Setting(
            "HAL_BACKENDS",
            "list",
            None,
            doc="allowlist and priority order of backend plugins (unset: real devices first)",
        ),
        Setting("HAL_DISABLE_BACKENDS", "list", None, doc="backend plugins never imported"),
        Setting(
            "HAL_TRACE", "str", "", doc="trace the whole process into this file (written at exit)"
        ),
        Setting("HAL_TOPO_FILE", "str", None, doc="a topology file replacing the probed links"),
        Setting("HAL_CACHE_DIR", "str", None, doc="directory of the on-disk compile cache"),
        Setting(
            "HAL_KERNELS_STRICT",
            "bool",
            False,
            doc="a kernel falling back to the generic path raises instead of warning",
        ),
        Setting(
            "HAL_KERNELS_NATIVE",
            "bool",
            True,
            doc="repeated op calls served by the launch cache's hit in C (built at first use); "
            "0 = its Python functions",
        ),
        Setting(
            "HAL_KERNELS_SUMMARY",
            "bool",
            True,
            doc="print the kernel fallback summary at exit",
        ),
        Setting(
            "HAL_KERNELS_PROGRAM_CACHE",
            "int",
            256,
            1,
            1 << 20,
            doc="compiled programs kept in memory per process (least recently used dropped)",
        ),
        Setting(
            "HAL_CPU_JITTER",
            "int",
            None,
            0,
            (1 << 63) - 1,
            doc="CPU emulator: seed of random delays",
        ),
        Setting(
            "HAL_CPU_KERNEL_THREADS",
            "int",
            1,
            1,
            4096,
            choices=("auto",),
            doc="CPU emulator: OpenMP threads of a kernel (auto: the CPUs of this process)",
        ),
        Setting("HAL_CPU_CC", "str", None, doc="CPU emulator: the C compiler of kernels"),
        Setting("HAL_CPU_SPEED", "str", None, doc="CPU emulator: speed factor per device (1,0.5)"),
        Setting(
            "HAL_CPU_CONFIG", "str", None, doc="CPU emulator: faults per device (JSON or file)"
        ),
        Setting("HAL_OPENCL_PLATFORM", "str", None, doc="OpenCL: substring of the platform name"),
        Setting("HAL_OPENCL_DEVICES", "str", None, doc="OpenCL: device indices to use"),
        Setting(
            "HAL_OPENCL_NATIVE",
            "bool",
            True,
            doc="OpenCL: prepared kernel launches through the native helper (one C call, no event "
            "per launch); 0 = PyOpenCL's calls",
        ),
        Setting("HAL_CUDA_DEVICES", "str", None, doc="CUDA: device ordinals to use"),
        Setting(
            "HAL_CUDA_STAGING",
            "bool",
            True,
            doc="CUDA: pageable host->device copies through pinned staging",
        ),
        Setting(
            "HAL_CUDA_HOST_SIGNAL",
            "bool",
            True,
            doc="CUDA: native host signals (cuStreamWaitValue)",
        ),
        Setting(
            "HAL_CUDA_BASELINE_HOST",
            "choice",
            "pageable",
            choices=("pageable", "pinned"),
            doc="CUDA memory baseline: host memory kind",
        ),
        Setting(
            "HAL_BENCH_OPENMPI_VENV",
            "str",
            None,
            doc="hal bench comm --baseline openmpi: venv with mpi4py built against Open MPI",
        ),
        Setting(
            "HAL_COMM_TRANSPORT", "str", None, doc="transport of hal.comm (shm, tcp, mpi, ...)"
        ),
        Setting("HAL_COMM_ALGO", "str", None, doc="algorithm per collective (allreduce:ring,...)"),
        Setting(
            "HAL_COMM_PROVIDER", "str", None, doc="collective provider (auto, generic, mpi, ...)"
        ),
        Setting("HAL_COMM_IFNAME", "str", None, doc="network interface(s) of the TCP transport"),
        Setting("HAL_COMM_NSOCKS", "int", 1, 1, 64, doc="TCP sockets per peer"),
        Setting(
            "HAL_COMM_TRACE_ENTRIES",
            "int",
            64,
            1,
            1 << 20,
            doc="collectives the flight recorder keeps",
        ),
        Setting(
            "HAL_COMM_TRACE_FILE", "str", None, doc="where the flight recorder dumps on failure"
        ),
        Setting("HAL_COMM_DLPACK", "bool", True, doc="collectives adopt DLPack tensors zero-copy"),
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


_DECLARED: Any = object()


def setting(name: str, env: Mapping[str, str] | None = None, *, default: Any = _DECLARED) -> Any:
    """Return the value of setting ``name`` from ``env`` (default ``os.environ``), parsed and checked.

    An unset or blank variable gives ``default``, or else the declared default.

    Raises:
        hal.ConfigError: the value does not fit (the message names variable, value and range).
        KeyError: ``name`` is not declared in :data:`SETTINGS`.
    """
    spec = SETTINGS[name]
    raw = (os.environ if env is None else env).get(name)
    if raw is None or not raw.strip():
        return spec.default if default is _DECLARED else default
    return spec.parse(raw)


def setting_at_import(
    name: str, env: Mapping[str, str] | None = None, *, default: Any = _DECLARED
) -> Any:
    """Like :func:`setting`, for what ``import hal`` reads: a bad value warns and gives the default.

    ``import hal`` never fails on the environment (the OpenTelemetry rule): the
    :class:`hal.HalWarning` names the variable, the value and what is allowed.
    """
    try:
        return setting(name, env, default=default)
    except ConfigError as exc:
        import warnings

        from hal._errors import HalWarning

        warnings.warn(f"{exc}; using the default", HalWarning, stacklevel=3)
        return SETTINGS[name].default if default is _DECLARED else default


def env_field(variable: str, *, doc: str = "") -> Any:
    """Declare a field of an :class:`Options` dataclass that defaults from ``variable``.

    The field's value is None until given in code; :meth:`Options.resolved` fills it from the
    environment (then the variable's declared default) and checks a value given in code with
    the same parser as the variable.
    """
    if variable not in SETTINGS:
        raise KeyError(f"{variable} is not declared in hal._settings.SETTINGS")
    return dataclasses.field(default=None, metadata={"env": variable, "doc": doc})


_O = TypeVar("_O", bound="Options")


@dataclasses.dataclass(frozen=True)
class Options:
    """Base of hal's frozen per-area options (``CommOptions``, ``KernelOptions``, ...).

    Precedence, field by field: a value given in code, else its environment variable, else the
    variable's declared default (**code > environment > default**).
    """

    def resolved(self: _O, env: Mapping[str, str] | None = None) -> _O:
        """Return a copy with every unset field taken from ``env`` (default ``os.environ``).

        Raises:
            hal.ConfigError: a value given in code (named ``Class.field``) or in the environment
                (named by its variable) does not fit.
        """
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            variable = f.metadata.get("env")
            if variable is None:
                continue
            value = getattr(self, f.name)
            if value is None:
                changes[f.name] = setting(variable, env)
            else:
                label = f"{type(self).__name__}.{f.name}"
                changes[f.name] = dataclasses.replace(SETTINGS[variable], name=label).parse(value)
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls: type[_O], env: Mapping[str, str] | None = None) -> _O:
        """Return the options of the environment alone (every field from its variable)."""
        return cls().resolved(env)

    @classmethod
    def variables(cls) -> dict[str, str]:
        """Return ``{field: environment variable}`` for the fields that have one."""
        return {f.name: f.metadata["env"] for f in dataclasses.fields(cls) if "env" in f.metadata}


@dataclasses.dataclass(frozen=True)
class PluginOptions(Options):
    """How backend plugins load (read when the plugin system is built: at the first
    ``hal.devices()`` and after ``hal.runtime().reset()``).

    Attributes:
        backends: allowlist and priority order (``HAL_BACKENDS``); None: every plugin.
        disable_backends: plugins never imported (``HAL_DISABLE_BACKENDS``).
        strict: a failed plugin raises :class:`hal.PluginError` (``HAL_STRICT_PLUGINS``).
        timeout_s: time limit of a plugin's import, hooks and probe (``HAL_PLUGIN_TIMEOUT_S``).
    """

    backends: tuple[str, ...] | None = env_field("HAL_BACKENDS")
    disable_backends: tuple[str, ...] | None = env_field("HAL_DISABLE_BACKENDS")
    strict: bool | None = env_field("HAL_STRICT_PLUGINS")
    timeout_s: float | None = env_field("HAL_PLUGIN_TIMEOUT_S")


@dataclasses.dataclass(frozen=True)
class MemoryOptions(Options):
    """The device memory pool (read at each device's first allocation; docs/memory.md).

    Attributes:
        pool: allocations go through the pool (``HAL_MEMORY_POOL``).
        limit: most bytes a device's pool takes, 0: no limit (``HAL_MEMORY_LIMIT``).
        reserve: bytes pre-allocated at the first allocation (``HAL_MEMORY_RESERVE``).
    """

    pool: bool | None = env_field("HAL_MEMORY_POOL")
    limit: int | None = env_field("HAL_MEMORY_LIMIT")
    reserve: int | None = env_field("HAL_MEMORY_RESERVE")


def describe() -> list[dict[str, Any]]:
    """Return every declared setting as a dict (name, kind, default, allowed, doc)."""
    return [
        {"name": s.name, "kind": s.kind, "default": s.default, "allowed": s.allowed(), "doc": s.doc}
        for s in SETTINGS.values()
    ]
