"""The certificate: build it, render its Markdown summary, compare two, validate the schema.

The schema is ``certificate.schema.json`` beside this module (documented in
docs/certificate-schema.md). ``SCHEMA_VERSION`` changes major on an incompatible change
and minor when optional fields are added.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import json
import os
import platform
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hal
from hal.conformance._registry import AREAS, SECTIONS, catalogue, load_sections

if TYPE_CHECKING:
    from hal.conformance._runner import Suite

__all__ = [
    "SCHEMA_VERSION",
    "SUITE_VERSION",
    "build_certificate",
    "compare",
    "load_schema",
    "render_markdown",
    "suite_hash",
    "validate",
]

#: Version of the certificate's JSON schema.
SCHEMA_VERSION = "1.1"
#: Version of the suite (requirements and checks); the hash pins the exact files.
SUITE_VERSION = "1.1.0"

_HERE = Path(__file__).resolve().parent
_SCHEMA_FILE = "certificate.schema.json"
_ENV_PREFIXES = ("HAL_", "POCL_", "OCL_ICD_")
_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def suite_hash() -> tuple[str, int]:
    """Return ``("sha256:...", file_count)`` over the suite's files.

    The files are this package's ``.py`` and ``.json`` files plus the module of every
    section listed in :data:`hal.conformance.spi.SECTIONS` that lives elsewhere (``hal.comm``'s).
    """
    load_sections()  # the sections registered by plugins count too
    h = hashlib.sha256()
    named = {
        p.relative_to(_HERE).as_posix(): p
        for p in _HERE.rglob("*")
        if p.is_file() and p.suffix in (".py", ".json")
    }
    for mod in SECTIONS:
        spec = importlib.util.find_spec(mod)
        origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if origin is not None and _HERE not in origin.parents:
            named[mod] = origin
    for key in sorted(named):
        h.update(key.encode() + b"\0" + named[key].read_bytes() + b"\0")
    return "sha256:" + h.hexdigest(), len(named)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def platform_info() -> dict[str, Any]:
    """Return the OS, Python and CPU the run happened on."""
    return {
        "os": platform.system(),
        "os_release": platform.release(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count() or 0,
    }


def _environment() -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES
    }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _device_entry(d: hal.Device) -> dict[str, Any]:
    try:
        props = _jsonable(d.properties())
    except Exception as exc:  # informative only
        props = {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "spec": str(d),
        "index": d.index,
        "name": d.name,
        "vendor": d.vendor,
        "total_memory": d.total_memory,
        "capabilities": _jsonable(d.capabilities.to_dict()),
        "properties": props,
    }


def _verdict(results: list[dict[str, Any]]) -> tuple[str, str | None, str]:
    """Return ``(verdict, level, reason)``.

    Any failed requirement, at any level, means "not certified": levels say how much of
    the catalogue ran (core only, or everything), never excuse a broken declaration.
    """
    all_ids = {r.id: r.level for r in catalogue()}
    ran = {r["id"] for r in results}
    failed = sorted(r["id"] for r in results if r["status"] == "fail")
    core = {i for i, lvl in all_ids.items() if lvl == "core"}
    missing_core = sorted(core - ran)
    if failed or missing_core:
        why = []
        if failed:
            why.append(f"requirements failed: {', '.join(failed)}")
        if missing_core:
            why.append(f"{len(missing_core)} core requirements were not run (deselected)")
        return "not certified", None, "; ".join(why)
    missing = sorted(set(all_ids) - ran)
    if missing:
        return (
            "certified",
            "core",
            f"{len(missing)} requirements outside the core were not run (deselected)",
        )
    return (
        "certified",
        "full",
        "every requirement passed or was skipped for a declared-absent capability",
    )


def build_certificate(
    suite: Suite,
    results: list[dict[str, Any]],
    started: datetime.datetime,
    selection: str | None = None,
) -> dict[str, Any]:
    """Return the certificate of ``results`` (aggregated requirement entries) run by ``suite``."""
    digest, nfiles = suite_hash()
    finished = datetime.datetime.now(datetime.timezone.utc)
    ran = {r["id"] for r in results}
    deselected = [r.id for r in catalogue() if r.id not in ran]
    counts = {s: sum(1 for r in results if r["status"] == s) for s in ("pass", "fail", "skip")}
    verdict, level, why = _verdict(results)
    areas = {}
    for prefix, area in AREAS.items():
        rs = [r for r in results if r["area"] == prefix]
        if not rs and not any(r.area == prefix for r in catalogue()):
            continue
        areas[prefix] = {
            "title": area.title,
            "level": area.level,
            "total": len(rs),
            **{s: sum(1 for r in rs if r["status"] == s) for s in ("pass", "fail", "skip")},
        }
    info = suite.info
    return {
        "schema_version": SCHEMA_VERSION,
        "hal_sdk_version": hal.__version__,
        "suite": {
            "version": SUITE_VERSION,
            "hash": digest,
            "files": nfiles,
            "seed": suite.seed,
            "timeout": suite.timeout,
            "selection": selection if selection is not None else suite.select,
            "deselected": deselected,
        },
        "timestamp": started.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "duration": round((finished - started).total_seconds(), 3),
        "platform": platform_info(),
        "environment": _environment(),
        "backend": {
            "name": info.name,
            "plugin": info.plugin,
            "dist": info.dist,
            "version": info.version,
            "api_version": info.api_version,
            "versions": dict(info.versions),
        },
        "devices": [_device_entry(d) for d in suite.devices],
        "areas": areas,
        "requirements": results,
        "summary": {"total": len(results), **counts, "deselected": len(deselected)},
        "verdict": verdict,
        "level": level,
        "verdict_reason": why,
    }


# -- schema -----------------------------------------------------------------------------
def load_schema() -> dict[str, Any]:
    """Return the certificate's JSON Schema (draft 2020-12)."""
    data: dict[str, Any] = json.loads((_HERE / _SCHEMA_FILE).read_text(encoding="utf-8"))
    return data


def validate(cert: Mapping[str, Any]) -> None:
    """Validate ``cert`` against the schema; raise ``jsonschema.ValidationError`` if it does not fit.

    Needs the ``jsonschema`` package (``pip install hal-sdk[test]``).
    """
    try:
        import jsonschema
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "validating a certificate needs jsonschema: pip install jsonschema"
        ) from exc
    jsonschema.Draft202012Validator(load_schema()).validate(cert)


# -- comparison -------------------------------------------------------------------------
def _justified_skip(entry: Mapping[str, Any]) -> bool:
    """True if every skipped instance of a requirement entry was skipped for a declaration."""
    insts = entry.get("instances") or []
    skips = [i for i in insts if i.get("status") == "skip"]
    if not skips:
        return str(entry.get("reason", "")).startswith(("capability ", "needs "))
    return all(
        i.get("basis") in ("capability", "devices")
        or str(i.get("reason", "")).startswith(("capability ", "needs "))  # schema 1.0
        for i in skips
    )


def compare(golden: Mapping[str, Any], cert: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return the requirements whose status differs between ``golden`` and ``cert``.

    Each entry: ``id``, ``golden`` and ``cert`` statuses (``"absent"`` when a certificate
    does not have the requirement), the ``cert`` reason, and ``justified``: True when the
    difference is a skip for a declared-absent capability (or too few devices) in ``cert``,
    or a requirement the golden certificate skipped and ``cert`` passed.
    """
    g = {r["id"]: r for r in golden.get("requirements", [])}
    c = {r["id"]: r for r in cert.get("requirements", [])}
    order = list(g) + [i for i in c if i not in g]
    out = []
    for rid in order:
        gs = g[rid]["status"] if rid in g else "absent"
        cs = c[rid]["status"] if rid in c else "absent"
        if gs != cs:
            reason = c[rid]["reason"] if rid in c else g[rid]["reason"]
            justified = (cs == "skip" and _justified_skip(c[rid])) or (
                gs == "skip" and cs == "pass"
            )
            out.append(
                {"id": rid, "golden": gs, "cert": cs, "reason": reason, "justified": justified}
            )
    return out


# -- Markdown ---------------------------------------------------------------------------
def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(cert: Mapping[str, Any]) -> str:
    """Return a Markdown summary of ``cert`` that a vendor can publish."""
    b = cert["backend"]
    s = cert["summary"]
    level = f" at level **{cert['level']}**" if cert["level"] else ""
    why = cert.get("verdict_reason", "")
    why = why[:1].upper() + why[1:]
    icon = {"pass": "pass", "fail": "**FAIL**", "skip": "skip"}
    out = [
        f"# HAL conformance: backend `{b['name']}`",
        "",
        f"**Verdict: {cert['verdict']}**{level}. {why}.",
        "",
        f"{s['pass']} passed, {s['fail']} failed, {s['skip']} skipped of {s['total']} requirements"
        + (f" ({s['deselected']} deselected)" if s["deselected"] else "")
        + ".",
        "",
        "## Run",
        "",
    ]
    suite = cert["suite"]
    p = cert["platform"]
    out += _table(
        ["what", "value"],
        [
            [
                "backend",
                f"{b['name']} (plugin {b['plugin']}, {b['dist']} {b['version']}, API {b['api_version']})",
            ],
            ["hal-sdk", cert["hal_sdk_version"]],
            ["suite", f"{suite['version']} ({suite['hash'][:19]}..., seed {suite['seed']})"],
            ["date", cert["timestamp"]],
            ["platform", f"{p['os']} {p['os_release']}, Python {p['python']}, {p['cpu']}"],
        ]
        + ([["isolated install", cert["isolation"]["spec"]]] if "isolation" in cert else []),
    )
    out += ["", "## Devices", ""]
    rows = []
    for d in cert["devices"]:
        caps = d["capabilities"]
        present = [k for k, v in caps.items() if v is True]
        absent = [
            f"{k} ({caps['absent_reasons'].get(k, 'no reason given')})"
            for k, v in caps.items()
            if v is False
        ]
        rows.append(
            [d["spec"], d["name"], d["total_memory"], ", ".join(present), "; ".join(absent) or "-"]
        )
    out += _table(
        ["device", "name", "memory (bytes)", "capabilities", "absent (justification)"], rows
    )
    out += ["", "## Requirements", ""]
    out += _table(
        ["id", "status", "statement", "reason"],
        [[r["id"], icon[r["status"]], r["statement"], r["reason"]] for r in cert["requirements"]],
    )
    out.append("")
    return "\n".join(out)
