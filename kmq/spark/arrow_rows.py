"""Arrow layouts of the rows the kmq-kafka source emits: one row per record, or
one row per chunk of packed markers. Shared by both clients' partition readers.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["ARROW_SCHEMA", "ARROW_SCHEMA_NO_HEADERS", "ARROW_CHUNK_SCHEMA", "ROWS_PER_ARROW_BATCH"]

ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])
ARROW_SCHEMA_NO_HEADERS = ARROW_SCHEMA.remove(ARROW_SCHEMA.get_field_index("headers"))
ARROW_CHUNK_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("first_offset", pa.int64()),
    ("records", pa.int32()),
    ("chunk", pa.binary()),
])
ROWS_PER_ARROW_BATCH = 20_000
