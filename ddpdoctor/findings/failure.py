"""The one builder of each job-failure finding that two sources see: `hang` and `rank-crashed` come from a watched
run (findings/hang.py and findings/crash.py: heartbeats, status files) and from the logs of a job that ran without
ddpdoctor (logs/rules.py, logs/crashes.py). Both build them here: the id, the severity and the evidence keys every source
must give are written once (docs/findings.md: hangs-hang and logs-hang, hangs-rank-crashed and logs-rank-crashed).
The evidence keeps the order the caller gives it (the terminal shows the first few)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.rundir.records import RankStateDoc

HANG_EVIDENCE = ("stalled_ranks", "culprit_ranks", "collective", "call_sites", "stacks", "detected_after_s")
CRASH_EVIDENCE = ("rank", "exception", "traceback", "call_site")


# A Python traceback's frame line, and the files that are no user's own code: installed packages (frameworks such as
# Lightning or accelerate, whose handlers a user's exception passes through), the standard library, torch, ddpdoctor.
_TB_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)', re.M)
_CHAIN = re.compile(r"^(?:The above exception was the direct cause of the following exception:|"
                    r"During handling of the above exception, another exception occurred:)\s*$", re.M)
_LIBRARY = re.compile(r"[/\\](?:site-packages|dist-packages|torch|ddpdoctor)[/\\]|[/\\]lib[/\\]python\d[\d.]*[/\\]")


def _library_frame(site: str) -> bool:
    return site.startswith("<") or bool(_LIBRARY.search(site))


def user_call_site(traceback: str) -> str | None:
    """``file:line`` of the user's own code where an exception was raised: the innermost frame outside installed
    packages, the standard library, torch and ddpdoctor, in the first exception of a chain that has one (Python
    prints a chain's original exception first; a framework that wraps it raises the later ones)."""
    for block in _CHAIN.split(traceback or ""):
        sites = [f"{p}:{n}" for p, n in _TB_FRAME.findall(block) if not _library_frame(p)]
        if sites:
            return sites[-1]
    return None


Evidence = TypeVar("Evidence", bound=Mapping[str, object])  # an evidence map, checked for its required keys


def _checked(fid: str, evidence: Evidence, required: tuple[str, ...]) -> Evidence:
    missing = [k for k in required if k not in evidence]
    if missing:  # a programming error in a rule, caught by the tests that build every finding
        raise TypeError(f"{fid} evidence lacks {missing}")
    return evidence


def hang_finding(title: str, ranks: list[int], advice: str, **evidence: Any) -> Finding:
    """A hang: the ranks stuck in a collective (``stalled_ranks``), the ranks they wait for (``culprit_ranks``),
    the collective, each rank's call site and stack, when it was seen; plus what the source knows beyond that."""
    return Finding("hang", Severity.ERROR, title, ranks=list(ranks),
                   evidence=_checked("hang", evidence, HANG_EVIDENCE), advice=advice)


def rank_crashed_finding(rank: int | None, title: str, advice: str, *, ranks: list[int] | None = None,
                         **evidence: Any) -> Finding:
    """A rank that failed: its exception, traceback and the user's call site; plus what the source knows beyond
    that (a watched run's victims). ``ranks`` names several ranks that died of one cause (``rank`` is then None)."""
    if ranks is None:
        ranks = [rank] if rank is not None else []
    site = evidence.get("call_site")
    if (site is None or (isinstance(site, str) and _library_frame(site))) and isinstance(evidence.get("traceback"), str):
        # raised in the user's code through a framework's handlers: name the user's line, not the framework's
        evidence["call_site"] = user_call_site(evidence["traceback"]) or site
    return Finding("rank-crashed", Severity.ERROR, title, ranks=list(ranks),
                   evidence=_checked("rank-crashed", {"rank": rank, **evidence}, CRASH_EVIDENCE), advice=advice)


def head_lost_finding(head: str, node_rank: int, ranks: list[RankStateDoc], last_verdict: str | None) -> Finding:
    """A node of a multi-node job lost the job's head (docs/findings.md#hangs-head-lost): what it knows, as plain
    data (its ranks' last state, the head's last verdict)."""
    own = sorted(r["rank"] for r in ranks if isinstance(r.get("rank"), int))
    return Finding("head-lost", Severity.ERROR,
                   f"the job's head node ({head}) was lost: node {node_rank} reports what it knows of its own ranks",
                   ranks=own, evidence={"head": head, "node_rank": node_rank, "ranks": ranks,
                                        "last_verdict": last_verdict},
                   advice="look at the head node's host, launcher and scheduler logs (OOM killer, preemption, node "
                          "failure); this node's ranks' errors are most likely victims of losing it")
