"""kmq: individual acknowledgements, timeout redelivery, lease renewal and
dead-lettering for any Kafka cluster (the KMQ pattern).

The public surface is listed in ``__all__`` and pinned by
tests/unit/test_public_api.py.
"""

from __future__ import annotations

__version__ = "0.1.0"

from kmq.config import Config
from kmq.errors import (
    BrokerUnavailable,
    ConfigError,
    KmqError,
    MarkerDecodeError,
    MarkerWriteError,
    MessageAlreadySettled,
    TopicError,
    TopicMisaligned,
    TopicMissing,
)

__all__ = [
    "__version__",
    # configuration
    "Config",
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
]
