"""The worker's logging: one handler on stderr, text or JSON lines, passwords redacted.

The runtime logs through the standard library (the ``nursery_jobs`` logger), and every record it
writes carries its facts as structured fields (``extra=``): ``event`` (a stable name such as
``attempt_failed``), and where they apply ``job_id``, ``kind``, ``queue``, ``attempt``,
``duration``, ``error``, ``backend``. The text format shows the message, which already says
all of it in words; the JSON format writes one object per line with the time, level, logger and
message and every structured field, for a log pipeline to index.

The worker owns its process, so it configures the root logger: the service's own records (its
handlers' ``logging`` calls) come out in the same format, at the same level. The standard
library's `json` is fast enough here: the runtime logs per failed attempt and per rare event,
never per job that succeeds, so a faster codec would buy nothing measurable.

Every line passes through `redact` on its way out, so a password in a URL that some message
quotes (the service's own, or a library's) never reaches the log.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from ..infra.redact import redact

__all__ = ["FORMATS", "LEVELS", "JsonFormatter", "TextFormatter", "configure"]

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")

# What every LogRecord has: the rest of its attributes are the record's structured fields.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's structured fields: what was passed as ``extra=``."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    """``2026-12-01T13:45:02.123Z WARNING nursery_jobs: job 7 (send_email) ...``: the message,
    which the runtime writes to say every fact of its fields."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return redact(line)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, then every
    structured field; ``exception`` holds a logged traceback. A value JSON cannot hold is
    written as its ``str``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in fields(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return redact(json.dumps(out, default=str, ensure_ascii=False))


def configure(level: str, fmt: str) -> None:
    """Send every record at `level` and above to stderr, in `fmt` (``text`` or ``json``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
