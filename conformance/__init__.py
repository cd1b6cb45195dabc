"""The conformance suite that certifies a backend. Filled in by the conformance issue."""

__all__: list[str] = []
