"""A topology-aware choice measured on one machine: 4 emulated devices, 2 "hosts", slow links between them.

The CPU emulator's link model (HAL_CPU_CONFIG ``links``) slows every copy between the hosts;
``hal.comm.create(devices, topology=...)`` tells the planner where the devices are. Results are
checked against NumPy; times are printed as a ratio (no wall-clock limits in tests).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

import hal
import hal.comm
from hal.backends.cpu import _faults

HOSTS = ["a", "a", "b", "b"]


@pytest.fixture
def slow_links() -> Iterator[list[hal.Device]]:
    """Four CPU devices; every pair across hosts a|b joined by a 0.5 GB/s, 100 us link."""
    devs = hal.devices("cpu")
    if len(devs) < 4:
        pytest.skip("needs 4 CPU emulator devices (HAL_CPU_DEVICES=4)")
    devs = devs[:4]
    _faults.clear_links()
    for i in range(4):
        for j in range(i + 1, 4):
            if HOSTS[i] != HOSTS[j]:
                _faults.set_link(devs[i].index, devs[j].index, bandwidth_gbps=0.5, latency_us=100)
    yield devs
    _faults.clear_links()


def topology() -> hal.comm.Topology:
    """Two hosts of two devices, the slow link described."""
    return hal.comm.Topology.from_dict(
        {
            "hosts": [{"name": "a", "devices": 2}, {"name": "b", "devices": 2}],
            "links": [{"hosts": ["a", "b"], "bandwidth_gbps": 0.5, "latency_us": 100}],
            "ranks": HOSTS,
        }
    )


def run(comm: hal.comm.DeviceCommunicator, devs: list[hal.Device], n: int) -> tuple[float, str]:
    """Time one all_reduce of ``n`` float32 per device (after a warm-up); check it vs NumPy."""
    streams = [d.create_stream() for d in devs]
    data = [np.random.default_rng(i).integers(-9, 9, n).astype(np.float32) for i in range(4)]
    xs = [hal.asarray(x, device=d) for x, d in zip(data, devs, strict=True)]
    comm.all_reduce(xs, op="sum", streams=streams).wait()  # warm-up (and result 1)
    want = np.sum(data, axis=0) * 4  # the second call sums 4 copies of the first result
    t0 = time.perf_counter()
    comm.all_reduce(xs, op="sum", streams=streams).wait()
    took = time.perf_counter() - t0
    for x in xs:
        np.testing.assert_array_equal(x.to_host(), want)
        x.close()
    for s in streams:
        s.close()
    plan = comm.last_plan
    assert plan is not None
    return took, plan.algorithm


def test_planner_picks_hierarchical_and_it_is_measurably_faster(
    slow_links: list[hal.Device], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the topology the planner chooses hierarchical; forced ring moves 3x more over the slow link."""
    n = 1 << 20  # 4 MiB per device
    with hal.comm.create(slow_links, topology=topology()) as comm:
        t_hier, algo = run(comm, slow_links, n)
    assert algo == "hierarchical"
    monkeypatch.setenv("HAL_COMM_ALGO", "allreduce:ring")
    with hal.comm.create(slow_links, topology=topology()) as comm:
        t_ring, algo = run(comm, slow_links, n)
    assert algo == "ring"
    print(
        f"\n4 devices, 2 hosts, 0.5 GB/s between them, 4 MiB all_reduce: ring {t_ring * 1e3:.1f} ms, "
        f"hierarchical {t_hier * 1e3:.1f} ms, ratio {t_ring / t_hier:.2f}x"
    )


def test_create_rejects_a_topology_of_another_size(slow_links: list[hal.Device]) -> None:
    """A topology placing 3 ranks for 4 devices is a ValueError; a non-Topology a TypeError."""
    bad = hal.comm.Topology.from_dict({"hosts": [{"name": "a"}], "ranks": ["a", "a", "a"]})
    with pytest.raises(ValueError, match="each of the 4 devices"):
        hal.comm.create(slow_links, topology=bad)
    with pytest.raises(TypeError, match="Topology"):
        hal.comm.create(slow_links, topology={"ranks": HOSTS})  # type: ignore[arg-type]


def test_in_a_process_with_4_devices() -> None:
    """Run this file's tests where the emulator has 4 devices (the suite's default is 2)."""
    import os
    import subprocess
    import sys

    if len(hal.devices("cpu")) >= 4:
        pytest.skip("this process has 4 devices: the tests above ran directly")
    env = dict(os.environ, HAL_CPU_DEVICES="4", HAL_BACKENDS="cpu")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            __file__,
            "-k",
            "not in_a_process",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    print(proc.stdout[-2000:])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout
