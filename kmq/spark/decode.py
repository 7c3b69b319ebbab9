"""Batch-wise marker decoding for the lag job (pure: no Spark import).

One implementation of the wire format: every record goes through
:func:`kmq.core.markers.decode_record`. Undecodable records become type ``BAD`` rows
(counted by the job, never fatal).
"""

from __future__ import annotations

from typing import Sequence

from kmq.core.markers import BadMarker, Closed, decode_record

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
    for p, off, ts, key, value in zip(partitions, offsets, timestamps_ms, keys, values):
        firsts: list[int] = []
        counts: list[int] = []
        outcome = None
        error = None
        m = decode_record(key, value, p)
        if isinstance(m, BadMarker):
            mtype = "BAD"
            error = m.reason
        else:
            mtype = m.TYPE.name
            for r in m.ranges:
                firsts.append(r.first)
                counts.append(r.count)
            if isinstance(m, Closed):
                outcome = int(m.outcome)
        out["partition"].append(p)
        out["moffset"].append(off)
        out["ts_ms"].append(ts)
        out["mtype"].append(mtype)
        out["firsts"].append(firsts)
        out["counts"].append(counts)
        out["outcome"].append(outcome)
        out["error"].append(error)
    return out
