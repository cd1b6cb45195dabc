"""Helpers of hal.spi: check_baseline_args (every ``memory_baseline``), moved_names (renames)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from hal import spi


def test_accepts_every_direction() -> None:
    assert spi.TRANSFER_DIRECTIONS == ("h2d", "d2h", "d2d", "peer")
    for direction in spi.TRANSFER_DIRECTIONS:
        spi.check_baseline_args(direction, 1, 1)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("sideways", 1024, 1), "direction='sideways'"),
        (("h2d", 0, 1), "nbytes=0"),
        (("h2d", True, 1), "nbytes=True"),
        (("h2d", 1.5, 1), "nbytes=1.5"),
        (("h2d", 1024, 0), "repeat=0"),
        (("h2d", 1024, False), "repeat=False"),
    ],
)
def test_refuses_bad_arguments_naming_them(args: tuple[Any, Any, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        spi.check_baseline_args(*args)


@pytest.mark.parametrize("module", ["hal.backends.cpu._baseline", "hal.backends.opencl._baseline"])
def test_builtin_baselines_refuse_the_same_input(module: str) -> None:
    baseline = importlib.import_module(module)
    assert baseline.DIRECTIONS == spi.TRANSFER_DIRECTIONS
    with pytest.raises(ValueError, match="direction='sideways' must be one of h2d, d2h, d2d, peer"):
        baseline.memory_baseline("sideways", 1024, 1)
    with pytest.raises(ValueError, match="repeat=0 must be an integer >= 1"):
        baseline.memory_baseline("h2d", 1024, 0)


def test_moved_names_warns_serves_falls_back_and_refuses() -> None:
    getattr_ = spi.moved_names("pkg", "hal.spi", {"Setting"}, fallback={"lazy": 7}.__getitem__)
    with pytest.warns(
        DeprecationWarning, match=r"pkg\.Setting moved to hal\.spi\.Setting .* hal-sdk 2\.0"
    ):
        assert getattr_("Setting") is spi.Setting
    assert getattr_("lazy") == 7
    plain = spi.moved_names("pkg", "hal.spi", {"Setting"})
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'nope'"):
        plain("nope")


def test_deferred_requirements_declare_in_order_once_asked() -> None:
    from hal.plugins import DeferredRequirements

    section = DeferredRequirements()
    declared: list[tuple[tuple[Any, ...], dict[str, Any], Any]] = []

    class Suite:  # the one call the suite's hal.conformance.spi offers a section
        @staticmethod
        def requirement(*args: Any, **kwargs: Any) -> Any:
            return lambda check: declared.append((args, kwargs, check))

    @section.requirement("X-1", title="first")
    def first(t: Any) -> None: ...

    @section.requirement("X-2")
    def second(t: Any) -> None: ...

    assert declared == []
    section.declare(Suite)
    assert declared == [(("X-1",), {"title": "first"}, first), (("X-2",), {}, second)]


def test_memory_account_allocate_counts_only_what_was_made() -> None:
    import hal

    acct = spi.MemoryAccount(1000, "acme:0")
    assert acct.allocate(300, bytearray, 300) == bytearray(300)
    assert acct.in_use == 300

    def refuse(n: int) -> bytearray:
        raise hal.OutOfMemoryError(f"driver refused {n} bytes", device="acme:0")

    with pytest.raises(hal.OutOfMemoryError, match="driver refused 200 bytes"):
        acct.allocate(200, refuse, 200)
    assert acct.in_use == 300  # the failed allocation is not counted
    made: list[int] = []
    with pytest.raises(hal.OutOfMemoryError, match="cannot allocate 701 bytes: 700 of 1000 free"):
        acct.allocate(701, made.append, 701)
    assert made == [] and acct.in_use == 300  # refused before ``make`` ran
