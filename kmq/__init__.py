"""kmq: individual acknowledgements, timeout redelivery, lease renewal and
dead-lettering for any Kafka cluster (the KMQ pattern).

The public surface is listed in ``__all__`` and pinned by
tests/unit/test_public_api.py.
"""

from __future__ import annotations

from kmq.config import Config
from kmq.core.errors import (
    BrokerUnavailable,
    ConfigError,
    KmqError,
    MarkerDecodeError,
    MarkerWriteError,
    InvalidSettlement,
    MessageAlreadySettled,
    TopicError,
    TopicMisaligned,
    TopicMissing,
    UnsupportedConsumer,
    ClientNotInstalled,
)
from kmq.consumer.consumer import KmqConsumer
from kmq.consumer.guard import IdempotencyGuard
from kmq.core.message import KmqMessage
from kmq.core.schedule import HEADER_NOT_BEFORE, ScheduleError, schedule
from kmq.consumer.writer import MarkerWriter, marked
from kmq.version import __version__

__all__ = [
    "__version__",
    # configuration
    "Config",
    # consuming
    "KmqConsumer",
    "KmqMessage",
    "MarkerWriter",
    "marked",
    "IdempotencyGuard",
    # producing
    "schedule",
    "HEADER_NOT_BEFORE",
    # errors
    "KmqError",
    "ConfigError",
    "MarkerDecodeError",
    "BrokerUnavailable",
    "TopicError",
    "TopicMissing",
    "TopicMisaligned",
    "MarkerWriteError",
    "MessageAlreadySettled",
    "InvalidSettlement",
    "ScheduleError",
    "UnsupportedConsumer",
    "ClientNotInstalled",
]
