"""Pools, per-job quotas and the scheduler's configuration file (TOML)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import tomllib

from hal.sched._health import HealthConfig
from hal.sched._task import SchedulerError

__all__ = ["ConfigError", "Pool", "SchedulerConfig", "load_config"]


class ConfigError(SchedulerError, ValueError):
    """A scheduler configuration (file or :class:`Pool`) is invalid; the message names the field."""


def _opt_number(name: str, v: object, *, integer: bool = False) -> None:
    if v is None:
        return
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not v >= 0:  # type: ignore[operator]
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{name}={v!r} must be {kind} >= 0 or None")


@dataclasses.dataclass(frozen=True)
class Pool:
    """A named pool: its devices, its priority against other pools and its per-job quota.

    Attributes:
        name: the pool's name (``submit(..., pool=name)``).
        devices: the device names it may use (``"cpu:0"``); None: every device of the
            scheduler. Pools may share devices (a share): their priorities decide who goes first.
        priority: added to the priority class of the pool's tasks (a higher pool goes first).
        max_cards: the most devices one job (``submit(..., job=)``) of this pool holds at once
            (the seeds' ``max_cards``); None: no limit.
        max_memory: the most ``memory_bytes`` one job's running tasks declare together; None: no limit.
    """

    name: str
    devices: tuple[str, ...] | None = None
    priority: float = 0.0
    max_cards: int | None = None
    max_memory: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"pool name={self.name!r} must be a non-empty string")
        if self.devices is not None:
            if isinstance(self.devices, str) or not all(isinstance(d, str) for d in self.devices):
                raise ConfigError(
                    f"pool {self.name!r}: devices={self.devices!r} must be a list of device names"
                )
            object.__setattr__(self, "devices", tuple(self.devices))
        if isinstance(self.priority, bool) or not isinstance(self.priority, (int, float)):
            raise ConfigError(f"pool {self.name!r}: priority={self.priority!r} must be a number")
        _opt_number(f"pool {self.name!r}: max_cards", self.max_cards, integer=True)
        _opt_number(f"pool {self.name!r}: max_memory", self.max_memory, integer=True)
        if self.max_cards == 0:
            raise ConfigError(f"pool {self.name!r}: max_cards=0 would never run a task")


@dataclasses.dataclass
class SchedulerConfig:
    """What a configuration file sets (see :func:`load_config`); ``kwargs()`` feeds :class:`Scheduler`."""

    policy: str = "eft"
    devices: list[str] | None = None
    timeout: float | None = None
    short_threshold: float | None = None
    preemption_grace: float = 0.0
    memory_wait: float = 60.0
    concurrency: int = 1
    health: HealthConfig = dataclasses.field(default_factory=HealthConfig)
    pools: list[Pool] = dataclasses.field(default_factory=list)

    def kwargs(self) -> dict[str, Any]:
        """Return the keyword arguments of :class:`Scheduler` this configuration stands for."""
        return {
            "devices": self.devices,
            "policy": self.policy,
            "timeout": self.timeout,
            "short_threshold": self.short_threshold,
            "preemption_grace": self.preemption_grace,
            "memory_wait": self.memory_wait,
            "concurrency": self.concurrency,
            "health": self.health,
            "pools": self.pools,
        }


_SCHED_KEYS = {
    "policy",
    "devices",
    "timeout",
    "short_threshold",
    "preemption_grace",
    "memory_wait",
    "concurrency",
}
_HEALTH_KEYS = {f.name for f in dataclasses.fields(HealthConfig)}
_POOL_KEYS = {"devices", "priority", "quota"}
_QUOTA_KEYS = {"max_cards", "max_memory"}


def _check_keys(where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(allowed))})"
        )


def parse_config(data: Mapping[str, Any], source: str = "<config>") -> SchedulerConfig:
    """Build a :class:`SchedulerConfig` from parsed TOML tables (see :func:`load_config`)."""
    _check_keys(source, data, {"scheduler", "health", "pools"})
    sched = data.get("scheduler", {})
    health = data.get("health", {})
    pools = data.get("pools", {})
    for name, table in (("[scheduler]", sched), ("[health]", health), ("[pools]", pools)):
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: {name} must be a table")
    _check_keys(f"{source} [scheduler]", sched, _SCHED_KEYS)
    _check_keys(f"{source} [health]", health, _HEALTH_KEYS)
    cfg = SchedulerConfig()
    for key, value in sched.items():
        setattr(cfg, key, value)
    if cfg.devices is not None and (
        isinstance(cfg.devices, str) or not all(isinstance(d, str) for d in cfg.devices)
    ):
        raise ConfigError(
            f"{source} [scheduler]: devices={cfg.devices!r} must be a list of device names"
        )
    for key in ("timeout", "short_threshold"):
        _opt_number(f"{source} [scheduler]: {key}", getattr(cfg, key))
    for key in ("preemption_grace", "memory_wait"):
        _opt_number(f"{source} [scheduler]: {key}", getattr(cfg, key))
    try:
        cfg.health = HealthConfig(**health)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source} [health]: {exc}") from None
    for name, table in pools.items():
        where = f"{source} [pools.{name}]"
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where} must be a table")
        _check_keys(where, table, _POOL_KEYS)
        quota = table.get("quota", {})
        if not isinstance(quota, Mapping):
            raise ConfigError(f"{where}: quota must be a table")
        _check_keys(f"{where} quota", quota, _QUOTA_KEYS)
        try:
            cfg.pools.append(
                Pool(
                    name, devices=table.get("devices"), priority=table.get("priority", 0.0), **quota
                )
            )
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return cfg


def load_config(path: str | os.PathLike[str]) -> SchedulerConfig:
    """Read a scheduler configuration file (TOML).

    Tables: ``[scheduler]`` (``policy``, ``devices``, ``timeout``: the default per-task
    timeout, ``short_threshold``, ``preemption_grace``, ``memory_wait``, ``concurrency``),
    ``[health]`` (``interval``, ``timeout``, ``evict_after``, ``recover_after``,
    ``readmit_after``) and ``[pools.<name>]`` (``devices``, ``priority``,
    ``quota = {max_cards = .., max_memory = ..}``).

    Raises:
        ConfigError: unreadable TOML, an unknown key or a bad value (the message names it).
    """
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read scheduler configuration {p!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return parse_config(data, p)
