"""Nox sessions of hal-sdk: ``nox -l`` lists them, ``nox -s NAME`` runs one.

Every session installs the package from this checkout into its own virtualenv as a
regular (non-editable) install, so that tests, type checks and import contracts see
exactly what ``pip install hal-sdk`` would ship (the top-level folders ``backends/``,
``comm/`` ... are mapped into the ``hal`` namespace only by the installed package).
Tools that inspect the package (mypy, import-linter) run from a temporary directory
outside the checkout, so that the repository's partial ``hal/`` folder cannot shadow
the installed package.
"""

from __future__ import annotations

import configparser
import os
import shutil
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent

nox.options.sessions = ["tests", "lint", "typecheck", "layers"]
nox.options.error_on_missing_interpreters = True

#: Two OpenCL CPU devices from the PoCL wheel, so that peer copies have a peer.
POCL_ENV = {"POCL_DEVICES": "pthread pthread"}


#: What installing needs none of: VCS data, environments, build litter, caches, bench output.
_NOT_COPIED = (
    ".git",
    ".nox",
    ".tox",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    "bench-results",
)


def install_package(session: nox.Session, extras: str = "") -> None:
    """Install hal-sdk from a copy of the checkout (regular install) with ``extras``.

    setuptools builds in the source tree (``build/``, ``*.egg-info``) and never removes a file
    from ``build/``: a module deleted or moved in the tree would still be installed from there,
    and two sessions building in one tree at once (CI runs the static checks beside the tests)
    would race. Each session builds from its own fresh copy in its temporary directory.
    """
    src = Path(session.create_tmp()) / "hal-sdk-src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*_NOT_COPIED))
    spec = f"{src}[{extras}]" if extras else str(src)
    session.install(spec)


def tests_impl(
    session: nox.Session,
    extras: str = "test,opencl,mpi,cuda,torch",
    env: dict[str, str] | None = None,
    default_args: tuple[str, ...] = (),
) -> None:
    """Install hal-sdk with ``extras`` and run pytest against the installed package.

    pytest runs from a temporary directory outside the checkout (``--rootdir`` points
    back at it), so neither pytest nor the subprocesses the tests start (``python -m hal``,
    ``hal run``) can import the checkout's partial ``hal/`` folder instead of the
    installed package. Positional arguments given after ``--`` on the nox command line
    replace ``default_args``; paths among them are taken relative to the checkout.
    The ``torch`` extra (also in ``test``) installs the pinned CPU torch wheel: the real
    ``torchrun`` and gloo for tests/torch and tests/launchers. The ``cuda`` extra installs
    CuPy, which imports without a GPU: the CUDA backend then reports ``unavailable`` and
    its error translation is tested on CuPy's real exceptions.
    """
    install_package(session, extras)
    run_env = {**POCL_ENV, **(env or {})}
    args = [
        str(ROOT / a) if not a.startswith("-") and (ROOT / a.split("::")[0]).exists() else a
        for a in (session.posargs or list(default_args))
    ]
    if not any((ROOT / a.split("::")[0]).exists() for a in args if not a.startswith("-")):
        args.append(str(ROOT / "tests"))
    session.chdir(session.create_tmp())
    session.run(
        "pytest", "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), *args, env=run_env
    )


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite on the CPU emulator and on OpenCL (PoCL, two devices).

    pytest-xdist runs the test files in parallel, one file per worker at a time (``--dist
    loadfile``: a file's module fixtures are built once). Many tests wait on the processes they
    launch (ranks, launchers, namespaces), so there is one worker more than there are cores
    (``HAL_TEST_WORKERS`` sets another count; ``0`` runs in this process). Arguments after
    ``--`` replace these defaults.
    """
    workers = os.environ.get("HAL_TEST_WORKERS") or str(min((os.cpu_count() or 1) + 1, 8))
    tests_impl(session, default_args=("-n", workers, "--dist", "loadfile"))


@nox.session
def lint(session: nox.Session) -> None:
    """Lint with ruff (rules in pyproject.toml) and check that ``ruff format`` changes nothing.

    The formatter wraps code at 100 columns; ``ruff check`` enforces 120 columns on every line
    (E501, docstrings and messages included), which the whole tree meets.
    """
    session.install("ruff==0.17.6")
    session.run("ruff", "check", str(ROOT))
    session.run("ruff", "format", "--check", "--diff", str(ROOT))


@nox.session
def typecheck(session: nox.Session) -> None:
    """Type-check the installed ``hal`` package with mypy (settings from pyproject.toml)."""
    install_package(session, "test")
    session.install("mypy")
    outside = session.create_tmp()
    session.chdir(outside)
    session.run("mypy", "--config-file", str(ROOT / "pyproject.toml"), "-p", "hal")


@nox.session
def layers(session: nox.Session) -> None:
    """Check the layering contracts of .importlinter, then that each fails on a planted import.

    The contracts run on the regular install, from outside the checkout; then
    tests/test_layers.py plants one forbidden import per contract in a copy of the installed
    package and checks that ``lint-imports`` reports that contract broken.
    """
    unlisted = _core_modules_missing_from_contract()
    if unlisted:
        session.error(f".importlinter: add the core modules {', '.join(unlisted)}")
    install_package(session)
    session.install("import-linter", "pytest>=8", "pytest-timeout>=2.2")
    outside = session.create_tmp()
    session.chdir(outside)
    session.run("lint-imports", str(ROOT / ".importlinter"))
    session.run(
        "pytest",
        "--rootdir",
        str(ROOT),
        "-c",
        str(ROOT / "pyproject.toml"),
        "-p",
        "no:cacheprovider",
        str(ROOT / "tests" / "test_layers.py"),
    )


def _core_modules_missing_from_contract() -> list[str]:
    """Return ``hal._*`` modules missing from a contract that lists core (``hal.X`` or ``_X``)."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    core = {
        f"hal.{p.stem}"
        for p in (ROOT / "hal").glob("_*.py")
        if p.stem not in ("__init__", "__main__")
    }
    core |= {f"hal.{p.name}" for p in (ROOT / "hal").glob("_*/") if (p / "__init__.py").exists()}
    narrow = set(config["importlinter:contract:core-is-narrow"]["source_modules"].split())
    public = set(
        config["importlinter:contract:backends-use-public-core"]["forbidden_modules"].split()
    )
    floor = config["importlinter:contract:layers"]["layers"].split("\n")[-1]
    lowest = {f"hal.{m.strip()}" for m in floor.split(":")}
    return sorted((core - narrow) | (core - public) | (core - lowest))


@nox.session
def docs(session: nox.Session) -> None:
    """Build the generated docs: the timeline PNG of examples/sched_mixed.py (matplotlib)."""
    install_package(session, "docs,opencl")
    session.chdir(session.create_tmp())
    session.run("python", str(ROOT / "docs" / "build.py"), *session.posargs, env=POCL_ENV)


#: ``nox -s bench``: JSON file name -> ``hal bench`` arguments. Sized so that the
#: whole run (install excluded) stays under 10 minutes on a loaded 2-core machine; the comm rows
#: are the sizes of issue #13's targets (4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB).
BENCH_STEPS: dict[str, str] = {
    "memory": "memory --max 16M --repeat 5",
    "kernels": "kernels --backend cpu --batches 2 --launch --op axpy --op sum --op softmax --op layernorm --op rmsnorm",
    "kernels-opencl": "kernels --backend opencl --batches 2 --launch --op axpy",
    "kernels-matmul": "kernels --backend cpu --batches 2 --op matmul --route dedicated",
    "comm-all_reduce-mpich": "comm -n 2 --min 4K --max 64M -f 4 --batches 3 --baseline mpi",
    "comm-all_reduce-openmpi": "comm -n 2 --min 4K --max 64M -f 4 --batches 3 --baseline openmpi",
    "comm-all_reduce-4ranks-mpich": "comm -n 4 --min 16M --max 16M --batches 3 --baseline mpi",
    "comm-all_gather-mpich": "comm --op all_gather --min 1M --max 16M -f 16 --batches 3 --baseline mpi",
    "comm-reduce_scatter-mpich": "comm --op reduce_scatter --min 1M --max 16M -f 16 --batches 3 --baseline mpi",
    "comm-broadcast-mpich": "comm --op broadcast --min 1M --max 16M -f 16 --batches 3 --baseline mpi",
    "sched-overhead": "sched --overhead",
    "sched-policies": "sched --repeat 3",
}


@nox.session
def bench(session: nox.Session) -> None:
    """Run every benchmark and write JSON plus Markdown tables (load average beside each).

    memory, kernels, comm beside MPICH (the ``mpi`` extra) and Open MPI (when its venv is there:
    ``hal bench comm --baseline openmpi`` says how to install it; skipped otherwise), and the
    scheduler's overhead, each ``--json`` into ``bench-results/`` (or the folder given after
    ``--``), then ``hal bench report`` into ``tables.md`` there. Runs in under 10 minutes on a
    2-core machine (install excluded).
    """
    install_package(session, "opencl,mpi,torch")
    out = Path(session.posargs[0]).resolve() if session.posargs else ROOT / "bench-results"
    out.mkdir(parents=True, exist_ok=True)
    session.chdir(session.create_tmp())
    session.run("hal", "info", env=POCL_ENV)
    for name, line in BENCH_STEPS.items():
        args = line.split()
        if "openmpi" in args and not _openmpi_ready(session):
            session.log(
                f"{name}: skipped (no Open MPI venv; `hal bench comm --baseline openmpi` says how)"
            )
            continue
        # comm on the CPU emulator, as the docs' tables say: without it the ranks take the first
        # real device, a PoCL OpenCL device here, and time OpenCL copies instead of the engine
        env = {**POCL_ENV, "HAL_BACKENDS": "cpu"} if args[0] == "comm" else POCL_ENV
        with open(out / f"{name}.json", "w") as fh:
            session.run("hal", "bench", *args, "--json", env=env, stdout=fh, stderr=None)
    session.run("hal", "bench", "report", str(out), "--out", str(out / "tables.md"))
    session.log(f"tables: {out / 'tables.md'}")


def _openmpi_ready(session: nox.Session) -> bool:
    """Whether ``hal bench comm --baseline openmpi`` finds Open MPI and its mpi4py venv."""
    code = (
        "from hal.cli.bench._comm import openmpi_launch; "
        "print('ready' if not isinstance(openmpi_launch(), str) else 'missing')"
    )
    out = session.run("python", "-c", code, silent=True)
    return isinstance(out, str) and out.strip().endswith("ready")
