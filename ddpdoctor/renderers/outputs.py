"""Writes the file views of a performance report (HTML, TensorBoard scalars, merged trace) where they were asked for."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.errors import BadInput
from ddpdoctor.report import Report
from ddpdoctor.reports.sections import PerfSection, section_of


def _input_ranks(perf: PerfSection | None) -> dict[str, int]:
    """Trace path -> rank as the analysis decided it (so the merge agrees with the report)."""
    out: dict[str, int] = {}
    for inp in (perf.inputs if perf else None) or []:
        rank, path = inp.get("rank"), inp.get("path")
        if isinstance(rank, int) and path:
            out[str(path)] = rank
            out[str(Path(path).resolve())] = rank
    return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def write_outputs(
    report: Report,
    run_dir: Path | None,
    html: Path | None,
    merge: Path | None,
    traces: list[Path],
    show_progress: bool = False,
) -> list[Path]:
    """RUN/report.html and RUN/scalars/rankR when there is a run directory, plus --html and --merge files.

    Returns the paths written. A path that cannot be written raises BadInput naming it.
    """
    written: list[Path] = []
    perf = section_of(report, PerfSection)
    html_targets = ([run_dir / "report.html"] if run_dir else []) + ([html] if html else [])
    for target in html_targets:
        # Imported only when written: `analyze --json` of one trace must not pay for the HTML renderer's imports.
        from ddpdoctor.renderers.diff_html import diff_of, diff_section_html
        from ddpdoctor.renderers.html import write_html

        try:
            written.append(write_html(report, target, diff_section_html(diff_of(report))))
        except OSError as exc:
            raise BadInput(f"cannot write the HTML report ({exc.strerror or exc})", target) from exc
    if run_dir and perf is not None:  # the scalars are the performance section's per-step rows
        from ddpdoctor.renderers.tensorboard import write_scalars

        try:
            written.extend(write_scalars(perf, run_dir / "scalars"))
        except OSError as exc:
            raise BadInput(f"cannot write TensorBoard scalars ({exc.strerror or exc})", run_dir / "scalars") from exc
    if merge:
        from ddpdoctor.renderers.merge import merge_traces

        sizes = {p: _size(p) for p in traces}
        from ddpdoctor.renderers.progress import bar

        with bar("merging traces", sum(sizes.values()), show_progress, unit="MB") as advance:
            written.append(merge_traces(traces, merge, perf.clock_offsets_us if perf else None, _input_ranks(perf),
                                        on_file=lambda p: advance(sizes.get(p, 0))))
    return written
