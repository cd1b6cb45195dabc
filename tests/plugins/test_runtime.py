"""hal.runtime(): one owner for plugins, backends and caches; reset() closes backends and drops caches."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import hal
import hal.comm
import hal.kernels

RunPython = Callable[..., subprocess.CompletedProcess[str]]
# A backend (the CPU emulator's devices under another name) whose close() leaves a line in a file.
_CLOSING = """
import os
from hal.backends.cpu import CpuBackend
from hal.plugins import hookimpl

class ClosingBackend(CpuBackend):
    name = "fxclosing"
    opened = 0

    def __init__(self):
        super().__init__()
        ClosingBackend.opened += 1
        self.serial = ClosingBackend.opened

    def close(self):
        with open(os.environ["FX_CLOSE_LOG"], "a") as f:
            f.write(f"close {self.serial}\\n")

@hookimpl
def hal_register_backends(registry):
    registry.add(ClosingBackend)
"""

_CHILD = """
import json, os, hal
log = os.environ["FX_CLOSE_LOG"]
read = lambda: open(log).read().split("\\n")[:-1] if os.path.exists(log) else []
first = hal.devices("fxclosing")[0]
before = read()
hal.runtime().reset()
after_reset = read()
second = hal.devices("fxclosing")[0]
hal.plugins.reload()  # goes through reset(): closes the second backend
after_reload = read()
hal.devices("fxclosing")
print(json.dumps({"before": before, "after_reset": after_reset, "after_reload": after_reload,
                  "new_device": second is not first}))
"""


def test_reset_reload_and_exit_close_each_backend_once(
    custom_dist: Callable[..., Path], tmp_path: Path, python_run: RunPython
) -> None:
    root = custom_dist("fxclosing", _CLOSING)
    log = tmp_path / "closed.txt"
    proc = python_run(
        ["-c", _CHILD],
        env={"FX_CLOSE_LOG": str(log), "HAL_BACKENDS": "fxclosing,cpu"},
        pythonpath=[root],
    )
    got = json.loads(proc.stdout)
    assert got["before"] == []
    assert got["after_reset"] == ["close 1"]
    assert got["after_reload"] == ["close 1", "close 2"]
    assert got["new_device"] is True
    # the third backend, loaded after the reload, is closed as the interpreter exits
    assert log.read_text().split("\n")[:-1] == ["close 1", "close 2", "close 3"]


def test_reset_drops_every_registered_cache() -> None:
    rt = hal.runtime()
    names = rt.caches()
    for name in (
        "hal.device_handles",
        "hal.trace.device_clocks",
        "hal.comm.transports",
        "hal.comm.providers",
        "hal.kernels.registry",
        "hal.kernels.programs",
        "hal.kernels.options",
    ):
        assert name in names
    transports = hal.comm.transports()
    dev = hal.devices("cpu")[0]
    calls: list[int] = []
    rt.register_cache("tests.counter", lambda: calls.append(1))
    gen = rt.generation
    try:
        rt.reset()
        assert calls == [1] and rt.generation == gen + 1 and not rt.loaded
        assert hal.comm.transports() is not transports  # rebuilt from the plugin hooks
        assert hal.devices("cpu")[0] is not dev  # new backends, new device handles
        assert rt.loaded
    finally:
        rt.register_cache("tests.counter", lambda: None)


def test_the_cpu_backend_drops_its_row_programs_when_closed() -> None:
    import numpy as np

    from hal.backends.cpu import _kernels

    dev = hal.devices("cpu")[0]
    x = hal.asarray(np.ones((2, 4), np.float32), device=dev)
    with dev.create_stream() as s:
        hal.kernels.softmax(x, stream=s).to_host(stream=s)
    assert any(k[0] is dev for k in _kernels._row_programs)
    hal.runtime().reset()
    assert not any(k[0] is dev for k in _kernels._row_programs)
    with dev.create_stream() as s:  # the old device still works (built-in backend)
        got = hal.kernels.softmax(x, stream=s).to_host(stream=s)
    assert np.allclose(got, 0.25)


def test_clear_caches_keeps_the_backends_and_a_failing_cache_is_named() -> None:
    rt = hal.runtime()
    dev = hal.devices("cpu")[0]
    cleared: list[str] = []

    def boom() -> None:
        raise RuntimeError("cannot drop")

    rt.register_cache("tests.boom", boom)
    rt.register_cache("tests.other", lambda: cleared.append("other"))
    try:
        with pytest.raises(hal.HalError, match=r"tests.boom: RuntimeError: cannot drop"):
            rt.clear_caches()
        assert cleared == ["other"]  # every other cache was still cleared
    finally:
        rt.register_cache("tests.boom", lambda: None)
        rt.register_cache("tests.other", lambda: None)
    assert hal.devices("cpu")[0] is not dev  # device handles are a cache too
    with pytest.raises(TypeError, match="must be callable"):
        rt.register_cache("tests.bad", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"use hal\.runtime\(\)"):
        hal.Runtime()


def test_import_hal_never_raises_on_a_bad_environment(python_run: RunPython) -> None:
    bad = {
        "HAL_LOG_LEVEL": "chatty",
        "HAL_TRACE": "trace\x01.json",
        "HAL_KERNELS_SUMMARY": "maybe",
        "HAL_RANK": "minus-one",
        "HAL_COMM_INLINE_BYTES": "inf",
        "HAL_CACHE_MAX_BYTES": "inf",
        "HAL_KERNELS_PROGRAM_CACHE": "lots",
    }
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import hal, hal.comm, hal.kernels, hal.sched\n"
        "print('\\n'.join(str(x.message) for x in w))\n"
    )
    proc = python_run(["-c", code], env=bad)
    out = proc.stdout
    assert "HAL_LOG_LEVEL='chatty' is not a known choice" in out
    assert "HAL_TRACE='trace\\x01.json' is not plain text" in out
    # what is read later is an error there, naming the variable and the value
    for var, value, problem in (
        ("HAL_COMM_INLINE_BYTES", "inf", "is not a size"),
        ("HAL_CACHE_MAX_BYTES", "inf", "is not a size"),
    ):
        check = (
            "import hal, hal.comm, hal.kernels\n"
            "from hal.comm._config import Config\n"
            "from hal.kernels._cache import max_bytes\n"
            "try:\n"
            f"    Config.from_options() if {var!r}.startswith('HAL_COMM') else max_bytes()\n"
            "except hal.ConfigError as e:\n"
            "    print(type(e).__name__, e)\n"
        )
        got = python_run(["-c", check], env={var: value}).stdout
        assert f"ConfigError {var}={value!r} {problem}" in got


def test_a_bad_value_in_code_names_the_field() -> None:
    with pytest.raises(hal.ConfigError, match=r"CommOptions.inline_bytes='inf' is not a size"):
        bad = hal.comm.CommOptions(inline_bytes="inf")  # type: ignore[arg-type]
        hal.comm.create(hal.devices("cpu")[:1], options=bad)
    with pytest.raises(TypeError, match=r"is not a hal\.comm\.CommOptions"):
        hal.comm.init(options={"timeout_ms": 5})  # type: ignore[arg-type]
