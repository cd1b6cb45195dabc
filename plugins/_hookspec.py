"""Hook specifications of hal-sdk. Every hook is named ``hal_*`` and takes keyword arguments only.

Lifecycle: hooks are called once per plugin, right after its entry point is loaded (lazily,
at the first call that needs backends: ``hal.backends()``, ``hal.devices()``, ``hal info``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from hal.plugins._registry import BackendRegistry

hookspec = pluggy.HookspecMarker("hal")
hookimpl = pluggy.HookimplMarker("hal")


@hookspec
def hal_register_backends(registry: BackendRegistry) -> None:
    """Register backend classes with ``registry.add(MyBackend)``.

    Implemented by: every backend plugin (built-in ``cpu``/``opencl``/``cuda`` and vendors').
    Called: once per plugin when hal loads plugins. Must not touch the vendor SDK beyond
    importing it lazily: probing happens in the backend's ``__init__``.
    """
