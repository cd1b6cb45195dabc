"""The public API: each package's ``__all__`` fits on one screen, is documented in docs/index.md,
and the names moved to an extension API (``*.spi``) keep working for a release, with a warning."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: package -> (its extension API, the names that moved there in hal-sdk 1.2)
MOVED = {
    "hal.comm": (
        "hal.comm.spi",
        [
            "CallContext",
            "CollectiveProvider",
            "ProviderRegistry",
            "Recv",
            "Send",
            "StagedTransport",
            "Transport",
            "TransportRegistry",
            "World",
        ],
    ),
    "hal.kernels": (
        "hal.kernels.spi",
        [
            "ACCUMULATE_OPS",
            "DIALECTS",
            "IMPLEMENTATIONS",
            "OPS",
            "KernelRegistry",
            "OpCall",
            "OpSpec",
            "define_op",
            "dialect_of",
            "internal",
            "parse_kernels",
            "reference",
            "register",
            "registry",
        ],
    ),
    "hal.sched": (
        "hal.sched.spi",
        [
            "HeftPlan",
            "Placement",
            "PolicyEnv",
            "capability_score",
            "heft",
            "make_policy",
            "plan_graph",
            "size_bucket",
            "upward_ranks",
        ],
    ),
    "hal.conformance": (
        "hal.conformance.spi",
        [
            "ConformanceFailure",
            "NotApplicable",
            "SECTIONS",
            "SectionRegistry",
            "Target",
            "add_area",
            "requirement",
        ],
    ),
}
PACKAGES = ["hal", "hal.comm", "hal.kernels", "hal.sched", "hal.conformance"]
SPIS = ["hal.spi", "hal.comm.spi", "hal.kernels.spi", "hal.sched.spi", "hal.conformance.spi"]


def _index_table(package: str) -> set[str]:
    """Return the names the docs/index.md table of ``package`` lists (backquoted, first column)."""
    text = (REPO / "docs" / "index.md").read_text()
    head = f"### `{package}`"
    assert head in text, f"docs/index.md has no section {head!r}"
    section = text.split(head, 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            first = line.split("|")[1]
            names.update(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)", first))
    return names


@pytest.mark.parametrize("package", PACKAGES + SPIS)
def test_all_fits_on_a_screen_and_resolves_without_warnings(package: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mod = importlib.import_module(package)
        names = list(mod.__all__)
        assert len(names) <= 40, f"{package}.__all__ has {len(names)} names (one screen: 40)"
        assert len(set(names)) == len(names)
        for name in names:
            assert getattr(mod, name) is not None, name


@pytest.mark.parametrize("package", PACKAGES)
def test_user_api_is_documented_in_the_index(package: str) -> None:
    mod = importlib.import_module(package)
    documented = _index_table(package)
    missing = sorted(set(mod.__all__) - documented)
    extra = sorted(documented - set(mod.__all__))
    assert not missing, f"docs/index.md's {package} table lacks {missing}"
    assert not extra, f"docs/index.md's {package} table lists {extra}, not in {package}.__all__"


@pytest.mark.parametrize("package", sorted(MOVED))
def test_moved_names_warn_naming_the_new_home_and_return_the_same_object(package: str) -> None:
    home, names = MOVED[package]
    mod = importlib.import_module(package)
    spi = importlib.import_module(home)
    for name in names:
        assert name in spi.__all__, f"{home}.__all__ lacks {name}"
        assert name not in mod.__all__, f"{package}.__all__ still lists {name}"
        with pytest.warns(DeprecationWarning, match=re.escape(f"{home}.{name}")):
            obj = getattr(mod, name)
        assert obj is getattr(spi, name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = mod.no_such_name


def test_from_import_of_a_moved_name_warns() -> None:
    with pytest.warns(DeprecationWarning, match=r"hal\.comm\.spi\.Transport"):
        from hal.comm import Transport  # noqa: F401
