"""The pytest face of the suite: ``pytest --pyargs hal.conformance --hal-backend NAME``.

Registered through the ``pytest11`` entry point ``hal.conformance.pytest_plugin`` (or
``-p hal.conformance.pytest_plugin`` where plugin autoloading is disabled). It is inert in
other test sessions: it only parametrizes tests that ask for the ``hal_instance`` fixture,
which only ``hal/conformance/test_conformance.py`` does. Each requirement instance
becomes one test with the ID ``REQ-ID@target`` (``MEM-COPY-H2D@cpu:0``), so ``-k`` works
on requirement IDs. ``--hal-report``/``--hal-summary`` write the same certificate as
``hal conformance``.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from hal.conformance._runner import Instance, Outcome, Suite

__all__ = ["ConformanceSession"]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--hal-*`` options."""
    g = parser.getgroup(
        "hal-conformance", "hal-sdk conformance suite (pytest --pyargs hal.conformance)"
    )
    g.addoption(
        "--hal-backend", metavar="NAME", help="backend to certify (e.g. cpu, opencl, a vendor's)"
    )
    g.addoption("--hal-report", metavar="PATH", help="write the JSON certificate here")
    g.addoption("--hal-summary", metavar="PATH", help="write the Markdown summary here")
    g.addoption(
        "--hal-seed",
        metavar="N",
        type=int,
        default=0,
        help="seed of the random patterns (default 0)",
    )
    g.addoption(
        "--hal-timeout",
        metavar="S",
        type=float,
        default=60.0,
        help="seconds one requirement instance may run before it fails as hung (default 60)",
    )


class ConformanceSession:
    """Per-pytest-session state: the :class:`Suite` and the outcomes collected so far."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._suite: Suite | None = None
        self.outcomes: dict[str, list[Outcome]] = {}
        self.started = datetime.datetime.now(datetime.timezone.utc)

    @property
    def suite(self) -> Suite:
        """The suite bound to ``--hal-backend`` (created on first use)."""
        if self._suite is None:
            from hal.conformance._runner import Suite

            backend = self.config.getoption("hal_backend")
            if not backend:
                raise pytest.UsageError(
                    "the hal conformance suite needs --hal-backend NAME (see `hal info`)"
                )
            try:
                self._suite = Suite(
                    backend,
                    seed=self.config.getoption("hal_seed"),
                    timeout=self.config.getoption("hal_timeout"),
                )
            except Exception as exc:
                raise pytest.UsageError(
                    f"--hal-backend {backend}: {type(exc).__name__}: {exc}"
                ) from exc
        return self._suite

    def execute(self, inst: Instance) -> None:
        """Run ``inst``, record its outcome, and turn it into a pytest pass, skip or failure."""
        outcome = self.suite.execute(inst)
        self.outcomes.setdefault(inst.requirement.id, []).append(outcome)
        if outcome.status == "skip":
            pytest.skip(f"{inst.requirement.id}: {outcome.reason}")
        if outcome.status == "fail":
            if outcome.error is not None and not isinstance(
                outcome.error, (KeyboardInterrupt, SystemExit)
            ):
                if type(outcome.error).__name__ in ("Skipped", "SkipTest"):
                    pytest.fail(f"{inst.requirement.id}: {outcome.reason}", pytrace=False)
                raise outcome.error
            pytest.fail(f"{inst.requirement.id}: {outcome.reason}", pytrace=False)

    def certificate(self) -> dict[str, Any]:
        """Return the certificate of the requirements run in this session."""
        from hal.conformance._certificate import build_certificate
        from hal.conformance._runner import aggregate

        suite = self.suite
        results = [
            aggregate(r, self.outcomes[r.id]) for r in suite.catalogue if r.id in self.outcomes
        ]
        keyword = self.config.getoption("keyword", default="") or None
        return build_certificate(suite, results, self.started, selection=keyword)


_KEY = pytest.StashKey[ConformanceSession]()


def pytest_configure(config: pytest.Config) -> None:
    """Create the session state and declare the marker."""
    config.stash[_KEY] = ConformanceSession(config)
    config.addinivalue_line(
        "markers", "hal_requirement(id): the conformance requirement an item checks"
    )
    asked = config.getoption("pyargs", False) and any(
        str(a).split("::")[0] in ("hal.conformance", "hal.conformance.test_conformance")
        for a in config.args
    )
    if asked and not config.getoption("hal_backend"):
        raise pytest.UsageError(
            "pytest --pyargs hal.conformance needs --hal-backend NAME (see `hal info`)"
        )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``hal_instance`` over every requirement instance of the backend under test."""
    if "hal_instance" not in metafunc.fixturenames:
        return
    session = metafunc.config.stash[_KEY]
    suite = session.suite
    params = []
    for req in suite.catalogue:
        for inst in suite.instances(req):
            params.append(
                pytest.param(
                    inst, id=f"{req.id}@{inst.label}", marks=pytest.mark.hal_requirement(req.id)
                )
            )
    metafunc.parametrize("hal_instance", params)


@pytest.fixture
def hal_conformance(request: pytest.FixtureRequest) -> ConformanceSession:
    """The conformance session state (the suite and its outcomes)."""
    return request.config.stash[_KEY]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write ``--hal-report`` / ``--hal-summary`` when requirements ran."""
    config = session.config
    state = config.stash.get(_KEY, None)
    report, summary = config.getoption("hal_report"), config.getoption("hal_summary")
    if state is None or not state.outcomes or not (report or summary):
        return
    from hal.conformance._certificate import render_markdown

    cert = state.certificate()
    if report:
        Path(report).write_text(json.dumps(cert, indent=2) + "\n", encoding="utf-8")
    if summary:
        Path(summary).write_text(render_markdown(cert), encoding="utf-8")
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        level = f" (level {cert['level']})" if cert["level"] else ""
        tr.write_line(
            f"hal conformance: backend {cert['backend']['name']}: {cert['verdict']}{level}"
        )
