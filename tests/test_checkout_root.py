"""The checkout works from its root with the editable install (the documented way to develop).

``pip install -e .`` maps ``hal.comm`` to ``comm/``, ``hal.backends`` to ``backends/`` ...
(setup.cfg ``package_dir``). Run from the repository root, Python finds the checkout's ``hal/``
folder first (the current directory is on ``sys.path``): that folder is the same ``hal``
package the editable install points at, and the editable finder supplies the subpackages that
live in other folders. With a regular install the root's ``hal/`` shadows the installed
package and has no ``comm/``: docs/architecture.md, "The checkout and the install". These
tests run the commands a developer runs, as subprocesses in the repository root; they skip
where hal is not an editable install of this checkout (under nox, for instance).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hal
import hal.comm

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    Path(hal.__file__).resolve().parent != REPO / "hal"
    or Path(hal.comm.__file__).resolve().parent != REPO / "comm",
    reason=f"hal is not an editable install of this checkout ({Path(hal.__file__).parent})",
)


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env["HAL_BACKENDS"] = "cpu"  # the import paths are the point; probing OpenCL is not
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_python_m_hal_info_from_the_root() -> None:
    done = _run("-m", "hal", "info")
    assert done.returncode == 0, done.stderr
    assert "backend cpu: available" in done.stdout


def test_upper_layers_and_backends_import_from_the_root() -> None:
    done = _run(
        "-c",
        "import hal, hal.comm, hal.backends.cpu, hal.kernels, hal.sched, hal.conformance; "
        "print(hal.__file__, hal.comm.__file__, hal.backends.cpu.__file__, sep='\\n')",
    )
    assert done.returncode == 0, done.stderr
    paths = [Path(p) for p in done.stdout.split()]
    assert paths == [
        REPO / "hal" / "__init__.py",
        REPO / "comm" / "__init__.py",
        REPO / "backends" / "cpu" / "__init__.py",
    ]


def test_pytest_tests_hal_from_the_root() -> None:
    done = _run(
        "-m",
        "pytest",
        "tests/hal/test_memset.py",
        "-q",
        "-x",
        "-k",
        "cpu",
        "-p",
        "no:cacheprovider",
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
