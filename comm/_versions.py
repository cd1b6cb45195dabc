"""Version agreement across ranks: every rank says what it runs; a mismatch that matters stops init.

At :func:`hal.comm.init` every rank sends its versions table (:func:`collect`) with the rest of
its init record; :func:`check` compares the tables. Mismatched libraries across machines are a
classic cause of collectives that hang or corrupt data, so a mismatch that matters is a
:class:`hal.CommError` naming the ranks, the package and each version in plain text:

- ``hal-sdk`` major.minor, the ``hal API`` (SPI) version;
- the library of the transport or provider in use (``MPI library`` under mpiexec or with the mpi
  transport, ``nccl`` on CUDA devices, ``ucx`` with the ucx transport);
- ``numpy`` major; ``mpi4py`` major;
- a plugin this rank uses (its backend drives the rank's device, or it provides the transport)
  whose major.minor differs.

Anything else that differs (patch versions, ``torch``, plugins not used) is a
:class:`hal.HalWarning`, given once per process. ``hal doctor`` prints the same table.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import hal

__all__ = ["check", "collect", "format_table", "group_ranks"]

#: Packages whose every difference is an error (their exact version must agree).
_EXACT = ("hal API", "MPI library", "nccl", "ucx")
_warned: set[str] = set()


def _dist_version(*names: str) -> str | None:
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return None


def _mpi_library() -> tuple[str | None, str | None]:
    try:
        import mpi4py
        from mpi4py import MPI
    except ImportError:
        return None, None
    text = MPI.Get_library_version().strip().splitlines()
    first = " ".join(text[0].split()) if text else "unknown"
    return first, str(mpi4py.__version__)


def _nccl() -> str | None:
    """NCCL's version through CuPy's bindings, else the nvidia-nccl wheel's, else None."""
    try:
        from cupy.cuda import nccl  # type: ignore[import-not-found,import-untyped,unused-ignore]

        v = int(nccl.get_version())
        return (
            f"{v // 10000}.{v // 100 % 100}.{v % 100}"
            if v >= 10000
            else f"{v // 1000}.{v // 100 % 10}.{v % 100}"
        )
    except Exception:  # noqa: BLE001 - no CuPy, no libnccl: fall back to the wheel's metadata
        return _dist_version("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


def collect(
    *,
    transport: str | None = None,
    launcher: str = "none",
    device: hal.Device | None = None,
    transport_owner: str | None = None,
    provider_owners: Sequence[str] = (),
) -> dict[str, Any]:
    """Return this rank's versions table: ``{"versions": {package: version}, "used": [package, ...]}``.

    ``transport`` is the transport this rank asks for (None: chosen later), ``launcher`` the
    launcher (``mpi`` adds the MPI library), ``device`` the rank's device (a CUDA device adds
    NCCL), ``transport_owner`` the plugin that registered the transport, ``provider_owners`` the
    plugins whose collective providers this rank can use (each is "used").
    """
    import numpy as np

    v: dict[str, str] = {
        "hal-sdk": hal.__version__,
        "hal API": ".".join(map(str, hal.API_VERSION)),
        "python": ".".join(map(str, sys.version_info[:3])),
        "numpy": np.__version__,
    }
    used = ["hal-sdk", "hal API", "numpy"]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(getattr(torch, "__version__", None), str):
        v["torch"] = str(torch.__version__)
    if launcher == "mpi" or transport == "mpi":
        lib, binding = _mpi_library()
        if lib is not None and binding is not None:
            v["MPI library"], v["mpi4py"] = lib, binding
            used += ["MPI library", "mpi4py"]
    backend = device.backend if device is not None else None
    if backend == "cuda":
        nccl = _nccl()
        if nccl is not None:
            v["nccl"] = nccl
            used.append("nccl")
    if transport == "ucx":
        from hal.comm._ucx import ucx_version

        # the UCX library the binding loaded; else what the wheels say
        ucx = ucx_version() or _dist_version(
            "libucx-cu13", "libucx-cu12", "libucx", "ucxx-cu12", "ucx-py-cu12"
        )
        if ucx is not None:
            v["ucx"] = ucx
            used.append("ucx")
    try:
        from hal.plugins import get_system

        for rec in get_system().plugins:
            if rec.status != "loaded" or (rec.dist or "").lower() in ("hal-sdk", "hal_sdk"):
                continue  # the built-in plugins are hal-sdk itself
            key = f"plugin {rec.name}"
            v[key] = f"{rec.dist or '?'} {rec.dist_version or '?'}"
            if (
                (backend is not None and backend in rec.backends)
                or transport_owner == rec.name
                or rec.name in provider_owners
            ):
                used.append(key)
    except Exception:  # noqa: BLE001 - a broken plugin system is reported by hal info, not here
        pass
    return {"versions": v, "used": used}


def group_ranks(ranks: Sequence[int]) -> str:
    """Return ``"rank 3"``, ``"ranks 0-2, 5"``."""
    rs = sorted(ranks)
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(parts)


def _nums(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(" ")[-1].split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def _severity(package: str, values: set[str], used: bool) -> tuple[str, str]:
    """Return (``"error"`` | ``"warning"``, why) for ``package`` with ``values`` on the ranks."""
    nums = {_nums(x) for x in values}
    if package in _EXACT:
        return "error", "its versions must match exactly"
    if package == "hal-sdk":
        if len({n[:2] for n in nums}) > 1:
            return "error", "major.minor differ"
        return "warning", "only the patch version differs"
    if package in ("numpy", "mpi4py"):
        if len({n[:1] for n in nums}) > 1:
            return "error", "major versions differ"
        return "warning", "the major version agrees"
    if package.startswith("plugin "):
        if not used:
            return "warning", "no rank's device or transport uses it"
        if len({n[:2] for n in nums}) > 1:
            return "error", "major.minor differ and a rank uses it"
        return "warning", "only the patch version differs"
    return "warning", "it does not take part in the collectives"


def check(tables: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str], set[int]]:
    """Compare every rank's :func:`collect` table; return ``(errors, warnings, ranks_at_fault)``.

    Each message names the package, the ranks and their versions in plain text. A package
    absent on some ranks (a plugin installed on some hosts, torch imported by some ranks) is
    a warning; ``ranks_at_fault`` are the ranks whose version differs from rank 0's in an error.
    """
    errors: list[str] = []
    warns: list[str] = []
    bad: set[int] = set()
    packages: list[str] = []
    for t in tables:
        for k in t.get("versions", {}):
            if k not in packages:
                packages.append(k)
    for pkg in packages:
        by_version: dict[str, list[int]] = {}
        missing: list[int] = []
        for r, t in enumerate(tables):
            val = t.get("versions", {}).get(pkg)
            if val is None:
                missing.append(r)
            else:
                by_version.setdefault(str(val), []).append(r)
        used = any(pkg in t.get("used", ()) for t in tables)
        if len(by_version) > 1:
            level, why = _severity(pkg, set(by_version), used)
            has = "; ".join(
                f"{group_ranks(rs)} {'have' if len(rs) > 1 else 'has'} {ver}"
                for ver, rs in by_version.items()
            )
            msg = f"{pkg}: {has} ({why})"
            if level == "error":
                errors.append(msg)
                ref = str(tables[0].get("versions", {}).get(pkg))
                bad.update(r for ver, rs in by_version.items() if ver != ref for r in rs)
            else:
                warns.append(msg)
        if missing and by_version:
            has = "; ".join(
                f"{group_ranks(rs)} {'have' if len(rs) > 1 else 'has'} {ver}"
                for ver, rs in by_version.items()
            )
            warns.append(
                f"{pkg}: {has}; {group_ranks(missing)} {'have' if len(missing) > 1 else 'has'} none"
            )
    return errors, warns, bad


def raise_or_warn(tables: Sequence[Mapping[str, Any]], rank: int) -> None:
    """Raise :class:`hal.CommError` for a mismatch that matters; warn (once, on rank 0) for the others."""
    errors, warns, bad = check(tables)
    if errors:
        raise hal.CommError(
            "ranks run different versions of what the collectives depend on: "
            + "; ".join(errors)
            + " -- install the same versions on every host (`hal doctor` under the launcher prints the table)",
            op="init",
            ranks=tuple(sorted(bad)),
        )
    if rank == 0:
        for w in warns:
            if w not in _warned:
                _warned.add(w)
                warnings.warn(
                    f"hal.comm: ranks run different versions: {w}", hal.HalWarning, stacklevel=4
                )


def format_table(tables: Sequence[Mapping[str, Any]]) -> list[str]:
    """Return the lines of the versions table (one column per distinct rank group)."""
    packages: list[str] = []
    for t in tables:
        for k in t.get("versions", {}):
            if k not in packages:
                packages.append(k)
    width = max([len(p) for p in packages] + [8])
    lines = []
    if len(tables) == 1:
        used = set(tables[0].get("used", ()))
        for p in packages:
            mark = "  (used)" if p in used and not p.startswith(("hal", "numpy")) else ""
            lines.append(f"{p:<{width}}  {tables[0]['versions'][p]}{mark}")
        return lines
    lines.append(f"{'package':<{width}}  " + "  ".join(f"rank {r}" for r in range(len(tables))))
    for p in packages:
        vals = [str(t.get("versions", {}).get(p, "-")) for t in tables]
        same = len(set(vals)) == 1
        lines.append(
            f"{p:<{width}}  " + ("  ".join(vals) if not same else f"{vals[0]}  (all ranks)")
        )
    return lines
