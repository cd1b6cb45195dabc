"""Every top-level ``examples/*.py`` runs to completion on the CPU emulator.

Each example is run as ``python examples/NAME.py`` in a subprocess, from a scratch
directory (so that the installed package is imported, not the checkout), with hal's
default environment. An example must exit 0 on its own; sub-folders of ``examples/``
are not collected here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))


def test_examples_exist() -> None:
    assert EXAMPLES / "quickstart.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_example_runs(script: Path, python_run: Callable[..., Any], tmp_path: Path) -> None:
    proc = python_run([str(script)], cwd=tmp_path)
    assert proc.stdout.strip(), f"{script.name} printed nothing"


def test_quickstart_reports_peer_path_and_result(python_run: Callable[..., Any], tmp_path: Path) -> None:
    out = python_run([str(EXAMPLES / "quickstart.py")], cwd=tmp_path).stdout
    assert "travelled by 'peer'" in out
    assert "all correct" in out
