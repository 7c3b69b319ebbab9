"""librdkafka's fatal producer errors recognised as confluent-kafka raises them (no broker)."""

from __future__ import annotations

import pytest

from kmq.client import ProducerFatal, produce_errors

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")

from kmq.client.confluent.fatal import FatalState, fatal_error_of  # noqa: E402


def fatal(code=None, reason="ProduceRequest failed: unable to satisfy gap-less guarantee"):
    return ck.KafkaError(ck.KafkaError._GAPLESS_GUARANTEE if code is None else code, reason, fatal=True)


def test_the_fatal_error_is_found_where_confluent_kafka_raises_it():
    err = fatal()
    assert fatal_error_of(ck.KafkaException(err)) is err  # from poll() or flush()
    # A report callback that ran with the fatal exception set raises SystemError from it.
    try:
        try:
            raise ck.KafkaException(err)
        except ck.KafkaException as inner:
            raise SystemError("<method 'code'> returned a result with an exception set") from inner
    except SystemError as outer:
        assert fatal_error_of(outer) is err
    # produce() on a fatal producer: _FATAL, not flagged fatal itself.
    assert fatal_error_of(ck.KafkaException(ck.KafkaError(ck.KafkaError._FATAL, "Local: Fatal error"))) is not None
    assert fatal_error_of(ck.KafkaException(ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT, "timed out"))) is None
    assert fatal_error_of(RuntimeError("no")) is None and fatal_error_of(None) is None


def test_the_first_fatal_error_is_kept_logged_once_and_is_a_produce_error(caplog):
    state = FatalState()
    assert not state.note(ck.KafkaException(ck.KafkaError(ck.KafkaError._TRANSPORT, "down")))
    assert state.error is None and state.refused(ck.KafkaError(ck.KafkaError.MSG_SIZE_TOO_LARGE, "x")) is None
    assert state.note(ck.KafkaException(fatal()))
    first = state.error
    assert isinstance(first, ProducerFatal) and isinstance(first, produce_errors()) and first.retriable
    assert "gap-less" in str(first) and "_GAPLESS_GUARANTEE" in str(first)
    assert state.refused(ck.KafkaError(ck.KafkaError._FATAL, "Unable to produce message")) is first
    assert state.note(ck.KafkaException(fatal(reason="again"))) and state.error is first
    assert caplog.text.count("reported a fatal error") == 1


def test_the_fatal_error_raised_as_the_error_object_itself_is_found():
    """confluent-kafka's flush with a report callback raises the KafkaError itself (no BaseException)."""
    err = fatal()
    assert fatal_error_of(err) is err
    assert fatal_error_of(ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT, "timed out")) is None
