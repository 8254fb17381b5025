"""The broker's log output: readable text (the default) or one JSON object per line.

JSON lines carry ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``message``
and, when a record has one, ``exception`` (the formatted traceback), so a log shipper can parse
every line without a pattern and a multi-line traceback stays inside one record.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from datetime import datetime, timezone

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure_logging"]

LOG_FORMATS = ("text", "json")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (newlines inside values are escaped by JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Send every log record at ``level`` and above to stderr in ``log_format`` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.captureWarnings(True)  # Python warnings become records in the same format
    if log_format == "json":  # so must a crash: a traceback printed raw would break one-object-per-line
        sys.excepthook = _log_uncaught
        threading.excepthook = lambda args: _log_uncaught(args.exc_type, args.exc_value, args.exc_traceback,
                                                          args.thread.name if args.thread else None)


def _log_uncaught(exc_type, exc_value, tb, thread: str | None = None) -> None:
    where = f" in thread {thread}" if thread else ""
    logging.getLogger("broker").critical("uncaught %s%s", exc_type.__name__, where,
                                         exc_info=(exc_type, exc_value, tb))
