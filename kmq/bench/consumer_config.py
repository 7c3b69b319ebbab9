"""The configuration every consumer benchmark runs with (``kmq bench consumer``, its latency
run and ``kmq bench aio``): default consumer settings, what a user gets, on the broker's
test timing."""

from __future__ import annotations

from kmq.config import Config

__all__ = ["consumer_config"]


def consumer_config(bootstrap: str, queue: str, group: str, flush_interval: str, client: str = "kafka-python",
                    ordering: str = "none", auto_renew: bool = True, fetch_wait: str | None = None,
                    hand_over: str = "committed") -> Config:
    """One queue ``queue`` consumed by ``group`` on ``client`` (``fetch_wait``: ``consumer.fetch_wait``,
    ``hand_over``: ``consumer.hand_over``)."""
    return Config.from_dict({
        "kafka": {"bootstrap_servers": bootstrap, "session_timeout": "6s", "heartbeat_interval": "1s",
                  "client": client},
        "queues": [{"name": queue}],
        # Default consumer settings (flow control and in-flight cap): what a user gets.
        "consumer": {"group_id": group, "ack_flush_interval": flush_interval, "ordering": ordering,
                     "auto_renew": auto_renew, "fetch_wait": fetch_wait, "hand_over": hand_over},
    })
