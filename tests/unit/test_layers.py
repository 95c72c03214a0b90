"""The pipeline's direction, checked on the code's imports (every import, including those inside functions): the
run directory knows nothing above it, analyses never start rules or reports, click lives in the command layer and
rich in the renderers. What still breaks a rule is listed by name below, so the list can only shrink."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "ddpdoctor"


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "ddpdoctor":  # `from ddpdoctor import safe_io` imports the module ddpdoctor.safe_io
                out.update(f"ddpdoctor.{a.name}" for a in node.names)
            else:
                out.add(node.module)
    return out


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PKG.parent).with_suffix("").parts)


def _breaking(where: str, allowed: tuple[str, ...], prefix: str = "ddpdoctor") -> dict[str, set[str]]:
    """Modules under ``where`` importing a ``prefix`` module outside ``allowed`` (and outside their own package)."""
    out: dict[str, set[str]] = {}
    for path in sorted((PKG / where).rglob("*.py")) if (PKG / where).is_dir() else [PKG / f"{where}.py"]:
        bad = {m for m in _imports(path) if (m == prefix or m.startswith(prefix + "."))
               and not m.startswith(f"ddpdoctor.{where}") and not m.startswith(allowed)}
        if bad:
            out[_module(path)] = bad
    return out


def test_the_run_directory_imports_only_errors_and_safe_io() -> None:
    bad = _breaking("rundir", ("ddpdoctor.errors", "ddpdoctor.safe_io", "ddpdoctor.version", "ddpdoctor.jsontypes"))
    assert bad == {}


def test_analyses_never_start_rules_or_reports() -> None:
    bad = {m: {i for i in b if i.startswith(("ddpdoctor.findings", "ddpdoctor.reports", "ddpdoctor.report",
                                              "ddpdoctor.renderers", "ddpdoctor.commands"))}
           for m, b in _breaking("analyses", ()).items()}
    assert {m: b for m, b in bad.items() if b} == {}


def test_findings_do_not_reach_up() -> None:
    bad = {m: {i for i in b if i.startswith(("ddpdoctor.reports", "ddpdoctor.renderers", "ddpdoctor.commands"))}
           for m, b in _breaking("findings", ()).items()}
    assert {m: b for m, b in bad.items() if b} == {}


def test_click_only_in_commands_and_rich_only_in_renderers() -> None:
    click_known = {"ddpdoctor.cli"}  # launch/, job/ and live/ neither (issue 24): their options live in commands/
    for path in sorted(PKG.rglob("*.py")):
        mod, imports = _module(path), _imports(path)
        if any(i == "click" or i.startswith("click.") for i in imports):
            assert mod.startswith("ddpdoctor.commands") or mod in click_known, mod
        if any(i == "rich" or i.startswith("rich.") for i in imports):
            assert mod.startswith("ddpdoctor.renderers"), mod
