"""kmq.telemetry.otel_sdk without a broker: which exporters the OTEL_* environment asks for, where
they send spans, and the clear errors; the tracker process's own spans are in
tests/integration/test_tracker_otel.py."""

from __future__ import annotations

import pytest

from kmq.core.errors import ConfigError
from kmq.telemetry.otel_sdk import destination, exporters_of, process_tracing
from tests.helpers.otel import span_exporter


@pytest.mark.parametrize("env, expected", [
    ({}, ()),  # nothing asked: off
    ({"OTEL_SERVICE_NAME": "kmq-tracker"}, ()),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp_proto_http",)),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ("otlp_proto_http",)),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp_proto_http",)),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, ("otlp_proto_grpc",)),
    ({"OTEL_TRACES_EXPORTER": " Console , otlp "}, ("console", "otlp_proto_http")),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ()),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, ()),
])
def test_the_environment_chooses_the_exporters(env, expected):
    assert exporters_of(env) == expected


def test_an_otlp_protocol_without_an_exporter_is_a_clear_error():
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json' is not supported"):
        exporters_of({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


@pytest.mark.parametrize("name, env, expected", [
    ("otlp_proto_http", {}, "OTLP/HTTP http://localhost:4318/v1/traces"),
    ("otlp_proto_http", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "OTLP/HTTP http://c:4318/v1/traces"),
    ("otlp_proto_http", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/t"}, "OTLP/HTTP http://c/t"),
    ("otlp_proto_grpc", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, "OTLP/gRPC http://c:4317"),
    ("console", {}, "the console (stdout)"),
])
def test_the_log_line_says_where_spans_go(name, env, expected):
    assert destination(name, env) == expected


def test_an_exporter_that_is_not_installed_is_a_clear_error_naming_the_fix():
    pytest.importorskip("opentelemetry.sdk", reason="the kmq[otel] extra (opentelemetry-sdk) is not installed")
    with pytest.raises(ConfigError, match="no span exporter 'zipkin' is installed .*unset OTEL_TRACES_EXPORTER"):
        with process_tracing("kmq-tracker", print, {"OTEL_TRACES_EXPORTER": "zipkin"}):
            pass


def test_nothing_is_set_up_while_the_environment_asks_for_no_spans():
    lines: list[str] = []
    with process_tracing("kmq-tracker", lines.append, {}) as on:
        assert on is False
    assert lines == []


def test_a_provider_installed_before_is_kept():
    span_exporter()  # the test session's provider, as opentelemetry-instrument would install one
    lines: list[str] = []
    with process_tracing("kmq-tracker", lines.append, {"OTEL_TRACES_EXPORTER": "console"}) as on:
        assert on is True
    assert lines == ["OpenTelemetry: a tracer provider is already installed (e.g. by opentelemetry-instrument): "
                     "spans go where it sends them"]
