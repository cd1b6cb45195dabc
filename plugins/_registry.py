"""The registry objects handed to plugin hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, final

from hal._spi import BackendImpl

__all__ = ["BackendRegistry", "DeferredRequirements"]


@final
class BackendRegistry:
    """Collects backend classes from one plugin's ``hal_register_backends`` hook."""

    def __init__(self, plugin: str) -> None:
        self._plugin = plugin
        self._classes: list[type[BackendImpl]] = []

    @property
    def plugin(self) -> str:
        """Name of the plugin (entry point) whose hook is running."""
        return self._plugin

    def add(self, backend_cls: type[BackendImpl]) -> None:
        """Register ``backend_cls`` (a subclass of ``hal.spi.BackendImpl`` with a ``name``)."""
        if not (isinstance(backend_cls, type) and issubclass(backend_cls, BackendImpl)):
            raise TypeError(f"backend_cls={backend_cls!r} is not a subclass of hal.spi.BackendImpl")
        name = getattr(backend_cls, "name", None)
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(
                f"{backend_cls.__qualname__}.name={name!r} must be an identifier string"
            )
        self._classes.append(backend_cls)

    @property
    def classes(self) -> tuple[type[BackendImpl], ...]:
        """The classes added so far."""
        return tuple(self._classes)


Check = Callable[[Any], None]
_C = TypeVar("_C", bound=Check)


@final
class DeferredRequirements:
    """Collects the checks of a conformance section that may not import ``hal.conformance``.

    A section module of a package below the conformance layer (hal.comm's, hal.kernels')
    decorates its checks with :meth:`requirement`, which takes the arguments of
    ``hal.conformance.spi.requirement``, and exposes :meth:`declare` as its
    ``declare_requirements(spi)``: the suite calls it once, after importing the module, with
    :mod:`hal.conformance.spi`. Use::

        _section = DeferredRequirements()
        requirement = _section.requirement
        declare_requirements = _section.declare

        @requirement("ACME-1", area="ACME", title="...")
        def check_acme_1(t): ...
    """

    __slots__ = ("_checks",)

    def __init__(self) -> None:
        self._checks: list[tuple[tuple[Any, ...], dict[str, Any], Check]] = []

    def requirement(self, *args: Any, **kwargs: Any) -> Callable[[_C], _C]:
        """Collect the decorated check; ``hal.conformance.spi.requirement``'s arguments."""

        def collect(check: _C) -> _C:
            self._checks.append((args, kwargs, check))
            return check

        return collect

    def declare(self, spi: Any) -> None:
        """Declare the collected requirements with ``spi.requirement`` (:mod:`hal.conformance.spi`)."""
        for args, kwargs, check in self._checks:
            spi.requirement(*args, **kwargs)(check)
