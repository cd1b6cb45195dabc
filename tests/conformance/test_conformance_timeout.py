"""The conformance runner's hang timeout: building kernels is work, a wait without end is a hang.

A first ``hal conformance --backend opencl`` on a fresh machine compiles every op's kernels in
KERN-ACCURACY (110-140 s with PoCL's and hal's caches empty, against a 60 s timeout): it failed as
"did not finish ... (a synchronize or wait that never returns?)" and the interpreter then crashed
in the abandoned compile at exit. Real kernel builds on the CPU emulator, real sleeping checks.
The checks load their kernels from hal's disk cache (compiled beforehand, one program kept in
memory), so each build inside the runner takes milliseconds however loaded the machine is.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from hal.conformance._registry import Requirement
from hal.conformance._runner import Instance, Suite

pytestmark = pytest.mark.usefixtures("requires_cpu")

TIMEOUT_S = 3.0


@pytest.fixture
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Six kernels compiled into a fresh disk cache; only one program stays in memory, so compiling
    them again in turn loads each from the disk cache (a build the runner sees)."""
    import hal
    import hal.kernels as hk

    monkeypatch.setenv("HAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HAL_KERNELS_PROGRAM_CACHE", "1")
    tag = uuid.uuid4().hex[:8]
    srcs = [
        f"HAL_KERNEL void k_{tag}_{i}(HAL_GLOBAL float* y) {{ y[HAL_GLOBAL_ID(0)] = {i}.0f; }}"
        for i in range(6)
    ]
    dev = hal.devices("cpu")[0]
    for src in srcs:
        hk.compile(src, dev)
    return srcs


def _run(check: Any) -> tuple[Suite, Any]:
    suite = Suite("cpu", timeout=TIMEOUT_S, select="MEM-ALLOC")
    req = Requirement("TEST-TIMEOUT", "a check of the runner's timeout", "MEM", check)
    return suite, suite.execute(Instance(req, suite.devices[:1], "cpu:0"))


def test_a_check_that_keeps_building_kernels_past_the_timeout_is_not_a_hang(
    sources: list[str],
) -> None:
    import hal.kernels as hk

    def check(t: Any) -> None:
        for src in sources:  # a build every 0.8 s, for longer than the timeout in all
            hk.compile(src, t.device)
            time.sleep(0.8)

    before = hk.cache_stats().hits
    suite, outcome = _run(check)
    assert outcome.status == "pass", outcome.reason
    assert hk.cache_stats().hits - before == len(sources)  # each one a build from the disk cache
    assert outcome.duration > TIMEOUT_S  # it did run past the timeout, building all the while
    assert not suite.hung


def test_a_check_that_waits_without_building_still_fails_as_hung() -> None:
    def check(t: Any) -> None:
        time.sleep(TIMEOUT_S + 2)

    suite, outcome = _run(check)
    assert outcome.status == "fail"
    assert outcome.reason == (
        f"did not finish within {TIMEOUT_S:g} s (a synchronize or wait that never returns?)"
    )
    assert len(suite.hung) == 1  # left behind; the CLI exits without waiting for it
    suite.hung[0].join()


def test_a_check_that_builds_then_waits_names_the_last_build(sources: list[str]) -> None:
    import hal.kernels as hk

    def check(t: Any) -> None:
        hk.compile(sources[0], t.device)  # the last program in memory is sources[-1]: a disk load
        time.sleep(TIMEOUT_S + 2)

    suite, outcome = _run(check)
    assert outcome.status == "fail"
    assert f"the last {TIMEOUT_S:g} s without a kernel build" in outcome.reason, outcome.reason
    suite.hung[0].join()
