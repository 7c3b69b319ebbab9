"""Verdicts given at flush from failure reports alone (the tracker's confluent producer): pure."""

from __future__ import annotations

from kmq.client import UNDECIDED, OutRecord
from kmq.client.api import Delivery
from kmq.client.confluent.flush_settlement import FlushSettlement


class Err:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Msg:
    """What librdkafka hands back with a failure: the record, not which send it was."""

    def __init__(self, topic, partition, key, value, headers):
        self._f = (topic, partition, key, value, headers)

    def topic(self): return self._f[0]
    def partition(self): return self._f[1]
    def key(self): return self._f[2]
    def value(self): return self._f[3]
    def headers(self): return None if self._f[4] is None else list(self._f[4])


def error_of(err, what):
    return RuntimeError(f"{what}{err.name}")


def records(n: int) -> list[OutRecord]:
    return [OutRecord("q", i % 2, b"k", b"v%d" % i, [("kmq-origin", b"q/0/%d" % i)]) for i in range(n)]


def test_after_a_complete_flush_every_record_no_failure_names_was_acknowledged():
    s = FlushSettlement(error_of)
    recs = records(5)
    verdicts = [UNDECIDED] * 5
    verdicts[4] = ValueError("refused before it left")
    s.batch(recs, verdicts)
    s.settle()
    assert verdicts[:4] == [None] * 4 and isinstance(verdicts[4], ValueError)


def test_a_failure_is_given_to_the_record_it_names_by_content():
    s = FlushSettlement(error_of)
    first, second = records(4), records(6)[4:]
    v1, v2 = [UNDECIDED] * 4, [UNDECIDED] * 2
    s.batch(first, v1)
    s.batch(second, v2)
    fut_ok, fut_bad = Delivery(), Delivery()
    s.future(fut_ok, "q__markers", 0, b"\x00", b"closed-1", None)
    s.future(fut_bad, "q__markers", 0, b"\x00", b"closed-2", None)
    r = first[2]
    s.report(Err("MSG_TIMED_OUT"), Msg(r.topic, r.partition, r.key, r.value, r.headers))
    r = second[1]
    s.report(Err("UNKNOWN_PARTITION"), Msg(r.topic, r.partition, r.key, r.value, r.headers))
    s.report(Err("RECORD_TOO_LARGE"), Msg("q__markers", 0, b"\x00", b"closed-2", None))
    s.report(None, Msg("q", 0, b"k", b"v0", None))  # an acknowledgement, were one reported: nothing to do
    s.settle()
    assert [v is None for v in v1] == [True, True, False, True] and str(v1[2]) == "q: MSG_TIMED_OUT"
    assert v2[0] is None and str(v2[1]) == "q: UNKNOWN_PARTITION"
    assert fut_ok.succeeded() and fut_ok.value == ("q__markers", 0, None)
    assert fut_bad.failed() and str(fut_bad.exception) == "q__markers: RECORD_TOO_LARGE"


def test_records_with_the_same_content_all_take_its_failure():
    s = FlushSettlement(error_of)
    same = [OutRecord("q", 0, None, b"same", None)] * 2 + [OutRecord("q", 0, None, b"other", None)]
    verdicts = [UNDECIDED] * 3
    s.batch(same, verdicts)
    s.report(Err("NOT_ENOUGH_REPLICAS"), Msg("q", 0, None, b"same", None))
    s.settle()
    assert [v is None for v in verdicts] == [False, False, True]  # retried both: a duplicate at worst


def test_a_failure_reported_without_headers_is_matched_by_the_rest_and_headers_narrow_when_reported():
    s = FlushSettlement(error_of)
    recs = [OutRecord("q", 0, b"k", b"same", [("kmq-origin", b"q/0/%d" % i)]) for i in range(3)]
    recs.append(OutRecord("q", 0, b"k", b"other", [("kmq-origin", b"q/0/9")]))
    v1, v2 = [UNDECIDED] * 4, [UNDECIDED] * 4
    s.batch(recs, v1)
    s.report(Err("MSG_TIMED_OUT"), Msg("q", 0, b"k", b"other", None))  # a timed-out record: no headers
    s.report(Err("MSG_TIMED_OUT"), Msg("q", 0, b"k", b"same", [("kmq-origin", b"q/0/1")]))
    s.settle()
    assert [v is None for v in v1] == [True, False, True, False]
    s.batch(recs, v2)
    s.report(Err("MSG_TIMED_OUT"), Msg("q", 0, b"k", b"same", None))  # which of the three: unknown, so all
    s.settle()
    assert [v is None for v in v2] == [False, False, False, True]


def test_a_record_sent_without_a_partition_is_matched_with_the_one_it_was_given():
    s = FlushSettlement(error_of)
    fut = Delivery()
    s.future(fut, "q", None, None, b"v", None)
    s.report(Err("MSG_TIMED_OUT"), Msg("q", 3, None, b"v", None))
    s.settle()
    assert fut.failed()


def test_a_failure_that_names_no_send_leaves_every_verdict_undecided(caplog):
    s = FlushSettlement(error_of)
    verdicts = [UNDECIDED] * 3
    fut = Delivery()
    s.batch(records(3), verdicts)
    s.future(fut, "q__markers", 0, None, b"closed", None)
    s.report(Err("MSG_TIMED_OUT"), Msg("q", 0, b"k", b"something else", None))
    s.settle()
    assert verdicts == [UNDECIDED] * 3 and not fut.is_done  # nothing vouched for: retried
    assert "names a record this producer has no send for" in caplog.text


def test_a_settled_window_is_forgotten():
    s = FlushSettlement(error_of)
    v1 = [UNDECIDED]
    s.batch(records(1), v1)
    s.settle()
    v2 = [UNDECIDED]
    s.batch(records(1), v2)
    s.report(Err("MSG_TIMED_OUT"), Msg("q", 0, b"k", b"v0", [("kmq-origin", b"q/0/0")]))
    s.settle()
    assert v1 == [None] and isinstance(v2[0], RuntimeError)


def test_once_the_producer_is_fatal_a_record_no_report_names_is_not_vouched_for():
    """A fatal error can swallow a failure report (kmq.client.confluent.fatal): what no report
    names then takes the fatal error, never an acknowledgement."""
    s = FlushSettlement(error_of)
    recs = records(3)
    verdicts = [UNDECIDED] * 3
    s.batch(recs, verdicts)
    fut = Delivery()
    s.future(fut, "q__markers", 0, b"\x00", b"closed", None)
    r = recs[0]
    s.report(Err("MSG_SIZE_TOO_LARGE"), Msg(r.topic, r.partition, r.key, r.value, r.headers))
    fatal = RuntimeError("fatal")
    s.settle(unknown=fatal)
    assert str(verdicts[0]) == "q: MSG_SIZE_TOO_LARGE" and verdicts[1:] == [fatal, fatal]
    assert fut.failed() and fut.exception is fatal
