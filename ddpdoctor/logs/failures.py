"""One log line against the failure grammar: a FailureLine (cause or victim), a ChildFailure (the elastic agent's
`failed (exitcode: -9) local_rank: 4`, the shell's `Killed`), an Unexplained failure line, or nothing."""

from __future__ import annotations

from ddpdoctor.logs import causes, grammar
from ddpdoctor.logs.events import ChildFailure, Event, FailureLine, Unexplained, Where
from ddpdoctor.logs.launchers import signal_name
from ddpdoctor.logs.lines import LogLine

_SHELL_SIGNALS = {"Killed": "SIGKILL", "Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS"}


def _odd_rank(kind: str, m_groups: dict[str, str | None], rank: int | None) -> int | None:
    if kind != "model-mismatch":
        return None
    if m_groups.get("odd") is not None:
        return int(m_groups["odd"] or 0)
    if m_groups.get("ref") is not None and rank is not None:
        return rank  # "params[i] in this process ... appears not to match ... in process 0": this process is odd
    return None


def parse_failure(line: LogLine) -> Event | None:
    """The failure event one line carries, if any (most lines carry none)."""
    text = line.text
    if "store based barrier" in text and (b := grammar.store_barrier(text)):
        # init_process_group's barrier, logged at INFO every 10 s while it waits (torch 1.8-1.13), DEBUG later; its
        # timeout error (all versions): a start-up that never filled, whatever the line's level.
        return FailureLine("init-barrier", "cause", line.rank if line.rank is not None else b.rank, None, None,
                           text.strip()[:1000], line.ts, Where(line.source, line.lineno))
    if (line.logger in ("W", "I") and "waitForInput" not in text) or text.startswith("#"):
        return None  # glog warnings and info (retried connects, shutdown notices), comments and nccl-tests headers
    where = Where(line.source, line.lineno)
    host: str | None = None
    gpu: int | None = None
    nccl = grammar.NCCL_LINE.search(text) if " NCCL " in text else None
    if nccl:
        level = nccl.group("level")
        if level in ("INFO", "TRACE"):
            return None
        host, gpu, msg = nccl.group("host"), int(nccl.group("gpu")), nccl.group("msg")
        if grammar.BENIGN_NCCL_WARN.search(msg):
            return None
        for rule in grammar.RULES:
            if rule.kind.startswith("nccl") or rule.kind == "oom":
                if rule.pattern.search(msg):
                    return FailureLine(rule.kind, rule.role, line.rank, host, gpu, text.strip(), line.ts, where)
        return FailureLine("nccl-error", "cause", line.rank, host, gpu, text.strip(), line.ts, where)
    if "Last error:" in text and (cause := causes.last_error(text)):
        # NCCL's cause, as torch prints it after the generic message: the cause decides the kind (a peer that went
        # away is a victim's report, anything else this rank's NCCL failing on its own).
        kind, role = ("oom", "cause") if grammar.RULES[0].pattern.search(cause) else (
            ("nccl-remote", "victim") if (c := causes.nccl_cause(cause)) is not None and c.where == "peer"
            else ("nccl-error", "cause"))
        return FailureLine(kind, role, line.rank, None, None, text.strip()[:1000], line.ts, where)
    m = grammar.DS_EXITS.search(text) or grammar.OLD_LAUNCH.search(text)
    if m:
        lr = grammar.LOCAL_RANK_ARG.search(text)
        groups = m.groupdict()
        code = int(groups["code"]) if groups.get("code") else -int(groups["num"]) if groups.get("num") else None
        reporter = "deepspeed" if m.re is grammar.DS_EXITS else "launch"
        return ChildFailure(int(lr.group(1)) if lr else line.rank, code, signal_name(code, text), text.strip()[:1000],
                            None, None, False, reporter, where)
    m = grammar.AGENT_FAILED.search(text)
    if m:
        code = int(m.group("code"))
        return ChildFailure(int(m.group("local")), code, signal_name(code, text), text.strip(), None, None, False,
                            "agent", where)
    m = grammar.SHELL_DEATH.match(text.strip())
    if m:
        return ChildFailure(line.rank, None, _SHELL_SIGNALS[m.group("what")], text.strip(), None, None, False,
                            "shell", where)
    for rule in grammar.RULES:
        m = rule.pattern.search(text)
        if m:
            if rule.kind == "teardown":
                return None  # the launcher stopping survivors: noise once the culprit is known, never a cause
            if rule.kind == "gloo-io":
                hm = grammar.HOST_IN_BRACKETS.search(text)
                host = hm.group(1) if hm else None
            if rule.kind == "oom":
                gm = grammar.OOM_GPU.search(text)
                gpu = int(gm.group(1)) if gm else None
            return FailureLine(rule.kind, rule.role, line.rank, host, gpu, text.strip()[:1000], line.ts, where,
                               _odd_rank(rule.kind, m.groupdict(), line.rank))
    if line.logger in ("E", "F") or grammar.FAILURE_LINE.search(text):
        return Unexplained(line.rank, host, text.strip()[:500], line.ts, where)
    return None
