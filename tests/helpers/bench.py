"""Benchmark reports written by hand, for the tests that judge them."""

from __future__ import annotations

#: Full garbage collections of one variant, as kmq bench consumer and aio report them.
GC_MET = {"count": 4, "max_ms": 4.5, "p99_ms": 4.5, "cpu_max_ms": 4.0, "default_collector": True}

#: A full report in the shape the benchmarks write, every target met.
MET = {
    "quick": False,
    "results": {
        "consumer": {"kafka-python": {"ratio_median": 0.97, "full_gc": {"kmq": dict(GC_MET), "plain": dict(GC_MET)}},
                     "confluent": {"ratio_median": 3.2, "full_gc": {"kmq": dict(GC_MET), "plain": dict(GC_MET)}}},
        "consumer_latency": {"kafka-python": {"rate": 5000, "p50_diff_ms": 1.0, "p95_diff_ms": -3.0},
                             "confluent": {"rate": 5000, "p50_diff_ms": 2.0, "p95_diff_ms": 0.0}},
        "aio": {"ratio_to_aiokafka": {"aio-for": 0.5, "aio-run": 0.4, "loop-for": 0.95, "loop-run": 0.91},
                "median_msgs_per_s": {"aiokafka": 400_000, "loop-for": 380_000, "loop-run": 364_000},
                "max_loop_gap_ms": {"aiokafka": 6.5, "loop-for": 9.0, "loop-run": 10.0},
                "max_loop_late_ms": {"aiokafka": 3.0, "aio-for": 30.0, "loop-for": 4.0, "loop-run": 5.0},
                "max_loop_late_besides_gc_ms": {"aiokafka": 1.5, "loop-for": 3.0, "loop-run": 2.5},
                "full_collections": {"aiokafka": 0, "loop-for": 1, "loop-run": 0},
                "full_gc": {v: dict(GC_MET) for v in ("threads", "aiokafka", "aio-for", "aio-run", "loop-for", "loop-run")}},
        "tracker": {"redelivery_throughput": {"confluent": {"messages": 200_000, "copies_per_s": 210_000}},
                    "idle_process": {"default_fetch_wait": {"partitions": 10_000, "cpu_pct_of_core": 9.1,
                                                            "fetch_wait_ms": 100},
                                     "fetch_wait_500ms": {"partitions": 10_000, "cpu_pct_of_core": 4.5,
                                                          "fetch_wait_ms": 500}}},
        "spark": {"confluent": {"client": "confluent", "markers_per_s": 448_665,
                                "latency_window_end_to_sink_s": {"p95": 1.66}},
                  "kafka-python": {"client": "kafka-python", "markers_per_s": 200_938,
                                   "latency_window_end_to_sink_s": {"p95": 1.68}}},
    },
}
