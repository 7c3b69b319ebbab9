"""librdkafka's log lines into Python logging (``kmq.librdkafka``), bounded during outages.

confluent-kafka hands each librdkafka log line to the ``logger`` setting as
``logger.log(level, "%s [%s] %s", facility, handle_name, text)``. While a
broker is down librdkafka logs every reconnect attempt of every handle to
every broker at ERROR: a 30 s outage gave about 1,350 "Connect to ... failed:
Connection refused" lines from one worker. The client reconnects on its own
and kmq's own outage handling says what the outage means for the work, so:

* connection-level failures (refused, reset, disconnected, all brokers down)
  are logged at WARNING, not ERROR; configuration-shaped failures (TLS, SASL,
  security.protocol hints, unresolvable names) keep librdkafka's level;
* repeats of the same line (same handle, facility, broker, and text with its
  numbers masked) are collapsed by :class:`kmq.client.confluent.log_throttle.RepeatThrottle`:
  the first is logged, then at most one line per :data:`REPEAT_INTERVAL_S`
  with the count, and the remaining counts when the client closes.

One :class:`LibrdkafkaLogBridge` per client handle (``client_confluent.settings``
makes a new one per call), so one handle's storm never hides another's.
No confluent-kafka import: the bridge only receives calls.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Callable

from kmq.client.confluent.log_throttle import RepeatThrottle, Suppressed

__all__ = ["LibrdkafkaLogBridge", "LOGGER_NAME", "REPEAT_INTERVAL_S", "is_transport_failure", "repeat_key"]

LOGGER_NAME = "kmq.librdkafka"
#: At most one line per repeated librdkafka message per this many seconds (per handle and broker).
REPEAT_INTERVAL_S = 30.0

_THREAD_PREFIX = re.compile(r"^\[thrd:[^\]]*\]:\s*")
_NUMBER = re.compile(r"\d+")
_STATE_SUFFIX = re.compile(r"\s*\(after \d+ms in state .*\)\s*$")  # timing, state, "N identical error(s) suppressed"
# Connection-level failures the client recovers from by reconnecting.
_TRANSPORT = re.compile(
    r"Connection refused|Connect to .* failed|Disconnected|connection reset|connection closed|brokers are down"
    r"|Receive failed|Send failed|timed out|No route to host|Network is unreachable|Broken pipe",
    re.IGNORECASE,
)
# ... unless the line points at a configuration problem, which must stay as loud as librdkafka says.
_CONFIG_HINT = re.compile(r"security\.protocol|SSL|TLS|SASL|authenticat|certificate|resolve", re.IGNORECASE)
# kafka.confluent settings go to producers and consumers alike, so a consumer's property on a
# producer (and the reverse) is expected: librdkafka ignores it, kmq logs that at DEBUG only.
_OTHER_ROLE = re.compile(r"is a (producer|consumer) property and will be ignored by this (consumer|producer)")


def is_transport_failure(text: str) -> bool:
    """Whether a librdkafka log text is a connection-level failure that reconnecting cures."""
    return bool(_TRANSPORT.search(text)) and not _CONFIG_HINT.search(text)


def repeat_key(facility: str, text: str) -> tuple[str, str, str]:
    """What makes two lines of one handle "the same": (facility, broker, text with numbers masked).

    ``text`` is ``[thrd:NAME]: BROKER: message (after 12ms in state CONNECT, 3 identical
    error(s) suppressed)``: the state suffix and numbers differ between repeats, the broker
    does not (kept whole, so two brokers' failures are two keys)."""
    body = _THREAD_PREFIX.sub("", text)
    broker, sep, rest = body.partition(": ")
    if not sep:
        broker, rest = "", body
    return facility, broker, _NUMBER.sub("N", _STATE_SUFFIX.sub("", rest))


class LibrdkafkaLogBridge:
    """The ``logger`` setting of a confluent-kafka client: demotes connection failures to
    WARNING and collapses repeats, then logs to ``logging.getLogger("kmq.librdkafka")``."""

    def __init__(self, logger: logging.Logger | None = None, interval: float = REPEAT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger or logging.getLogger(LOGGER_NAME)
        self._throttle: RepeatThrottle[tuple[str, str, str]] = RepeatThrottle(interval)
        self._clock = clock
        self._lock = threading.Lock()  # log() runs on whichever thread polls the handle
        # The newest dropped line of each key with pending repeats, for its summary line.
        self._dropped: dict[tuple[str, str, str], tuple[int, str, str]] = {}

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        """Called by confluent-kafka (on the polling thread) for each librdkafka log line."""
        if len(args) != 3 or kwargs:  # not librdkafka's (facility, handle, text): pass through
            self._logger.log(level, msg, *args, **kwargs)
            return
        facility, handle, text = (str(a) for a in args)
        if level > logging.WARNING and is_transport_failure(text):
            level = logging.WARNING
        if _OTHER_ROLE.search(text):
            level = logging.DEBUG
        key = repeat_key(facility, text)
        out: list[tuple[int, str, tuple[Any, ...]]] = []
        with self._lock:
            now = self._clock()
            admitted = self._throttle.admit(key, now)
            if admitted is None:
                self._dropped[key] = (level, handle, text)
            else:
                self._dropped.pop(key, None)
                if admitted.count:
                    out.append((level, "%s [%s] %s (%d repeats in the previous %.0f s not logged)",
                                (facility, handle, text, admitted.count, admitted.seconds)))
                else:
                    out.append((level, msg, (facility, handle, text)))
            out.extend(self._summaries(self._throttle.due(now)))
        for lvl, fmt, fmt_args in out:
            self._logger.log(lvl, fmt, *fmt_args)

    def flush(self) -> None:
        """Log the counts of repeats not logged yet (the client is closing)."""
        with self._lock:
            out = self._summaries(self._throttle.drain(self._clock()))
        for lvl, fmt, fmt_args in out:
            self._logger.log(lvl, fmt, *fmt_args)

    def _summaries(self, dropped: list[Suppressed[tuple[str, str, str]]]) -> list[tuple[int, str, tuple[Any, ...]]]:
        out = []
        for s in dropped:
            level, handle, text = self._dropped.pop(s.key)
            out.append((level, "%s [%s] repeated %d times in the last %.0f s (not logged one by one): %s",
                        (s.key[0], handle, s.count, s.seconds, text)))
        return out
