"""The agent's log formats: text for a terminal or journal, JSON for a log pipeline.

Both write what a record says as data: control characters and line breaks in a message
(an API server's error text, a name a user chose) are escaped, so a record cannot forge
a second log line or drive a terminal; tracebacks keep their frames' lines.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from typing import Any

from exporter.core.escape import for_terminal


class JsonFormatter(logging.Formatter):
    """One JSON object per line (time, level, logger, message; a GPU incident's record under
    ``incident``) for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        incident = getattr(record, "incident", None)  # a GPU incident's record (exporter.incidents.watch)
        if isinstance(incident, dict):
            entry["incident"] = incident
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    """A record's message on one line, control characters written as visible escapes.

    A log line can carry text chosen by others: an API server's or a kubelet's error
    text, a request's path, a name a user chose. Written raw, a newline in it would forge
    a log line of its own and an escape sequence would drive the terminal of whoever
    reads the log (`exporter.core.escape.for_terminal`). A traceback keeps its lines, each
    escaped; JSON logs escape everything as JSON does.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return for_terminal(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802
        # The frames and Python's own lines keep their line breaks; an exception's
        # message (which may quote others' text) is one line, its newlines escaped.
        out = []
        for chunk in traceback.TracebackException(ei[0], ei[1], ei[2]).format():
            if chunk.startswith((" ", "\n", "Traceback ")):
                out.append(_lines_for_terminal(chunk))
            else:
                out.append(for_terminal(chunk[:-1] if chunk.endswith("\n") else chunk) + "\n")
        return "".join(out).rstrip("\n")

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return _lines_for_terminal(super().formatStack(stack_info))


def _lines_for_terminal(text: str) -> str:
    return "\n".join(for_terminal(line) for line in text.split("\n"))


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

