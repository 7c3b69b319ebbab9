"""Keyed messages for the ``consumer.ordering: key`` tests: produce them, check completion order."""

from __future__ import annotations

from typing import Iterable

from kmq.config import KafkaConfig
from tests.helpers.kafka import produce


def keyed_value(key: int, seq: int) -> bytes:
    """The value of message ``seq`` of key ``k<key>``: ``k<key>/<seq>``."""
    return b"k%d/%d" % (key, seq)


def produce_keyed(kafka: KafkaConfig, topic: str, keys: int, per_key: int) -> list[bytes]:
    """Produce ``per_key`` messages of each of ``keys`` keys (``k0``, ``k1``...), interleaved
    (every key's message 0, then every key's message 1...), so each partition holds several keys
    in turn; returns their values (:func:`keyed_value`)."""
    values = [keyed_value(k, i) for i in range(per_key) for k in range(keys)]
    produce(kafka, topic, values=values, keys=[v.split(b"/")[0] for v in values], partition=None)
    return values


def first_completions(done: Iterable[bytes | str]) -> dict[str, list[int]]:
    """Per key, the sequence numbers of completed values in the order of their first completion
    (a message completed again, a duplicate, keeps its first place)."""
    by_key: dict[str, list[int]] = {}
    for v in dict.fromkeys(x.decode() if isinstance(x, bytes) else x for x in done):
        key, seq = v.split("/")
        by_key.setdefault(key, []).append(int(seq))
    return by_key


def keys_out_of_order(done: Iterable[bytes | str]) -> list[str]:
    """The keys whose first completions are not in offset (sequence) order."""
    return sorted(k for k, seqs in first_completions(done).items() if seqs != sorted(seqs))
