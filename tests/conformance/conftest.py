"""Fixtures of the suite's own tests: the mutant plugin, registered as a real distribution.

``mutant_dist`` writes ``hal_conformance_mutants-1.0.dist-info`` (METADATA and an
``entry_points.txt`` naming ``hal_mutants:plugin`` in the ``hal.backends`` group). With
that folder and this one on ``sys.path`` (in process) or ``PYTHONPATH`` (subprocesses),
``importlib.metadata`` finds the mutants exactly as it finds an installed vendor plugin.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import hal
import hal.plugins

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _load_mutants() -> None:
    """Import hal_mutants.py as the top-level module the entry point names (importlib mode)."""
    if "hal_mutants" not in sys.modules:
        spec = importlib.util.spec_from_file_location("hal_mutants", HERE / "hal_mutants.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["hal_mutants"] = module
        spec.loader.exec_module(module)


_load_mutants()


@pytest.fixture(scope="session")
def mutant_dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the fixture distribution that registers the mutant backends."""
    root = tmp_path_factory.mktemp("mutant-dist")
    info = root / "hal_conformance_mutants-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hal-conformance-mutants\nVersion: 1.0\nRequires-Dist: hal-sdk>=0.1\n"
    )
    (info / "entry_points.txt").write_text("[hal.backends]\nmutants = hal_mutants:plugin\n")
    return root


@pytest.fixture(scope="session")
def mutant_path(mutant_dist: Path) -> list[Path]:
    """``PYTHONPATH`` entries that make the mutants visible to a subprocess."""
    return [mutant_dist, HERE]


@pytest.fixture
def mutants(
    mutant_dist: Path, hal_env: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Register the mutant plugin in this process (plugins reloaded), jitter on; undone after."""
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.syspath_prepend(str(mutant_dist))
    hal_env(HAL_CPU_JITTER="5")
    names = {b.name: b.status for b in hal.list_backends()}
    assert names.get("mut_control") == "available", names
    yield


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report the suite's catch rate over its own mutants (CI keeps it at 100 %).

    With ``HAL_CONFORMANCE_CATCH_REPORT=PATH`` the numbers are also written there as JSON.
    """
    catches: dict[str, bool] = getattr(sys.modules.get("hal_mutants"), "CATCHES", {})
    if not catches:
        return
    caught = sorted(n for n, ok in catches.items() if ok)
    missed = sorted(n for n, ok in catches.items() if not ok)
    rate = 100.0 * len(caught) / len(catches)
    line = (
        f"hal.conformance catch rate over its mutants: {len(caught)}/{len(catches)} ({rate:.0f} %)"
    )
    terminalreporter.write_sep("-", line + (f"; missed: {', '.join(missed)}" if missed else ""))
    path = os.environ.get("HAL_CONFORMANCE_CATCH_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(
                {"caught": caught, "missed": missed, "total": len(catches), "rate_percent": rate},
                f,
                indent=2,
            )
