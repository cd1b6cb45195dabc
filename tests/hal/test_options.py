"""Options objects: code > environment > default, field by field, checked by the settings' parsers."""

from __future__ import annotations

import pytest

import hal
import hal.comm
from hal.comm._config import Config
from hal.spi import MemoryOptions, PluginOptions


def test_event_options_and_the_keyword_sugar() -> None:
    dev = hal.devices("cpu")[0]
    with dev.create_stream() as s:
        e0 = dev.create_event(options=hal.EventOptions(timing=True))
        e1 = dev.create_event(True)
        e0.record(s)
        e1.record(s)
        s.synchronize()
        assert e1.elapsed_ms(e0) >= 0.0
        plain = dev.create_event()
        plain.record(s)
        s.synchronize()
        with pytest.raises(hal.HalError, match="timing"):
            plain.elapsed_ms(e0)
        # the keyword wins over the same field of options
        off = dev.create_event(False, options=hal.EventOptions(timing=True))
        off.record(s)
        s.synchronize()
        with pytest.raises(hal.HalError, match="timing"):
            off.elapsed_ms(e0)
        for e in (e0, e1, plain, off):
            e.close()
    with pytest.raises(TypeError, match=r"is not a hal\.EventOptions"):
        dev.create_event(options={"timing": True})  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        hal.EventOptions().timing = True  # type: ignore[misc]  # frozen


def test_comm_options_code_beats_environment_beats_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in (
        "HAL_COMM_TIMEOUT_MS",
        "HAL_COMM_ALGO",
        "HAL_COMM_INLINE_BYTES",
        "HAL_COMM_PROVIDER",
    ):
        monkeypatch.delenv(var, raising=False)
    default = Config.from_options()
    assert (default.timeout_s, default.inline_bytes, default.algo) == (600.0, 64 << 10, {})
    monkeypatch.setenv("HAL_COMM_TIMEOUT_MS", "2500")
    monkeypatch.setenv("HAL_COMM_INLINE_BYTES", "8K")
    monkeypatch.setenv("HAL_COMM_ALGO", "allreduce:ring")
    env = Config.from_options()
    assert (env.timeout_s, env.inline_bytes, env.algo) == (2.5, 8192, {"all_reduce": "ring"})
    opts = hal.comm.CommOptions(timeout_ms=1000, algo={"all_reduce": "recursive_doubling"})
    code = Config.from_options(opts)
    assert code.timeout_s == 1.0 and code.algo == {"all_reduce": "recursive_doubling"}
    assert code.inline_bytes == 8192  # not given in code: the environment's
    assert Config.from_env(timeout_ms=500, options=opts).timeout_s == 0.5  # the keyword wins
    assert opts.resolved().timeout_ms == 1000.0 and opts.timeout_ms == 1000  # frozen, copied


def test_comm_options_reach_the_communicator() -> None:
    opts = hal.comm.CommOptions(timeout_ms=1234, algo="allreduce:recursive_doubling")
    comm = hal.comm.create(hal.devices("cpu")[:2], options=opts)
    try:
        assert comm.ranks[0]._config.timeout_s == pytest.approx(1.234)
        assert comm.ranks[0]._config.algo == {"all_reduce": "recursive_doubling"}
    finally:
        comm.close()
    with pytest.raises(ValueError, match="has no algorithm 'bogus'"):
        hal.comm.create(
            hal.devices("cpu")[:2], options=hal.comm.CommOptions(algo="allreduce:bogus")
        )


def test_bad_values_are_named_where_they_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAL_COMM_INLINE_BYTES", "inf")
    with pytest.raises(hal.ConfigError, match=r"HAL_COMM_INLINE_BYTES='inf' is not a size"):
        Config.from_options()
    monkeypatch.delenv("HAL_COMM_INLINE_BYTES")
    with pytest.raises(hal.ConfigError, match=r"CommOptions\.timeout_ms=-5 is out of range"):
        Config.from_options(hal.comm.CommOptions(timeout_ms=-5))
    with pytest.raises(hal.ConfigError, match=r"MemoryOptions\.pool='perhaps' is not a switch"):
        MemoryOptions(pool="perhaps").resolved()  # type: ignore[arg-type]
    assert PluginOptions(backends=["cpu", " opencl "]).resolved({}).backends == ("cpu", "opencl")
    assert PluginOptions.from_env({"HAL_BACKENDS": "cpu,opencl"}).backends == ("cpu", "opencl")
    assert PluginOptions.variables()["timeout_s"] == "HAL_PLUGIN_TIMEOUT_S"
