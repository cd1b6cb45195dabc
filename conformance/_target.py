"""What a check receives: the devices under test, a seeded RNG and resource tracking."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

import hal

__all__ = ["ConformanceFailure", "NotApplicable", "Target"]


class ConformanceFailure(AssertionError):
    """A check found the backend violating its requirement (the message says how)."""


class NotApplicable(Exception):
    """Raised by a check when the backend's *own declaration* makes this instance moot.

    For a per-target declaration of a capability (``can_access_peer`` false for one pair
    of devices that declare ``p2p``): ``capability`` names it and the runner reports a
    skip with the message as reason. Without a capability the runner reports a
    *failure*: a requirement is skipped only for a declared-absent capability.

    Attributes:
        capability: the field of :class:`hal.Capabilities` the declaration is about.
    """

    def __init__(self, reason: str, capability: str | None = None) -> None:
        super().__init__(reason)
        self.capability = capability


class Target:
    """The devices one instance of a requirement runs on, plus helpers for checks.

    Attributes:
        backend: the backend name.
        devices: the devices of this instance (one, a pair, or all of them).
        all_devices: every device of the backend.
        rng: a NumPy generator seeded from the suite seed, the requirement and the devices.
        data: JSON-friendly details the check attaches for the certificate.
        cache: a dict shared by every instance of one suite run (calibrations).
    """

    def __init__(
        self,
        backend: str,
        devices: Sequence[hal.Device],
        all_devices: Sequence[hal.Device],
        seed: int,
        cache: dict[Any, Any] | None = None,
    ) -> None:
        self.backend = backend
        self.devices = tuple(devices)
        self.all_devices = tuple(all_devices)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.data: dict[str, Any] = {}
        self.cache: dict[Any, Any] = {} if cache is None else cache
        self._stack = contextlib.ExitStack()

    @property
    def device(self) -> hal.Device:
        """The (first) device under test."""
        return self.devices[0]

    @property
    def peer(self) -> hal.Device:
        """The second device of a pair."""
        return self.devices[1]

    @property
    def label(self) -> str:
        """``cpu:0``, ``cpu:0->cpu:1`` or ``cpu`` (backend scope)."""
        if len(self.devices) == len(self.all_devices) and len(self.devices) != 1:
            return self.backend
        return "->".join(str(d) for d in self.devices)

    # -- tracked resources ---------------------------------------------------------------
    def alloc(self, nbytes: int, device: hal.Device | None = None) -> hal.Buffer:
        """Allocate a buffer that is closed when the check ends."""
        buf = (device or self.device).alloc(nbytes)
        self._stack.callback(buf.close)
        return buf

    def stream(self, device: hal.Device | None = None) -> hal.Stream:
        """Create a stream that is closed when the check ends."""
        s = (device or self.device).create_stream()
        self._stack.callback(s.close)
        return s

    def event(self, device: hal.Device | None = None, timing: bool = False) -> hal.Event:
        """Create an event that is closed when the check ends."""
        e = (device or self.device).create_event(timing=timing)
        self._stack.callback(e.close)
        return e

    def keep(self, obj: Any) -> Any:
        """Keep ``obj`` alive until the check ends (host memory of asynchronous copies)."""
        self._stack.callback(lambda: obj)
        return obj

    def close(self) -> None:
        """Wait for the devices, then release every tracked resource (last created first)."""
        try:
            for dev in self.devices:
                dev.synchronize()
        finally:
            self._stack.close()

    # -- results ------------------------------------------------------------------------
    def attach(self, key: str, value: Any) -> None:
        """Attach JSON-friendly ``value`` under ``key`` to this instance's certificate entry."""
        json.dumps(value)
        self.data[key] = value

    @staticmethod
    def fail(message: str) -> ConformanceFailure:
        """Return a failure to ``raise``."""
        return ConformanceFailure(message)

    def expect(self, condition: object, message: str) -> None:
        """Fail with ``message`` unless ``condition`` is true."""
        if not condition:
            raise ConformanceFailure(message)

    def not_applicable(self, reason: str, capability: str | None = None) -> NotApplicable:
        """Return a :class:`NotApplicable` to ``raise`` (see its docstring for when).

        Without ``capability`` the instance fails: only a declared capability justifies a skip.
        """
        return NotApplicable(reason, capability)
