"""One log line per record, whatever a request puts into it.

Log records carry text from outside (an EHR's `error_description`, a path, a header, an exception
message); a newline in it would start a line of the attacker's choosing ("2099-01-01 ... INFO
forged"), and a right-to-left override would make a line read differently than it is. Escaping at
each call site would miss the next one, so chartcite formats every record through
`OneLineFormatter`, installed wherever it configures logging: the command line (`configure_logging`),
gunicorn (`server.GunicornLogger`) and Celery's worker and beat (`keep_chartcite_logging_in_celery`).
The same formatter masks the credentials of any URL a record holds (a broker URL in Celery's
"Connected to ...", an EHR endpoint in an error), as `chartcite config` does.
"""
from __future__ import annotations

import logging
import re
import sys

from .settings import mask_url_password

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Continuation lines of a traceback: never mistaken for a record of their own.
CONTINUATION = "\n  | "

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# C0 and C1 controls, DEL, the Unicode line and paragraph separators, and the bidirectional
# controls (marks, embeddings, overrides, isolates) that reorder what a reader sees.
_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029, 0x061C, 0x200E, 0x200F,
             *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xFEFF]
_ESCAPES = {code: _NAMED.get(chr(code)) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
            for code in _CONTROLS}


# A URL inside free text: its scheme, then everything up to whitespace or a quote.
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")


def mask_urls_in_text(text: str) -> str:
    return _URL_IN_TEXT.sub(lambda m: mask_url_password(m.group(0)), text) if "://" in text else text


def escape_controls(text: str) -> str:
    """The text on one line, each control character written as its escape (`\\n`, `\\u202e`)."""
    return text.translate(_ESCAPES)


class OneLineFormatter(logging.Formatter):
    """A record's line escaped; a traceback or stack after it kept readable, each of its lines
    escaped and marked as a continuation."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(mask_urls_in_text(super().formatMessage(record)))

    def format(self, record: logging.LogRecord) -> str:
        # The traceback is appended after the first newline (the line itself holds none now);
        # it may have been formatted, unescaped, by another handler's formatter and cached.
        head, newline, tail = super().format(record).partition("\n")
        if not newline:
            return head
        return head + CONTINUATION + CONTINUATION.join(escape_controls(mask_urls_in_text(line))
                                                       for line in tail.split("\n"))


def one_line(formatter: logging.Formatter) -> OneLineFormatter:
    """The same format and date format, one line per record."""
    return OneLineFormatter(formatter._fmt, formatter.datefmt)


# Libraries that log every request or task at INFO. Elasticsearch's transport writes a line per
# request (thousands in a sync); Celery writes one per task received and one per task succeeded,
# the latter with the task's return value, which is not chartcite's to decide the content of.
# They keep their warnings; at DEBUG everything is written.
NOISY_LOGGERS = ("elastic_transport", "elasticsearch", "urllib3", "celery.app.trace", "celery.worker.strategy",
                 "kombu", "amqp", "alembic")


def configure_logging(level: str) -> None:
    """The command line's (and so `chartcite serve`'s, `worker`'s and `beat`'s) root logger."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(LOG_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    quiet_libraries(level)


def quiet_libraries(level: str) -> None:
    if level.upper() != "DEBUG":
        for name in NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


def keep_chartcite_logging_in_celery() -> None:
    """Celery configures logging itself unless something answers its `setup_logging` signal;
    answering it keeps the root logger `configure_logging` set up, so tasks log one line each too."""
    from celery import signals

    signals.setup_logging.connect(_logging_already_configured, weak=False)


def _logging_already_configured(**_) -> None:
    return None
