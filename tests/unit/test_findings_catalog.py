"""findings/catalog.py, docs/findings.md and the code agree: the same ids, areas, anchors and severities, and each
id is built by the module the catalogue names (issue 25, point 5)."""

from __future__ import annotations

import ast
import json
import re
from collections import defaultdict
from pathlib import Path

from ddpdoctor.findings.catalog import AREAS, CATALOG, kinds, severity_allowed
from ddpdoctor.findings.model import Finding, Severity

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "docs" / "findings.md").read_text()
INDEX_ROW = re.compile(r"^\| \[`([^`]+)`\]\(#([^)]+)\) \| (\w+) \|$", re.M)
SECTION = re.compile(r'<a id="([^"]+)"></a>\s*\n\s*### (\S+)\n(.*?)(?=\n<a id=|\n## |\Z)', re.S)

# Ids still built in two modules of one area's evidence: the topo log rules and the topology-XML rules each see
# the same problem (gdr-disabled, few-nics) from their own input. Run-side and log-side builders of one id are
# listed as rows of their areas in the catalogue.
SAME_AREA_BUILDERS = {"gdr-disabled": {"ddpdoctor.topo.rules", "ddpdoctor.topo.rules_xml"},
                      "few-nics": {"ddpdoctor.topo.rules_gpu", "ddpdoctor.topo.rules_xml"}}


def test_docs_index_is_the_catalogue_in_order() -> None:
    rows = [(fid, anchor, area) for fid, anchor, area in INDEX_ROW.findall(DOCS)]
    assert rows == [(k.id, k.anchor, k.area) for k in CATALOG]


def test_every_row_has_its_docs_section_and_no_section_is_missing_a_row() -> None:
    sections = {m.group(1): m.group(2) for m in SECTION.finditer(DOCS)}
    assert {k.anchor: k.id for k in CATALOG} == sections
    assert {k.area for k in CATALOG} == set(AREAS)
    assert len({(k.id, k.area) for k in CATALOG}) == len(CATALOG)


def test_severities_the_docs_name_are_in_the_catalogue() -> None:
    by_anchor = {k.anchor: k for k in CATALOG}
    checked = 0
    for m in SECTION.finditer(DOCS):
        sev = re.search(r"Severity\W*(.*?)(?=\n- |\n\n|\Z)", m.group(3), re.S)
        if sev is None:
            continue
        named = {s for s in Severity if re.search(rf"\b{s.value}\b", sev.group(1))}
        kind = by_anchor[m.group(1)]
        assert named <= set(kind.severities), (kind.id, kind.area, named)
        assert max(kind.severities, key=lambda s: s.rank) in named or kind.area == "preflight", (kind.id, named)
        checked += 1
    assert checked >= 60  # most sections state a severity; a parse that finds none would check nothing


def _literal_builders() -> dict[str, set[str]]:
    """id -> the modules with a Finding("id", ...) call."""
    out: dict[str, set[str]] = defaultdict(set)
    for path in (REPO / "ddpdoctor").rglob("*.py"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Finding":
                first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "id"), None)
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    out[first.value].add(module)
    return out


def test_each_id_is_built_where_the_catalogue_says() -> None:
    builders = _literal_builders()
    assert len(builders) > 70
    for fid, modules in builders.items():
        rows = kinds(fid)
        assert rows, f"{fid} is built in {sorted(modules)} but not in findings/catalog.py"
        owners = {k.owner for k in rows} | SAME_AREA_BUILDERS.get(fid, set())
        assert modules <= owners, (fid, modules, owners)


def test_owner_modules_exist_and_name_their_ids() -> None:
    for k in CATALOG:
        path = REPO / Path(*k.owner.split(".")).with_suffix(".py")
        text = path.read_text()
        name = k.id.split(".", 1)[1] if k.area == "preflight" else k.id
        assert f'"{name}"' in text, (k.id, k.owner)


def test_golden_reports_carry_catalogued_ids_and_severities() -> None:
    seen = 0
    for path in sorted((REPO / "tests" / "fixtures" / "golden").glob("*.json")):
        for f in json.loads(path.read_text())["json"].get("findings", []):
            finding = Finding(f["id"], Severity(f["severity"]), f["title"], f["ranks"], f["evidence"], f["advice"])
            assert severity_allowed(finding), (path.name, f["id"], f["severity"])
            seen += 1
    assert seen > 50


def test_demoted_perf_findings_are_allowed_and_nothing_else_is() -> None:
    demoted = Finding("straggler-rank", Severity.INFO, "t", evidence={"incomplete_run": "crashed"})
    assert severity_allowed(demoted)
    assert not severity_allowed(Finding("straggler-rank", Severity.INFO, "t"))
    assert not severity_allowed(Finding("hang", Severity.WARNING, "t"))
    assert not severity_allowed(Finding("no-such-id", Severity.INFO, "t"))
