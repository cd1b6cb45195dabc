"""The device scheduler for heterogeneous pools. Filled in by the scheduler issue."""

__all__: list[str] = []
