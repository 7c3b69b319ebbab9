"""Process-wide logging set up from ``logging: {level, format}`` in kmq.yaml.

Applied once by the CLI entry (after the configuration is loaded), never at
import time: a library user keeps their own logging. ``format: json`` writes
one JSON object per line (``ts``, ``level``, ``logger``, ``message``, and
``exc`` with the traceback when there is one), which log shippers parse
without multi-line rules.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

from kmq.config import LoggingConfig

__all__ = ["JsonFormatter", "configure_logging", "TEXT_FORMAT"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; extra attributes given with ``extra=`` are kept."""

    _STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in self._STANDARD and not key.startswith("_"):
                out[key] = value if _plain(value) else repr(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _plain(value: object) -> bool:
    """A scalar, or a list of scalars (``partitions``): kept as JSON; anything else as its repr."""
    scalars = (str, int, float, bool, type(None))
    return isinstance(value, scalars) or (isinstance(value, list) and all(isinstance(v, scalars) for v in value))


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (test runners swap it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(cfg: LoggingConfig, verbose: int = 0, stream=None) -> None:
    """Install one stderr handler on the root logger with ``cfg``'s format and level.

    ``-v``/``-vv`` on the command line can only raise verbosity above the
    configured level (INFO, DEBUG). kafka-python's own loggers stay at
    CRITICAL unless the level is DEBUG: it logs every refused connection at
    ERROR, and kmq's own one-line errors say what matters. The loggers named
    in ``cfg.debug`` log at DEBUG whatever the level.
    """
    level = logging.getLevelName(cfg.level)
    if verbose >= 2:
        level = logging.DEBUG
    elif verbose == 1:
        level = min(level, logging.INFO)
    handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(JsonFormatter() if cfg.format == "json" else logging.Formatter(TEXT_FORMAT))
    handler._kmq_handler = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    # Replace our own earlier handler (and the CLI's plain default), keep anyone else's
    # (an embedding application's, a test runner's capture).
    for old in list(root.handlers):
        if getattr(old, "_kmq_handler", False) or getattr(old, "_kmq_default", False):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("kafka").setLevel(logging.DEBUG if level <= logging.DEBUG else logging.CRITICAL)
    for name in cfg.debug_loggers:  # under a quieter parent ("kafka" at CRITICAL) too: their own level wins
        logging.getLogger(name).setLevel(logging.DEBUG)
