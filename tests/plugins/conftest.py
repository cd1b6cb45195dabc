"""Fixture distributions for the plugin tests, built at test time (no checked-in binaries).

A fixture distribution is what pip would leave in site-packages: a ``NAME-VERSION.dist-info``
folder (``METADATA`` + ``entry_points.txt``) beside a module. Put the folder on the
``PYTHONPATH`` of a subprocess and ``importlib.metadata`` finds its ``hal.backends`` entry
point exactly as it finds an installed vendor plugin.

Every fixture module starts by touching ``<module>.imported`` next to itself, so a test can
prove that a blocked or refused plugin was never imported.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

_PREAMBLE = """\
import pathlib as _pathlib
_pathlib.Path(__file__).with_name(__name__ + ".imported").touch()
"""

# Module bodies by fixture name; the entry point name (and backend name) is the fixture name.
PLUGIN_SOURCES: dict[str, str] = {
    "fxbroken": """
        raise RuntimeError("fixture import boom")
    """,
    "fxhook": """
        from hal.plugins import hookimpl

        @hookimpl
        def hal_register_backends(registry):
            raise ValueError("fixture hook boom")
    """,
    "fxtypo": """
        from hal.plugins import hookimpl

        @hookimpl
        def hal_register_backend(registry):  # misspelled: no such hook
            pass
    """,
    "fxbadclass": """
        from hal.plugins import hookimpl

        @hookimpl
        def hal_register_backends(registry):
            registry.add(object)
    """,
    "fxblocked": """
        from hal.plugins import hookimpl

        @hookimpl
        def hal_register_backends(registry):
            pass
    """,
    "fxold": """
        from hal.plugins import hookimpl

        @hookimpl
        def hal_register_backends(registry):
            pass
    """,
    "fxapi2": """
        from hal.plugins import hookimpl
        from hal.spi import BackendImpl

        class Api2Backend(BackendImpl):
            name = "fxapi2"
            api_version = (2, 0)

            def __init__(self):
                pass

            def devices(self):
                return []

        @hookimpl
        def hal_register_backends(registry):
            registry.add(Api2Backend)
    """,
    "fxunavail": """
        import hal
        from hal.plugins import hookimpl
        from hal.spi import BackendImpl

        class UnavailableBackend(BackendImpl):
            name = "fxunavail"

            def __init__(self):
                raise hal.BackendUnavailableError("fxunavail", "no fixture device: install fixture-sdk")

            def devices(self):
                return []

        @hookimpl
        def hal_register_backends(registry):
            registry.add(UnavailableBackend)
    """,
    "fxprobe": """
        from hal.plugins import hookimpl
        from hal.spi import BackendImpl

        class CrashingBackend(BackendImpl):
            name = "fxprobe"

            def __init__(self):
                raise RuntimeError("fixture probe boom")

            def devices(self):
                return []

        @hookimpl
        def hal_register_backends(registry):
            registry.add(CrashingBackend)
    """,
    "fxdup": """
        from hal.plugins import hookimpl
        from hal.spi import BackendImpl

        class DuplicateBackend(BackendImpl):
            name = "cpu"

            def __init__(self):
                pass

            def devices(self):
                return []

        @hookimpl
        def hal_register_backends(registry):
            registry.add(DuplicateBackend)
    """,
    "fxcpu": """
        # A second, fully working backend: the CPU emulator under another name.
        from hal.backends.cpu import CpuBackend
        from hal.plugins import hookimpl

        class FixtureCpuBackend(CpuBackend):
            name = "fxcpu"

        @hookimpl
        def hal_register_backends(registry):
            registry.add(FixtureCpuBackend)
    """,
}

PLUGIN_REQUIRES: dict[str, Sequence[str]] = {
    "fxold": ["hal-sdk<0.1"],
    "fxcpu": ["hal-sdk>=0.1", "numpy", "hal-sdk<0.1; extra == 'legacy'"],
}


def make_dist(
    root: Path,
    name: str,
    source: str,
    *,
    requires: Sequence[str] = (),
    version: str = "1.0",
    entry_point: str | None = None,
) -> Path:
    """Write fixture distribution ``hal-fixture-NAME`` with module ``hal_fixture_NAME`` into ``root``.

    Returns the module file. The entry point ``ENTRY_POINT = hal_fixture_NAME`` is declared
    in the ``hal.backends`` group (``ENTRY_POINT`` defaults to ``name``).
    """
    module = f"hal_fixture_{name}"
    path = root / f"{module}.py"
    path.write_text(_PREAMBLE + textwrap.dedent(source))
    info = root / f"{module}-{version}.dist-info"
    info.mkdir()
    meta = ["Metadata-Version: 2.1", f"Name: hal-fixture-{name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    (info / "entry_points.txt").write_text(f"[hal.backends]\n{entry_point or name} = {module}\n")
    (info / "top_level.txt").write_text(module + "\n")
    return path


def was_imported(root: Path, name: str) -> bool:
    """Return True if fixture module ``name`` in ``root`` was ever imported."""
    return (root / f"hal_fixture_{name}.imported").exists()


@pytest.fixture
def imported() -> Callable[[Path, str], bool]:
    """The :func:`was_imported` helper."""
    return was_imported


@pytest.fixture
def fixture_dists(tmp_path: Path) -> Callable[..., Path]:
    """Build fixture distributions by name (see ``PLUGIN_SOURCES``) into a fresh folder; return it."""

    def build(*names: str) -> Path:
        for n in names:
            make_dist(tmp_path, n, PLUGIN_SOURCES[n], requires=PLUGIN_REQUIRES.get(n, ()))
        return tmp_path

    return build


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder holding every fixture distribution (shared by a module's tests)."""
    root = tmp_path_factory.mktemp("zoo")
    for n, src in PLUGIN_SOURCES.items():
        make_dist(root, n, src, requires=PLUGIN_REQUIRES.get(n, ()))
    return root


@pytest.fixture
def custom_dist(tmp_path: Path) -> Callable[..., Path]:
    """Build a fixture distribution from a given module body into a fresh folder; return the folder.

    ``custom_dist(name, source, entry_point=None, requires=())`` (see :func:`make_dist`).
    """

    def build(name: str, source: str, **kwargs: Any) -> Path:
        make_dist(tmp_path, name, source, **kwargs)
        return tmp_path

    return build
