"""The layering contracts of .importlinter hold, and each one fails on a planted import.

The package is copied into a temporary tree laid out as installed (``hal/comm``,
``hal/backends`` ...: setup.cfg maps the checkout's top-level folders there), one import is
planted in one module, and ``lint-imports --contract ID`` must report exactly that contract
broken, naming the module. Needs import-linter (``nox -s layers`` installs it and runs this
file after checking the contracts on the regular install); skipped without it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "importlinter",
    reason="import-linter is not installed (nox -s layers installs it and runs this)",
)

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / ".importlinter"
SUBPACKAGES = ("backends", "comm", "kernels", "plugins", "conformance", "sched", "torch", "cli")

#: (contract id, module file under the tree's hal/, the planted line, a module the report names)
PLANTED = [
    ("layers", "kernels/_plan.py", "import hal.comm", "hal.kernels._plan"),
    ("layers", "backends/cpu/_worker.py", "import hal.kernels", "hal.backends.cpu._worker"),
    ("layers", "_discovery.py", "import hal.plugins", "hal._discovery"),
    ("layers", "plugins/_registry.py", "import hal.backends", "hal.plugins._registry"),
    ("layers", "sched/_model.py", "import hal.cli", "hal.sched._model"),
    ("core-is-narrow", "_copy.py", "import cffi", "hal._copy"),
    ("core-is-narrow", "_device.py", "import hal.backends.cpu", "hal._device"),
    (
        "core-is-narrow",
        "__init__.py",
        "import hal.kernels",
        "hal is not allowed to import hal.kernels",
    ),
    (
        "upper-layers-use-public-hal",
        "comm/_plan.py",
        "import hal.backends.cpu._backend",
        "hal.comm._plan",
    ),
    ("core-is-acyclic", "_stream.py", "import hal._copy", "._stream -> ._copy"),
    (
        "backends-independent",
        "backends/opencl/_select.py",
        "import hal.backends.cpu",
        "hal.backends.opencl",
    ),
    (
        "backends-use-public-core",
        "backends/cuda/_errors.py",
        "import hal._errors",
        "hal.backends.cuda",
    ),
    (
        "conformance-private",
        "kernels/_conformance.py",
        "import hal.conformance._target",
        "hal.kernels._conformance",
    ),
]


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``hal`` package as installed (whatever the install: regular or editable)."""
    root = tmp_path_factory.mktemp("layers")
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.c")
    top = _package_dir("hal")
    assert top is not None
    shutil.copytree(top, root / "hal", ignore=ignore)
    for sub in SUBPACKAGES:
        where = _package_dir(f"hal.{sub}")
        if where is not None and not (root / "hal" / sub).exists():
            shutil.copytree(where, root / "hal" / sub, ignore=ignore)
    return root


def _lint(tree: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    args = [
        sys.executable,
        "-c",
        "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())",
        str(CONFIG),
        "--no-cache",
    ]
    for c in contracts:
        args += ["--contract", c]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        args, cwd=tree, env=env, capture_output=True, text=True, timeout=240, check=False
    )


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    done = _lint(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("contract", "path", "line", "names"), PLANTED, ids=[f"{c}:{p}" for c, p, _, _ in PLANTED]
)
def test_each_contract_fails_on_a_planted_import(
    tree: Path, contract: str, path: str, line: str, names: str
) -> None:
    target = tree / "hal" / path
    original = target.read_text()
    target.write_text(original + f"\n{line}  # planted by tests/test_layers.py\n")
    try:
        done = _lint(tree, contract)
    finally:
        target.write_text(original)
    assert done.returncode == 1, (
        f"{contract} kept with `{line}` in {path}:\n{done.stdout}{done.stderr}"
    )
    assert "1 broken" in done.stdout and names in done.stdout, done.stdout
