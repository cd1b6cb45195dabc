"""The shared runner: expand requirements into instances, run them with a timeout, aggregate.

Used by both ``hal conformance`` and the pytest plugin, so both produce the same
certificate. Backend-agnostic: it sees the backend only through the public HAL.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import itertools
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import hal
from hal.conformance._registry import Requirement, catalogue
from hal.conformance._select import compile_expression
from hal.conformance._target import ConformanceFailure, NotApplicable, Target

__all__ = ["Instance", "Outcome", "Progress", "Suite", "aggregate"]

Status = Literal["pass", "fail", "skip"]

#: At most this many devices take part in ``pair`` requirements (all ordered pairs among them).
MAX_PAIR_DEVICES = 4


@dataclasses.dataclass(frozen=True)
class Instance:
    """One requirement on one target (a device, a pair, or the whole backend)."""

    requirement: Requirement
    devices: tuple[hal.Device, ...]
    label: str
    skip: str | None = None

    @property
    def name(self) -> str:
        """``MEM-COPY-H2D[cpu:0]``: the instance's name in progress output and pytest IDs."""
        return f"{self.requirement.id}[{self.label}]"


@dataclasses.dataclass
class Outcome:
    """What one instance did."""

    target: str
    status: Status
    reason: str
    duration: float
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: BaseException | None = None
    traceback: str = ""
    #: why a skip is justified: ``"capability"`` (declared absent) or ``"devices"`` (too few)
    basis: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the certificate entry of the instance."""
        out: dict[str, Any] = {
            "target": self.target,
            "status": self.status,
            "reason": self.reason,
            "duration": round(self.duration, 6),
        }
        if self.data:
            out["data"] = self.data
        if self.basis is not None:
            out["basis"] = self.basis
        return out


class Progress(Protocol):
    """Receives progress of a run (the CLI prints it)."""

    def started(self, requirement: Requirement, index: int, total: int) -> None:
        """Called before the instances of ``requirement`` run."""

    def finished(
        self, requirement: Requirement, index: int, total: int, result: dict[str, Any]
    ) -> None:
        """Called with the aggregated certificate entry of ``requirement``."""


def _is_skip_exception(exc: BaseException) -> bool:
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"Skipped", "SkipTest"})


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConformanceFailure):
        return str(exc)
    text = f"{type(exc).__name__}: {exc}"
    if _is_skip_exception(exc):
        return f"undeclared skip ({text}): a requirement is skipped only for a declared-absent capability"
    return text


_MAX_TIMEOUTS = 10  # a check that keeps building kernels still fails after this many timeouts


def _kernel_builds() -> int:
    """Programs hal.kernels compiled or loaded from its disk cache so far (0 if it is not in use)."""
    kernels = sys.modules.get("hal.kernels")
    if kernels is None:
        return 0
    stats = kernels.cache_stats()
    return int(stats.misses) + int(stats.hits)


class Suite:
    """The conformance suite bound to one backend.

    Args:
        backend: the backend name (``hal.devices(backend)`` must be available).
        seed: seed of every random pattern (recorded in the certificate).
        timeout: seconds one instance may run without building a kernel before it fails as
            hung (at most 10 timeouts in all, builds or not).
        select: a ``-k`` expression choosing requirements by ID; ``None`` runs all.

    Raises:
        ValueError: unknown backend or malformed ``select``.
        hal.BackendUnavailableError: the backend cannot run here.
    """

    def __init__(
        self, backend: str, *, seed: int = 0, timeout: float = 60.0, select: str | None = None
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"{timeout=} must be > 0")
        self.backend = backend
        self.seed = int(seed)
        self.timeout = float(timeout)
        self.select = select
        self.devices = tuple(hal.devices(backend))
        self.info = next(b for b in hal.list_backends() if b.name == backend)
        self.catalogue = catalogue()
        pred = compile_expression(select) if select else None
        self.selected = [r for r in self.catalogue if pred is None or pred(r.id)]
        self._cache: dict[object, object] = {}
        #: threads of checks that timed out and still run (the CLI exits without waiting for them)
        self.hung: list[threading.Thread] = []

    # -- instances ----------------------------------------------------------------------
    def instances(self, req: Requirement) -> list[Instance]:
        """Return the instances of ``req`` on this backend (predetermined skips included)."""
        devs = self.devices
        if len(devs) < req.min_devices:
            reason = (
                f"needs {req.min_devices} devices; backend {self.backend!r} exposes {len(devs)} "
                "(the device count is the backend's declaration)"
            )
            return [Instance(req, devs, self.backend, reason)]
        if req.scope == "device":
            groups: list[tuple[hal.Device, ...]] = [(d,) for d in devs]
        elif req.scope == "pair":
            groups = list(itertools.permutations(devs[:MAX_PAIR_DEVICES], 2))
        else:
            groups = [devs]
        out = []
        for g in groups:
            label = self.backend if req.scope == "backend" else "->".join(str(d) for d in g)
            out.append(Instance(req, g, label, self._capability_skip(req, g)))
        return out

    @staticmethod
    def _capability_skip(req: Requirement, devs: Sequence[hal.Device]) -> str | None:
        for d in devs:
            for cap in req.needs:
                why = d.capabilities.reason_absent(cap)
                if why is not None:
                    return f"capability {cap!r} declared absent: {why}"
        return None

    def _seed(self, inst: Instance) -> int:
        digest = hashlib.sha256(f"{self.seed}/{inst.requirement.id}/{inst.label}".encode()).digest()
        return int.from_bytes(digest[:8], "little")

    # -- execution ----------------------------------------------------------------------
    def execute(self, inst: Instance) -> Outcome:
        """Run one instance in a worker thread; a hang longer than the timeout is a failure."""
        if inst.skip is not None:
            basis = "capability" if inst.skip.startswith("capability ") else "devices"
            return Outcome(inst.label, "skip", inst.skip, 0.0, basis=basis)
        target = Target(self.backend, inst.devices, self.devices, self._seed(inst), self._cache)
        box: dict[str, Any] = {}

        def body() -> None:
            t0 = time.perf_counter()
            error: BaseException | None = None
            try:
                inst.requirement.check(target)
            except BaseException as exc:  # noqa: BLE001 - every exception is a verdict
                error = exc
            try:
                target.close()
            except BaseException as exc:  # noqa: BLE001
                if error is None:
                    error = exc
                    box["cleanup"] = True
            box["duration"] = time.perf_counter() - t0
            box["error"] = error
            if error is not None:
                box["traceback"] = "".join(traceback.format_exception(error))

        thread = threading.Thread(target=body, name=f"hal-conformance {inst.name}", daemon=True)
        # a hang is `timeout` seconds without a kernel build: a first run compiles every op's
        # kernels (KERN-ACCURACY took 110 s with PoCL's cache empty, 4 s with it warm), which is
        # work, not a wait that never returns; a check never runs longer than 10 timeouts in all.
        # Counted before the thread starts, so a build it makes at once is seen.
        builds = _kernel_builds()
        t_start = idle_since = time.perf_counter()
        thread.start()
        while True:
            now = time.perf_counter()
            left = min(idle_since + self.timeout, t_start + _MAX_TIMEOUTS * self.timeout) - now
            if left <= 0:
                break
            thread.join(min(left, 1.0))
            if not thread.is_alive():
                break
            if (b := _kernel_builds()) != builds:
                builds, idle_since = b, time.perf_counter()
        if thread.is_alive():
            self.hung.append(thread)
            spent = time.perf_counter() - t_start
            if spent >= _MAX_TIMEOUTS * self.timeout:
                why = (
                    f"did not finish within {spent:.0f} s ({_MAX_TIMEOUTS} x the {self.timeout:g} s timeout), "
                    "though it was still building kernels (raise --timeout for a slow compiler)"
                )
            elif idle_since > t_start:
                why = (
                    f"did not finish within {spent:.0f} s, the last {self.timeout:g} s without a kernel "
                    "build (a synchronize or wait that never returns?)"
                )
            else:
                why = f"did not finish within {self.timeout:g} s (a synchronize or wait that never returns?)"
            return Outcome(inst.label, "fail", why, spent)
        err = box["error"]
        dur = box["duration"]
        if err is None:
            return Outcome(inst.label, "pass", "", dur, dict(target.data))
        if isinstance(err, NotApplicable):
            if err.capability is not None:
                return Outcome(
                    inst.label,
                    "skip",
                    f"capability {err.capability!r} declared absent here: {err}",
                    dur,
                    dict(target.data),
                    basis="capability",
                )
            return Outcome(
                inst.label,
                "fail",
                f"skipped for a reason that is not a declared-absent capability "
                f"({err}): only a declared-absent capability justifies a skip",
                dur,
                dict(target.data),
                err,
            )
        reason = _describe(err)
        if box.get("cleanup"):
            reason = f"releasing resources after the check failed: {reason}"
        return Outcome(
            inst.label, "fail", reason, dur, dict(target.data), err, box.get("traceback", "")
        )

    def run_requirement(self, req: Requirement) -> tuple[dict[str, Any], list[Outcome]]:
        """Run every instance of ``req``; return its certificate entry and the outcomes."""
        outcomes = [self.execute(i) for i in self.instances(req)]
        return aggregate(req, outcomes), outcomes

    def run(self, progress: Progress | None = None) -> dict[str, Any]:
        """Run the selected requirements and return the certificate (a JSON-friendly dict)."""
        from hal.conformance._certificate import build_certificate

        started = datetime.datetime.now(datetime.timezone.utc)
        results = []
        total = len(self.selected)
        for i, req in enumerate(self.selected, 1):
            if progress is not None:
                progress.started(req, i, total)
            entry, _ = self.run_requirement(req)
            results.append(entry)
            if progress is not None:
                progress.finished(req, i, total, entry)
        return build_certificate(self, results, started)


def aggregate(req: Requirement, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Fold the outcomes of a requirement's instances into its certificate entry.

    ``fail`` if any instance failed, ``skip`` if every instance was skipped, else ``pass``.
    """
    fails = [o for o in outcomes if o.status == "fail"]
    skips = [o for o in outcomes if o.status == "skip"]
    status: Status
    if fails:
        status = "fail"
        reason = f"{fails[0].target}: {fails[0].reason}"
        if len(fails) > 1:
            reason += f" (and {len(fails) - 1} more failing target(s))"
    elif outcomes and len(skips) == len(outcomes):
        status = "skip"
        reasons = sorted({o.reason for o in skips})
        reason = "; ".join(reasons)
    else:
        status = "pass"
        reason = (
            ""
            if not skips
            else f"{len(skips)} of {len(outcomes)} targets skipped: {skips[0].reason}"
        )
    return {
        "id": req.id,
        "area": req.area,
        "statement": req.statement,
        "status": status,
        "reason": reason,
        "duration": round(sum(o.duration for o in outcomes), 6),
        "needs": list(req.needs),
        "scope": req.scope,
        "instances": [o.to_dict() for o in outcomes],
    }
