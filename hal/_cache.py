"""The on-disk compile cache: one file per compiled program, LRU-evicted under a size cap.

Core owns it (public for plugins as ``hal.spi.compile_cache``) because more than hal.kernels
compiles native code into it: the CPU emulator's native runtime, hal.comm's native engine.
hal.kernels re-exports the user part (:func:`cache_info`, :func:`clear_cache` ...) and
supplies the settings in force (:class:`hal.kernels.KernelOptions`: code > environment), see
:func:`set_options_source`.

- ``HAL_CACHE_DIR``: the cache root (default ``$XDG_CACHE_HOME/hal-sdk`` or
  ``~/.cache/hal-sdk``); programs live in ``<root>/kernels/``.
- ``HAL_CACHE_MAX_BYTES``: the cap (bytes or ``512M``/``1G``; default 512 MiB; ``0``
  disables the on-disk cache). After each store the least recently used entries are
  removed until the total fits. A hit touches the entry (its mtime is the LRU clock).

The key is a SHA-256 over the translated source, the options, the backend, the device,
the compiler/driver identity the backend reports and the hal-sdk version. Entries are
written to a temporary file in the same directory, flushed to disk (``fsync``) and renamed
into place (atomic on POSIX), so concurrent processes never read a partial entry.

Nothing from disk is loaded unchecked (a cached library is ``dlopen``-ed: its constructors
run in this process). Before an entry's bytes are handed to the backend:

- the entry directory (``<root>/kernels``, created ``0700``) must be owned by this user and
  not group- or world-writable, else the disk cache is off for the process (one warning);
- the entry must be a regular file owned by this user, not group- or world-writable;
- its header must name the same key (so the compiler, flags and source it was built from)
  and the SHA-256 and size of the library bytes that follow.

Any mismatch (a planted, truncated, corrupted or swapped entry) is a :class:`hal.HalWarning`
naming the entry and the reason; the entry is removed and the program recompiled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hal._errors import HalWarning
from hal._settings import setting
from hal._version import __version__

__all__ = [
    "CacheInfo",
    "cache_dir",
    "cache_info",
    "cache_key",
    "clear_cache",
    "evict",
    "load",
    "max_bytes",
    "set_options_source",
    "store",
]


def _from_env() -> tuple[str | None, int | None]:
    return setting("HAL_CACHE_DIR") or None, setting("HAL_CACHE_MAX_BYTES")


#: Returns ``(cache_dir or None, max_bytes)`` in force: the environment, until hal.kernels
#: installs its options (``KernelOptions.cache_dir``/``cache_max_bytes``: code > environment).
_source: Callable[[], tuple[str | None, int | None]] = _from_env


def set_options_source(source: Callable[[], tuple[str | None, int | None]]) -> None:
    """Take the cache directory and cap from ``source()`` (``(dir or None, max_bytes)``) from now on."""
    global _source
    _source = source


_MAGIC = b"HALK2\n"
_OLD_MAGIC = b"HALK1\n"  # before digests: recompiled quietly
_SUFFIX = ".halk"
_lock = threading.Lock()
_refused_dirs: set[str] = set()


def cache_dir() -> Path:
    """Return the cache root (``KernelOptions.cache_dir``, ``HAL_CACHE_DIR``, or the user cache directory)."""
    env = _source()[0]
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "hal-sdk"


def _kernel_dir() -> Path:
    return cache_dir() / "kernels"


def max_bytes() -> int:
    """Return the cap (``KernelOptions.cache_max_bytes``, ``HAL_CACHE_MAX_BYTES``; default 512 MiB; 0: off).

    Raises:
        hal.ConfigError: (a ValueError) the variable is not a size in 0..1P.
    """
    return int(_source()[1] or 0)


def cache_key(
    *,
    source: str,
    options: Sequence[str],
    backend: str,
    device: str,
    compiler: Mapping[str, str],
) -> str:
    """Return the hex SHA-256 key of one compilation."""
    blob = json.dumps(
        {
            "source": source,
            "options": list(options),
            "backend": backend,
            "device": device,
            "compiler": dict(sorted(compiler.items())),
            "hal-sdk": __version__,
        },
        sort_keys=True,
    ).encode()
    return hashlib.sha256(blob).hexdigest()


def _path(key: str) -> Path:
    return _kernel_dir() / f"{key}{_SUFFIX}"


def _insecure(st: os.stat_result) -> str | None:
    """Return why a file or directory with status ``st`` cannot be trusted, or None."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _trusted_dir(create: bool) -> Path | None:
    """Return the entry directory if it can be trusted (creating it ``0700``), else None (warned once)."""
    folder = _kernel_dir()
    if create:
        try:
            if not folder.parent.exists():
                folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            return None
    try:
        st = os.stat(folder)
    except OSError:
        return None
    why = "not a directory" if not stat.S_ISDIR(st.st_mode) else _insecure(st)
    if why is None:
        return folder
    if str(folder) not in _refused_dirs:
        _refused_dirs.add(str(folder))
        warnings.warn(
            f"compile cache directory {folder} refused: {why}; the disk cache is off "
            "(chmod go-w / chown it, or set HAL_CACHE_DIR to a private directory)",
            HalWarning,
            stacklevel=4,
        )
    return None


def _refuse(path: Path, key: str, why: str) -> None:
    warnings.warn(
        f"compile cache entry {path.name} refused: {why}; removed and recompiled",
        HalWarning,
        stacklevel=4,
    )
    _unlink(path)


def _header(key: str, binary: bytes, meta: Mapping[str, Any]) -> bytes:
    head = {
        **dict(meta),
        "key": key,
        "sha256": hashlib.sha256(binary).hexdigest(),
        "size": len(binary),
    }
    return json.dumps(head, sort_keys=True, default=str).encode().replace(b"\n", b" ")


def load(key: str) -> bytes | None:
    """Return the verified cached binary for ``key`` (touching it), or None on a miss or a refused entry.

    An entry is refused (:class:`hal.HalWarning`, removed, so the caller recompiles) when it
    is not a regular file owned by this user and private to it, is larger than the cap, or
    its header does not match ``key`` and the SHA-256 and size of the bytes that follow.
    """
    cap = max_bytes()
    if cap == 0:
        return None
    folder = _trusted_dir(create=False)
    if folder is None:
        return None
    path = folder / f"{key}{_SUFFIX}"
    try:  # O_NONBLOCK: a FIFO planted under the key cannot hang the open; O_NOFOLLOW: no symlink
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _refuse(path, key, f"cannot be opened ({exc.strerror or exc})")
        return None
    try:
        st = os.fstat(fd)
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else _insecure(st)
        if why is None and st.st_size > cap + 65536:
            why = f"{st.st_size} bytes, larger than HAL_CACHE_MAX_BYTES={cap}"
        if why is not None:
            _refuse(path, key, why)
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read()
    finally:
        os.close(fd)
    if data.startswith(_OLD_MAGIC):
        _unlink(path)  # an entry of an older hal-sdk, without a digest: rebuilt quietly
        return None
    nl = data.find(b"\n", len(_MAGIC))
    if not data.startswith(_MAGIC) or nl < 0:
        _refuse(path, key, "not a hal compile-cache entry (bad magic or header)")
        return None
    try:
        head = json.loads(data[len(_MAGIC) : nl])
    except ValueError:
        head = None
    if not isinstance(head, dict):
        _refuse(path, key, "its header is not valid JSON")
        return None
    binary = data[nl + 1 :]
    if head.get("key") != key:
        _refuse(
            path,
            key,
            f"it was built for key {str(head.get('key'))[:16]}..., not this one (compiler, flags or source differ)",
        )
        return None
    if head.get("size") != len(binary):
        _refuse(
            path,
            key,
            f"truncated or padded: {len(binary)} bytes, the header says {head.get('size')}",
        )
        return None
    if head.get("sha256") != hashlib.sha256(binary).hexdigest():
        _refuse(path, key, "its SHA-256 does not match the header (corrupted or altered)")
        return None
    try:
        os.utime(path)
    except OSError:
        pass
    return binary


def store(key: str, binary: bytes, meta: Mapping[str, Any]) -> bool:
    """Write ``binary`` under ``key`` atomically and durably, then evict down to the cap. Return True if kept."""
    cap = max_bytes()
    if cap == 0:
        return False
    folder = _trusted_dir(create=True)
    if folder is None:
        return False
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=_SUFFIX, dir=folder)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(_MAGIC + _header(key, binary, meta) + b"\n" + binary)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, _path(key))
        except BaseException:
            _unlink(Path(tmp))
            raise
        try:  # make the rename durable too
            dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass
    except OSError:
        return False  # an unwritable cache is not an error: the program is still compiled
    evict(cap)
    return _path(key).exists()


def _entries() -> list[tuple[Path, os.stat_result]]:
    out = []
    try:
        it = list(_kernel_dir().iterdir())
    except OSError:
        return []
    for p in it:
        if p.suffix != _SUFFIX or p.name.startswith(".tmp-"):
            continue
        try:
            out.append((p, p.stat()))
        except OSError:
            continue
    return out


def evict(cap: int | None = None) -> list[str]:
    """Remove least recently used entries until the cache fits ``cap``; return removed keys."""
    limit = max_bytes() if cap is None else cap
    removed: list[str] = []
    with _lock:
        entries = sorted(_entries(), key=lambda e: (e[1].st_mtime_ns, e[0].name))
        total = sum(st.st_size for _, st in entries)
        for path, st in entries:
            if total <= limit:
                break
            if _unlink(path):
                removed.append(path.stem)
            total -= st.st_size
    return removed


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """What ``hal cache info`` reports.

    Attributes:
        path: the directory holding the entries.
        entries: number of cached programs; ``bytes`` their total size.
        max_bytes: the cap (``HAL_CACHE_MAX_BYTES``).
        items: per entry: key, bytes, last use (unix time), backend, device, kernels.
    """

    path: str
    entries: int
    bytes: int
    max_bytes: int
    items: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict."""
        return dataclasses.asdict(self)


def _meta(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_MAGIC))
            line = fh.readline(65536)
        if head != _MAGIC:
            return {}
        value = json.loads(line)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def cache_info() -> CacheInfo:
    """Describe the cache: location, entries, total bytes, cap, and each entry (most recent first)."""
    entries = sorted(_entries(), key=lambda e: -e[1].st_mtime_ns)
    items = []
    for path, st in entries:
        meta = _meta(path)
        items.append(
            {
                "key": path.stem,
                "bytes": st.st_size,
                "last_used": st.st_mtime,
                "backend": meta.get("backend"),
                "device": meta.get("device"),
                "kernels": meta.get("kernels", []),
            }
        )
    return CacheInfo(
        path=str(_kernel_dir()),
        entries=len(items),
        bytes=sum(i["bytes"] for i in items),
        max_bytes=max_bytes(),
        items=items,
    )


def clear_cache() -> int:
    """Remove every entry (and stale temporary files); return how many entries were removed."""
    n = 0
    with _lock:
        try:
            paths = list(_kernel_dir().iterdir())
        except OSError:
            return 0
        for p in paths:
            if p.suffix == _SUFFIX and _unlink(p) and not p.name.startswith(".tmp-"):
                n += 1
    return n
