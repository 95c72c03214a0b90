"""The one exception type that means "the user gave us something we cannot use" (exit code 2)."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.terminal_text import one_line


class BadInput(Exception):
    """Bad input: a missing or unreadable file, a truncated trace, a bad flag value.

    The CLI prints ``str(exc)`` as one line and exits 2. ``path`` names the file when there is one. Both may come
    from an attacker (a file name, a pickle's global name): the message is made one line without escape sequences.
    """

    def __init__(self, problem: str, path: str | Path | None = None) -> None:
        self.problem = problem
        self.path = str(path) if path is not None else None
        super().__init__(one_line(f"{self.path}: {problem}" if self.path else problem))


EXIT_OK = 0
EXIT_FINDING = 1
EXIT_BAD_INPUT = 2
