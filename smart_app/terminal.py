"""Text from outside (record text, file names, an EHR's error, a launch's patient id) made safe
for an operator's terminal: control characters (ESC starts a terminal escape sequence, a newline
or carriage return forges a line of output), C1 controls, and the invisible format and
bidirectional characters (U+202E turns the rest of a line around) are written as escapes such as
\\x1b, \\n or \\u202e, so the operator sees them rather than their effect. `--json` output and the
logs escape them already.
"""
from __future__ import annotations

import io
import sys
import unicodedata

# Unicode categories that change what a terminal shows rather than show a character: controls,
# format characters (bidi embeddings and isolates, zero-width ones), line and paragraph separators.
# Surrogates ("Cs") are the bytes of a file name the locale could not decode (Python's
# surrogateescape): written as the bytes they stand for.
_HIDDEN = {"Cc", "Cf", "Zl", "Zp", "Cs"}


def _escape(char: str) -> str:
    if char in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def utf8_streams() -> None:
    """Standard input, output and error in UTF-8 whatever the locale says. A server started with a
    C or ASCII locale (a bare container, `PYTHONUTF8=0`) would otherwise fail on the first em dash,
    "≥" or accented name an answer, a log line or a report holds, or a patient's message piped in."""
    for stream, errors in ((sys.stdin, "replace"), (sys.stdout, "backslashreplace"), (sys.stderr, "backslashreplace")):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if encoding != "utf8" and hasattr(stream, "reconfigure"):
            stream.reconfigure(encoding="utf-8", errors=errors)


def shown(value) -> str:
    """`value` as text with every control, format and separator character escaped, newlines too:
    one field from outside stays on its line."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(_escape(c) if unicodedata.category(c) in _HIDDEN else c for c in text)


class TerminalSafe(io.TextIOBase):
    """A text stream that escapes what `shown` escapes except the newlines and tabs the command
    itself writes between lines and columns: the safety net under every human-readable output."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        safe = "".join(c if c in "\n\t" or unicodedata.category(c) not in _HIDDEN else _escape(c) for c in text)
        self.stream.write(safe)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")
