"""Rendezvous through a torch.distributed key-value store (torchrun's, or the one torch hands a backend).

Under ``torchrun`` the elastic agent already serves a ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``
(``TORCHELASTIC_USE_AGENT_STORE=True``): :class:`TorchStoreBootstrap` connects to it as a client,
so hal never binds that port. The same class serves :mod:`hal.torch`, whose backend creator
receives the process group's (already prefixed) store from ``init_process_group``.

An ``allgather`` round is one ``set`` of this rank's JSON value under
``<prefix>/<round>/<rank>`` and one ``multi_get`` of every rank's key; each rank deletes its
key of round ``n - 1`` once round ``n`` completed (every rank has read it by then).

The shared secret (:attr:`TorchStoreBootstrap.secret`, which the transports' hellos prove):
``HAL_COMM_SECRET`` / ``HAL_COMM_SECRET_FILE`` when set (never written to the store); otherwise
rank 0 draws ``secrets.token_bytes(32)`` and publishes it as ``<prefix>/secret`` for the others.
That protection is only as good as torchrun's store, which anyone who can reach
``MASTER_ADDR:MASTER_PORT`` can read.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from datetime import timedelta
from typing import Any

import hal
from hal.comm._auth import Keys
from hal.comm._bootstrap import Bootstrap
from hal.comm._config import job_secret

__all__ = ["TorchStoreBootstrap", "torchrun_store", "under_torchrun"]

_stores: dict[tuple[str, int], Any] = {}
_generations: dict[tuple[str, int], int] = {}
_lock = threading.Lock()


def under_torchrun(env: dict[str, str]) -> bool:
    """True when ``env`` was set by torchrun's elastic agent (``TORCHELASTIC_RUN_ID`` and friends)."""
    return "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env


def _import_torch_distributed() -> Any:
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise hal.CommError(
            "this process runs under torchrun (TORCHELASTIC_* is set): hal.comm rendezvous goes through "
            f"torchrun's TCPStore, which needs torch importable ({exc}); pip install 'hal-sdk[torch]'",
            op="init",
        ) from exc
    if not dist.is_available():
        raise hal.CommError("torch.distributed is not available in this torch build", op="init")
    return dist


def torchrun_store(
    addr: str, port: int, rank: int, size: int, timeout_s: float, *, agent: bool
) -> Any:
    """Return a client of torchrun's store at ``addr:port`` (one per process, cached).

    ``agent`` (``TORCHELASTIC_USE_AGENT_STORE=True``, torchrun's default) means the elastic agent
    serves the store: every rank is a client. Otherwise rank 0 serves it, as torch's ``env://``.
    """
    dist = _import_torch_distributed()
    with _lock:
        store = _stores.get((addr, port))
        if store is not None:
            return store
        try:
            store = dist.TCPStore(
                addr,
                port,
                None if agent else size,
                not agent and rank == 0,
                timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
        except (RuntimeError, OSError) as exc:
            raise hal.CommError(
                f"rank {rank}: cannot reach torchrun's store at {addr}:{port} within {timeout_s:.0f} s "
                f"(HAL_COMM_INIT_TIMEOUT_MS): {exc}",
                op="init",
                ranks=(0,) if not agent else (),
            ) from exc
        _stores[(addr, port)] = store
        return store


def next_prefix(addr: str, port: int) -> str:
    """Key prefix of this process's next communicator on torchrun's store at ``addr:port``.

    The n-th ``hal.comm.init`` of each rank meets the n-th of the others (as with hal's own
    server); ``TORCHELASTIC_RESTART_COUNT`` keeps a restarted job off the keys of the last attempt.
    """
    with _lock:
        gen = _generations.get((addr, port), 0)
        _generations[(addr, port)] = gen + 1
    return f"hal.comm/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{gen}"


def _source_address(addr: str, port: int) -> str:
    """This host's address on the route to ``addr`` (a UDP ``connect`` sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, port))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


class TorchStoreBootstrap(Bootstrap):
    """Rendezvous over a ``torch.distributed.Store`` (``set``/``multi_get`` under ``prefix``).

    Args:
        store: a ``torch.distributed.Store`` every rank reaches (torchrun's ``TCPStore``, a
            process group's ``PrefixStore``).
        rank, size: this rank and the number of ranks meeting under ``prefix``.
        timeout_s: how long a round waits for the others before raising ``hal.CommError``
            naming the ranks that never arrived (the init timeout, ``HAL_COMM_INIT_TIMEOUT_MS``).
        prefix: keys of this communicator; every rank passes the same, no other communicator uses it.
        address: the address of this host that the other ranks should use (default: the source
            address of the route to ``route_to``, else ``127.0.0.1``).
        route_to: ``(host, port)`` of the store, to find ``address``.
    """

    secret: bytes | None
    local_address: str

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout_s: float,
        prefix: str,
        *,
        address: str | None = None,
        route_to: tuple[str, int] | None = None,
    ) -> None:
        self.rank = rank
        self.size = size
        self._store = store
        self._timeout_s = timeout_s
        self._prefix = prefix
        self._round = 0
        self.local_address = address or (_source_address(*route_to) if route_to else "127.0.0.1")
        own = job_secret()
        # with the job's own secret every value carries a MAC: a rank of another secret, or a stranger
        # writing into torchrun's store, is refused by name (without it the store holds the secret)
        self._keys = Keys(own) if own is not None else None
        if (
            own is not None
        ):  # HAL_COMM_SECRET(_FILE): every rank holds it already; never put it in the store
            self.secret = own
            return
        key = f"{prefix}/secret"
        if rank == 0:
            self._call("publish the secret", store.set, key, secrets.token_hex(32))
        self._wait([key], "secret")
        self.secret = bytes.fromhex(self._call("read the secret", store.get, key).decode())

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (RuntimeError, OSError) as exc:  # DistStoreError/DistNetworkError are RuntimeErrors
            raise hal.CommError(
                f"rank {self.rank}: rendezvous failed ({what}) on the torch store: {exc}", op="init"
            ) from exc

    def _wait(self, keys: list[str], what: str) -> None:
        deadline = time.monotonic() + self._timeout_s
        try:
            self._store.wait(keys, timedelta(seconds=self._timeout_s))
            return
        except (RuntimeError, OSError) as exc:
            if time.monotonic() < deadline - 0.5 and "timeout" not in str(exc).lower():
                raise hal.CommError(
                    f"rank {self.rank}: rendezvous failed ({what}) on the torch store: {exc}",
                    op="init",
                ) from exc
        missing = (
            tuple(r for r, k in enumerate(keys) if not self._check(k)) if what != "secret" else (0,)
        )
        earlier = self._gave_up()
        try:  # tell the ranks still waiting that this one is gone, and what it waited for
            note = json.dumps({"what": what, "missing": list(missing)})
            if self._keys is not None:  # signed with the job's secret, as the round values are
                note = self._signed(b"gaveup", self.rank, note)
            self._store.set(f"{self._prefix}/gaveup/{self.rank}", note)
        except (RuntimeError, OSError):
            pass
        if what == "secret":  # rank 0 publishes one only when it has none of its own
            earlier += (
                " (or rank 0 has HAL_COMM_SECRET / HAL_COMM_SECRET_FILE and this rank has not: "
                "set it on every rank)"
            )
        raise hal.CommError(
            f"rank {self.rank}: rendezvous timed out after {self._timeout_s:.1f} s (HAL_COMM_INIT_TIMEOUT_MS) "
            f"waiting for {what}; rank(s) {', '.join(map(str, missing))} never arrived{earlier}",
            op="init",
            ranks=missing,
        )

    def _gave_up(self) -> str:
        """Say which other ranks gave up before this one, and what they waited for ("" if none).

        A rank that arrives after another gave up finds that rank's keys of the later rounds
        missing: without this it would blame the rank that was on time. With the job's own secret
        (``HAL_COMM_SECRET`` / ``_FILE``) a note must carry its MAC, else it is reported as not
        believed; without one the note is unsigned (anyone who reaches torchrun's store can write
        it), and the message says so.
        """
        notes = []
        for r in range(self.size):
            key = f"{self._prefix}/gaveup/{r}"
            if r == self.rank or not self._check(key):
                continue
            try:
                raw = bytes(self._store.get(key))
            except (RuntimeError, OSError):
                notes.append(f"rank {r} gave up first")
                continue
            signed = ""
            if self._keys is not None:
                inner = self._unwrap(b"gaveup", r, raw)
                if inner is None:
                    notes.append(
                        f"a note in torchrun's store ({key}) says rank {r} gave up first, but it carries "
                        "no valid MAC of this job's secret: not believed (a stranger, or a rank of "
                        "another HAL_COMM_SECRET, wrote it)"
                    )
                    continue
                raw = inner
            else:
                signed = (
                    ", by an unsigned note in torchrun's store (no HAL_COMM_SECRET: anyone who reaches "
                    "MASTER_ADDR:MASTER_PORT could have written it; set HAL_COMM_SECRET on every rank "
                    "for signed notes)"
                )
            try:
                info = json.loads(raw)
                waited = ", ".join(str(int(m)) for m in info["missing"])
                notes.append(
                    f"rank {r} gave up first{signed}: its init timed out waiting for "
                    f"{str(info['what'])[:40]} (for rank(s) {waited})"
                )
            except (ValueError, RecursionError, TypeError, KeyError):
                notes.append(f"rank {r} gave up first{signed}")
        return f" ({'; '.join(notes)})" if notes else ""

    def _check(self, key: str) -> bool:
        try:
            return bool(self._store.check([key]))
        except (RuntimeError, OSError):
            return False

    def allgather(self, value: Any) -> list[Any]:
        """Return every rank's ``value``, in rank order (through the store)."""
        rnd = self._round
        self._round += 1
        keys = [f"{self._prefix}/{rnd}/{r}" for r in range(self.size)]
        data = json.dumps(value)
        if self._keys is not None:
            data = self._signed(b"%d" % rnd, self.rank, data)
        self._call(f"round {rnd}", self._store.set, keys[self.rank], data)
        self._wait(keys, f"round {rnd}")
        raw = self._call(f"round {rnd}", self._store.multi_get, keys)
        if rnd:  # every rank read round rnd - 1 before it wrote round rnd
            try:
                self._store.delete_key(f"{self._prefix}/{rnd - 1}/{self.rank}")
            except (RuntimeError, OSError):
                pass
        return [self._parse(keys[r], r, rnd, bytes(v), value) for r, v in enumerate(raw)]

    def _parts(self, tag: bytes, rank: int, data: str) -> tuple[bytes, ...]:
        """What the MAC of rank ``rank``'s ``data`` covers; ``tag``: its round's number, or
        ``b"gaveup"`` for its gave-up note."""
        return (self._prefix.encode(), tag, b"%d" % rank, data.encode())

    def _signed(self, tag: bytes, rank: int, data: str) -> str:
        """``data`` in an envelope with its MAC (purpose ``rdzv-store``, parts :meth:`_parts`)."""
        assert self._keys is not None
        mac = self._keys.mac("rdzv-store", *self._parts(tag, rank, data))
        return json.dumps({"v": data, "mac": mac.hex()})

    def _unwrap(self, tag: bytes, rank: int, raw: bytes) -> bytes | None:
        """The value inside rank ``rank``'s MAC'd envelope; None when it carries no MAC of this job's."""
        assert self._keys is not None
        try:
            env = json.loads(raw)
            data, mac = env["v"], bytes.fromhex(env["mac"])
        except (ValueError, RecursionError, TypeError, KeyError):
            return None
        if not isinstance(data, str):
            return None
        ok = self._keys.verify("rdzv-store", mac, *self._parts(tag, rank, data))
        return data.encode() if ok else None

    def _parse(self, key: str, rank: int, rnd: int, raw: bytes, mine: Any) -> Any:
        """Decode rank ``rank``'s value; ``hal.CommError`` unless it has the shape of this rank's own.

        The store is not authenticated: anyone who reaches it can write these keys, and what they
        write must end ``init`` with a clear error, never a raw ``JSONDecodeError``/``KeyError``.
        With the job's own secret, a value must also carry its MAC.
        """
        why: str | None = None
        value: Any = None
        inner = raw if self._keys is None else self._unwrap(b"%d" % rnd, rank, raw)
        if inner is None:
            why = (
                "carries no valid MAC of this job's secret: HAL_COMM_SECRET / HAL_COMM_SECRET_FILE differ "
                "between the ranks (or their hal-sdk versions do), or a stranger wrote it"
            )
        else:
            try:
                value = json.loads(inner)
            except (ValueError, RecursionError):  # RecursionError: nested too deep for the decoder
                why = f"is not JSON ({inner[:40]!r})"
        if why is None and isinstance(mine, dict):  # a table: an object with this rank's keys
            if not isinstance(value, dict):
                why = f"is a JSON {type(value).__name__}, not an object like this rank's"
            elif not set(mine) <= set(value):
                missing = sorted(set(mine) - set(value))
                why = (
                    f"lacks the key(s) {', '.join(missing)} (its versions: {value.get('versions', '?')!r}: "
                    "a different hal-sdk?)"
                )
        if why is not None:
            hint = (
                ""
                if inner is None
                else "; only hal ranks of this job should write there - is something else using "
                "torchrun's store (MASTER_ADDR:MASTER_PORT)?"
            )
            raise hal.CommError(
                f"rank {self.rank}: rendezvous failed: the value of rank {rank} on the torch store "
                f"(key {key}) {why}{hint}",
                op="init",
                ranks=(rank,),
            )
        return value
