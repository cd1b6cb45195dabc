"""Shared fixtures: the HAL test suite runs on every available backend.

The environment for the backends is set here, at import time, *before* hal loads its
plugins (hal loads them lazily, at the first ``hal.devices()``):

- ``POCL_DEVICES="pthread pthread"`` (if unset): two OpenCL devices on PoCL, for peer tests.
- ``HAL_CPU_DEVICES=2`` (if unset): two CPU-emulator devices, for peer tests.
- ``HAL_CPU_JITTER`` is removed: the in-process suite runs without jitter; the tests that
  need it start a subprocess with it set.

``HAL_BACKENDS`` / ``HAL_DISABLE_BACKENDS`` are respected: the suite is parametrized over
the backends that ``hal.devices()`` returns devices for (test ids ``[cpu]``, ``[opencl]``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("POCL_DEVICES", "pthread pthread")
os.environ.setdefault("HAL_CPU_DEVICES", "2")
os.environ.pop("HAL_CPU_JITTER", None)

import pytest

import hal
import hal.plugins

_available: list[str] | None = None


def available_backends() -> list[str]:
    """Return the names of the backends with at least one device, in priority order."""
    global _available
    if _available is None:
        names: list[str] = []
        for dev in hal.devices():
            if dev.backend not in names:
                names.append(dev.backend)
        _available = names
    return _available


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Show which backends the suite runs on, and why the others do not."""
    lines = []
    for info in hal.list_backends():
        extra = f" ({info.reason})" if info.reason else ""
        lines.append(
            f"hal backend {info.name}: {info.status}, {info.device_count} device(s){extra}"
        )
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize every test that uses ``backend_name`` over the available backends."""
    if "backend_name" in metafunc.fixturenames:
        names = available_backends()
        metafunc.parametrize("backend_name", names, ids=names, scope="session")


@pytest.fixture(scope="session")
def backend_name(request: pytest.FixtureRequest) -> str:
    """Name of the backend under test (parametrized over every available backend)."""
    return str(request.param)


@pytest.fixture
def requires_cpu() -> None:
    """Skip unless the CPU emulator is available in this process (HAL_BACKENDS may leave it out)."""
    if "cpu" not in available_backends():
        pytest.skip("the cpu backend is not enabled (HAL_BACKENDS / HAL_DISABLE_BACKENDS)")


@pytest.fixture(params=["native", "python"])
def cpu_kernel_stream(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[hal.Stream]:
    """A stream of cpu:0 with kernels: a native one, or a Python one (``HAL_CPU_NATIVE=0``)."""
    from hal.backends.cpu import _native

    dev = hal.device("cpu:0")
    if not dev.capabilities.kernels:
        pytest.skip(dev.capabilities.absent_reasons.get("kernels", "no kernels"))
    if request.param == "native":
        if _native.runtime() is None:
            pytest.skip(str(_native.unavailable_reason()))
        monkeypatch.setenv("HAL_CPU_NATIVE", "1")
    else:
        monkeypatch.setenv("HAL_CPU_NATIVE", "0")
    with dev.create_stream() as stream:
        yield stream


@pytest.fixture
def backend_devices(backend_name: str) -> list[hal.Device]:
    """All devices of the backend under test."""
    return hal.devices(backend_name)


@pytest.fixture
def device(backend_devices: list[hal.Device]) -> hal.Device:
    """The first device of the backend under test."""
    return backend_devices[0]


@pytest.fixture
def device_pair(
    backend_devices: list[hal.Device], backend_name: str
) -> tuple[hal.Device, hal.Device]:
    """Two devices of the backend under test (skipped when the backend has only one)."""
    if len(backend_devices) < 2:
        pytest.skip(
            f"backend {backend_name} has {len(backend_devices)} device; peer tests need two"
        )
    return backend_devices[0], backend_devices[1]


@pytest.fixture
def stream(device: hal.Device) -> Iterator[hal.Stream]:
    """A stream of ``device``, closed after the test."""
    s = device.create_stream()
    yield s
    s.close()


@pytest.fixture
def hal_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Reload hal's plugins under a modified environment; restore both after the test.

    ``hal_env(HAL_CPU_MEMORY="1M", HAL_CPU_DEVICES=None)`` sets (or, with ``None``, removes)
    the variables and reloads the plugin system, so that ``hal.devices()`` sees fresh
    backends. Objects made before the call stay valid but belong to the old backends.
    """
    changed = False

    def apply(**env: str | None) -> None:
        nonlocal changed
        for key, value in env.items():
            if value is None:
                monkeypatch.delenv(key, raising=False)
            else:
                monkeypatch.setenv(key, value)
        hal.plugins.reload()
        changed = True

    yield apply
    monkeypatch.undo()
    if changed:
        hal.plugins.reload()


def run_python(
    args: list[str],
    *,
    env: Mapping[str, str | None] | None = None,
    pythonpath: list[Path] | None = None,
    cwd: Path | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` in a subprocess with a controlled environment.

    ``env`` overrides (``None`` removes) variables of the current environment; HAL_* variables
    not named there are removed so that the child starts from hal's defaults (POCL_* stay).
    The child runs in ``cwd``, by default the temporary directory: never in the checkout,
    whose partial ``hal/`` folder would shadow the installed package for ``-m``/``-c``.
    """
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    child.setdefault("POCL_DEVICES", "pthread pthread")
    for key, value in (env or {}).items():
        if value is None:
            child.pop(key, None)
        else:
            child[key] = value
    if pythonpath:
        parts = [str(p) for p in pythonpath]
        if child.get("PYTHONPATH"):
            parts.append(child["PYTHONPATH"])
        child["PYTHONPATH"] = os.pathsep.join(parts)
    proc = subprocess.run(
        [sys.executable, *args],
        env=child,
        cwd=str(cwd) if cwd is not None else tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"python {' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def run_json(args: list[str], **kwargs: Any) -> Any:
    """Run ``python ARGS`` (see :func:`run_python`) and parse its stdout as JSON."""
    proc = run_python(args, **kwargs)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"not JSON: {proc.stdout!r}\n--- stderr\n{proc.stderr}") from exc


def called_functions(fn: Callable[[], Any], *, where: bool = False) -> set[str]:
    """Names of the Python functions ``fn()`` calls (a real trace, ``sys.setprofile``).

    With ``where``, each name is ``"FILE:NAME"`` (tell a backend's ``launch`` from hal.kernels').
    """
    names: set[str] = set()

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            names.add(f"{code.co_filename}:{code.co_name}" if where else code.co_name)

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return names


@pytest.fixture(scope="session")
def traced_calls() -> Callable[..., set[str]]:
    """The :func:`called_functions` helper: which Python functions a call runs."""
    return called_functions


@pytest.fixture(scope="session")
def python_run() -> Callable[..., subprocess.CompletedProcess[str]]:
    """The :func:`run_python` helper: run ``python ARGS`` in a subprocess."""
    return run_python


@pytest.fixture(scope="session")
def python_json() -> Callable[..., Any]:
    """The :func:`run_json` helper: run ``python ARGS`` and parse its stdout as JSON."""
    return run_json
