"""The CPU emulator's speed factors and injected faults (HAL_CPU_SPEED, HAL_CPU_CONFIG)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import hal
from hal.backends.cpu import _faults, clear_faults, inject_fault


def test_speed_list_and_config_file_apply_at_backend_start(
    hal_env: Callable[..., None], tmp_path: Path
) -> None:
    cfg = tmp_path / "faults.json"
    cfg.write_text(
        json.dumps(
            {
                "seed": 7,
                "devices": {
                    "2": {"fail": True},
                    "cpu:3": {
                        "spike_every": 10,
                        "spike_factor": 100,
                        "transfer_drop_every": 3,
                        "transfer_delay_ms": 1,
                    },
                },
            }
        )
    )
    hal_env(
        HAL_CPU_DEVICES="4",
        HAL_CPU_SPEED="1,0.25,,0.5",
        HAL_CPU_CONFIG=str(cfg),
        HAL_BACKENDS="cpu",
    )
    props = [d.properties() for d in hal.devices("cpu")]
    assert [p["speed"] for p in props] == [1.0, 0.25, 1.0, 0.5]
    assert _faults.faults(2).fail and _faults.faults(3).spike_every == 10
    assert _faults.faults(3).settings()["transfer_drop_every"] == 3


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HAL_CPU_SPEED": "1,fast"}, "'fast' is not a number"),
        ({"HAL_CPU_SPEED": "1,0"}, "speed=0.0 must be > 0"),
        ({"HAL_CPU_SPEED": "1,1,1"}, "lists 3 speeds for 2 device"),
        ({"HAL_CPU_CONFIG": "{not json"}, "not a readable JSON"),
        ({"HAL_CPU_CONFIG": '{"devices": {"5": {}}}'}, "device '5' is not one of 0..1"),
        ({"HAL_CPU_CONFIG": '{"devices": {"0": {"sped": 1}}}'}, "unknown fault setting 'sped'"),
        ({"HAL_CPU_CONFIG": '{"devices": {"0": {"spike_prob": 2}}}'}, "spike_prob=2 must be in"),
        (
            {"HAL_CPU_CONFIG": '{"devices": {"0": {"fail": "yes"}}}'},
            "fail='yes' must be true or false",
        ),
        ({"HAL_CPU_CONFIG": '{"device": {}}'}, "unexpected top-level keys"),
    ],
)
def test_bad_configuration_is_rejected_naming_the_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        _faults.configure(2, env)
    clear_faults()


def test_failed_device_raises_stream_error_and_counts_it(cpu_pair: list[hal.Device]) -> None:
    d = cpu_pair[1]
    s = d.create_stream()
    a = hal.asarray(np.ones(256, np.float32), device=d)
    inject_fault(d.index, fail=True)
    host = np.empty(256, np.float32)
    hal.copy(host, a, stream=s)
    ev = d.create_event()
    ev.record(s)
    ev.synchronize()  # event marks still fire: nothing hangs
    with pytest.raises(hal.StreamError, match=f"injected fault: device {d} failed") as info:
        s.synchronize()
    assert info.value.device == str(d)
    assert d.properties()["errors"] == 1
    clear_faults(d.index)
    hal.copy(host, a, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(host, 1.0)


def test_dropped_transfer_fails_and_leaves_the_destination_unwritten(
    cpu_pair: list[hal.Device],
) -> None:
    src, dst = cpu_pair
    a = hal.asarray(np.arange(64, dtype=np.float32), device=src)
    b = hal.asarray(np.zeros(64, np.float32), device=dst)
    s = dst.create_stream()
    inject_fault(dst.index, transfer_drop_every=1)
    hal.copy(b, a, stream=s)
    with pytest.raises(hal.StreamError, match="transfer dropped"):
        s.synchronize()
    clear_faults(dst.index)
    np.testing.assert_array_equal(b.to_host(), 0.0)
    assert dst.properties()["dropped"] == 0  # counters reset with clear_faults


def test_speed_factor_and_spikes_stretch_ops(cpu_pair: list[hal.Device]) -> None:
    d = cpu_pair[0]
    s = d.create_stream()
    a = hal.asarray(np.ones(1 << 20, np.float32), device=d)
    b = d.alloc(a.nbytes)
    inject_fault(d.index, spike_every=2, spike_factor=5.0, speed=0.5)
    for _ in range(4):
        hal.copy(b, a, stream=s)
    s.synchronize()
    counters = d.properties()
    assert counters["ops"] >= 4 and counters["spikes"] == counters["ops"] // 2
    with pytest.raises(ValueError, match=r"spike_factor=0\.5 must be >= 1"):
        inject_fault(d.index, spike_factor=0.5)


def test_delay_is_applied_per_op(cpu_pair: list[hal.Device]) -> None:
    import time

    d = cpu_pair[0]
    s = d.create_stream()
    inject_fault(d.index, delay_ms=30)
    t0 = time.perf_counter()
    hal.asarray(np.ones(4, np.float32), device=d, stream=s)
    s.synchronize()
    # the op cannot finish before its injected delay (a lower bound, not a time limit)
    assert time.perf_counter() - t0 >= 0.03
