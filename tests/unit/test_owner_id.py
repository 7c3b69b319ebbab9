"""The owner id in START markers fits the wire's 255 utf-8 bytes, whatever the client id.

The owner is ``client_id@host:pid`` (or the group member id, which brokers build from the
client id): a long non-ASCII client id cut to 255 *characters* is still up to 1020 bytes,
and every START built from it was refused, so the fetcher failed on every start."""

from __future__ import annotations

import pytest

from kmq.consumer.writer import default_owner
from kmq.core.markers import MAX_OWNER_BYTES, Start, clip_owner, decode, encode


@pytest.mark.parametrize("client_id", ["é" * 200, "日本" * 100, "🦀" * 80, "k" * 300])
def test_default_owner_of_a_long_client_id_fits_a_start_marker(client_id):
    owner = default_owner(client_id)
    assert len(owner.encode("utf-8")) <= MAX_OWNER_BYTES
    assert owner and client_id.startswith(owner[:10])
    assert decode(encode(Start([(0, 1)], lease_ms=1000, owner=owner))).owner == owner


@pytest.mark.parametrize("owner, expected", [
    ("short@host:1", "short@host:1"),
    ("a" * 255, "a" * 255),
    ("a" * 254 + "é", "a" * 254),  # é is 2 bytes: cut before it, never in its middle
    ("a" * 253 + "🦀", "a" * 253),  # 4 bytes
    ("a" * 251 + "🦀", "a" * 251 + "🦀"),  # exactly 255 bytes
    ("a\ud800b", "a?b"),  # not encodable: replaced, so the marker always encodes
])
def test_clip_owner_cuts_at_a_character_boundary_within_255_bytes(owner, expected):
    assert clip_owner(owner) == expected
    Start([(0, 1)], lease_ms=1, owner=clip_owner(owner))
