"""The registry objects handed to plugin hooks."""

from __future__ import annotations

from typing import final

from hal._spi import BackendImpl

__all__ = ["BackendRegistry"]


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
