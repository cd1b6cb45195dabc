"""The conformance suite: certify a backend against the HAL's requirements.

Run it as ``hal conformance --backend NAME [--report cert.json] [--summary cert.md]`` or
as ``pytest --pyargs hal.conformance --hal-backend NAME``. Each requirement has a stable
ID (``MEM-COPY-H2D``), a one-line statement and a check that uses the public HAL only.
A requirement is skipped only where the backend declares the capability it needs absent
(:class:`hal.Capabilities`), and the certificate carries the backend's justification.

Sections (``MEM``, ``STREAM``, ``EVENT``, ``ERR``, ``P2P``, ``DLPACK``; ``KERN`` and
``COMM`` registered by hal.kernels and hal.comm through the ``hal_register_conformance`` hook,
as a vendor's sections are) are modules that declare requirements; writing one is the
extension API, :mod:`hal.conformance.spi`. This package is the user API: run the suite, list
the catalogue, build, validate, compare and render certificates. See docs/certify.md and
docs/certificate-schema.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hal import spi as _hal_spi

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
    from hal.conformance._isolated import run_isolated
    from hal.conformance._registry import AREAS, Area, Requirement, catalogue
    from hal.conformance._runner import Instance, Outcome, Progress, Suite, aggregate

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
    **dict.fromkeys(["AREAS", "Area", "Requirement", "catalogue"], "_registry"),
    "run_isolated": "_isolated",
    **dict.fromkeys(["Instance", "Outcome", "Progress", "Suite", "aggregate"], "_runner"),
}


def _lazy(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'hal.conformance' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hal.conformance.{mod}"), name)


#: Names of the section-author (extension) API that moved to :mod:`hal.conformance.spi` in
#: hal-sdk 1.2; the old spelling ``hal.conformance.NAME`` works until 2.0, with a warning.
__getattr__ = _hal_spi.moved_names(
    "hal.conformance",
    "hal.conformance.spi",
    {
        "ConformanceFailure",
        "NotApplicable",
        "SECTIONS",
        "SectionRegistry",
        "Target",
        "add_area",
        "requirement",
    },
    fallback=_lazy,
)


__all__ = [
    "AREAS",
    "SCHEMA_VERSION",
    "SUITE_VERSION",
    "Area",
    "Instance",
    "Outcome",
    "Progress",
    "Requirement",
    "Suite",
    "aggregate",
    "build_certificate",
    "catalogue",
    "compare",
    "load_schema",
    "render_markdown",
    "run",
    "run_isolated",
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
