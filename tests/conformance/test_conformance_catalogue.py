"""The catalogue, -k selection, verdict levels, comparison and the certificate schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hal.conformance import AREAS, catalogue, compare, load_schema, validate
from hal.conformance._certificate import _verdict
from hal.conformance._select import compile_expression
from hal.conformance.spi import requirement

REPO = Path(__file__).resolve().parents[2]


def test_ids_are_stable_unique_and_grouped_by_declared_areas() -> None:
    reqs = catalogue()
    ids = [r.id for r in reqs]
    assert len(ids) == len(set(ids))
    for prefix in ("MEM", "STREAM", "EVENT", "P2P", "ERR", "DLPACK"):
        assert any(i.startswith(prefix + "-") for i in ids), prefix
    assert {p for p, a in AREAS.items() if a.level == "core"} == {"MEM", "STREAM", "EVENT", "ERR"}
    assert {"KERN", "COMM"} <= set(AREAS)  # hal.kernels' and hal.comm's sections, through the hook
    for r in reqs:
        assert (
            r.area == r.id.split("-")[0] and r.statement.endswith(".") and "\n" not in r.statement
        )


def test_catalogue_is_documented() -> None:
    text = (REPO / "docs" / "certify.md").read_text()
    missing = [r.id for r in catalogue() if r.id not in text]
    assert not missing, f"requirements missing from docs/certify.md: {missing}"


def test_requirement_declarations_are_validated() -> None:
    with pytest.raises(ValueError, match="AREA-NAME"):
        requirement("mem-lower", "A statement.")
    with pytest.raises(ValueError, match="not declared"):
        requirement("NOPE-THING", "A statement.")
    with pytest.raises(ValueError, match=r"not a field of hal\.Capabilities"):
        requirement("MEM-X-FIXTURE", "A statement.", needs="warp_drive")
    with pytest.raises(ValueError, match="declared twice"):
        requirement("MEM-ALLOC", "A statement.")(lambda t: None)


@pytest.mark.parametrize(
    ("expr", "hits"),
    [
        ("MEM", {"MEM-ALLOC", "MEM-OOM"}),
        ("mem and not oom", {"MEM-ALLOC"}),
        ("OOM or P2P-COPY", {"MEM-OOM", "P2P-COPY"}),
        ("(STREAM or EVENT) and SYNC", {"STREAM-SYNC", "EVENT-SYNC"}),
        ("not (MEM or STREAM or EVENT)", {"P2P-COPY"}),
    ],
)
def test_k_expressions(expr: str, hits: set[str]) -> None:
    ids = ["MEM-ALLOC", "MEM-OOM", "STREAM-SYNC", "EVENT-SYNC", "P2P-COPY"]
    pred = compile_expression(expr)
    assert {i for i in ids if pred(i)} == hits


@pytest.mark.parametrize("bad", ["", "MEM and", "(MEM", "MEM)", "and MEM", "MEM or or OOM"])
def test_k_expressions_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="-k expression"):
        compile_expression(bad)


def _results(status: dict[str, str]) -> list[dict[str, Any]]:
    return [{"id": r.id, "status": status.get(r.id, "pass")} for r in catalogue()]


def test_verdict_levels() -> None:
    assert _verdict(_results({}))[:2] == ("certified", "full")
    assert _verdict(_results({"DLPACK-VALUES": "skip"}))[:2] == ("certified", "full")
    # a declared capability that fails is a failed certificate, whatever its level
    assert _verdict(_results({"P2P-COPY": "fail"}))[:2] == ("not certified", None)
    assert _verdict(_results({"DLPACK-VALUES": "fail"}))[:2] == ("not certified", None)
    assert "DLPACK-VALUES" in _verdict(_results({"DLPACK-VALUES": "fail"}))[2]
    assert _verdict(_results({"MEM-OOM": "fail"}))[:2] == ("not certified", None)
    partial = [r for r in _results({}) if not r["id"].startswith("STREAM")]
    assert _verdict(partial)[:2] == ("not certified", None)
    no_full = [r for r in _results({}) if not r["id"].startswith("P2P")]
    assert _verdict(no_full)[:2] == ("certified", "core")


def _cert(statuses: dict[str, str]) -> dict[str, Any]:
    return {
        "requirements": [{"id": i, "status": s, "reason": f"r-{i}"} for i, s in statuses.items()]
    }


def test_compare_lists_every_difference() -> None:
    golden = _cert({"MEM-A": "pass", "MEM-B": "pass", "P2P-C": "pass", "MEM-GONE": "pass"})
    cert = _cert({"MEM-A": "pass", "MEM-B": "fail", "P2P-C": "skip", "MEM-NEW": "pass"})
    diffs = compare(golden, cert)
    assert [(d["id"], d["golden"], d["cert"]) for d in diffs] == [
        ("MEM-B", "pass", "fail"),
        ("P2P-C", "pass", "skip"),
        ("MEM-GONE", "pass", "absent"),
        ("MEM-NEW", "absent", "pass"),
    ]
    assert compare(golden, golden) == []
    assert [d["justified"] for d in diffs] == [False, False, False, False]  # no instances say why


def test_compare_marks_skips_for_declared_capabilities_justified() -> None:
    def entry(status: str, reason: str = "", basis: str | None = None) -> dict[str, Any]:
        inst: dict[str, Any] = {
            "target": "x:0",
            "status": status,
            "reason": reason,
            "duration": 0.0,
        }
        if basis:
            inst["basis"] = basis
        return {"id": "DLPACK-VALUES", "status": status, "reason": reason, "instances": [inst]}

    golden = {"requirements": [entry("pass")]}
    declared = {
        "requirements": [
            entry("skip", "capability 'dlpack' declared absent: no importer", "capability")
        ]
    }
    (d,) = compare(golden, declared)
    assert d["justified"] and d["cert"] == "skip"
    old_schema = {
        "requirements": [entry("skip", "capability 'dlpack' declared absent: no importer")]
    }
    assert compare(golden, old_schema)[0]["justified"]  # a 1.0 certificate: judged by the reason
    failed = {"requirements": [entry("fail", "values differ")]}
    assert not compare(golden, failed)[0]["justified"]
    assert compare(declared, golden)[0]["justified"]  # the golden skipped, the backend passes


def test_schema_file_is_valid_and_rejects_broken_certificates(tmp_path: Path) -> None:
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    import hal.conformance as c

    cert = c.run("cpu", select="ERR-DISCOVERY")
    assert cert["schema_version"] == c.SCHEMA_VERSION == "1.1"
    validate(json.loads(json.dumps(cert)))
    for mutate in (
        lambda x: x["requirements"][0].update(status="maybe"),
        lambda x: x["requirements"][0].update(status="fail", reason=""),
        lambda x: x.update(verdict="certified"),  # certified needs a level
        lambda x: x["suite"].update(hash="md5:0"),
        lambda x: x.pop("backend"),
        lambda x: x["requirements"][0].update(id="lowercase-id"),
        lambda x: (
            x.update(verdict="certified", level="core"),
            x["summary"].update(fail=1),
        ),  # certified with a failure
        lambda x: x["requirements"][0]["instances"][0].update(basis="vibes"),
    ):
        bad = copy.deepcopy(cert)
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            validate(bad)
