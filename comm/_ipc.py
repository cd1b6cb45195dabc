"""The direct intra-host path: collectives that read and write the peers' buffers through IPC.

When every rank of a one-host communicator has a device that declares ``ipc`` (the CPU
emulator with ``HAL_CPU_IPC=1``; CUDA through CuPy's IPC handles), ``all_reduce``,
``all_gather``, ``reduce_scatter`` and ``broadcast`` can skip the shared-memory slots: each
rank maps the peers' buffers (``Buffer.export_handle`` / ``Device.import_handle``) and moves
every byte with one copy instead of two (NCCL's P2P/IPC path). The ranks still talk through
the transport, but only in small control messages:

1. *control* (the "inputs ready" barrier): each rank sends the handles of its buffers
   (exported once per buffer and cached; imported once per peer) after its stream reached
   the call, or why it cannot share them. If any rank cannot, every rank runs the slot
   algorithm the cost model picks instead (``work.plan.fallback`` says why);
2. the data movement (all_reduce: reduce-scatter, where rank r reduces segment r read from
   every peer's buffer, then a barrier, then an all-gather by direct reads);
3. *done*: a rank returns only after every rank that reads its memory said it finished
   reading, so a buffer reused right after ``wait()`` is never read half-changed by a slow peer.

Every message goes through the transport, so a dead or silent peer ends the call with the
transport's :class:`hal.CommError` naming the ranks and the operation within
``HAL_COMM_TIMEOUT_MS``. Memory the host can reach (DLPack ``kDLCPU``: the emulator) is
reduced with NumPy on the host pointers; other memory moves with ``hal.copy`` and reduces with
``hal.kernels.accumulate`` (the CUDA path: written, not run here: no GPU).

``HAL_COMM_IPC`` (``auto``: the cost model decides; ``on``/``1``: use it for every call it can
run, an error at init when it cannot run at all; ``off``/``0``: never) and
``HAL_COMM_ALGO=allreduce:ipc`` (force it per collective; an error at the call naming why it
cannot run) choose it.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import hal
from hal.comm._config import IPC_COLLECTIVES
from hal.comm._ops import accumulate, sub
from hal.comm._transport import Recv, Send, _host_view

if TYPE_CHECKING:
    from hal.comm._algorithms import Run
    from hal.comm._engine import Call, Engine
    from hal.comm._plan import Plan

__all__ = [
    "BETA_S_PER_BYTE",
    "IPC_COLLECTIVES",
    "IpcState",
    "decide",
    "local_info",
    "predict",
    "run",
]

#: Seconds per byte of one direct copy between mapped buffers (one host memcpy here; the slot
#: path's β counts two copies per byte: into the slot and out of it).
BETA_S_PER_BYTE = 1 / 8e9
#: Fixed cost of one call on the IPC path (Python: the handle cache, the control messages' JSON,
#: the host views), measured here; it keeps small calls on the slot path's native engine.
CALL_S = 100e-6
#: Size of a control message (the handles of up to two buffers and the retired handle ids).
CTRL_BYTES = 4096
#: Imported buffers kept per peer at most (the least recently used is closed beyond it).
MAX_IMPORTS_PER_PEER = 64
#: Elements of one host reduction block (the partial result stays in cache).
_BLOCK_BYTES = 256 << 10
#: A test hook: called as ``_TEST_HOOK(stage, rank)`` at "mapped" (after the control exchange) and
#: "read" (after this rank's reads, before it says it is done); tests use it to slow or kill a rank.
_TEST_HOOK: Any = None

_NP_OPS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _mode() -> str:
    from hal.spi import setting

    raw = str(setting("HAL_COMM_IPC") or "auto")
    return {"1": "on", "0": "off"}.get(raw, raw)


def local_info(device: hal.Device) -> dict[str, Any]:
    """Return what this rank tells the others at init: the IPC mode, its device's ``ipc`` and the devices it sees."""
    caps = device.capabilities
    try:
        seen = [str(d) for d in hal.devices(device.backend)]
    except hal.HalError:
        seen = [str(device)]
    return {
        "mode": _mode(),
        "ipc": bool(caps.ipc),
        "why": ""
        if caps.ipc
        else caps.absent_reasons.get("ipc", "the backend does not declare it"),
        "device": str(device),
        "sees": seen,
    }


def decide(rank: int, table: Sequence[dict[str, Any]], rank_hosts: Sequence[str]) -> IpcState:
    """Return the communicator's IPC state from every rank's :func:`local_info` (same on every rank).

    Raises:
        hal.CommError: the ranks disagree on ``HAL_COMM_IPC``, or it is ``on`` and IPC cannot run
            (the message says why).
    """
    infos = [t.get("ipc") or {} for t in table]
    modes = [str(i.get("mode", "auto")) for i in infos]
    if len(set(modes)) > 1:
        raise hal.CommError(
            "ranks disagree on HAL_COMM_IPC: "
            + ", ".join(f"rank {r}: {m!r}" for r, m in enumerate(modes)),
            op="init",
            ranks=tuple(r for r, m in enumerate(modes) if m != modes[0]),
        )
    mode = modes[0] if modes else "auto"
    size = len(table)
    reason = ""
    if size < 2:
        reason = "a single rank has no peers"
    elif len(set(rank_hosts)) > 1:
        reason = f"the ranks run on {len(set(rank_hosts))} hosts; IPC joins the ranks of one host"
    else:
        for r, info in enumerate(infos):
            if not info.get("ipc"):
                reason = f"rank {r}'s device {info.get('device', '?')} has no ipc: {info.get('why') or 'not declared'}"
                break
        else:
            for r, info in enumerate(infos):
                missing = [
                    i.get("device")
                    for i in infos
                    if i.get("device") not in (info.get("sees") or ())
                ]
                if missing:
                    reason = (
                        f"rank {r} has no device {missing[0]} to open the memory of its peers on"
                    )
                    break
    if mode == "off" and not reason:
        reason = "HAL_COMM_IPC=off"
    if mode == "on" and reason and size > 1:
        raise hal.CommError(
            f"HAL_COMM_IPC=on, but the direct IPC path cannot run: {reason}; unset HAL_COMM_IPC "
            "(or set it to auto) to use the shared-memory slots",
            op="init",
        )
    return IpcState(rank, mode, reason)


def predict(collective: str, nbytes: int, p: int, alpha: float) -> float:
    """Return the predicted seconds of the IPC path: control rounds of latency ``alpha``, one copy per byte.

    ``all_reduce``: ``CALL_S + 3α + 2(p-1)/p·nβ + (p-1)/p·nγ`` (each rank reads the peers' parts
    of its segment, then the other segments: (p-1)/p·n bytes each time, one copy per byte);
    ``reduce_scatter``: ``CALL_S + 2α + (p-1)/p·n(β+γ)``; ``all_gather``: ``CALL_S + 2α +
    (p-1)/p·nβ``; ``broadcast``: ``CALL_S + 2α + nβ``. β is :data:`BETA_S_PER_BYTE`, γ the
    planner's.
    """
    from hal.comm._plan import GAMMA_S_PER_BYTE as g

    n, b = float(nbytes), BETA_S_PER_BYTE
    frac = (p - 1) / p if p else 0.0
    if collective == "all_reduce":  # control, reduce-scatter, barrier, all-gather, done
        return CALL_S + 3 * alpha + 2 * frac * n * b + frac * n * g
    if collective == "reduce_scatter":
        return CALL_S + 2 * alpha + frac * n * (b + g)
    if collective == "all_gather":
        return CALL_S + 2 * alpha + frac * n * b
    if collective == "broadcast":
        return CALL_S + 2 * alpha + n * b
    return math.inf


@dataclasses.dataclass
class _Import:
    buffer: hal.Buffer
    host: np.ndarray[Any, Any] | None


class IpcState:
    """One rank's IPC bookkeeping: whether the path can run, the exported and the imported buffers.

    Attributes:
        mode: ``auto``, ``on`` or ``off`` (``HAL_COMM_IPC``).
        reason: why the path cannot run ("" when it can).
    """

    def __init__(self, rank: int, mode: str, reason: str) -> None:
        self.rank = rank
        self.mode = mode
        self.reason = reason
        self._ids = itertools.count(1)
        self._exports: weakref.WeakKeyDictionary[hal.Buffer, tuple[int, str]] = (
            weakref.WeakKeyDictionary()
        )
        #: ids of freed exports to tell the peers (with the next control message every peer gets)
        self._retired: collections.deque[int] = collections.deque()
        self._imports: dict[int, collections.OrderedDict[int, _Import]] = {}
        self._views: weakref.WeakKeyDictionary[hal.Buffer, Any] = weakref.WeakKeyDictionary()
        self.exported = 0  # buffers exported (tests and ``hal bench`` read these counts)
        self.imported = 0

    @property
    def usable(self) -> bool:
        """True when the communicator can run collectives on the IPC path."""
        return not self.reason

    def predict(self, collective: str, nbytes: int, p: int, alpha: float) -> float:
        """Return the predicted seconds of ``collective`` on the IPC path (``inf`` where it cannot run)."""
        if self.reason or collective not in IPC_COLLECTIVES:
            return math.inf
        return predict(collective, nbytes, p, alpha)

    # -- handles ----------------------------------------------------------------------------
    def export(self, arr: hal.Array) -> tuple[int, str] | str:
        """Return (id, handle) of ``arr``'s buffer, exported once and cached, or why it cannot be shared."""
        buf = arr.buffer
        got = self._exports.get(buf)
        if got is not None and not buf.closed:
            return got
        try:
            handle = buf.export_handle().decode()
        except hal.HalError as exc:
            return str(exc)
        ident = next(self._ids)
        self._exports[buf] = (ident, handle)
        self.exported += 1
        # the peers drop their import when the buffer is gone (or closed: _retire_closed)
        weakref.finalize(buf, self._retired.append, ident)
        return ident, handle

    def _retire_closed(self) -> list[int]:
        for buf, (ident, _) in list(self._exports.items()):
            if buf.closed:
                del self._exports[buf]
                self._retired.append(ident)
        out: list[int] = []
        while self._retired and len(out) < 64:
            out.append(self._retired.popleft())
        return out

    def _open(self, peer: int, ident: int, handle: str) -> _Import:
        cache = self._imports.setdefault(peer, collections.OrderedDict())
        got = cache.get(ident)
        if got is not None:
            cache.move_to_end(ident)
            return got
        head = json.loads(handle[len("HALIPC1:") :])
        dev = next((d for d in hal.devices(head["backend"]) if d.index == head["index"]), None)
        if dev is None:
            raise hal.CommError(
                f"rank {self.rank} has no device {head['backend']}:{head['index']} to map rank {peer}'s memory on"
            )
        buf = dev.import_handle(handle.encode())
        imp = _Import(buf, _host_view(buf.view(np.uint8)))
        cache[ident] = imp
        self.imported += 1
        while len(cache) > MAX_IMPORTS_PER_PEER:
            _, old = cache.popitem(last=False)
            old.host = None
            old.buffer.close()
        return imp

    def _drop(self, peer: int, idents: Sequence[int]) -> None:
        cache = self._imports.get(peer)
        for ident in idents:
            old = cache.pop(ident, None) if cache else None
            if old is not None:
                old.host = None
                old.buffer.close()

    def close(self) -> None:
        """Close every imported buffer (the communicator closes)."""
        for cache in self._imports.values():
            for imp in cache.values():
                imp.host = None
                imp.buffer.close()
        self._imports.clear()


# -- the wire ----------------------------------------------------------------------------------
def _pack(obj: dict[str, Any]) -> np.ndarray[Any, Any]:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    if len(raw) > CTRL_BYTES:
        raw = json.dumps(
            {"why": f"its handles take {len(raw)} bytes, more than {CTRL_BYTES}"}
        ).encode()
    out = np.zeros(CTRL_BYTES, dtype=np.uint8)
    out[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return out


def _unpack(buf: np.ndarray[Any, Any]) -> dict[str, Any]:
    raw = buf.tobytes().rstrip(b"\0")
    out: dict[str, Any] = json.loads(raw)
    return out


def _round(
    run: Run, to: Sequence[int], frm: Sequence[int], msg: np.ndarray[Any, Any]
) -> dict[int, Any]:
    """Send ``msg`` to ``to`` and receive one message like it from each of ``frm`` (one exchange)."""
    got = {p: np.zeros_like(msg) for p in frm}
    ctx = run.ctx
    chunk = ctx.chunk_bytes
    ctx.chunk_bytes = max(chunk, msg.nbytes)  # one piece per message
    try:
        run.exchange([Send(p, msg) for p in to], [Recv(p, got[p]) for p in frm])
    finally:
        ctx.chunk_bytes = chunk
    return got


def _flag(run: Run, to: Sequence[int], frm: Sequence[int], failed: str, stage: str) -> None:
    """A barrier carrying this rank's failure: raise if a peer failed (naming it)."""
    msg = np.zeros(256, dtype=np.uint8)
    raw = failed.encode()[:255]
    msg[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    got = _round(run, to, frm, msg)
    if failed:
        raise hal.CommError(
            f"ipc: rank {run.rank}: {failed}", op=run.ctx.collective, ranks=(run.rank,)
        )
    bad = {p: m.tobytes().rstrip(b"\0").decode(errors="replace") for p, m in got.items() if m.any()}
    if bad:
        raise hal.CommError(
            f"ipc: {stage}: "
            + "; ".join(f"rank {p} failed: {why}" for p, why in sorted(bad.items())),
            op=run.ctx.collective,
            ranks=tuple(sorted(bad)),
        )


# -- memory access ------------------------------------------------------------------------------
class _Ops:
    """Reads, copies and reductions over this rank's and the peers' arrays (host or device path)."""

    def __init__(self, run: Run, state: IpcState, host: bool) -> None:
        self.run = run
        self.state = state
        self.host = host

    def view(self, arr: hal.Array) -> Any:
        if not self.host:
            return arr
        v = _host_view(arr, self.state._views)
        assert v is not None
        return v.view(arr.dtype)

    def peer(self, imp: _Import | None, off: int, dtype: Any, count: int) -> Any:
        assert imp is not None  # None only for zero-size buffers, which are never read
        if self.host:
            assert imp.host is not None
            return imp.host[off : off + count * np.dtype(dtype).itemsize].view(dtype)
        return imp.buffer.view(dtype, count, offset=off)

    def seg(self, x: Any, start: int, n: int) -> Any:
        return x[start : start + n] if self.host else sub(x, start, n)

    def copy(self, dst: Any, src: Any) -> None:
        if self.host:
            np.copyto(dst, src)
        elif dst.size:
            hal.copy(dst, src, stream=self.run.stream)

    def reduce(self, out: Any, ins: list[Any], op: str) -> None:
        """``out = op(ins[0], ins[1], ...)`` in rank order (``out`` may be one of ``ins``)."""
        if not self.host:
            self._reduce_device(out, ins, op)
            return
        fn = _NP_OPS[op]
        n = out.size
        if n == 0:
            return
        if len(ins) == 1:
            np.copyto(out, ins[0])
            return
        alias = any(np.may_share_memory(out, x) for x in ins)
        blk = max(1, _BLOCK_BYTES // out.itemsize)
        tmp = np.empty(min(n, blk), dtype=out.dtype) if alias else None
        with np.errstate(
            all="ignore"
        ):  # float overflow to inf is the reduction's result, not an error
            for a in range(0, n, blk):
                b = min(n, a + blk)
                t = tmp[: b - a] if tmp is not None else out[a:b]
                fn(ins[0][a:b], ins[1][a:b], out=t)
                for x in ins[2:]:
                    fn(t, x[a:b], out=t)
                if tmp is not None:
                    out[a:b] = t

    def _reduce_device(self, out: hal.Array, ins: list[hal.Array], op: str) -> None:
        if out.size == 0:
            return
        run = self.run
        acc = run.temp(out.dtype, out.size)
        run.copy(acc, ins[0])
        tmp = run.temp(out.dtype, out.size) if len(ins) > 1 else None
        for x in ins[1:]:
            src = x
            if x.device != out.device:
                assert tmp is not None
                run.copy(tmp, x)
                src = tmp
            accumulate(acc, src, op, run.stream)
        run.copy(out, acc)

    def sync(self) -> None:
        self.run.stream.synchronize()


# -- the collectives ---------------------------------------------------------------------------
def run(engine: Engine, run_: Run, call: Call) -> Plan | None:
    """Run ``call`` on the IPC path; fall back to the slot algorithm if a rank cannot share its buffers.

    Returns the plan that ran when it differs from ``call.plan`` (the fallback), else None.
    """
    state: IpcState = engine.ipc
    r, p = engine.rank, engine.size
    coll = call.collective
    bufs: list[hal.Array] = []
    if coll == "all_reduce":
        assert call.send is not None and call.recv is not None
        bufs = [call.send] if call.recv is call.send else [call.send, call.recv]
        readers = everyone = [q for q in range(p) if q != r]
        sources = everyone
    elif coll == "all_gather":
        assert call.recv is not None
        part = call.send if call.send is not None else sub(call.recv, r * call.count, call.count)
        bufs = [part]
        readers = sources = [q for q in range(p) if q != r]
    elif coll == "reduce_scatter":
        assert call.send is not None
        bufs = [call.send]
        readers = sources = [q for q in range(p) if q != r]
    elif coll == "broadcast":
        assert call.send is not None
        root = call.root
        bufs = [call.send] if r == root else []
        readers = [q for q in range(p) if q != r] if r == root else []
        sources = [] if r == root else [root]
    else:  # pragma: no cover - the planner offers ipc for IPC_COLLECTIVES only
        raise hal.CommError(f"{coll} has no IPC path", op=coll)
    if call.plan.nbytes == 0:
        return None  # nothing to move (the engine still checks the signatures)
    if (
        p == 1
    ):  # one rank: the slot algorithms' local copies (none of them uses the algorithm name then)
        getattr(engine, "_do_" + coll)(run_, call)
        return None
    run_.stream.synchronize()  # this rank's inputs are in place before any peer reads them
    why = ""
    entries: list[list[Any]] = []
    for b in bufs:
        exp = state.export(b) if b.nbytes else (0, "")
        if isinstance(exp, str):
            why = (
                f"rank {r}'s {'send' if b is call.send else 'recv'} buffer cannot be shared: {exp}"
            )
            entries = []
            break
        entries.append([exp[0], b.offset, exp[1]])
    host = all(
        _host_view(b, state._views) is not None for b in (call.send, call.recv) if b is not None
    )
    # freed buffers' ids travel only in a message every peer gets (not a broadcast's non-root)
    gone = state._retire_closed() if len(readers) == p - 1 else []
    msg = _pack({"why": why, "e": entries, "gone": gone, "host": host})
    got = _round(run_, readers, sources, msg)
    ctrl = {q: _unpack(m) for q, m in got.items()}
    for q, c in ctrl.items():
        state._drop(q, c.get("gone") or ())
    whys = {q: str(c.get("why") or "") for q, c in ctrl.items()}
    whys[r] = why
    problems = [w for _, w in sorted(whys.items()) if w]
    if (
        problems
    ):  # every rank sees the statuses that matter, so every rank falls back (lowest rank's why)
        return _fallback(engine, run_, call, problems[0])
    if _TEST_HOOK is not None:
        _TEST_HOOK("mapped", r)
    ops = _Ops(run_, state, host and all(c.get("host", False) for c in ctrl.values()))
    failed = ""
    peers: dict[int, list[_Import | None]] = {}
    try:
        for q, c in ctrl.items():
            peers[q] = [state._open(q, int(e[0]), str(e[2])) if e[2] else None for e in c["e"]]
    except (hal.HalError, ValueError, KeyError) as exc:
        failed = f"cannot map the memory of its peers: {exc}"
    offs = {q: [int(e[1]) for e in c["e"]] for q, c in ctrl.items()}
    getattr(_Collectives, coll)(engine, ops, call, peers, offs, failed, readers, sources)
    return None


def _fallback(engine: Engine, run_: Run, call: Call, why: str) -> Plan:
    from hal.comm._plan import choose

    tr = engine.transport
    plan = call.plan
    alt = choose(
        call.collective,
        nbytes=plan.nbytes,
        ranks=engine.size,
        hosts=plan.hosts,
        transport=type(tr),
        chunk_bytes=plan.chunk_bytes,
        path=tr.path,
        override=None,
    )
    alt = dataclasses.replace(alt, seq=plan.seq, fallback=f"ipc: {why}")
    if getattr(tr, "engine", "python") != "python" and hasattr(alt, "engine"):
        alt = dataclasses.replace(alt, engine=tr.engine)  # as the communicator's planner marks it
    getattr(engine, "_do_" + call.collective)(run_, dataclasses.replace(call, plan=alt))
    return alt


def _segs(count: int, p: int) -> list[tuple[int, int]]:
    from hal.comm._algorithms import split

    return split(count, p)


class _Collectives:
    """The four IPC collectives; each gets the mapped peers (``peers[q][i]``: q's i-th buffer)."""

    @staticmethod
    def all_reduce(
        engine: Engine,
        ops: _Ops,
        call: Call,
        peers: dict[int, list[_Import | None]],
        offs: dict[int, list[int]],
        failed: str,
        readers: list[int],
        sources: list[int],
    ) -> None:
        assert call.send is not None and call.recv is not None
        r, p = engine.rank, engine.size
        dt, count = call.recv.dtype, call.recv.size
        segs = _segs(count, p)
        src, dst = ops.view(call.send), ops.view(call.recv)
        start, n = segs[r]
        if not failed:  # reduce-scatter: segment r from every rank's input, in rank order
            ins = [
                ops.seg(src, start, n)
                if q == r
                else ops.seg(ops.peer(peers[q][0], offs[q][0], dt, count), start, n)
                for q in range(p)
            ]
            ops.reduce(ops.seg(dst, start, n), ins, call.op)
            ops.sync()
        _flag(ops.run, readers, sources, failed, "after the reduce-scatter")
        if _TEST_HOOK is not None:
            _TEST_HOOK("gather", r)
        for q in sources:  # all-gather: segment q from rank q's output
            a, m = segs[q]
            k = len(peers[q]) - 1  # the output is the last buffer (the only one in place)
            ops.copy(
                ops.seg(dst, a, m), ops.seg(ops.peer(peers[q][k], offs[q][k], dt, count), a, m)
            )
        ops.sync()
        _done(engine, ops, readers, sources)
        engine._avg(call.recv, call)

    @staticmethod
    def all_gather(
        engine: Engine,
        ops: _Ops,
        call: Call,
        peers: dict[int, list[_Import | None]],
        offs: dict[int, list[int]],
        failed: str,
        readers: list[int],
        sources: list[int],
    ) -> None:
        assert call.recv is not None
        r, c, dt = engine.rank, call.count, call.recv.dtype
        out = ops.view(call.recv)
        if call.send is not None:
            ops.copy(ops.seg(out, r * c, c), ops.view(call.send))
        if not failed:
            for q in sources:
                ops.copy(ops.seg(out, q * c, c), ops.peer(peers[q][0], offs[q][0], dt, c))
        ops.sync()
        _done(engine, ops, readers, sources, failed)

    @staticmethod
    def reduce_scatter(
        engine: Engine,
        ops: _Ops,
        call: Call,
        peers: dict[int, list[_Import | None]],
        offs: dict[int, list[int]],
        failed: str,
        readers: list[int],
        sources: list[int],
    ) -> None:
        assert call.send is not None
        r, p = engine.rank, engine.size
        dt, count = call.send.dtype, call.send.size
        start, n = _segs(count, p)[r]
        src = ops.view(call.send)
        out_arr = call.recv if call.recv is not None else sub(call.send, start, n)
        if not failed:
            ins = [
                ops.seg(src, start, n)
                if q == r
                else ops.seg(ops.peer(peers[q][0], offs[q][0], dt, count), start, n)
                for q in range(p)
            ]
            ops.reduce(ops.view(out_arr), ins, call.op)
        ops.sync()
        _done(engine, ops, readers, sources, failed)
        engine._avg(out_arr, call)

    @staticmethod
    def broadcast(
        engine: Engine,
        ops: _Ops,
        call: Call,
        peers: dict[int, list[_Import | None]],
        offs: dict[int, list[int]],
        failed: str,
        readers: list[int],
        sources: list[int],
    ) -> None:
        assert call.send is not None
        r, root = engine.rank, call.root
        dt, count = call.send.dtype, call.send.size
        if r == root:
            if call.recv is not None:
                ops.copy(ops.view(call.recv), ops.view(call.send))
        elif not failed:
            out = call.recv if call.recv is not None else call.send
            ops.copy(ops.view(out), ops.peer(peers[root][0], offs[root][0], dt, count))
        ops.sync()
        _done(engine, ops, readers, sources, failed)


def _done(
    engine: Engine, ops: _Ops, readers: list[int], sources: list[int], failed: str = ""
) -> None:
    """Tell the ranks this one read from that it is done; wait until the ranks reading this one's memory are."""
    if _TEST_HOOK is not None:
        _TEST_HOOK("read", engine.rank)
    _flag(ops.run, sources, readers, failed, "while the peers read")
