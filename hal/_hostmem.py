"""Which host memory hal copies: plain numbers only (the one check every entry point calls).

Host memory enters hal through ``hal.copy`` (either side), ``hal.asarray``,
``hal.from_dlpack`` and whatever builds on them (kernels' host route, collectives'
staging). Device memory holds bytes; only element types whose bytes *are* the value may
cross: ``bool``, signed and unsigned integers, floats and complex numbers (NumPy kinds
``b``, ``i``, ``u``, ``f``, ``c``; buffer-protocol formats ``?``, ``b B h H i I l L q Q n N``,
``e f d``, ``Zf Zd``, ``c``), and the number types of ``ml_dtypes`` (bfloat16, float8).
Refused, with a ``TypeError`` naming the dtype: ``object``
arrays (their bytes are ``PyObject*`` addresses), structured and ``void`` records (they can
hold objects or padding), strings, datetimes and pointers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "ACCEPTED",
    "PLAIN_KINDS",
    "check_host_array",
    "check_host_dtype",
    "check_host_format",
    "dtype_problem",
]

#: NumPy dtype kinds that may cross between host and device memory.
PLAIN_KINDS = "biufc"
_PLAIN_FORMATS = frozenset("?bBhHiIlLqQnNefdc") | {"Zf", "Zd", "Ze"}
ACCEPTED = "bool, signed/unsigned integers, floats or complex numbers"


def _why(dt: np.dtype[Any]) -> str:
    if dt.hasobject:
        return "its bytes are Python object pointers"
    if dt.names is not None:
        return "a structured record"
    return {
        "V": "raw void records",
        "S": "byte strings",
        "U": "strings",
        "M": "datetimes",
        "m": "timedeltas",
    }.get(dt.kind, "not a plain number type")


def _extension_number(dt: np.dtype[Any]) -> bool:
    """A registered number type outside NumPy's kinds (``ml_dtypes`` bfloat16, float8, int4)."""
    return (
        dt.kind == "V"
        and dt.names is None
        and dt.subdtype is None
        and not dt.hasobject
        and dt.type is not np.void
        and dt.num >= 256
    )


def dtype_problem(dt: np.dtype[Any]) -> str | None:
    """Return why elements of ``dt`` may not cross between host and device memory, or None."""
    if _extension_number(dt):
        return None
    if dt.kind not in PLAIN_KINDS or dt.names is not None or dt.hasobject:
        return _why(dt)
    return None


def check_host_dtype(dtype: Any, what: str) -> np.dtype[Any]:
    """Return ``numpy.dtype(dtype)`` if host memory of it may be copied, else raise ``TypeError``.

    Args:
        dtype: anything ``numpy.dtype`` accepts.
        what: the argument's name, for the message (``"host_array"``, ``"src"``).
    """
    dt = np.dtype(dtype)
    why = dtype_problem(dt)
    if why is not None:
        raise TypeError(
            f"{what} has dtype {dt} ({why}); host memory copied by hal must hold plain numbers: {ACCEPTED}"
        )
    return dt


def check_host_format(view: memoryview, what: str) -> None:
    """Raise ``TypeError`` unless buffer-protocol ``view`` holds plain numbers (its ``format``)."""
    fmt = view.format
    code = fmt[1:] if fmt[:1] in "@=<>!" else fmt
    if code not in _PLAIN_FORMATS:
        kind = {"O": "Python object pointers", "P": "pointers"}.get(code, "")
        if code.startswith("T{"):
            kind = "a structured record"
        elif code.endswith("x"):
            kind = "raw void records"
        elif code.endswith(("s", "w")):
            kind = "strings"
        raise TypeError(
            f"{what} is a host buffer of format {fmt!r}{f' ({kind})' if kind else ''}; "
            f"host memory copied by hal must hold plain numbers: {ACCEPTED}"
        )


def check_host_array(value: object, what: str) -> None:
    """Check a host object before its bytes are used: NumPy-like by ``dtype``, others by buffer format.

    Raises:
        TypeError: the element type is not a plain number (object, structured, void, string, datetime).
    """
    dtype = getattr(value, "dtype", None)
    if isinstance(value, np.ndarray) or isinstance(dtype, np.dtype):
        check_host_dtype(dtype, what)
        return
    try:
        view = memoryview(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return  # not a buffer: the caller says what it wants instead
    check_host_format(view, what)
