"""Fixtures for hal.sched: emulated pools with speed factors and injected faults."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import hal
from hal.backends.cpu import clear_faults
from hal.sched import HealthConfig

#: Quick probing for tests: a probe every 20 ms, three failures evict, five probes re-admit.
FAST_HEALTH = HealthConfig(
    interval=0.02, timeout=2.0, evict_after=3, recover_after=3, readmit_after=5
)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Compile generic kernels into a session directory (the user's cache stays untouched)."""
    path = tmp_path_factory.mktemp("hal-cache")
    old = os.environ.get("HAL_CACHE_DIR")
    os.environ["HAL_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("HAL_CACHE_DIR", None)
    else:
        os.environ["HAL_CACHE_DIR"] = old


@pytest.fixture(autouse=True)
def _no_faults() -> Iterator[None]:
    """Every test starts and ends with full-speed, fault-free emulated devices."""
    clear_faults()
    yield
    clear_faults()


@pytest.fixture
def cpu_pool(hal_env: Callable[..., None]) -> list[hal.Device]:
    """Four emulated devices (the suite's default is two)."""
    hal_env(HAL_CPU_DEVICES="4", HAL_CPU_SPEED=None, HAL_CPU_CONFIG=None, HAL_BACKENDS="cpu")
    return hal.devices("cpu")


@pytest.fixture
def cpu_pair(requires_cpu: None) -> list[hal.Device]:
    """The two emulated devices of the suite's default environment."""
    return hal.devices("cpu")[:2]
