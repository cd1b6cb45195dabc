"""Portable kernels and the operator registry. Filled in by the kernels issue."""

__all__: list[str] = []
