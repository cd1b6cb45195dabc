"""The opencl backend (work in progress: registers nothing yet)."""

from hal.plugins import BackendRegistry, hookimpl


class _Plugin:
    @hookimpl
    def hal_register_backends(self, registry: BackendRegistry) -> None:
        """Register nothing until the backend lands."""


plugin = _Plugin()
