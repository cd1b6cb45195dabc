"""The conformance suite: certify a backend against the HAL's requirements.

Run it as ``hal conformance --backend NAME [--report cert.json] [--summary cert.md]`` or
as ``pytest --pyargs hal.conformance --hal-backend NAME``. Each requirement has a stable
ID (``MEM-COPY-H2D``), a one-line statement and a check that uses the public HAL only.
A requirement is skipped only where the backend declares the capability it needs absent
(:class:`hal.Capabilities`), and the certificate carries the backend's justification.

Sections (``MEM``, ``STREAM``, ``EVENT``, ``ERR``, ``P2P``, ``DLPACK``; ``KERN`` and
``COMM`` through the ``hal_register_conformance`` hook, as a vendor's sections) are modules
that declare requirements with :func:`requirement`; see docs/certify.md and
docs/certificate-schema.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hal.conformance._certificate import (
        SCHEMA_VERSION,
        SUITE_VERSION,
        build_certificate,
        compare,
        load_schema,
        render_markdown,
        suite_hash,
        validate,
    )
    from hal.conformance._registry import (
        AREAS,
        SECTIONS,
        Area,
        Requirement,
        SectionRegistry,
        add_area,
        catalogue,
        requirement,
    )
    from hal.conformance._runner import Instance, Outcome, Progress, Suite, aggregate
    from hal.conformance._target import ConformanceFailure, NotApplicable, Target

# Names load lazily: the pytest plugin (hal.conformance.pytest_plugin) is imported in
# every pytest session of an environment with hal-sdk, and must stay light there.
_LAZY = {
    **dict.fromkeys(
        [
            "SCHEMA_VERSION",
            "SUITE_VERSION",
            "build_certificate",
            "compare",
            "load_schema",
            "render_markdown",
            "suite_hash",
            "validate",
        ],
        "_certificate",
    ),
    **dict.fromkeys(
        [
            "AREAS",
            "SECTIONS",
            "Area",
            "Requirement",
            "SectionRegistry",
            "add_area",
            "catalogue",
            "requirement",
        ],
        "_registry",
    ),
    **dict.fromkeys(["Instance", "Outcome", "Progress", "Suite", "aggregate"], "_runner"),
    **dict.fromkeys(["ConformanceFailure", "NotApplicable", "Target"], "_target"),
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'hal.conformance' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hal.conformance.{mod}"), name)


__all__ = [
    "AREAS",
    "SCHEMA_VERSION",
    "SECTIONS",
    "SUITE_VERSION",
    "Area",
    "ConformanceFailure",
    "Instance",
    "NotApplicable",
    "Outcome",
    "Progress",
    "Requirement",
    "SectionRegistry",
    "Suite",
    "Target",
    "add_area",
    "aggregate",
    "build_certificate",
    "catalogue",
    "compare",
    "load_schema",
    "render_markdown",
    "requirement",
    "run",
    "suite_hash",
    "validate",
]


def run(
    backend: str,
    *,
    select: str | None = None,
    seed: int = 0,
    timeout: float = 60.0,
    progress: Progress | None = None,
) -> dict[str, object]:
    """Run the suite on ``backend`` and return the certificate (a JSON-friendly dict).

    Args:
        backend: the backend name (``"cpu"``, ``"opencl"``, a vendor's).
        select: a ``-k`` expression over requirement IDs (``"MEM and not OOM"``).
        seed: seed of the random patterns.
        timeout: seconds one requirement instance may run before it fails as hung.
        progress: receives progress events (see :class:`Progress`).
    """
    from hal.conformance._runner import Suite

    return Suite(backend, seed=seed, timeout=timeout, select=select).run(progress)
