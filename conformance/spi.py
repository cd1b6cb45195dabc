"""The extension API of the conformance suite: what a section author needs.

A *section* is a module that declares requirements when imported; a plugin registers it
through the ``hal_register_conformance(registry)`` hook (``registry.add("pkg.module")``,
a :class:`SectionRegistry`). hal's own ``COMM-*`` and ``KERN-*`` sections come in the same
way, from ``hal.comm`` and ``hal.kernels``, and import only this module of the suite::

    from hal.conformance.spi import Target, add_area, requirement

    add_area("VND", "A vendor's own requirements", "full")

    @requirement("VND-HELLO", "A vendor section registered through hal_register_conformance runs.")
    def _hello(t: Target) -> None:
        t.attach("hello", str(t.device))

A check raises :class:`ConformanceFailure` (or fails an ``assert``) when the backend breaks
the requirement, and :class:`NotApplicable` when the backend's own declaration makes the
instance moot. Running the suite and reading certificates is the user API, in
:mod:`hal.conformance`. See docs/certify.md.
"""

from hal.conformance._registry import (
    AREAS,
    SECTIONS,
    Area,
    Check,
    Requirement,
    Scope,
    SectionRegistry,
    add_area,
    requirement,
)
from hal.conformance._target import ConformanceFailure, NotApplicable, Target

__all__ = [
    "AREAS",
    "SECTIONS",
    "Area",
    "Check",
    "ConformanceFailure",
    "NotApplicable",
    "Requirement",
    "Scope",
    "SectionRegistry",
    "Target",
    "add_area",
    "requirement",
]
