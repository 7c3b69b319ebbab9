"""Marker wire format v1: golden vectors, round-trips, rejection of bad bytes, fuzzing."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.core import markers as m
from kmq.core.errors import MarkerDecodeError, NewerMarkerVersion
from kmq.core.ranges import OffsetRange

GOLDEN = json.loads((Path(__file__).parent.parent / "data" / "markers_v1_golden.json").read_text())
CLASSES = {"START": m.Start, "END": m.End, "RENEW": m.Renew, "NACK": m.Nack, "REJECT": m.Reject, "CLOSED": m.Closed}


def _from_golden(case: dict) -> m.Marker:
    cls = CLASSES[case["type"]]
    extra = {k: case[k] for k in ("lease_ms", "owner", "delay_ms", "counted", "reason", "outcome") if k in case}
    return cls(ranges=tuple(map(tuple, case["ranges"])), **extra)


@pytest.mark.parametrize("case", [c for c in GOLDEN if "hex" in c], ids=lambda c: c["name"])
def test_golden_vectors_encode_and_decode_exactly(case):
    marker = _from_golden(case)
    assert m.encode(marker).hex() == case["hex"]
    assert m.decode(bytes.fromhex(case["hex"])) == marker


def test_every_type_has_a_golden_vector():
    assert {c["type"] for c in GOLDEN if "type" in c} == set(CLASSES)


def test_golden_key():
    case = next(c for c in GOLDEN if "key_hex" in c)
    assert m.encode_key(case["partition"]).hex() == case["key_hex"]
    assert m.decode_key(bytes.fromhex(case["key_hex"])) == case["partition"]


def test_start_layout_by_hand():
    # u8 version, u8 type, u16 n, (i64 first, u32 count), u32 lease, u8 len + owner
    raw = m.encode(m.Start([(5, 3)], 1000, "w"))
    assert raw == struct.pack(">BBHqIIB", 1, 1, 1, 5, 3, 1000, 1) + b"w"


# ----------------------------------------------------------------- strategies
offsets = st.integers(min_value=0, max_value=(1 << 40))
range_lists = st.lists(st.tuples(offsets, st.integers(1, 10_000)), min_size=1, max_size=20).map(
    lambda rs: _disjoint(rs)
)


def _disjoint(rs):
    out, cursor = [], 0
    for gap, count in sorted(rs):
        first = cursor + gap % 1000
        out.append((first, count))
        cursor = first + count + 1
    return out


text = st.text(max_size=40)
markers_st = st.one_of(
    st.builds(m.Start, range_lists, st.integers(0, 0xFFFFFFFF), st.text(max_size=30).filter(lambda s: len(s.encode()) <= 255)),
    st.builds(m.End, range_lists),
    st.builds(m.Renew, range_lists, st.integers(0, 0xFFFFFFFF)),
    st.builds(m.Nack, range_lists, st.integers(0, 0xFFFFFFFF)),
    st.builds(m.Reject, range_lists, text),
    st.builds(m.Closed, range_lists, st.sampled_from(list(m.Outcome))),
)


@settings(max_examples=500, deadline=None)
@given(markers_st)
def test_round_trip_every_type(marker):
    raw = m.encode(marker)
    back = m.decode(raw)
    assert back == marker
    assert m.encode(back) == raw


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=300))
def test_ranges_are_coalesced_on_encode(offs):
    marker = m.End([(o, 1) for o in sorted(set(offs))])
    covered = [o for r in marker.ranges for o in r.offsets()]
    assert covered == sorted(set(offs))
    # consecutive offsets must be one range: no two ranges touch
    assert all(a.end < b.first for a, b in zip(marker.ranges, marker.ranges[1:]))


# ----------------------------------------------------------------- rejection
def _ranges_bytes(*pairs):
    return struct.pack(">H", len(pairs)) + b"".join(struct.pack(">qI", f, c) for f, c in pairs)


BAD = {
    "empty": b"",
    "only_version": b"\x01",
    "version_zero": b"\x00\x02" + _ranges_bytes((1, 1)),
    "newer_version_without_ranges": b"\x02\x02\x00",
    "unknown_type": b"\x01\x07" + _ranges_bytes((1, 1)),
    "type_zero": b"\x01\x00" + _ranges_bytes((1, 1)),
    "no_ranges": b"\x01\x02" + struct.pack(">H", 0),
    "count_zero": b"\x01\x02" + _ranges_bytes((1, 0)),
    "overlap": b"\x01\x02" + _ranges_bytes((1, 5), (3, 1)),
    "duplicate_range": b"\x01\x02" + _ranges_bytes((9, 1), (9, 1)),
    "negative_offset": b"\x01\x02" + _ranges_bytes((-1, 1)),
    "truncated_range": (b"\x01\x02" + _ranges_bytes((1, 1)))[:-1],
    "truncated_lease": b"\x01\x03" + _ranges_bytes((1, 1)) + b"\x00\x00",
    "trailing_byte_end": b"\x01\x02" + _ranges_bytes((1, 1)) + b"\x00",
    "trailing_after_start": m.encode(m.Start([(1, 1)], 5, "x")) + b"!",
    "owner_too_short": b"\x01\x01" + _ranges_bytes((1, 1)) + struct.pack(">IB", 5, 4) + b"ab",
    "owner_bad_utf8": b"\x01\x01" + _ranges_bytes((1, 1)) + struct.pack(">IB", 5, 1) + b"\xff",
    "reason_bad_utf8": b"\x01\x05" + _ranges_bytes((1, 1)) + struct.pack(">H", 2) + b"\xc3\x28",
    "closed_unknown_outcome": b"\x01\x06" + _ranges_bytes((1, 1)) + b"\x09",
    "closed_outcome_zero": b"\x01\x06" + _ranges_bytes((1, 1)) + b"\x00",
    "range_past_i64": b"\x01\x02" + _ranges_bytes(((1 << 63) - 1, 2)),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_values_raise_marker_decode_error_with_reason(name):
    with pytest.raises(MarkerDecodeError) as info:
        m.decode(BAD[name])
    assert info.value.reason


@pytest.mark.parametrize("value", [None, "text", 5, bytearray(b"\x01")])
def test_non_bytes_values_are_decode_errors(value):
    with pytest.raises(MarkerDecodeError):
        m.decode(value)


@pytest.mark.parametrize("key", [None, b"", b"\x00\x00\x01", b"\x00\x00\x00\x00\x00", b"\xff\xff\xff\xff"])
def test_bad_keys(key):
    with pytest.raises(MarkerDecodeError):
        m.decode_key(key)


def test_adjacent_ranges_from_the_wire_are_merged():
    raw = b"\x01\x02" + _ranges_bytes((1, 2), (3, 2))
    assert m.decode(raw).ranges == (OffsetRange(1, 4),)


@pytest.mark.parametrize(
    "build",
    [
        lambda: m.End([]),
        lambda: m.End([(1, 0)]),
        lambda: m.End([(1, 3), (2, 1)]),
        lambda: m.Start([(1, 1)], -1),
        lambda: m.Start([(1, 1)], 1 << 32),
        lambda: m.Start([(1, 1)], 5, "x" * 256),
        lambda: m.Closed([(1, 1)], 7),
    ],
)
def test_invalid_markers_cannot_be_built(build):
    with pytest.raises(ValueError):
        build()


def test_long_reject_reason_is_cut_at_u16():
    r = m.Reject([(1, 1)], "é" * 40000)
    assert len(r.reason.encode()) <= 0xFFFF
    assert m.decode(m.encode(r)) == r


# ----------------------------------------------------------------- fuzz
def _mutations(rng: random.Random, seeds: list[bytes]):
    for _ in range(50_000):  # pure random
        yield rng.randbytes(rng.randint(0, 64))
    for _ in range(60_000):  # mutated valid markers
        b = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            op = rng.randint(0, 3)
            if op == 0 and b:
                b[rng.randrange(len(b))] = rng.randrange(256)
            elif op == 1 and b:
                del b[rng.randrange(len(b)) :]
            elif op == 2:
                b.insert(rng.randint(0, len(b)), rng.randrange(256))
            elif b:
                i = rng.randrange(len(b))
                del b[i]
        yield bytes(b)


def test_fuzz_110k_random_and_mutated_values_only_raise_marker_decode_error():
    rng = random.Random(20261121)
    seeds = [bytes.fromhex(c["hex"]) for c in GOLDEN if "hex" in c]
    decoded = rejected = 0
    for raw in _mutations(rng, seeds):
        try:
            marker = m.decode(raw)
        except MarkerDecodeError:
            rejected += 1
        else:
            decoded += 1
            assert m.decode(m.encode(marker)) == marker  # whatever decodes is a valid marker
    assert decoded + rejected == 110_000
    assert rejected > 50_000 and decoded > 0


# ------------------------------------------------------------------ decode_record: the one decoder of a markers record


def test_decode_record_returns_the_marker_of_its_own_partition():
    start = m.Start([(3, 2)], lease_ms=1000, owner="w")
    assert m.decode_record(m.encode_key(4), m.encode(start), 4) == start
    assert m.decode_record(bytearray(m.encode_key(0)), memoryview(m.encode(start)), 0) == start


@pytest.mark.parametrize("key,value,reason", [
    (m.encode_key(3), m.encode(m.End([(0, 1)])), "marker for queue partition 3 found in markers partition 1"),
    (None, m.encode(m.End([(0, 1)])), "marker key must be 4 bytes, got 0"),
    (b"\x00\x01", m.encode(m.End([(0, 1)])), "marker key must be 4 bytes, got 2"),
    (b"\xff\xff\xff\xff", m.encode(m.End([(0, 1)])), "marker key holds negative partition -1"),
    (m.encode_key(1), None, "marker value is empty (tombstone)"),
    (m.encode_key(1), b"\x03\x01", "unknown marker version 3 and no marker's ranges after it (truncated: range "
                                   "count needs 2 bytes at byte 2, 0 left)"),
])
def test_decode_record_names_why_a_record_is_bad_and_never_raises(key, value, reason):
    assert m.decode_record(key, value, 1) == m.BadMarker(reason)


# ------------------------------------------------------------------ rolling upgrades: markers of a newer version


@pytest.mark.parametrize("case", [c for c in GOLDEN if "hex" in c and c.get("version", 1) == 1], ids=lambda c: c["name"])
@pytest.mark.parametrize("version", [3, 255])
def test_a_newer_version_of_a_known_type_is_read_by_its_version_1_fields(case, version):
    """A later version keeps each type's version-1 layout and only appends fields."""
    v1 = bytes.fromhex(case["hex"])
    assert m.decode(bytes([version]) + v1[1:] + b"\x00\x2afields of a later version") == m.decode(v1)


@pytest.mark.parametrize("value, what", [
    (b"\x03\x07" + _ranges_bytes((5, 3)) + b"new body", "type 7"),  # a type added by a later version
    (b"\x03\x01" + _ranges_bytes((5, 3)) + b"\x00", "START (truncated: lease_ms"),  # not a v1 START body
    (b"\x03\x06" + _ranges_bytes((5, 3)) + b"\x21", "CLOSED (unknown CLOSED outcome 33)"),
])
def test_a_newer_marker_not_readable_by_its_version_1_fields_is_told_apart_from_garbage(value, what):
    with pytest.raises(NewerMarkerVersion) as info:
        m.decode(value)
    assert info.value.version == value[0] and info.value.type_code == value[1]
    assert what in info.value.reason and "names offsets 5..7" in info.value.reason
    bad = m.decode_record(m.encode_key(0), value, 0)
    assert isinstance(bad, m.BadMarker) and bad.newer == value[0] and bad.reason == info.value.reason


@pytest.mark.parametrize("value", [b"\x03", b"\x03\x07", b"\x03\x07\xff\xff" + b"\x00" * 12,
                                   b"\x03\x02" + _ranges_bytes((5, 0)), b"\x09\x01" + _ranges_bytes((-1, 1))])
def test_a_newer_version_whose_ranges_do_not_parse_is_no_marker_and_skipped_as_bad(value):
    with pytest.raises(MarkerDecodeError) as info:
        m.decode(value)
    assert not isinstance(info.value, NewerMarkerVersion)
    assert m.decode_record(m.encode_key(0), value, 0).newer is None


def test_version_1_keeps_its_exact_layout():
    end = m.encode(m.End([(1, 1)]))
    with pytest.raises(MarkerDecodeError, match="trailing bytes"):
        m.decode(end + b"\x00")
    with pytest.raises(MarkerDecodeError, match="unknown marker type 7"):
        m.decode(b"\x01\x07" + end[2:])


# ------------------------------------------------------------------ version 2: a NACK that is not a delivery


def test_a_nack_not_a_delivery_is_version_2_with_a_flags_byte_and_every_other_marker_stays_version_1():
    counted, released = m.Nack([(42, 3)], 2500), m.Nack([(42, 3)], 2500, counted=False)
    assert m.encode(counted)[0] == 1 and m.encode(released)[0] == 2
    assert m.encode(released) == b"\x02" + m.encode(counted)[1:] + bytes([m.NACK_NOT_A_DELIVERY])
    assert m.decode(m.encode(released)) == released and not m.decode(m.encode(released)).counted


def test_a_version_1_reader_reads_a_nack_not_a_delivery_as_a_counted_nack():
    # What an older tracker does (rolling upgrades): the version-1 fields, the flags ignored.
    released = m.encode(m.Nack([(42, 3)], 2500, counted=False))
    rd = m._Reader(released)  # noqa: SLF001 - the decoder as a version-1 build runs it
    rd.pos = 2
    as_v1 = m._decode_body(rd, released[1], 1, newer=True)  # noqa: SLF001
    assert as_v1 == m.Nack([(42, 3)], 2500)


def test_version_2_is_exact_and_its_unknown_flag_bits_are_ignored():
    v2 = m.encode(m.Nack([(1, 1)], 0, counted=False))
    with pytest.raises(MarkerDecodeError, match="NACK flags"):
        m.decode(v2[:-1])
    with pytest.raises(MarkerDecodeError, match="trailing bytes"):
        m.decode(v2 + b"\x00")
    assert m.decode(v2[:-1] + b"\xfe").counted and not m.decode(v2[:-1] + b"\xff").counted
    assert m.decode(b"\x02" + m.encode(m.End([(1, 1)]))[1:]) == m.End([(1, 1)])  # other types: as in version 1
