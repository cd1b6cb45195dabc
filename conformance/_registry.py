"""The catalogue: areas and requirements with stable IDs, one-line statements and checks.

A section of the suite is a module that declares requirements with :func:`requirement`.
The core sections are listed in :data:`SECTIONS`; more sections come through the
``hal_register_conformance(registry)`` plugin hook (:class:`SectionRegistry`): hal's own
``COMM-*`` and ``KERN-*`` sections are registered that way by hal.comm and hal.kernels,
exactly like a vendor's (section authors import :mod:`hal.conformance.spi`).
:func:`load_sections` collects them once and imports every module.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, final

if TYPE_CHECKING:
    from hal.conformance._target import Target

__all__ = [
    "AREAS",
    "SECTIONS",
    "Area",
    "Check",
    "Requirement",
    "Scope",
    "SectionRegistry",
    "add_area",
    "catalogue",
    "load_sections",
    "requirement",
]

Scope = Literal["device", "pair", "backend"]
Level = Literal["core", "full"]
Check = Callable[["Target"], None]

_ID = re.compile(r"^[A-Z][A-Z0-9]*(-[A-Z0-9]+)+$")


@dataclasses.dataclass(frozen=True)
class Area:
    """A group of requirements sharing an ID prefix.

    Attributes:
        prefix: the ID prefix (``"MEM"``); requirement IDs are ``PREFIX-NAME``.
        title: a short human title.
        level: ``"core"`` if a core certificate needs the area, else ``"full"``.
    """

    prefix: str
    title: str
    level: Level


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One requirement of the catalogue.

    Attributes:
        id: the stable ID (``"MEM-COPY-H2D"``); never reused for another statement.
        statement: one sentence saying what a conforming backend does.
        area: the :class:`Area` prefix.
        check: the function that verifies the requirement on a :class:`Target`.
        needs: capability names (fields of :class:`hal.Capabilities`) the requirement
            needs; it is skipped on devices that declare one of them absent.
        scope: ``"device"`` (run once per device), ``"pair"`` (once per ordered pair of
            distinct devices) or ``"backend"`` (once, with every device).
        min_devices: fewest devices the requirement needs (more than 1 only for
            ``"backend"`` scope; a ``"pair"`` always needs 2).
    """

    id: str
    statement: str
    area: str
    check: Check = dataclasses.field(repr=False, compare=False)
    needs: tuple[str, ...] = ()
    scope: Scope = "device"
    min_devices: int = 1

    @property
    def level(self) -> Level:
        """The certificate level this requirement belongs to."""
        return AREAS[self.area].level


AREAS: dict[str, Area] = {}
_REQUIREMENTS: dict[str, Requirement] = {}

#: Modules that declare the sections, imported in this order: the core ones here, then
#: those registered through ``hal_register_conformance`` (appended by :func:`load_sections`).
SECTIONS: list[str] = [
    "hal.conformance._sec_mem",
    "hal.conformance._sec_ipc",
    "hal.conformance._sec_stream",
    "hal.conformance._sec_event",
    "hal.conformance._sec_p2p",
    "hal.conformance._sec_err",
    "hal.conformance._sec_dlpack",
    "hal.conformance._sec_async",
    "hal.conformance._sec_scale",
]


def add_area(prefix: str, title: str, level: Level) -> Area:
    """Declare an area (idempotent for an identical declaration) and return it."""
    if not re.fullmatch(r"[A-Z][A-Z0-9]*", prefix):
        raise ValueError(f"{prefix=} must be upper-case letters and digits")
    if level not in ("core", "full"):
        raise ValueError(f"{level=} must be 'core' or 'full'")
    area = Area(prefix, title, level)
    old = AREAS.get(prefix)
    if old is not None and old != area:
        raise ValueError(f"area {prefix!r} is already declared as {old}")
    AREAS[prefix] = area
    return area


add_area("MEM", "Memory: allocation, limits, copies, memset, close", "core")
add_area("STREAM", "Streams: ordering, synchronize, query, many streams", "core")
add_area("EVENT", "Events: cross-stream ordering, synchronize, timing", "core")
add_area("ERR", "Errors: bad arguments rejected with the right error and no side effect", "core")
add_area("P2P", "Peer devices: query consistency, peer copies, reported path", "full")
add_area("DLPACK", "DLPack export", "full")
add_area("KERN", "Portable kernels (hal.kernels)", "full")
add_area("COMM", "Collectives (hal.comm)", "full")


def requirement(
    id: str,
    statement: str,
    *,
    needs: str | tuple[str, ...] = (),
    scope: Scope = "device",
    min_devices: int | None = None,
) -> Callable[[Check], Check]:
    """Register the decorated function as the check of requirement ``id``.

    The area is the ID's prefix and must have been declared with :func:`add_area`.

    Example::

        @requirement("MEM-ZERO-SIZE", "Zero-byte buffers allocate, copy and close.")
        def _(t: Target) -> None: ...
    """
    if not _ID.match(id):
        raise ValueError(f"{id=} must look like 'AREA-NAME' (upper case, digits, dashes)")
    area = id.split("-", 1)[0]
    if area not in AREAS:
        raise ValueError(f"{id=}: area {area!r} is not declared (see add_area)")
    if not statement or "\n" in statement:
        raise ValueError(f"{id}: the statement must be one non-empty line")
    if scope not in ("device", "pair", "backend"):
        raise ValueError(f"{scope=} must be 'device', 'pair' or 'backend'")
    caps = (needs,) if isinstance(needs, str) else tuple(needs)
    from hal import Capabilities

    for cap in caps:
        if cap == "absent_reasons" or cap not in {f.name for f in dataclasses.fields(Capabilities)}:
            raise ValueError(f"{id}: needs={cap!r} is not a field of hal.Capabilities")
    lowest = 2 if scope == "pair" else 1
    mind = lowest if min_devices is None else max(int(min_devices), lowest)

    def register(check: Check) -> Check:
        if id in _REQUIREMENTS:
            raise ValueError(f"requirement {id} is declared twice")
        _REQUIREMENTS[id] = Requirement(id, statement, area, check, caps, scope, mind)
        return check

    return register


_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@final
class SectionRegistry:
    """Collects conformance sections from ``hal_register_conformance`` hooks.

    A section is a module that declares requirements with :func:`requirement` (and its area
    with :func:`add_area`) when imported; it is imported before the run, and its file counts
    in the suite hash. A section module of a package below the conformance layer, which may
    not import it (hal.comm's, hal.kernels'), instead defines ``declare_requirements(spi)``:
    the suite calls it once, after the import, with :mod:`hal.conformance.spi`. Example of a
    vendor plugin::

        @hookimpl
        def hal_register_conformance(registry):
            registry.add("acme_hal.conformance")   # declares ACME-* requirements

    Attributes:
        modules: the module names added so far, in order.
        plugin: the plugin whose hook is running (for messages).
    """

    def __init__(self) -> None:
        self.modules: list[str] = []
        self.plugin = ""

    def add(self, module: str) -> None:
        """Add the section module ``module`` (a dotted import name). Idempotent.

        Raises:
            ValueError: ``module`` is not a dotted module name.
        """
        if not isinstance(module, str) or not _MODULE.match(module):
            raise ValueError(
                f"{module=} must be a dotted module name (plugin {self.plugin or '?'})"
            )
        if module not in self.modules:
            self.modules.append(module)


_collected = False
#: section modules whose ``declare_requirements(spi)`` ran
_declared: set[str] = set()
#: plugin -> why its ``hal_register_conformance`` hook failed
SECTION_FAILURES: dict[str, str] = {}


def load_sections() -> None:
    """Collect the hooks' sections into :data:`SECTIONS` (once), then import every module."""
    global _collected
    if not _collected:
        # hal.comm and hal.kernels (layers below this one) ship their own sections and join
        # the plugin system with their built-in plugin, like a vendor's plugin: the hook is
        # called on every plugin alike, and no module of theirs is named here.
        import hal.comm.spi
        import hal.kernels.spi

        hal.comm.spi.plugin_system()
        system = hal.kernels.spi.plugin_system()
        reg = SectionRegistry()

        def label(name: str) -> None:
            reg.plugin = name

        SECTION_FAILURES.update(
            system.call_plugin_hook("hal_register_conformance", on_plugin=label, registry=reg)
        )
        # hal's own sections first, then the vendors', each in registration order
        ordered = sorted(reg.modules, key=lambda m: not m.startswith("hal."))
        SECTIONS.extend(m for m in ordered if m not in SECTIONS)
        _collected = True
    for name in SECTIONS:
        module = importlib.import_module(name)
        declare = getattr(module, "declare_requirements", None)
        if callable(declare) and name not in _declared:
            _declared.add(name)
            import hal.conformance.spi

            declare(hal.conformance.spi)


def catalogue() -> list[Requirement]:
    """Return every requirement, grouped by area in declaration order."""
    load_sections()
    order = {p: i for i, p in enumerate(AREAS)}
    reqs = list(_REQUIREMENTS.values())
    return sorted(reqs, key=lambda r: order[r.area])  # stable: declaration order within an area
