"""Structure-aware mutations of real logs: what log collectors, pastes and terminals do to a log, not random bytes.

Each takes a log's text (and a random.Random) and returns the text as it might reach `ddpdoctor logs` / `topo`:
  dedent          leading whitespace removed (a traceback pasted into a chat or an issue loses its indentation)
  strip_prefixes  the per-line prefixes removed ("[default0]:[rank0]: ", timestamps, "node01: ", "[1,0]<stderr>:")
  cut_mid_table   the log cut inside a block of similar lines (an NCCL ring/channel table, a traceback)
  interleave      two ranks' logs interleaved line by line, each line with its rank's prefix (torchrun --tee)
  crlf            CRLF line ends (a Windows editor, some collectors), or a stray CR mid-line (progress bars)
  ansi            ANSI colours around words and whole lines (rich, loguru, coloured NCCL output)
  prefix_rank     every line prefixed with a torchrun-style rank tag (the log of one rank as torchrun --tee writes it)
Driven by a random.Random so hypothesis (st.randoms()) replays them."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

_PREFIX = re.compile(r"^(?:\[[A-Za-z_]*\d+\]:\s?|\[\d+,\d+\]<std(?:out|err)>:\s?|[\w.-]+: (?=\[|\w)|"
                     r"\d{4}-\d\d-\d\d[ T][\d:.,]+\s*|\[?\d\d:\d\d:\d\d[.,]?\d*\]?\s*)+")
_COLOURS = ["\x1b[31m", "\x1b[1;33m", "\x1b[38;5;208m", "\x1b[2m", "\x1b[0;36m"]
_RESET = "\x1b[0m"


def dedent(text: str, rnd: random.Random) -> str:
    lines = text.split("\n")
    if rnd.random() < 0.5:
        return "\n".join(ln.lstrip() for ln in lines)
    start = rnd.randrange(len(lines))  # one stretch only (a part of the log pasted elsewhere)
    end = min(len(lines), start + rnd.randint(1, 60))
    return "\n".join(ln.lstrip() if start <= i < end else ln for i, ln in enumerate(lines))


def strip_prefixes(text: str, rnd: random.Random) -> str:
    return "\n".join(_PREFIX.sub("", ln, count=1) for ln in text.split("\n"))


def _blocks(lines: list[str]) -> list[tuple[int, int]]:
    """Runs of >= 3 lines that start alike (their first 12 characters with digits blurred): tables, tracebacks."""
    key = [re.sub(r"\d", "0", ln.strip()[:12]) for ln in lines]
    out, i = [], 0
    while i < len(lines):
        j = i
        while j + 1 < len(lines) and key[j + 1] == key[i] and key[i]:
            j += 1
        if j - i >= 2:
            out.append((i, j + 1))
        i = j + 1
    return out


def cut_mid_table(text: str, rnd: random.Random) -> str:
    lines = text.split("\n")
    blocks = _blocks(lines)
    if blocks:
        start, end = rnd.choice(blocks)
    else:
        start, end = 0, len(lines)
    at = rnd.randrange(start, end) if end > start else 0
    line = lines[at]
    return "\n".join(lines[:at] + [line[: rnd.randrange(len(line) + 1)]])


def prefix_rank(text: str, rnd: random.Random, rank: int | None = None) -> str:
    r = rnd.randrange(8) if rank is None else rank
    tag = rnd.choice([f"[default{r}]:[rank{r}]: ", f"[rank{r}]: ", f"[1,{r}]<stderr>:", f"node{r:02d}: "])
    return "\n".join(tag + ln for ln in text.split("\n"))


def interleave(text: str, rnd: random.Random, other: str | None = None) -> str:
    """This log as rank 0 and ``other`` (or this one again) as rank 1, line by line in a random merge."""
    a = prefix_rank(text, rnd, 0).split("\n")
    b = prefix_rank(other if other is not None else text, rnd, 1).split("\n")
    out, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and rnd.random() < 0.5):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return "\n".join(out)


def crlf(text: str, rnd: random.Random) -> str:
    if rnd.random() < 0.7:
        return text.replace("\n", "\r\n")
    lines = text.split("\n")
    i = rnd.randrange(len(lines))
    lines[i] = "progress 10%\r" + lines[i]
    return "\n".join(lines)


def ansi(text: str, rnd: random.Random) -> str:
    lines = text.split("\n")
    for i in rnd.sample(range(len(lines)), k=min(len(lines), rnd.randint(1, 40))):
        words = lines[i].split(" ")
        if rnd.random() < 0.5:
            lines[i] = rnd.choice(_COLOURS) + lines[i] + _RESET
        elif words:
            k = rnd.randrange(len(words))
            words[k] = rnd.choice(_COLOURS) + words[k] + _RESET
            lines[i] = " ".join(words)
    return "\n".join(lines)


MUTATIONS: dict[str, Callable[[str, random.Random], str]] = {
    "dedent": dedent, "strip_prefixes": strip_prefixes, "cut_mid_table": cut_mid_table, "interleave": interleave,
    "crlf": crlf, "ansi": ansi, "prefix_rank": prefix_rank,
}


def mutate_structure(text: str, rnd: random.Random, changes: int | None = None) -> tuple[str, list[str]]:
    """1-3 of the mutations above, in a random order; returns the text and the names applied."""
    names = [rnd.choice(sorted(MUTATIONS)) for _ in range(changes or rnd.randint(1, 3))]
    for name in names:
        text = MUTATIONS[name](text, rnd)
    return text, names
