"""Fixtures for hal.kernels: a private compile cache and the devices that compile kernels."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import hal
import hal.kernels
import hal.kernels.spi


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point HAL_CACHE_DIR at a session directory (the user's cache stays untouched)."""
    path = tmp_path_factory.mktemp("hal-cache")
    old = os.environ.get("HAL_CACHE_DIR")
    os.environ["HAL_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("HAL_CACHE_DIR", None)
    else:
        os.environ["HAL_CACHE_DIR"] = old


def kernel_backends() -> list[str]:
    """Backends whose first device declares the kernel capability."""
    out = []
    for dev in hal.devices():
        if dev.backend not in out and dev.capabilities.kernels and hal.kernels.spi.dialect_of(dev):
            out.append(dev.backend)
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``kernel_backend`` over every available backend with kernels."""
    if "kernel_backend" in metafunc.fixturenames:
        names = kernel_backends()
        metafunc.parametrize("kernel_backend", names, ids=names, scope="session")


@pytest.fixture
def kdev(kernel_backend: str) -> hal.Device:
    """The first device of the backend under test."""
    return hal.device(f"{kernel_backend}:0")


@pytest.fixture
def stream(kdev: hal.Device) -> Iterator[hal.Stream]:
    """A stream of ``kdev``, closed after the test."""
    s = kdev.create_stream()
    yield s
    s.close()


@pytest.fixture(params=["python", "native"])
def launch_hit(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test with the launch cache's Python hit, then with its hit in C (``_fast.use_native``).

    Modules of the launch cache use it for every test (``pytestmark``); where the C hit cannot
    be built the ``native`` run is skipped with the reason.
    """
    from hal.kernels import _fast, _native

    was = _fast.native_active()
    if request.param == "native" and not _fast.use_native(True):
        pytest.skip(_native.unavailable_reason() or "HAL_KERNELS_NATIVE=0")
    if request.param == "python":
        _fast.use_native(False)
    # no switch in the middle of a test (the Python hits would load the C ones at _NATIVE_AFTER)
    old_after = _fast._NATIVE_AFTER
    _fast._NATIVE_AFTER = -1
    try:
        yield request.param
    finally:
        _fast._NATIVE_AFTER = old_after
        _fast.use_native(was)
