"""Version numbers of the distribution and of the backend API (SPI), and renamed names."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable
from typing import Any

__version__ = "1.2.0"

#: Version of the backend SPI. A backend declares the version it was written
#: against; a different *major* version is refused at load time.
API_VERSION = (1, 2)


def moved_names(
    package: str,
    target: str,
    names: Iterable[str],
    *,
    fallback: Callable[[str], Any] | None = None,
) -> Callable[[str], Any]:
    """Return a module ``__getattr__`` that keeps names moved out of ``package`` working.

    ``package.NAME`` for a NAME in ``names`` returns ``target.NAME`` (imported on first use)
    with a ``DeprecationWarning`` saying where it went and that the old name goes in
    hal-sdk 2.0. Any other name goes to ``fallback`` (a lazy import, say), else raises
    ``AttributeError``. Use::

        __getattr__ = hal.spi.moved_names("hal.comm", "hal.comm.spi", {"Transport", "World"})

    Args:
        package: the dotted name of the module whose ``__getattr__`` this is.
        target: the dotted name of the module the names moved to.
        names: the moved names.
        fallback: called with a name that did not move.
    """
    moved = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in moved:
            warnings.warn(
                f"{package}.{name} moved to {target}.{name} (the extension API); "
                "the old name is removed in hal-sdk 2.0",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(target), name)
        if fallback is not None:
            return fallback(name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
