"""Batch-wise marker decoding for the lag job (pure: no Spark import).

One implementation of the wire format: every value goes through
:func:`kmq.core.markers.decode`. Undecodable records become type ``BAD`` rows
(counted by the job, never fatal).
"""

from __future__ import annotations

from typing import Sequence

from kmq.core.errors import MarkerDecodeError
from kmq.core.markers import Closed, decode, decode_key, encode_key

__all__ = ["DECODED_COLUMNS", "decode_batch"]

DECODED_COLUMNS = ("partition", "moffset", "ts_ms", "mtype", "firsts", "counts", "outcome", "error")


def decode_batch(
    partitions: Sequence[int],
    offsets: Sequence[int],
    timestamps_ms: Sequence[int],
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
) -> dict[str, list]:
    """Decode marker records column-wise; returns :data:`DECODED_COLUMNS` as lists."""
    out: dict[str, list] = {c: [] for c in DECODED_COLUMNS}
    expected_keys: dict[int, bytes] = {}
    for p, off, ts, key, value in zip(partitions, offsets, timestamps_ms, keys, values):
        firsts: list[int] = []
        counts: list[int] = []
        outcome = None
        error = None
        try:
            want = expected_keys.get(p)
            if want is None:
                want = expected_keys[p] = encode_key(p)
            if key != want:  # the common case skips decode_key
                qp = decode_key(key)
                raise MarkerDecodeError(f"marker for queue partition {qp} found in markers partition {p}")
            m = decode(value)
            mtype = m.TYPE.name
            for r in m.ranges:
                firsts.append(r.first)
                counts.append(r.count)
            if isinstance(m, Closed):
                outcome = int(m.outcome)
        except MarkerDecodeError as exc:
            mtype = "BAD"
            error = exc.reason
        out["partition"].append(p)
        out["moffset"].append(off)
        out["ts_ms"].append(ts)
        out["mtype"].append(mtype)
        out["firsts"].append(firsts)
        out["counts"].append(counts)
        out["outcome"].append(outcome)
        out["error"].append(error)
    return out
