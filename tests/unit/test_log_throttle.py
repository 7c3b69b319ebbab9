"""kmq.client.confluent.log_throttle.RepeatThrottle and the librdkafka log bridge built on it (pure, time passed in)."""

from __future__ import annotations

import logging

import pytest

from kmq.client.confluent.log_bridge import LibrdkafkaLogBridge, is_transport_failure, repeat_key
from kmq.client.confluent.log_throttle import RepeatThrottle, Suppressed

REFUSED = ("[thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: "
           "Connection refused (after {ms}ms in state CONNECT{extra})")


def refused(ms: int = 0, extra: str = "", port: int = 9092) -> str:
    return REFUSED.format(ms=ms, extra=extra).replace("9092", str(port))


# ---------------------------------------------------------------- RepeatThrottle


def test_first_line_passes_repeats_within_the_interval_are_counted_not_passed():
    t = RepeatThrottle(30.0)
    assert t.admit("k", 0.0) == Suppressed("k", 0, 0.0)
    assert [t.admit("k", 0.05 * i) for i in range(1, 100)] == [None] * 99
    assert t.due(29.9) == []


def test_one_line_per_interval_carries_the_count_of_the_dropped():
    t = RepeatThrottle(30.0)
    t.admit("k", 0.0)
    for i in range(1, 58):
        assert t.admit("k", i * 0.5) is None  # 57 repeats up to 28.5 s
    assert t.admit("k", 30.0) == Suppressed("k", 57, 30.0)  # this one passes with the count
    assert t.admit("k", 30.1) is None  # and a new interval starts


def test_a_storm_of_any_length_is_one_line_per_interval():
    t = RepeatThrottle(30.0)
    passed = 0
    now = 0.0
    for _ in range(36_000):  # one hour at 10 lines a second
        passed += t.admit("k", now) is not None
        passed += len(t.due(now))
        now += 0.1
    assert 120 <= passed <= 121  # 3600 s / 30 s, plus the first


def test_due_summarises_a_key_that_went_quiet_and_forgets_a_quiet_key():
    t = RepeatThrottle(10.0)
    t.admit("storm", 0.0)
    t.admit("storm", 1.0)
    t.admit("storm", 2.0)
    t.admit("once", 0.0)
    assert t.due(9.0) == []
    assert t.due(10.0) == [Suppressed("storm", 2, 10.0)]  # "once" had no repeats: forgotten
    assert t.due(25.0) == []  # "storm" quiet since its summary: forgotten too
    assert t.admit("once", 26.0) == Suppressed("once", 0, 0.0)  # a first occurrence again


def test_keys_are_independent():
    t = RepeatThrottle(30.0)
    assert t.admit("broker-a", 0.0) is not None
    assert t.admit("broker-b", 0.1) is not None
    assert t.admit("broker-a", 0.2) is None


def test_drain_reports_every_pending_count_and_clears():
    t = RepeatThrottle(30.0)
    t.admit("a", 0.0)
    t.admit("a", 1.0)
    t.admit("b", 0.0)
    assert t.drain(5.0) == [Suppressed("a", 1, 5.0)]
    assert t.drain(6.0) == []
    assert t.admit("a", 6.0) == Suppressed("a", 0, 0.0)


@pytest.mark.parametrize("interval", [0, -1.0])
def test_interval_must_be_positive(interval):
    with pytest.raises(ValueError, match="interval must be > 0"):
        RepeatThrottle(interval)


# ---------------------------------------------------------------- librdkafka lines


def test_repeat_key_ignores_timings_and_counts_but_keeps_the_broker():
    a = repeat_key("FAIL", refused(0))
    assert a == repeat_key("FAIL", refused(3, ", 4 identical error(s) suppressed"))
    assert a != repeat_key("FAIL", refused(0, port=9093))  # another broker
    assert a != repeat_key("ERROR", refused(0))
    assert a[1] == "127.0.0.1:9092/bootstrap"


@pytest.mark.parametrize("text", [
    refused(),
    "[thrd:GroupCoordinator]: GroupCoordinator: 127.0.0.1:9092: Disconnected: connection closed by peer: receive 0 "
    "after POLLIN (after 3004ms in state UP)",
    "[thrd:127.0.0.1:9092/1]: 127.0.0.1:9092/1: Connection setup timed out in state CONNECT (after 30028ms in state CONNECT)",
    "1/1 brokers are down",
])
def test_connection_failures_are_transport_failures(text):
    assert is_transport_failure(text)


@pytest.mark.parametrize("text", [
    "[thrd:ssl://h:9093/bootstrap]: ssl://h:9093/bootstrap: SSL handshake failed: certificate verify failed",
    "[thrd:sasl_ssl://h:9093/bootstrap]: sasl_ssl://h:9093/bootstrap: SASL authentication error: Authentication failed",
    "[thrd:h:9092/bootstrap]: h:9092/bootstrap: Disconnected while requesting ApiVersion: might be caused by incorrect "
    "security.protocol configuration (connecting to a SSL listener?)",
    "[thrd:app]: Failed to resolve 'nohost:9092': Name or service not known",
    "[thrd:main]: Topic q partition count changed from 2 to 4",
])
def test_configuration_problems_and_others_are_not(text):
    assert not is_transport_failure(text)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def captured():
    logger = logging.getLogger("kmq.test-librdkafka-bridge")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.DEBUG)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, records
    logger.removeHandler(handler)
    logger.propagate = True


def test_bridge_turns_a_reconnect_storm_into_a_few_warnings_naming_the_broker(captured):
    logger, records = captured
    clock = Clock()
    bridge = LibrdkafkaLogBridge(logger, interval=30.0, clock=clock)
    for i in range(960):  # 60 s at 16 attempts a second (librdkafka's consumer made 20)
        bridge.log(logging.ERROR, "%s [%s] %s", "FAIL", "kmq#consumer-2", refused(i % 3))
        clock.now += 1 / 16
    bridge.flush()
    lines = [(r.levelno, r.getMessage()) for r in records]
    assert [lvl for lvl, _ in lines] == [logging.WARNING] * 3, lines
    assert all("127.0.0.1:9092/bootstrap" in m and "Connection refused" in m for _, m in lines)
    assert lines[0][1] == "FAIL [kmq#consumer-2] " + refused(0)  # the first, as librdkafka wrote it
    assert "479 repeats in the previous 30 s not logged" in lines[1][1]
    assert "repeated 479 times in the last 30 s" in lines[2][1]  # the close reports the rest


def test_bridge_keeps_handles_brokers_and_levels_apart(captured):
    logger, records = captured
    clock = Clock()
    bridge = LibrdkafkaLogBridge(logger, interval=30.0, clock=clock)
    tls = "[thrd:ssl://h:9093/bootstrap]: ssl://h:9093/bootstrap: SSL handshake failed: certificate verify failed"
    for _ in range(5):
        bridge.log(logging.ERROR, "%s [%s] %s", "FAIL", "kmq#producer-1", refused(port=9092))
        bridge.log(logging.ERROR, "%s [%s] %s", "FAIL", "kmq#producer-1", refused(port=9093))
        bridge.log(logging.ERROR, "%s [%s] %s", "FAIL", "kmq#producer-1", tls)
        bridge.log(logging.INFO, "%s [%s] %s", "CONFWARN", "kmq#producer-1", "[thrd:app]: No bootstrap.servers")
        clock.now += 1.0
    got = [(r.levelno, r.getMessage().split(": ", 2)[1]) for r in records]
    assert got == [(logging.WARNING, "127.0.0.1:9092/bootstrap"), (logging.WARNING, "127.0.0.1:9093/bootstrap"),
                   (logging.ERROR, "ssl://h:9093/bootstrap"), (logging.INFO, "No bootstrap.servers")]
    clock.now += 30.0
    bridge.log(logging.INFO, "%s [%s] %s", "CONFWARN", "kmq#producer-1", "[thrd:app]: something else")
    summaries = [r for r in records[4:] if "repeated 4 times" in r.getMessage()]
    assert len(summaries) == 4  # each key's count arrives with the next line after its interval


def test_bridge_passes_other_calls_through(captured):
    logger, records = captured
    LibrdkafkaLogBridge(logger).log(logging.ERROR, "plain %s", "line")
    assert [r.getMessage() for r in records] == ["plain line"]
