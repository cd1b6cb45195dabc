"""The flight recorder: the last calls of one rank, dumped when a collective fails.

Every call a rank submits is recorded (sequence number, collective, op, dtype, count, bytes,
algorithm, state ``queued`` -> ``running`` -> ``done``/``failed``/``aborted``, times). When a
call fails, the rank writes its record to ``HAL_COMM_TRACE_FILE`` (``{rank}`` in the path is
replaced by the rank; without it ``.rank<N>`` is appended) or, unset, logs it at WARNING level.
Comparing the ranks' last sequence numbers shows which rank was behind.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from typing import Any

from hal.spi import setting

__all__ = ["FlightRecorder"]

_log = logging.getLogger("hal.comm")


class FlightRecorder:
    """Keep the last ``capacity`` calls of rank ``rank`` (``HAL_COMM_TRACE_ENTRIES``, default 64)."""

    def __init__(self, rank: int, capacity: int | None = None) -> None:
        if capacity is None:
            capacity = int(setting("HAL_COMM_TRACE_ENTRIES"))  # >= 1 (hal.ConfigError)
        if capacity < 1:
            raise ValueError(f"HAL_COMM_TRACE_ENTRIES={capacity!r} must be >= 1")
        self.rank = rank
        # add()'s dicts and again()'s lists, in call order
        self._entries: collections.deque[Any] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()
        self.dumped_to: str | None = None

    def add(self, **fields: Any) -> dict[str, Any]:
        """Record a submitted call; return its entry (updated in place by :meth:`state`).

        ``fields``: those of :meth:`entry` (``running``: the call starts at once, as an inline
        call does, and the entry starts ``running``).
        """
        return self.keep(self.entry(**fields))

    def keep(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Record ``entry``, one :meth:`entry` returned; return it."""
        with self._lock:
            self._entries.append(entry)
        return entry

    @staticmethod
    def entry(
        *,
        seq: int,
        op: str,
        reduce_op: str,
        dtype: str,
        count: int,
        nbytes: int,
        algorithm: str,
        peer: int,
        running: bool = False,
    ) -> dict[str, Any]:
        """Return the entry of a call submitted now, without recording it (:meth:`add` does)."""
        now = time.time()
        return {
            "seq": seq,
            "op": op,
            "reduce_op": reduce_op,
            "dtype": dtype,
            "count": count,
            "nbytes": nbytes,
            "algorithm": algorithm,
            "peer": peer,
            "state": "running" if running else "queued",
            "submitted": now,
            "started": now if running else None,
            "ended": None,
            "error": None,
        }

    def again(self, entry: dict[str, Any], seq: int) -> list[Any]:
        """Record call ``seq``, a call like ``entry``'s (same op, sizes, algorithm), running from now.

        The repeated inline calls of hal.comm's fast path record their entries so, at the cost
        of one short list per call: ``[entry, seq, started, end]`` (``end`` None while running,
        then ``(state, ended, error)``, set in one store by :meth:`state`), appended without the
        lock (a deque's append is atomic under the GIL). :meth:`entries` turns it into the same
        dict as :meth:`add` keeps. Returns the record, for :meth:`state`.
        """
        rec = [entry, seq, time.time(), None]
        self._entries.append(rec)
        return rec

    @staticmethod
    def done(rec: list[Any]) -> None:
        """Move ``rec``, a record :meth:`again` returned, to ``done``: :meth:`state`'s fast path."""
        rec[3] = ("done", time.time(), rec[3] and rec[3][2])

    def state(
        self, entry: dict[str, Any] | list[Any], state: str, error: BaseException | None = None
    ) -> None:
        """Move ``entry`` (an :meth:`add` or :meth:`again` record) to ``state`` (``running``,
        ``done``, ``failed``, ``aborted``)."""
        if isinstance(entry, list):  # a repeated call's record (again): one store, no lock
            end = entry[3]
            if state == "running":
                entry[2] = time.time()
                entry[3] = None
                return
            why = f"{type(error).__name__}: {error}" if error is not None else end and end[2]
            entry[3] = (state, time.time(), why)
            return
        with self._lock:
            entry["state"] = state
            if state == "running":
                entry["started"] = time.time()
            else:
                entry["ended"] = time.time()
            if error is not None:
                entry["error"] = f"{type(error).__name__}: {error}"

    def entries(self) -> list[dict[str, Any]]:
        """Return copies of the recorded calls, oldest first."""
        with self._lock:
            calls = list(self._entries)  # one C call: atomic against again()'s appends
            return [dict(e) if type(e) is dict else _expand(*e) for e in calls]

    def dump(self, reason: str) -> str | None:
        """Write the record to ``HAL_COMM_TRACE_FILE`` or the log; return the file written, if any."""
        calls = self.entries()
        record: dict[str, Any] = {
            "rank": self.rank,
            "pid": os.getpid(),
            "reason": reason,
            "time": time.time(),
            "calls": calls,
        }
        target = setting("HAL_COMM_TRACE_FILE")
        if target:
            path = (
                target.replace("{rank}", str(self.rank))
                if "{rank}" in target
                else f"{target}.rank{self.rank}"
            )
            try:
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(record, f, indent=1)
                _log.warning("rank %d: flight recorder written to %s (%s)", self.rank, path, reason)
                self.dumped_to = path
                return path
            except OSError as exc:
                _log.warning(
                    "rank %d: cannot write the flight recorder to %s: %s", self.rank, path, exc
                )
        lines = [f"rank {self.rank}: flight recorder ({reason}); last {len(calls)} call(s):"]
        for e in calls:
            lines.append(
                f"  seq={e['seq']} {e['op']} op={e['reduce_op'] or '-'} dtype={e['dtype'] or '-'} "
                f"count={e['count']} bytes={e['nbytes']} algorithm={e['algorithm']} state={e['state']}"
                + (f" error={e['error']}" if e["error"] else "")
            )
        _log.warning("\n".join(lines))
        return None


def _expand(
    entry: dict[str, Any], seq: int, started: float, end: tuple[str, float, str | None] | None
) -> dict[str, Any]:
    """Return the entry of a repeated call's record (:meth:`FlightRecorder.again`), as a dict
    like those :meth:`FlightRecorder.add` keeps (the same keys, in the same order)."""
    new = entry.copy()
    new["seq"] = seq
    new["submitted"] = new["started"] = started
    if end is None:
        new["state"], new["ended"], new["error"] = "running", None, None
    else:
        new["state"], new["ended"], new["error"] = end
    return new
