"""The fast-path views of hal.spi: public, read-only names for what per-call code reads of core objects.

``array.signature``, ``array.spi_buffer``, ``array.spi_offset``, ``buffer.spi_memory`` and
``hal.spi.stream_impl``: the same values as the objects' own state, at the cost of the private
attribute (the slot itself, no property), and hal.kernels' launch fast path reads nothing else.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import hal
import hal.spi

REPO = Path(__file__).resolve().parents[2]


def test_views_are_the_values_and_follow_close() -> None:
    d = hal.devices("cpu")[0]
    buf = d.alloc(64)
    a = buf.view(np.float32, (4,), offset=16)
    assert a.spi_buffer is a.buffer is buf and a.spi_offset == a.offset == 16
    assert buf.spi_memory is hal.spi.impl_of(buf)
    buf.close()
    assert buf.spi_memory is None and a.spi_buffer.spi_memory is None


def test_signature_names_dtype_shape_and_device() -> None:
    d0, d1 = hal.devices("cpu")[:2]
    x = hal.asarray(np.zeros(4, np.float32), device=d0)
    same = hal.asarray(np.ones(4, np.float32), device=d0)
    others = [
        hal.asarray(np.zeros(4, np.float64), device=d0),
        hal.asarray(np.zeros(5, np.float32), device=d0),
        hal.asarray(np.zeros((2, 2), np.float32), device=d0),
        hal.asarray(np.zeros(4, np.float32), device=d1),
    ]
    assert isinstance(x.signature, int) and x.signature == same.signature
    assert len({x.signature, *(o.signature for o in others)}) == 5
    assert x.reshape(2, 2).signature == others[2].signature
    for arr in (x, same, *others):
        arr.close()


def test_stream_impl_is_impl_of_without_the_type_check() -> None:
    d = hal.devices("cpu")[0]
    s = d.create_stream()
    before = s.enqueue_count
    assert hal.spi.stream_impl(s) is hal.spi.impl_of(s)
    assert s.enqueue_count == before + 2  # both are the door of an enqueue (counted)
    s.close()
    with pytest.raises(hal.InvalidBufferError, match="closed"):
        hal.spi.stream_impl(s)
    assert "stream_impl" in hal.spi.__all__


@pytest.mark.parametrize(
    ("cls", "public", "slot"),
    [
        (hal.Array, "signature", "_sig"),
        (hal.Array, "spi_buffer", "_buffer"),
        (hal.Array, "spi_offset", "_offset"),
        (hal.Buffer, "spi_memory", "_impl"),
    ],
)
def test_views_cost_what_the_slot_costs(cls: type, public: str, slot: str) -> None:
    """A view is the slot's own descriptor under a second name (no property, no call per read)."""
    assert cls.__dict__[public] is cls.__dict__[slot]
    assert not isinstance(cls.__dict__[public], property)


def _core_private_names() -> set[str]:
    names: set[str] = set()
    for cls in (hal.Array, hal.Buffer, hal.Stream, hal.Event, hal.Device):
        for klass in cls.__mro__[:-1]:
            names |= {n for n in vars(klass) if n.startswith("_") and not n.startswith("__")}
    return names


def test_launch_fast_path_reads_no_private_attribute_of_core() -> None:
    """kernels/_fast.py reaches core objects only through hal and the hal.spi views."""
    tree = ast.parse((REPO / "kernels" / "_fast.py").read_text())
    private = _core_private_names()
    assert {"_sig", "_buffer", "_offset", "_impl", "_live"} <= private
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr not in private:
            continue
        base = node.value
        # hal.kernels' own objects (its modules, its Program) may use their own private names
        if isinstance(base, ast.Name) and (base.id.startswith("_") or base.id == "prog"):
            continue
        found.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert not found, found


def test_open_tracers_is_empty_exactly_while_nothing_is_traced() -> None:
    """``hal.spi.open_tracers``: the truth test that stands for ``hal.tracer() is None``."""
    assert "open_tracers" in hal.spi.__all__
    assert not hal.spi.open_tracers and hal.tracer() is None
    with hal.trace() as t:
        assert hal.spi.open_tracers and hal.tracer() is t
        with hal.trace() as inner:
            assert list(hal.spi.open_tracers)[-1] is inner
    assert not hal.spi.open_tracers and hal.tracer() is None
