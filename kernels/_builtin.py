"""hal.kernels' built-in plugin: its ``KERN-*`` conformance section, registered through the
same hook as a vendor's."""

from __future__ import annotations

import sys
from typing import Any

from hal.plugins import get_system, hookimpl

__all__ = ["hal_register_conformance", "plugin_system"]


def plugin_system() -> Any:
    """Return hal's plugin system with hal.kernels' built-in plugin registered (once) beside the plugins."""
    system = get_system()
    me = sys.modules[__name__]
    if not system.manager.is_registered(me):
        system.manager.register(me, name="hal.kernels.builtin")
    return system


@hookimpl
def hal_register_conformance(registry: Any) -> None:
    """Register the ``KERN-*`` conformance section (portable kernels, ops, accuracy table)."""
    registry.add("hal.kernels._conformance")
