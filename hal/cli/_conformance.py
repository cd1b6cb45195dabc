"""``hal conformance``: certify a backend, compare certificates, certify a plugin in isolation."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from hal.cli._output import write_output

_EXIT_CERTIFIED, _EXIT_NOT_CERTIFIED, _EXIT_USAGE = 0, 1, 2


def add_commands(sub: Any) -> None:
    """Add ``conformance`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "conformance",
        help="certify a backend against the HAL requirements (exit 0 only when certified)",
        description=(
            "Run the conformance suite on a backend and write a certificate. Exit status: 0 certified "
            "(at the --require level), 1 not certified or certificates differ (--compare), 2 usage error."
        ),
    )
    p.add_argument("--backend", metavar="NAME", help="the backend to certify (see `hal info`)")
    p.add_argument("--report", metavar="PATH", help="write the JSON certificate here")
    p.add_argument("--summary", metavar="PATH", help="write a Markdown summary here")
    p.add_argument(
        "-k",
        dest="select",
        metavar="EXPR",
        help="run only requirements whose ID matches EXPR (words, and/or/not, parentheses)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random patterns (default 0)")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds one requirement instance may run before it fails as hung (default 60)",
    )
    p.add_argument(
        "--require",
        choices=("core", "full"),
        default="core",
        help="level needed for exit status 0 (default core)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print failures and the verdict only")
    p.add_argument(
        "--list",
        action="store_true",
        help="list the requirements (ID, area, needs, statement) and exit",
    )
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("GOLDEN", "CERT"),
        help="list requirements whose status differs between two certificates (exit 1 if any "
        "difference is not a skip justified by a declared-absent capability)",
    )
    p.add_argument(
        "--isolated",
        metavar="PIP-SPEC",
        help="install hal-sdk and PIP-SPEC (a path, a wheel, a requirement) in a clean tox "
        "environment and run the suite there",
    )
    p.add_argument(
        "--hal-sdk",
        dest="hal_sdk",
        metavar="PIP-SPEC",
        help="with --isolated: how to install hal-sdk (default: this installation's source)",
    )
    p.add_argument(
        "--keep", action="store_true", help="with --isolated: keep the temporary tox directory"
    )
    p.add_argument(
        "--env",
        dest="env",
        metavar="NAME",
        action="append",
        default=[],
        help="with --isolated: also pass the environment variable NAME (repeatable; NAME_* for a "
        "prefix); HAL_*, POCL_*, OCL_ICD_* and *_VISIBLE_DEVICES always pass",
    )
    p.set_defaults(func=cmd_conformance)


class _Printer:
    """Progress display: one line per requirement as it finishes, failures with their reason."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stdout.isatty()

    def started(self, requirement: Any, index: int, total: int) -> None:
        if not self.quiet:
            print(f"[{index:>3}/{total}] {requirement.id:<26}", end="", flush=True)

    def finished(self, requirement: Any, index: int, total: int, result: dict[str, Any]) -> None:
        status = result["status"]
        if self.quiet:
            if status == "fail":
                print(f"FAIL {requirement.id}: {result['reason']}", flush=True)
            return
        word = {"pass": "pass", "fail": "FAIL", "skip": "skip"}[status]
        if self.tty:
            word = {
                "pass": "\033[32mpass\033[0m",
                "fail": "\033[31;1mFAIL\033[0m",
                "skip": "\033[33mskip\033[0m",
            }[status]
        line = f" {word}  {result['duration']:7.2f} s"
        if status != "pass" and result["reason"]:
            line += f"\n        {result['reason']}"
        print(line, flush=True)


def _verdict_line(cert: dict[str, Any]) -> str:
    s = cert["summary"]
    level = f" (level {cert['level']})" if cert["level"] else ""
    return (
        f"{s['total']} requirements: {s['pass']} passed, {s['fail']} failed, {s['skip']} skipped"
        + (f", {s['deselected']} deselected" if s["deselected"] else "")
        + f" -> {cert['verdict']}{level}: {cert['verdict_reason']}"
    )


def _exit_for(cert: dict[str, Any], require: str) -> int:
    ok = cert["verdict"] == "certified" and (require == "core" or cert["level"] == "full")
    return _EXIT_CERTIFIED if ok else _EXIT_NOT_CERTIFIED


def _unwritable(option: str, path: str | None) -> str | None:
    """Say why ``path`` cannot take the output of ``option`` (checked before a run of minutes), or None."""
    if not path:
        return None
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        why = "is a directory"
    elif not parent.is_dir():
        why = f"is in {str(parent)!r}, which is not a directory"
    elif not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        why = "is not writable"
    else:
        return None
    return f"hal conformance: {option} {path!r} {why}"


def _write(cert: dict[str, Any], report: str | None, summary: str | None) -> bool:
    from hal.conformance import render_markdown

    for option, path, text in (
        ("--report", report, lambda: json.dumps(cert, indent=2) + "\n"),
        ("--summary", summary, lambda: render_markdown(cert)),
    ):
        if not path:
            continue
        if not write_output("hal conformance", option, path, text()):
            return False
        print(f"{'certificate' if option == '--report' else 'summary'}: {path}")
    return True


def _load(path: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"hal conformance: cannot read certificate {path}: {exc}") from None
    return data


def _cmd_compare(golden_path: str, cert_path: str) -> int:
    from hal.conformance import compare

    golden, cert = _load(golden_path), _load(cert_path)
    gb, cb = golden.get("backend", {}).get("name"), cert.get("backend", {}).get("name")
    print(f"golden {golden_path} (backend {gb}) vs {cert_path} (backend {cb})")
    if golden.get("suite", {}).get("hash") != cert.get("suite", {}).get("hash"):
        print("note: the certificates come from different suite files (suite hashes differ)")
    diffs = compare(golden, cert)
    for d in diffs:
        mark = " (justified skip)" if d["justified"] else ""
        print(f"  {d['id']:<26} golden {d['golden']:<6} cert {d['cert']:<6}{mark} {d['reason']}")
    unjustified = [d for d in diffs if not d["justified"]]
    if not diffs:
        print("no requirement differs")
    else:
        print(
            f"{len(diffs)} requirement(s) differ, {len(unjustified)} not justified by a declared-absent capability"
        )
    return _EXIT_NOT_CERTIFIED if unjustified else _EXIT_CERTIFIED


def _cmd_list() -> int:
    from hal.conformance import catalogue

    for r in catalogue():
        needs = ",".join(r.needs) or "-"
        print(f"{r.id:<26} {r.level:<4} {r.scope:<7} needs={needs:<14} {r.statement}")
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    """Run ``hal conformance``."""
    if args.compare:
        return _cmd_compare(*args.compare)
    if args.list:
        return _cmd_list()
    if not args.backend:
        print(
            "hal conformance: --backend NAME is required (see `hal info` for the backends)",
            file=sys.stderr,
        )
        return _EXIT_USAGE
    if args.isolated:
        return _cmd_isolated(args)
    if args.env:
        print(
            f"hal conformance: --env {args.env[0]} only applies with --isolated (this process already "
            "sees its whole environment)",
            file=sys.stderr,
        )
        return _EXIT_USAGE
    import hal
    from hal.conformance import Suite

    for option, path in (("--report", args.report), ("--summary", args.summary)):
        if (why := _unwritable(option, path)) is not None:
            print(why, file=sys.stderr)
            return _EXIT_USAGE
    try:
        suite = Suite(args.backend, seed=args.seed, timeout=args.timeout, select=args.select)
    except (ValueError, TypeError, hal.HalError) as exc:
        print(f"hal conformance: {exc}", file=sys.stderr)
        return _EXIT_USAGE
    if not args.quiet:
        b = suite.info
        print(
            f"hal conformance: backend {b.name} ({b.dist} {b.version}, API {b.api_version}), "
            f"{len(suite.devices)} device(s), {len(suite.selected)} requirement(s), seed {args.seed}"
        )
    try:
        cert = suite.run(_Printer(args.quiet))
    except KeyboardInterrupt:
        print("\nhal conformance: interrupted; no certificate written", file=sys.stderr)
        return 130
    print(_verdict_line(cert))
    code = _exit_for(cert, args.require) if _write(cert, args.report, args.summary) else _EXIT_USAGE
    hung = [t.name for t in suite.hung if t.is_alive()]
    if hung:  # a hung check's thread cannot be stopped; the interpreter's exit would wait on or crash in it
        print(
            f"hal conformance: {len(hung)} check(s) still running after their timeout "
            f"({', '.join(hung[:3])}); exiting without waiting for them",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _cmd_isolated(args: argparse.Namespace) -> int:
    from hal.conformance import run_isolated

    extra = ["--seed", str(args.seed), "--timeout", str(args.timeout), "--require", args.require]
    if args.select:
        extra += ["-k", args.select]
    if args.quiet:
        extra.append("-q")
    try:
        code, cert = run_isolated(
            args.isolated,
            args.backend,
            report=args.report,
            summary=args.summary,
            extra_args=extra,
            hal_sdk_spec=args.hal_sdk,
            keep=args.keep,
            env_names=args.env,
        )
    except (RuntimeError, ValueError) as exc:
        print(f"hal conformance: {exc}", file=sys.stderr)
        return _EXIT_USAGE
    if cert is None:
        print(
            f"hal conformance: the isolated environment produced no certificate (tox exit {code}); "
            "see the installation output above",
            file=sys.stderr,
        )
        return _EXIT_USAGE
    print(f"isolated ({cert['isolation']['tool']}): " + _verdict_line(cert))
    for path, what in ((args.report, "certificate"), (args.summary, "summary")):
        if path:
            print(f"{what}: {path}")
    return _exit_for(cert, args.require)
