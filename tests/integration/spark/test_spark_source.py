"""The kmq-kafka Python data source, driven through its reader API (no query needed)."""

from __future__ import annotations

import datetime as dt

import pytest
from kafka import TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from kmq.spark.source import DataLossError, KafkaStreamReader, SourceError
from tests.integration.spark.markers_workload import write_records
from tests.helpers.kafka import recent_ms

T0 = recent_ms()

pytestmark = [pytest.mark.spark, pytest.mark.integration]
# The client the source's tasks read records with (option kafka.client).
CLIENTS = pytest.mark.parametrize("client", ["kafka-python", "confluent"])


def _reader(bootstrap, topic, **extra):
    # Spark hands options over with lower-cased keys.
    opts = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **{k.lower(): v for k, v in extra.items()}}
    return KafkaStreamReader(opts)


def _read(reader, start, end):
    rows = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            rows.extend(batch.to_pylist())
    return rows


@CLIENTS
def test_reader_plans_batches_and_yields_spark_kafka_columns(queue_topics, bootstrap, client):
    cfg, q = queue_topics(partitions=2)
    t = recent_ms() + 123
    recs = [(i % 2, t + i, b"k%d" % i, b"v%d" % i) for i in range(30)]
    from kmq.client.kafka_python.clients import producer

    p = producer(cfg.kafka)
    for part, ts, k, v in recs:
        p.send(q.markers_topic, key=k, value=v, partition=part, timestamp_ms=ts, headers=[("h", b"x")])
    p.flush()
    p.close()
    reader = _reader(bootstrap, q.markers_topic, maxOffsetsPerTrigger="10", startingOffsets="earliest",
                     **{"kafka.client": client})
    try:
        start = reader.initialOffset()
        assert start == {q.markers_topic: {"0": 0, "1": 0}}
        assert reader.getDefaultReadLimit() == ReadMaxRows(10)
        end = reader.latestOffset(start, ReadMaxRows(10))
        assert end == {q.markers_topic: {"0": 5, "1": 5}}  # the cap is spread over the partitions
        rows = _read(reader, start, end)
        everything = reader.latestOffset(end, ReadAllAvailable())
        assert everything == {q.markers_topic: {"0": 15, "1": 15}}
        rows += _read(reader, end, everything)
        assert reader.latestOffset(everything, ReadAllAvailable()) == everything
        assert reader.partitions(everything, everything) == []
    finally:
        reader.stop()
    assert len(rows) == 30
    r = next(x for x in rows if x["partition"] == 1 and x["offset"] == 2)
    assert r["key"] == b"k5" and r["value"] == b"v5" and r["topic"] == q.markers_topic
    assert r["timestamp"] == dt.datetime.fromtimestamp((t + 5) / 1000, dt.timezone.utc)
    assert r["timestamp"].tzinfo is not None
    assert r["timestampType"] == 0
    assert r["headers"] == [{"key": "h", "value": b"x"}]
    # JSON starting offsets: named partitions start there, the others at the earliest offset.
    r2 = _reader(bootstrap, q.markers_topic, startingOffsets='{"%s": {"1": 12}}' % q.markers_topic)
    try:
        assert r2.initialOffset() == {q.markers_topic: {"0": 0, "1": 12}}
    finally:
        r2.stop()


def test_reader_errors_are_clear(queue_topics, bootstrap):
    with pytest.raises(SourceError, match="kafka.bootstrap.servers"):
        KafkaStreamReader({"subscribe": "x"})
    with pytest.raises(SourceError, match="kafka.client must be kafka-python or confluent, got 'aiokafka'"):
        _reader(bootstrap, "x", **{"kafka.client": "aiokafka"})
    reader = _reader(bootstrap, "no-such-topic-kmq")
    try:
        with pytest.raises(SourceError, match="does not exist"):
            reader.initialOffset()
    finally:
        reader.stop()


@CLIENTS
def test_deleted_offsets_fail_or_skip_per_option(queue_topics, bootstrap, skip_on_tansu, client):
    skip_on_tansu("DeleteRecords is not supported, so retention cannot be simulated")
    cfg, q = queue_topics(partitions=1)
    write_records(cfg, q.markers_topic, [(0, T0 + i, b"k", b"v") for i in range(20)])
    from kmq.client.kafka_python.clients import admin_client

    admin = admin_client(cfg.kafka)
    admin.delete_records({TopicPartition(q.markers_topic, 0): 10})
    admin.close()
    for fail, expect in ((True, None), (False, list(range(10, 20)))):
        reader = _reader(bootstrap, q.markers_topic, failOnDataLoss=str(fail).lower(),
                         startingOffsets='{"%s": {"0": 3}}' % q.markers_topic, **{"kafka.client": client})
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, ReadAllAvailable())
            if expect is None:
                with pytest.raises(DataLossError, match="failOnDataLoss"):
                    _read(reader, start, end)
            else:
                assert [r["offset"] for r in _read(reader, start, end)] == expect
        finally:
            reader.stop()


def test_new_partitions_are_discovered_and_read_from_the_start(queue_topics, bootstrap, skip_on_tansu):
    skip_on_tansu("CreatePartitions is not supported, so a topic cannot grow")
    from kafka.admin import NewPartitions

    from kmq.client.kafka_python.clients import admin_client

    cfg, q = queue_topics(partitions=1)
    write_records(cfg, q.markers_topic, [(0, T0, b"k", b"v")])
    reader = _reader(bootstrap, q.markers_topic, metadataMaxAgeMs="100")
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {q.markers_topic: {"0": 1}}
        admin = admin_client(cfg.kafka)
        admin.create_partitions({q.markers_topic: NewPartitions(2)})
        admin.close()
        write_records(cfg, q.markers_topic, [(1, T0 + 1, b"k", b"v")] * 2)

        def grown():
            e = reader.latestOffset(end, ReadAllAvailable())
            return e if e[q.markers_topic].get("1") == 2 else None

        from tests.helpers.kafka import wait_until

        e2 = wait_until(grown, timeout=20, what="the new partition in the planned offsets")
        assert [r["partition"] for r in _read(reader, end, e2)] == [1, 1]
    finally:
        reader.stop()


@CLIENTS
def test_marker_chunks_hold_every_record_decoded_and_bad_ones_counted(queue_topics, bootstrap, client):
    from kmq.core import markers as mk
    from kmq.core.markers_bulk import BAD
    from kmq.spark.marker_chunks import unpack
    from kmq.spark.source import KafkaPythonSource
    from tests.integration.spark.markers_workload import rec

    cfg, q = queue_topics(partitions=2)
    t = recent_ms()
    recs = [rec(i % 2, t + i, mk.Start(ranges=((i * 10, 10),), lease_ms=1000, owner="w")) for i in range(40)]
    recs += [(0, t + 50, mk.encode_key(0), b"\x01"), (1, t + 51, b"xx", mk.encode(mk.End(ranges=((0, 1),)))),
             (1, t + 52, mk.encode_key(1), None)]
    write_records(cfg, q.markers_topic, recs)
    reader = _reader(bootstrap, q.markers_topic, markerChunks="true", **{"kafka.client": client})
    try:
        start = reader.initialOffset()
        rows = _read(reader, start, reader.latestOffset(start, ReadAllAvailable()))
    finally:
        reader.stop()
    assert KafkaPythonSource({"markerchunks": "true"}).schema().startswith("topic string, partition int")
    assert {r["partition"] for r in rows} == {0, 1} and all(r["topic"] == q.markers_topic for r in rows)
    by_partition = {}
    for r in sorted(rows, key=lambda r: (r["partition"], r["first_offset"])):
        offsets, ts, d = unpack(r["chunk"])
        assert r["records"] == len(d) and r["first_offset"] == offsets[0]
        by_partition.setdefault(r["partition"], []).extend(
            zip(offsets.tolist(), ts.tolist(), d.mtype.tolist(), [d.ranges(i) for i in range(len(d))]))
    assert [o for o, *_ in by_partition[0]] == list(range(21)) and [o for o, *_ in by_partition[1]] == list(range(22))
    assert by_partition[0][3] == (3, t + 6, int(mk.MarkerType.START), [(60, 10)])
    assert by_partition[0][20][2] == BAD  # truncated value
    assert [x[2] for x in by_partition[1][20:]] == [BAD, BAD]  # foreign key, tombstone


@CLIENTS
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_markers_are_read_and_decoded_on_either_client(queue_topics, bootstrap, client, codec):
    from kmq.client.kafka_python.clients import producer
    from kmq.core import markers as mk
    from kmq.spark.marker_chunks import unpack
    from tests.helpers.kafka import stored_codecs

    cfg, q = queue_topics(partitions=1)
    p = producer(cfg.kafka, compression_type=codec, linger_ms=100)
    futures = [p.send(q.markers_topic, key=mk.encode_key(0), partition=0,
                      value=mk.encode(mk.Start(ranges=((i * 10, 10),), lease_ms=1000, owner="worker-1")))
               for i in range(50)]
    p.flush()
    assert [f.get(timeout=10).offset for f in futures] == list(range(50))
    p.close()
    assert set(stored_codecs(bootstrap, q.markers_topic).values()) == {codec}
    reader = _reader(bootstrap, q.markers_topic, markerChunks="true", **{"kafka.client": client})
    try:
        start = reader.initialOffset()
        rows = _read(reader, start, reader.latestOffset(start, ReadAllAvailable()))
    finally:
        reader.stop()
    decoded = [unpack(r["chunk"]) for r in rows]
    assert [o for offsets, _, _ in decoded for o in offsets.tolist()] == list(range(50))
    assert [d.ranges(i) for _, _, d in decoded for i in range(len(d))] == [[(i * 10, 10)] for i in range(50)]
    assert {t for _, _, d in decoded for t in d.mtype.tolist()} == {int(mk.MarkerType.START)}
