"""Environment settings of hal.comm (``HAL_COMM_*``), parsed once per communicator."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Mapping
from typing import Any

import hal
from hal.comm._options import CommOptions
from hal.spi import parse_size as _parse_size

__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "INIT_TIMEOUT_S",
    "IPC_COLLECTIVES",
    "Config",
    "job_secret",
    "parse_algo",
    "parse_size",
]

#: Algorithms each collective can run (the first is the fallback when nothing else applies).
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "recursive_doubling", "rabenseifner", "hierarchical"),
    "all_gather": ("ring", "recursive_doubling"),
    "reduce_scatter": ("ring",),
    "broadcast": ("tree", "scatter_allgather"),
    "reduce": ("tree", "reduce_scatter_gather"),
    "all_to_all": ("pairwise",),
    "barrier": ("all_to_all",),
    "send": ("direct",),
    "recv": ("direct",),
}
COLLECTIVES = tuple(ALGORITHMS)
#: Collectives the direct intra-host path (``ipc``, hal.comm._ipc) runs; ``HAL_COMM_ALGO`` may name it for them.
IPC_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
#: the least rendezvous timeout by default (seconds): ``HAL_COMM_INIT_TIMEOUT_MS`` unset, a
#: rendezvous waits the larger of this and the collective timeout (``HAL_COMM_TIMEOUT_MS``)
INIT_TIMEOUT_S = 60.0


def parse_size(text: str, name: str) -> int:
    """Parse ``"4K"``, ``"256M"``, ``"1048576"``, ``"64KiB"`` into bytes; raise ValueError naming ``name``.

    hal's one size parser (:func:`hal.spi.parse_size`); errors are :class:`hal.ConfigError`.
    """
    return _parse_size(text, name)


def _secret_error(variable: str, value: str, message: str) -> hal.ConfigError:
    """A :class:`hal.ConfigError` of a secret setting whose text is ``message`` (it never holds the secret)."""
    err = hal.ConfigError(
        variable,
        value,
        "HAL_COMM_SECRET (a non-empty secret) or HAL_COMM_SECRET_FILE (a regular file of this user's, mode 0600)",
    )
    err.args = (message,)
    return err


def job_secret(env: Mapping[str, str] | None = None) -> bytes | None:
    """Return the job's secret from ``HAL_COMM_SECRET`` or ``HAL_COMM_SECRET_FILE`` (None: neither set).

    ``HAL_COMM_SECRET`` is the secret itself (its UTF-8 bytes); ``HAL_COMM_SECRET_FILE`` names a
    file holding it (trailing newlines stripped), which must be a regular file owned by this user
    and readable by nobody else (``chmod 600``). ``hal run`` sets ``HAL_COMM_SECRET`` to a fresh
    random value for its ranks.

    Raises:
        hal.ConfigError: (a ``ValueError``) both are set, the secret is empty, or the file is
            missing, unreadable, not this user's or readable by others (the message names the
            variable and the path, never the secret).
    """
    e = os.environ if env is None else env
    text, path = e.get("HAL_COMM_SECRET"), e.get("HAL_COMM_SECRET_FILE")
    if text is not None and path is not None:
        raise _secret_error(
            "HAL_COMM_SECRET_FILE",
            path,
            "HAL_COMM_SECRET and HAL_COMM_SECRET_FILE are both set; set only one of them",
        )
    if text is not None:
        if not text.strip():
            raise _secret_error(
                "HAL_COMM_SECRET",
                text,
                "HAL_COMM_SECRET is set but empty; unset it or give a secret (e.g. 64 hex digits)",
            )
        return text.encode()
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise _secret_error(
            "HAL_COMM_SECRET_FILE",
            path,
            f"HAL_COMM_SECRET_FILE={path!r} cannot be read: {exc.strerror}",
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _secret_error(
                "HAL_COMM_SECRET_FILE", path, f"HAL_COMM_SECRET_FILE={path!r} is not a regular file"
            )
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            raise _secret_error(
                "HAL_COMM_SECRET_FILE",
                path,
                f"HAL_COMM_SECRET_FILE={path!r} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})",
            )
        if st.st_mode & 0o077:
            raise _secret_error(
                "HAL_COMM_SECRET_FILE",
                path,
                f"HAL_COMM_SECRET_FILE={path!r} is accessible to others (mode {stat.S_IMODE(st.st_mode):04o}); "
                "make it owner-only: chmod 600",
            )
        data = os.read(fd, 1 << 16).rstrip(b"\r\n")
    finally:
        os.close(fd)
    if not data.strip():
        raise _secret_error("HAL_COMM_SECRET_FILE", path, f"HAL_COMM_SECRET_FILE={path!r} is empty")
    return data


def _canonical(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    aliases = {
        "allreduce": "all_reduce",
        "allgather": "all_gather",
        "reducescatter": "reduce_scatter",
        "alltoall": "all_to_all",
        "bcast": "broadcast",
    }
    return aliases.get(key, key)


def parse_algo(text: str | None) -> dict[str, str]:
    """Parse ``HAL_COMM_ALGO`` (``"allreduce:ring,broadcast:tree"``) into ``{collective: algorithm}``."""
    out: dict[str, str] = {}
    if not text or not text.strip():
        return out
    for part in text.split(","):
        if not part.strip():
            continue
        if ":" not in part:
            raise ValueError(
                f"HAL_COMM_ALGO entry {part.strip()!r} must be COLLECTIVE:ALGORITHM (e.g. allreduce:ring)"
            )
        coll, algo = (s.strip() for s in part.split(":", 1))
        c = _canonical(coll)
        if c not in ALGORITHMS:
            raise ValueError(
                f"HAL_COMM_ALGO names unknown collective {coll!r}; known: {', '.join(COLLECTIVES)}"
            )
        a = algo.lower().replace("-", "_")
        if a not in ALGORITHMS[c] and not (a == "ipc" and c in IPC_COLLECTIVES):
            known = ALGORITHMS[c] + (("ipc",) if c in IPC_COLLECTIVES else ())
            raise ValueError(
                f"HAL_COMM_ALGO={text!r}: {c} has no algorithm {algo!r}; choose one of {', '.join(known)}"
            )
        out[c] = a
    return out


@dataclasses.dataclass(frozen=True)
class Config:
    """The settings of one communicator, resolved from :class:`hal.comm.CommOptions`."""

    #: progress timeout of every collective and point-to-point call after init
    timeout_s: float = 600.0
    algo: dict[str, str] = dataclasses.field(default_factory=dict)
    transport: str | None = None
    inline_bytes: int = 64 << 10
    #: whether ``inline_bytes`` was given (``HAL_COMM_INLINE_BYTES``, ``CommOptions.inline_bytes``);
    #: if not, a transport's own ``inline_bytes`` may raise it (the native shm engine's)
    inline_given: bool = False
    provider: str | None = None
    #: where ``provider`` came from, for messages: ``CommOptions.provider`` or ``HAL_COMM_PROVIDER``
    provider_from: str = "HAL_COMM_PROVIDER"
    #: the rendezvous timeout as given (``CommOptions.init_timeout_ms`` / ``HAL_COMM_INIT_TIMEOUT_MS``,
    #: in seconds); None: derived from ``timeout_s`` (see :attr:`init_timeout_s`)
    init_timeout_given_s: float | None = None

    @property
    def init_timeout_s(self) -> float:
        """Seconds every wait of the rendezvous and the transport's set-up may take.

        ``HAL_COMM_INIT_TIMEOUT_MS`` when given, else the larger of :data:`INIT_TIMEOUT_S` and
        :attr:`timeout_s`: ranks that start seconds apart still meet when the collective
        timeout is short.
        """
        given = self.init_timeout_given_s
        return given if given is not None else max(INIT_TIMEOUT_S, self.timeout_s)

    @classmethod
    def from_options(cls, options: CommOptions | None = None) -> Config:
        """Resolve ``options`` (code > environment > default) and check every field.

        Raises:
            hal.ConfigError: a value does not fit (named ``CommOptions.field`` or by its variable).
            ValueError: ``algo`` names an unknown collective or algorithm.
            TypeError: ``options`` is not a :class:`hal.comm.CommOptions`.
        """
        if options is None:
            options = CommOptions()
        if not isinstance(options, CommOptions):
            raise TypeError(f"options={options!r} is not a hal.comm.CommOptions")
        # the same options and variables resolve to the same Config (a communicator built per
        # sub-group pays this once): the key holds every field with its type, and the variables
        key: tuple[Any, ...] = tuple(
            (type(v), v) for v in (getattr(options, f) for f in _OPTION_FIELDS)
        )
        key += tuple(os.environ.get(v) for v in _OPTION_VARIABLES)
        try:
            hit = _RESOLVED.get(key)
        except TypeError:  # a value that is not hashable: resolved() says what is wrong with it
            return cls._resolve(options)
        if hit is None:
            hit = cls._resolve(options)
            if len(_RESOLVED) >= 64:
                _RESOLVED.clear()
            _RESOLVED[key] = hit
        return hit

    @classmethod
    def _resolve(cls, options: CommOptions) -> Config:
        """Resolve and check ``options`` (what :meth:`from_options` caches)."""
        opts = options.resolved()  # bounded, finite (hal.ConfigError)
        timeout_ms = opts.timeout_ms
        algo = opts.algo
        return cls(
            timeout_s=(float(timeout_ms) / 1e3) if timeout_ms else 600.0,
            algo=parse_algo(str(algo) if algo else None),
            transport=opts.transport or None,
            inline_bytes=int(opts.inline_bytes if opts.inline_bytes is not None else 64 << 10),
            inline_given=options.inline_bytes is not None or "HAL_COMM_INLINE_BYTES" in os.environ,
            provider=(str(opts.provider).strip().lower() or None) if opts.provider else None,
            provider_from="CommOptions.provider" if options.provider else "HAL_COMM_PROVIDER",
            init_timeout_given_s=(
                float(opts.init_timeout_ms) / 1e3 if opts.init_timeout_ms is not None else None
            ),
        )

    @classmethod
    def from_env(
        cls,
        *,
        timeout_ms: float | None = None,
        transport: str | None = None,
        options: CommOptions | None = None,
        init_timeout_ms: float | None = None,
    ) -> Config:
        """:meth:`from_options`, with ``timeout_ms``, ``transport`` and ``init_timeout_ms`` given as
        keywords (they win)."""
        opts = CommOptions() if options is None else options
        if not isinstance(opts, CommOptions):
            raise TypeError(f"options={opts!r} is not a hal.comm.CommOptions")
        keywords = (
            ("timeout_ms", timeout_ms),
            ("transport", transport),
            ("init_timeout_ms", init_timeout_ms),
        )
        given: dict[str, Any] = {k: v for k, v in keywords if v is not None}
        return cls.from_options(dataclasses.replace(opts, **given) if given else opts)


#: the fields of CommOptions and their variables (the key of :data:`_RESOLVED`)
_OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(CommOptions))
_OPTION_VARIABLES = tuple(CommOptions.variables().values())
#: Config.from_options's results by options and variables (the Config is frozen and never changed)
_RESOLVED: dict[tuple[Any, ...], Config] = {}
hal.runtime().register_cache("hal.comm.config", _RESOLVED.clear)
