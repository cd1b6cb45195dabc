"""An unknown HAL_COMM_TRANSPORT is a hal.ConfigError naming the variable, before any rendezvous
(torchrun users saw a bare "ValueError: transport 'bogus' is not registered" that did not say
where the name came from)."""

from __future__ import annotations

import pytest

import hal
import hal.comm

pytestmark = pytest.mark.usefixtures("requires_cpu")


def test_unknown_transport_from_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for k, v in {
        "HAL_RANK": "0",
        "HAL_WORLD_SIZE": "2",
        "HAL_STORE_ADDR": "127.0.0.1:9",  # never reached: the name is checked first
        "HAL_COMM_TRANSPORT": "bogus",
    }.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(
        hal.ConfigError,
        match=r"HAL_COMM_TRANSPORT='bogus' is not a registered transport; allowed: .*shm.*tcp",
    ) as err:
        hal.comm.init()
    assert err.value.__cause__ is None and "Traceback" not in str(err.value)


def test_unknown_transport_argument_names_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HAL_COMM_TRANSPORT", raising=False)
    for k, v in {"HAL_RANK": "0", "HAL_WORLD_SIZE": "2", "HAL_STORE_ADDR": "127.0.0.1:9"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=r"transport 'bogus' is not registered; known: .*tcp"):
        hal.comm.init(transport="bogus")
