"""The active tracer follows the context: threads tracing at once keep their own timelines."""

from __future__ import annotations

import asyncio
import threading

import hal


def _names(t: hal.Tracer) -> set[str]:
    return {e["name"] for e in t.events if e.get("ph") == "i"}


def test_two_threads_tracing_at_once_are_parented_by_their_own_context() -> None:
    both_open = threading.Barrier(2, timeout=30)
    both_recorded = threading.Barrier(2, timeout=30)
    got: dict[str, tuple[hal.Tracer, hal.Tracer]] = {}
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            with hal.trace() as outer:
                both_open.wait()  # the other thread's tracer is open too, opened before or after
                with hal.trace() as inner:
                    active = hal.tracer()
                    assert active is inner
                    active.instant(name, f"{name}-event", "test")
                    both_recorded.wait()
                assert hal.tracer() is outer
                got[name] = (outer, inner)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    (outer_a, inner_a), (outer_b, inner_b) = got["a"], got["b"]
    # each inner tracer's parent is its own thread's outer one, never the other thread's
    assert inner_a._parent is outer_a and inner_b._parent is outer_b
    assert outer_a._parent is None and outer_b._parent is None
    assert _names(inner_a) == _names(outer_a) == {"a-event"}
    assert _names(inner_b) == _names(outer_b) == {"b-event"}
    assert hal.tracer() is None  # nothing leaks into the main thread once both are closed


def test_a_thread_that_traces_nothing_records_into_the_open_trace() -> None:
    # hal's worker threads (comm engine, scheduler) have no trace of their own
    with hal.trace() as t:
        seen: list[hal.Tracer | None] = []
        th = threading.Thread(target=lambda: seen.append(hal.tracer()))
        th.start()
        th.join(30)
    assert seen == [t]


def test_asyncio_tasks_trace_apart() -> None:
    async def task(name: str, gate: asyncio.Event, other: asyncio.Event) -> hal.Tracer:
        with hal.trace() as t:
            gate.set()
            await other.wait()  # both tasks are inside their trace block now
            tr = hal.tracer()
            assert tr is not None
            tr.instant(name, f"{name}-event", "test")
        return t

    async def main() -> tuple[hal.Tracer, hal.Tracer]:
        ea, eb = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(task("x", ea, eb), task("y", eb, ea))

    tx, ty = asyncio.run(main())
    assert _names(tx) == {"x-event"} and _names(ty) == {"y-event"}
    assert tx._parent is None and ty._parent is None


def test_muted_is_per_thread() -> None:
    with hal.trace() as t:
        inside = threading.Event()
        release = threading.Event()

        def mute() -> None:
            with hal.Tracer.muted():
                inside.set()
                release.wait(30)

        th = threading.Thread(target=mute)
        th.start()
        inside.wait(30)
        assert hal.tracer() is t  # another thread's muted block does not mute this one
        release.set()
        th.join(30)
