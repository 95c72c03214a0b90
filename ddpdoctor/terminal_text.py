"""Text from untrusted input made safe for a terminal: escape sequences (CSI, OSC, C0, C1) never reach it."""

from __future__ import annotations

import re

# C0 and C1 control characters except tab and newline, and DEL: what makes a terminal change its title, clear
# the screen or move the cursor. ESC sequences are dropped whole where they parse, else the ESC byte alone.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# A lone surrogate (U+D800..U+DFFF: a str decoded with surrogateescape/surrogatepass) is shown the same way: a
# strict stdout (en_US.UTF-8) cannot encode it, and printing it was a traceback (issue 40 item 8).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def strip_ansi(text: str) -> str:
    """Text without its colour and cursor escape sequences (a log a CI system or a coloured logger kept them in)."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def clean_text(text: str) -> str:
    """Text from an untrusted input made safe to print: escape sequences removed, other control characters shown
    as visible escapes (``\\x1b``), tabs and newlines kept."""
    if not _CONTROL.search(text):
        return text
    text = _ANSI.sub("", text)
    return _CONTROL.sub(_visible, text.replace("\r\n", "\n"))


def _visible(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\u{code:04x}" if code > 0xFF else f"\\x{code:02x}"


def one_line(text: str) -> str:
    """``clean_text`` on one line: newlines and tabs shown as ``\\n`` / ``\\t`` too (an error line stays one line)."""
    return clean_text(text).replace("\n", "\\n").replace("\t", " ")
