"""``kmq bench tracker``'s redelivery throughput over rounds: the median round is reported, with
every round's rate, and a round that did not finish is never left out."""

from __future__ import annotations

import copy

from kmq.bench import tracker as bench_tracker
from kmq.bench.targets import judge
from tests.helpers.bench import MET


def _rounds(monkeypatch, rates):
    it = iter(rates)

    def one(bootstrap, client, messages):
        rate = next(it)
        return {"client": client, "messages": messages, "redelivered": messages if rate else 7, "copies_per_s": rate}

    monkeypatch.setattr(bench_tracker, "redelivery_throughput", one)


def test_the_median_round_is_reported_with_every_rounds_rate(monkeypatch):
    _rounds(monkeypatch, [230_000, 190_000, 210_000])
    out = bench_tracker.median_redelivery("b:1", "confluent", 200_000, 3)
    assert out["copies_per_s"] == 210_000 and out["rounds"] == [230_000, 190_000, 210_000]


def test_an_even_number_of_rounds_reports_the_lower_middle_one(monkeypatch):
    _rounds(monkeypatch, [230_000, 190_000, 210_000, 220_000])
    assert bench_tracker.median_redelivery("b:1", "confluent", 200_000, 4)["copies_per_s"] == 210_000


def test_a_round_that_did_not_finish_makes_the_result_unfinished(monkeypatch):
    _rounds(monkeypatch, [230_000, None, 240_000])
    out = bench_tracker.median_redelivery("b:1", "confluent", 200_000, 3)
    assert out["copies_per_s"] is None and out["redelivered"] == 7 and out["rounds"] == [230_000, None, 240_000]


def test_one_round_is_the_run_itself(monkeypatch):
    _rounds(monkeypatch, [205_000])
    assert "rounds" not in bench_tracker.median_redelivery("b:1", "confluent", 200_000, 1)


def test_the_verdict_names_the_rounds_it_took_the_median_of():
    report = copy.deepcopy(MET)
    report["results"]["tracker"]["redelivery_throughput"]["confluent"]["rounds"] = [190_000, 210_000, 230_000]
    verdict = judge(report)[1]
    assert verdict.met is True
    assert "median of 3 rounds: 190,000, 210,000, 230,000" in verdict.measured
    report["results"]["tracker"]["redelivery_throughput"]["confluent"]["rounds"] = [230_000, None, 240_000]
    assert "median of 3 rounds: 230,000, not measured, 240,000" in judge(report)[1].measured


def test_the_tracker_run_takes_the_median_of_its_redelivery_rounds_per_client(monkeypatch):
    # The wiring of run() alone: the figures that need a broker or a second process are stood in for.
    _rounds(monkeypatch, [230_000, 190_000, 210_000, 31_000, 29_000, 30_000])
    monkeypatch.setattr(bench_tracker, "throughput", lambda batches: {})
    monkeypatch.setattr(bench_tracker, "memory", lambda: {})
    monkeypatch.setattr(bench_tracker, "redelivery_delay", lambda bootstrap, messages: {})
    monkeypatch.setattr(bench_tracker, "recovery", lambda bootstrap, pairs: {})
    monkeypatch.setattr(bench_tracker.importlib.util, "find_spec", lambda name: object())
    out = bench_tracker.run(bootstrap="b:1", messages=200_000, redelivery_rounds=3)["redelivery_throughput"]
    assert out["kafka-python"]["copies_per_s"] == 210_000 and out["confluent"]["copies_per_s"] == 30_000
    assert out["confluent"]["rounds"] == [31_000, 29_000, 30_000]
