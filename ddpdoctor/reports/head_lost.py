"""The report of a node whose job's head was lost (`run`/`profile` on a node of a multi-node launch): no job report
came from the head, so this node reports what it knows: its own ranks' last state and the head's last verdict, as
one `head-lost` finding (docs/hangs.md#lost-head), plus which node it is."""

from __future__ import annotations

from ddpdoctor.findings.failure import head_lost_finding
from ddpdoctor.job.role import NodeInfo
from ddpdoctor.job.verdict import HeadLost
from ddpdoctor.report import Report
from ddpdoctor.reports.sections import NodeSection


def assemble(command: str, lost: HeadLost, node: NodeInfo) -> Report:
    doc = lost.to_json()
    finding = head_lost_finding(lost.head, lost.node_rank, doc["ranks"], lost.last_verdict)
    return Report(command, parts=[NodeSection(node.to_json())], findings=[finding])
