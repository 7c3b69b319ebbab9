"""A Kafka source for Spark Structured Streaming without extra jars.

:class:`KafkaPythonSource` is a Spark Python data source (``format("kmq-kafka")``
once registered with :func:`register`) that reads Kafka with kafka-python and
yields the columns of Spark's own Kafka source: key, value, topic, partition,
offset, timestamp, timestampType, headers.

Options (Spark lower-cases option keys; both spellings work):

* ``kmq.kafka``: the connection, a :class:`~kmq.config.KafkaConfig` as JSON
  (:meth:`~kmq.config.KafkaConfig.to_json`: servers, client id, TLS, SASL, OAUTHBEARER and
  ``client``, the client the tasks read with); it holds the passwords, so treat the
  options as a secret. The lag job passes ``kafka:`` of kmq.yaml this way. TLS files and
  the OAUTHBEARER token file must exist where the tasks run (same paths on the driver and
  the executors); each process builds its own TLS context and token provider
* or, for a plaintext broker: ``kafka.bootstrap.servers`` and ``kafka.client``
  (``kafka-python``, the default, or ``confluent``)
* ``subscribe`` (comma-separated topics)
* ``startingOffsets``: ``earliest`` (default), ``latest`` or JSON
  ``{"topic": {"0": 42}}`` (partitions not named start at the earliest offset)
* ``maxOffsetsPerTrigger``: cap on records per micro-batch, spread over partitions
* ``failOnDataLoss``: ``true`` (default) fails with a clear error when offsets
  were deleted by retention; ``false`` skips to the earliest available offset
* ``pollTimeoutMs``: how long a task waits for records it knows exist (default 30000)
* ``includeHeaders``: ``true`` (default) or ``false``: without headers the
  ``headers`` column is left out (as in Spark's own source), which saves
  building a list per record; the lag job reads without them
* ``markerChunks``: ``true`` makes the source decode marker records itself and
  emit one row per run of up to 20,000 records of a partition instead of one
  per record: columns ``topic, partition, first_offset, records, chunk``
  (:mod:`kmq.spark.marker_chunks`). The lag job reads this way; Spark then
  moves a few rows a batch instead of one per marker
* the client the tasks read records with: ``kafka-python`` or ``confluent``
  (:mod:`kmq.spark.source_confluent`; needs ``kmq[confluent]`` where the tasks run). The
  driver plans with kafka-python either way.

Offsets are ``{"topic": {"partition": next_offset}}``, as in Spark's source.
The end of a partition is the high-water mark reported by a fetch made now,
never a latest-offset look-up, which some brokers answer wrongly. Driver and
tasks read through the client seam's :class:`~kmq.client.api.LogReader`
(:mod:`kmq.core.scan_cursor` decides where a read ends and what a deleted
offset means). New partitions are discovered on metadata refresh (every
``metadataMaxAgeMs``, default 5000) and read from their earliest offset. Readers are reused: one per
stream reader on the driver, one cached per Python worker process for the tasks.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from kmq.client import LogReadError, open_log_reader, require_client
from kmq.config import ConfigError, KafkaConfig
from kmq.core.errors import KmqError
from kmq.spark.arrow_rows import ARROW_CHUNK_SCHEMA, ARROW_SCHEMA, ARROW_SCHEMA_NO_HEADERS, ROWS_PER_ARROW_BATCH

__all__ = ["KafkaPythonSource", "register", "SOURCE_NAME", "KAFKA_OPTION", "SCHEMA", "SCHEMA_NO_HEADERS", "SourceError",
           "DataLossError", "kafka_config_from_options"]

log = logging.getLogger(__name__)

SOURCE_NAME = "kmq-kafka"
#: The option carrying the source's connection: a :class:`~kmq.config.KafkaConfig` as JSON.
KAFKA_OPTION = "kmq.kafka"
SCHEMA_NO_HEADERS = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
)
SCHEMA = SCHEMA_NO_HEADERS + ", headers array<struct<key: string, value: binary>>"


class SourceError(KmqError):
    """The Kafka data source cannot go on (bad options, broker gone, timeouts)."""


class DataLossError(SourceError):
    """Offsets the query needs were deleted (retention) and failOnDataLoss is true."""


def register(spark) -> None:
    """Register the source with a SparkSession as ``format("kmq-kafka")``."""
    spark.dataSource.register(KafkaPythonSource)


def _opt(options, name: str, default: Any = None) -> Any:
    # Spark lower-cases keys; read from the options object itself (it is case-insensitive).
    for key in (name, name.lower()):
        try:
            if key in options:
                return options[key]
        except TypeError:  # pragma: no cover - options without __contains__
            pass
    return default


def kafka_config_from_options(options) -> KafkaConfig:
    """The source's connection: option ``kmq.kafka``, a :class:`~kmq.config.KafkaConfig` as JSON
    (what the lag job passes: ``kafka:`` of kmq.yaml, security included), or for a plaintext
    broker ``kafka.bootstrap.servers`` and ``kafka.client``. Driver and tasks rebuild the same
    KafkaConfig and connect through kmq's client settings (:mod:`kmq.client.kafka_python.settings`,
    :mod:`kmq.client.confluent.settings`)."""
    text = _opt(options, KAFKA_OPTION)
    servers = _opt(options, "kafka.bootstrap.servers")
    client = _opt(options, "kafka.client")
    if text and (servers or client):
        raise SourceError(f"the kmq-kafka source takes its connection from {KAFKA_OPTION} alone: "
                          "drop the options kafka.bootstrap.servers and kafka.client")
    if not text and not servers:
        raise SourceError(f"the kmq-kafka source needs the option {KAFKA_OPTION} (a KafkaConfig as JSON) "
                          "or kafka.bootstrap.servers")
    client = str(client or "kafka-python").strip().lower()
    if client not in ("kafka-python", "confluent"):
        raise SourceError(f"the kmq-kafka option kafka.client must be kafka-python or confluent, got {client!r}")
    try:
        if text:
            return KafkaConfig.from_json(str(text))
        return KafkaConfig.from_mapping({"bootstrap_servers": str(servers), "client_id": "kmq-spark", "client": client})
    except ConfigError as exc:
        raise SourceError(f"the kmq-kafka source's connection: {exc}") from None


def _bool(value: Any, default: bool) -> bool:
    if value is None:
        return default
    return str(value).strip().lower() in ("1", "true", "yes", "on")


# ------------------------------------------------------------------ readers
_TASK_READERS: dict[tuple[str, str, int], Any] = {}


def _task_reader(part: "KafkaInputPartition") -> Any:
    """One cached :class:`~kmq.client.api.LogReader` per Python worker process, client and configuration."""
    client = getattr(part, "client", "kafka-python")
    key = (client, part.client_json, part.poll_timeout_ms)
    reader = _TASK_READERS.get(key)
    if reader is None:
        kafka = KafkaConfig.from_json(part.client_json)
        if client == "confluent":
            from kmq.spark.source_confluent import BATCH, SETTINGS

            reader = open_log_reader(kafka, part.poll_timeout_ms / 1000, max_poll_records=BATCH, **SETTINGS)
        else:
            reader = open_log_reader(kafka, part.poll_timeout_ms / 1000, fetch_wait=0.1,
                                     max_poll_records=50_000, max_partition_fetch_bytes=4 * 1024 * 1024,
                                     fetch_max_bytes=32 * 1024 * 1024)
        _TASK_READERS[key] = reader
    return reader


def close_task_consumers(client_json: str) -> None:
    """Close this process's cached task readers for ``client_json`` (either client).

    Spark runs tasks in its Python worker processes, whose cached readers live as long as
    they do. A process that ran tasks itself (a local read, a test) closes them when its stream
    stops, so no consumer is left polling the brokers; in the driver of a real job there are none."""
    for key in [k for k in _TASK_READERS if k[1] == client_json]:
        _TASK_READERS.pop(key).close()


class KafkaInputPartition(InputPartition):
    """Offsets ``start`` (inclusive) to ``end`` (exclusive) of one topic partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int, client_json: str,
                 fail_on_data_loss: bool, poll_timeout_ms: int, client: str = "kafka-python",
                 include_headers: bool = True, marker_chunks: bool = False) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.client_json = client_json
        self.fail_on_data_loss = fail_on_data_loss
        self.poll_timeout_ms = poll_timeout_ms
        self.client = client
        self.include_headers = include_headers and not marker_chunks
        self.marker_chunks = marker_chunks


def read_partition(part: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    """Records ``start..end-1`` of one partition as Arrow batches (runs in a task)."""
    confluent = getattr(part, "client", "kafka-python") == "confluent"
    chunks = getattr(part, "marker_chunks", False)
    names = CHUNK_INPUTS if chunks else ARROW_SCHEMA.names
    if chunks:
        if confluent:
            from kmq.spark.source_confluent import append_marker_columns as append
        else:
            append = _append_kafka_python_markers  # type: ignore[assignment]  # the same call; a parameter's name differs
    elif confluent:
        from kmq.spark.source_confluent import append_columns

        append = partial(append_columns, with_headers=getattr(part, "include_headers", True))
    else:
        append = partial(_append_kafka_python, with_headers=getattr(part, "include_headers", True))
    reader = _task_reader(part)
    cols: dict[str, list] = {n: [] for n in names}
    try:
        for batch in reader.batches(part.topic, part.partition, part.start, part.end,
                                    lambda deleted: _deleted(part, deleted)):
            append(cols, batch)
            if len(cols["offset"]) >= ROWS_PER_ARROW_BATCH:
                yield _arrow(cols, part)
                cols = {n: [] for n in names}
    except LogReadError as exc:
        raise SourceError(f"{exc}; expected offsets up to {part.end - 1}. Is the broker reachable? A recreated "
                          "topic needs a restart with a new checkpoint") from exc
    if cols["offset"]:
        yield _arrow(cols, part)


def _append_kafka_python(cols: dict[str, list], records: list, with_headers: bool) -> None:
    """Append kafka-python ``ConsumerRecord``\\ s to the source's column lists."""
    keys, values, offs, stamps, kinds, hdrs = (cols["key"], cols["value"], cols["offset"], cols["timestamp"],
                                               cols["timestampType"], cols["headers"])
    for r in records:
        keys.append(r.key)
        values.append(r.value)
        offs.append(r.offset)
        stamps.append(r.timestamp * 1000)
        kinds.append(r.timestamp_type)
        if with_headers:
            hdrs.append([{"key": k, "value": v} for k, v in (r.headers or [])])


#: The columns a task collects for a marker chunk (:func:`_chunk`): record times in ms, as chunks hold them.
CHUNK_INPUTS = ("key", "value", "offset", "ts_ms")


def _append_kafka_python_markers(cols: dict[str, list], records: list) -> None:
    """Append only what the lag job's marker chunks use (key, value, offset, time)."""
    cols["key"].extend([r.key for r in records])
    cols["value"].extend([r.value for r in records])
    cols["offset"].extend([r.offset for r in records])
    cols["ts_ms"].extend([r.timestamp for r in records])


def _deleted(part: KafkaInputPartition, deleted: Any) -> None:
    """Offsets of the task's range deleted (retention) before it read them: fail or skip (failOnDataLoss)."""
    r = deleted.offsets
    if part.fail_on_data_loss:
        raise DataLossError(
            f"{part.topic}[{part.partition}]: offsets {r.first}..{r.last} were deleted (retention) "
            "before the job read them; set failOnDataLoss=false to skip them, or restart with a new checkpoint")
    log.warning("%s[%d]: skipping deleted offsets %d..%d", part.topic, part.partition, r.first, r.last)


def _arrow(cols: dict[str, list], part: KafkaInputPartition) -> pa.RecordBatch:
    if getattr(part, "marker_chunks", False):
        return _chunk(cols, part)
    n = len(cols["offset"])
    arrays = [
        pa.array(cols["key"], pa.binary()),
        pa.array(cols["value"], pa.binary()),
        pa.repeat(pa.scalar(part.topic, pa.string()), n),
        pa.repeat(pa.scalar(part.partition, pa.int32()), n),
        pa.array(cols["offset"], pa.int64()),
        pa.array(cols["timestamp"], pa.timestamp("us", tz="UTC")),
        pa.array(cols["timestampType"], pa.int32()),
    ]
    if not getattr(part, "include_headers", True):
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA_NO_HEADERS)
    arrays.append(pa.array(cols["headers"], ARROW_SCHEMA.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _chunk(cols: dict[str, list], part: KafkaInputPartition) -> pa.RecordBatch:
    """One row holding the records of ``cols`` decoded (bad ones as BAD rows) and packed."""
    import numpy as np

    from kmq.core.markers_bulk import decode_records
    from kmq.spark.marker_chunks import pack

    n = len(cols["offset"])
    decoded = decode_records(cols["value"], cols["key"], np.full(n, part.partition, dtype=np.int64))  # type: ignore[arg-type]  # an array
    return pa.RecordBatch.from_arrays(
        [
            pa.array([part.topic], pa.string()),
            pa.array([part.partition], pa.int32()),
            pa.array([cols["offset"][0]], pa.int64()),
            pa.array([n], pa.int32()),
            pa.array([pack(cols["offset"], cols["ts_ms"], decoded)], pa.binary()),
        ],
        schema=ARROW_CHUNK_SCHEMA,
    )


# ------------------------------------------------------------------ driver side
class KafkaStreamReader(DataSourceStreamReader):
    """Plans micro-batches: offsets per topic partition from fetch high-water marks."""

    def __init__(self, options) -> None:
        self.kafka = kafka_config_from_options(options)
        # What the tasks rebuild the connection from (and the key of their cached readers).
        self.client_json = self.kafka.to_json()
        topics = _opt(options, "subscribe")
        if not topics:
            raise SourceError("the kmq-kafka source needs the option subscribe (comma-separated topics)")
        self.topics = [t.strip() for t in str(topics).split(",") if t.strip()]
        self.starting = str(_opt(options, "startingOffsets", "earliest")).strip()
        mx = _opt(options, "maxOffsetsPerTrigger")
        self.max_offsets = int(mx) if mx not in (None, "") else None
        self.fail_on_data_loss = _bool(_opt(options, "failOnDataLoss"), True)
        self.poll_timeout_ms = int(_opt(options, "pollTimeoutMs", 30000))
        self.metadata_max_age_ms = int(_opt(options, "metadataMaxAgeMs", 5000))
        self.include_headers = _bool(_opt(options, "includeHeaders"), True)
        self.marker_chunks = _bool(_opt(options, "markerChunks"), False)
        self.client = self.kafka.client
        if self.client == "confluent":
            require_client("confluent")  # the driver's Python has the extra; the tasks' must too
        self._reader = None
        self._hw: dict[tuple[str, int], int] = {}
        self._counts: dict[str, tuple[int, float | None]] = {}  # topic -> (partitions, when asked)

    # -- helpers
    def _log(self):
        """The driver's :class:`~kmq.client.api.LogReader`, on the source's client (it only plans:
        its fetches are for high-water marks, so they ask for the least data a fetch may bring)."""
        if self._reader is None:
            self._reader = open_log_reader(self.kafka, self.poll_timeout_ms / 1000, fetch_wait_ms=50,
                                           max_partition_fetch_bytes=1, metadata_max_age=self.metadata_max_age_ms / 1000)
        return self._reader

    def _partitions(self) -> list[tuple[str, int]]:
        """The topics' partitions, asked of the cluster at most every ``metadataMaxAgeMs``; while it
        does not answer (an outage) the last known ones, so planning rides through."""
        now = time.monotonic()
        out: list[tuple[str, int]] = []
        for t in self.topics:
            n, asked = self._counts.get(t, (0, None))
            if asked is None or now - asked >= self.metadata_max_age_ms / 1000:
                try:
                    n, asked = self._log().partition_count(t), now
                except LogReadError as exc:
                    if not n:
                        raise SourceError(f"the partitions of {t!r} could not be read: {exc}") from exc
                    log.warning("partitions of %s not refreshed (%s); planning with the %d known", t, exc, n)
                else:
                    self._counts[t] = (n, asked)
            if not n:
                raise SourceError(f"topic {t!r} does not exist (create it first, e.g. `kmq topics create`)")
            out.extend((t, p) for p in range(n))
        return out

    def _earliest(self, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        if not tps:
            return {}
        return {tp: start for tp, (start, _end) in self._call(self._log().bounds, tps).items()}

    def _high_water(self, tps: Sequence[tuple[str, int]], floor: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """High-water marks from a fetch made now (at the last known end: a short read)."""
        starts = {tp: max(self._hw.get(tp, 0), floor.get(tp, 0)) for tp in tps}
        for tp, v in self._call(self._log().high_waters, starts).items():
            self._hw[tp] = max(self._hw.get(tp, 0), v)
        return {tp: self._hw[tp] for tp in tps}

    @staticmethod
    def _call(fn, *args):
        try:
            return fn(*args)
        except LogReadError as exc:
            raise SourceError(f"planning the next batch failed: {exc}") from exc

    # -- DataSourceStreamReader
    def initialOffset(self) -> dict:
        tps = self._partitions()
        earliest = self._earliest(tps)
        if self.starting == "earliest":
            start = earliest
        elif self.starting == "latest":
            start = self._high_water(tps, earliest)
        else:
            try:
                given = json.loads(self.starting)
            except json.JSONDecodeError:
                raise SourceError(f"startingOffsets must be earliest, latest or JSON, got {self.starting!r}") from None
            start = dict(earliest)
            for t, parts in given.items():
                for p, off in parts.items():
                    if (t, int(p)) in start and int(off) >= 0:
                        start[(t, int(p))] = int(off)
        return _to_json_offsets(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_offsets) if self.max_offsets else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        current = _from_json_offsets(start)
        tps = self._partitions()
        new = [tp for tp in tps if tp not in current]
        if new:
            log.info("new partitions %s start at their earliest offset", new)
            current.update(self._earliest(new))
        hw = self._high_water(tps, current)
        end = {tp: max(current[tp], hw[tp]) for tp in tps}
        if isinstance(limit, ReadMaxRows):
            end = _limit(current, end, int(limit.max_rows))
        return _to_json_offsets(end)

    def reportLatestOffset(self):
        return _to_json_offsets(self._hw) if self._hw else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        s, e = _from_json_offsets(start), _from_json_offsets(end)
        new = [tp for tp in e if tp not in s]
        if new:  # partitions found by latestOffset start at their earliest offset
            s.update(self._earliest(new))
        out = []
        for (t, p), hi in sorted(e.items()):
            lo = s.get((t, p), 0)
            if hi > lo:
                out.append(KafkaInputPartition(t, p, lo, hi, self.client_json, self.fail_on_data_loss,
                                               self.poll_timeout_ms, self.client, self.include_headers,
                                               self.marker_chunks))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)  # type: ignore[arg-type]

    def commit(self, end: dict) -> None:
        """Offsets live in Spark's checkpoint; nothing to do."""

    def stop(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        close_task_consumers(self.client_json)


def _limit(start: dict, end: dict, max_rows: int) -> dict:
    """Spread ``max_rows`` over partitions in proportion to their backlog."""
    backlog = {tp: end[tp] - start.get(tp, end[tp]) for tp in end}
    total = sum(backlog.values())
    if total <= max_rows:
        return end
    out = {}
    for tp, n in backlog.items():
        take = (n * max_rows) // total
        out[tp] = start[tp] + max(take, 1 if n else 0)
    return out


def _to_json_offsets(offsets: dict[tuple[str, int], int]) -> dict:
    out: dict[str, dict[str, int]] = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def _from_json_offsets(offsets: dict) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, parts in (offsets or {}).items() for p, o in parts.items()}


class KafkaPythonSource(DataSource):
    """Kafka for Structured Streaming, read with kafka-python (no Spark Kafka jar)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        if _bool(_opt(self.options, "markerChunks"), False):
            from kmq.spark.marker_chunks import CHUNK_COLUMNS

            return CHUNK_COLUMNS
        return SCHEMA if _bool(_opt(self.options, "includeHeaders"), True) else SCHEMA_NO_HEADERS

    def streamReader(self, schema) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)
