"""The CPU emulator's link model: ``HAL_CPU_CONFIG`` ``links`` (per-link bandwidth and latency)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

import hal
from hal.backends.cpu import _faults


@pytest.fixture
def links() -> Iterator[None]:
    """Clear every link model after the test."""
    _faults.clear_links()
    yield
    _faults.clear_links()


def test_a_copy_across_a_modelled_link_takes_its_time(links: None) -> None:
    """A 4 MB copy over a 0.2 GB/s, 500 us link takes at least 21.5 ms, and its data arrives."""
    devs = hal.devices("cpu")[:2]
    if len(devs) < 2:
        pytest.skip("needs 2 CPU emulator devices (HAL_CPU_DEVICES=2)")
    a = [
        hal.asarray(np.arange(1 << 20, dtype=np.float32) * (i + 1), device=d)
        for i, d in enumerate(devs)
    ]
    s = devs[0].create_stream()
    _faults.set_link(devs[0].index, devs[1].index, bandwidth_gbps=0.2, latency_us=500)
    assert _faults.link(devs[1].index, devs[0].index) == _faults.Link(
        0.2, 500.0
    )  # either direction
    t0 = time.perf_counter()
    hal.copy(a[1], a[0], stream=s)
    s.synchronize()
    slow = time.perf_counter() - t0
    assert slow >= 0.95 * (500e-6 + (4 << 20) / 0.2e9)
    assert np.array_equal(a[1].to_host(), a[0].to_host())
    for arr in a:
        arr.close()
    s.close()


@pytest.mark.parametrize(
    ("links_value", "match"),
    [
        ({"between": ["cpu:0"], "bandwidth_gbps": 1}, "between"),
        ({"between": ["cpu:0", "cpu:9"], "bandwidth_gbps": 1}, "cpu:9"),
        ({"between": ["cpu:0", "cpu:1"]}, "bandwidth_gbps"),
        ({"between": ["cpu:0", "cpu:1"], "bandwidth_gbps": 0}, "bandwidth_gbps=0"),
        ({"between": ["cpu:0", "cpu:1"], "bandwidth_gbps": 1, "latency_us": -1}, "latency_us=-1"),
        ({"between": ["cpu:0", "cpu:0"], "bandwidth_gbps": 1}, "two different ends"),
        ({"between": ["cpu:0", "host"], "bandwidth_gbps": 1, "colour": "red"}, "colour"),
    ],
)
def test_bad_links_are_rejected(links: None, links_value: object, match: str) -> None:
    """Every malformed link entry is a ValueError naming it; no link is installed."""
    with pytest.raises(ValueError, match=match):
        _faults.configure(2, {"HAL_CPU_CONFIG": json.dumps({"links": [links_value]})})
    assert _faults.link(0, 1) is None and _faults.link(0, _faults.HOST) is None


def test_hal_topo_measures_the_modelled_link(tmp_path: object) -> None:
    """``hal topo`` on 3 emulated devices sees the slow link 0 <-> 2 (a topology-aware choice is measurable)."""
    cfg = {"links": [{"between": ["cpu:0", "cpu:2"], "bandwidth_gbps": 0.25, "latency_us": 200}]}
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "3", "HAL_CPU_CONFIG": json.dumps(cfg)})
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "topo", "--json", "--size", "1M"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (host,) = json.loads(proc.stdout)["hosts"]
    bw = {(p["src"], p["dst"]): p["bandwidth_gbps"] for p in host["p2p"]}
    assert bw[(0, 2)] <= 0.25 and bw[(2, 0)] <= 0.25
    assert bw[(0, 1)] > 4 * bw[(0, 2)]
