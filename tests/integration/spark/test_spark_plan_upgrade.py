"""A checkpoint written by the per-record plan (kmq before the source emitted decoded
marker chunks) resumes under the chunk plan: same state layout, same figures."""

from __future__ import annotations

import json

import pytest

from kmq.spark.job import JobOptions, build_windows, read_markers, start
from kmq.spark.sinks import BatchSinks, parquet_rows
from tests.helpers.kafka import wait_until
from tests.integration.spark.markers_workload import write_records
from tests.integration.spark.lag_workload import T0, W, commit_tracker_offset, expected, strip_keys, workload

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _end_offsets(query) -> dict:
    p = query.lastProgress
    if not p or not p["sources"]:
        return {}
    end = p["sources"][0]["endOffset"]
    return json.loads(end) if isinstance(end, str) else end


def test_checkpoint_of_the_per_record_plan_resumes_under_the_chunk_plan(spark, queue_topics, tmp_path):
    cfg, q = queue_topics(partitions=2)
    recs = workload()
    # Partition 0's records are recs[0:13], partition 1's recs[13:19]: split each in log order.
    first, second = recs[0:6] + recs[13:16], recs[6:13] + recs[16:19]
    write_records(cfg, q.markers_topic, first)
    commit_tracker_offset(cfg, q.markers_topic, 0, 5)
    # The Python source: the chunk plan is its own (Spark's connector reads per record).
    base = dict(source="python", sinks=("parquet",), checkpoint=str(tmp_path / "ck"), trigger="500 milliseconds",
                window_s=W / 1000, parquet_path=str(tmp_path / "pq"), prometheus_port=None, max_offsets_per_trigger=4)

    # Phase 1: the per-record plan (raw key/value rows, decoded in the stateful step). No idle
    # close, so the windows still open at the stop must be carried in the checkpoint's state.
    opts1 = JobOptions(**base, idle_close_s=300.0)
    sinks1 = BatchSinks.from_options(spark, cfg, opts1)
    raw = read_markers(spark, cfg, opts1, marker_chunks=False)
    assert "value" in raw.columns and "chunk" not in raw.columns
    query = (build_windows(spark, cfg, opts1, markers=raw).writeStream.foreachBatch(sinks1.write_batch)
             .option("checkpointLocation", opts1.checkpoint).trigger(processingTime=opts1.trigger).start())
    try:
        wait_until(lambda: _end_offsets(query) == {q.markers_topic: {"0": 6, "1": 3}}, timeout=90,
                   what="the per-record plan read the first records")
    finally:
        query.stop()
        sinks1.close()
    assert query.exception() is None
    assert sinks1.windows_written == 0  # every window still open: it lives only in the state

    # Phase 2: the chunk plan on the same checkpoint.
    write_records(cfg, q.markers_topic, second)
    opts2 = JobOptions(**base, idle_close_s=1.0)
    sinks2 = BatchSinks.from_options(spark, cfg, opts2)
    query, _ = start(spark, cfg, opts2, sinks2)
    want = expected(q.name)
    try:
        wait_until(lambda: sinks2.windows_written >= len(want), timeout=90, what="three window rows")
        rows = parquet_rows(opts2.parquet_path)
    finally:
        query.stop()
        sinks2.close()
    assert query.exception() is None
    got = {(r["partition"], int(r["window_start"].timestamp() * 1000)): r for r in rows}
    assert len(rows) == len(got) == len(want), rows
    for key, exp in want.items():
        assert strip_keys(got[key], exp) == exp, key
    assert min(k[1] for k in got) == T0
