"""The OpenTelemetry SDK of kmq's own processes, set up from the standard ``OTEL_*`` environment.

For ``kmq tracker run`` and ``kmq work`` only: in the library an application brings its own tracer
provider, and kmq never installs one. :func:`process_tracing` installs a tracer provider when the
SDK is installed (the ``kmq[otel-sdk]`` extra, in the container image) and the environment asks
for spans; otherwise the process makes none, as before. The variables are the SDK's own:

* ``OTEL_TRACES_EXPORTER``: ``otlp``, ``console`` or another installed exporter (comma-separated;
  ``none`` = off); unset, spans are exported by OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, else tracing stays off;
* ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``..._HEADERS``, ``..._PROTOCOL`` (``http/protobuf``, the
  default here, or ``grpc`` with ``opentelemetry-exporter-otlp-proto-grpc`` installed), read by the
  exporter;
* ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (default service name: the process's, e.g.
  ``kmq-tracker``), ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ``OTEL_SDK_DISABLED``, read by the SDK.

The decision (:func:`exporters_of`) is pure; the module imports ``opentelemetry`` only inside
:func:`process_tracing`, when tracing is on.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Iterator, Mapping

from kmq.core.errors import ConfigError, install_extra

__all__ = ["exporters_of", "destination", "process_tracing"]

log = logging.getLogger(__name__)

#: ``OTEL_TRACES_EXPORTER``'s ``otlp`` by protocol: the exporters' entry point names.
_OTLP = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
_PACKAGES = {"otlp_proto_http": f"opentelemetry-exporter-otlp-proto-http ({install_extra('otel-sdk')})",
             "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc"}
_GROUP = "opentelemetry_traces_exporter"


def _get(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "").strip()


def exporters_of(env: Mapping[str, str]) -> tuple[str, ...]:
    """The span exporters (entry point names) ``env`` asks for; empty = tracing off."""
    if _get(env, "OTEL_SDK_DISABLED").lower() == "true":
        return ()
    raw = _get(env, "OTEL_TRACES_EXPORTER")
    if not raw:
        if not (_get(env, "OTEL_EXPORTER_OTLP_ENDPOINT") or _get(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
            return ()
        raw = "otlp"
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    if "none" in names:
        return ()
    out = []
    for name in names:
        if name == "otlp":
            protocol = (_get(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _get(env, "OTEL_EXPORTER_OTLP_PROTOCOL")
                        or "http/protobuf")
            if protocol not in _OTLP:
                raise ConfigError("OTEL_EXPORTER_OTLP_PROTOCOL", f"{protocol!r} is not supported; use http/protobuf "
                                  "(the default) or grpc")
            name = _OTLP[protocol]
        if name not in out:
            out.append(name)
    return tuple(out)


def destination(name: str, env: Mapping[str, str]) -> str:
    """Where exporter ``name`` sends spans, for the log line."""
    traces = _get(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    base = _get(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
    if name == "otlp_proto_http":
        return "OTLP/HTTP " + (traces or (base or "http://localhost:4318").rstrip("/") + "/v1/traces")
    if name == "otlp_proto_grpc":
        return "OTLP/gRPC " + (traces or base or "http://localhost:4317")
    if name == "console":
        return "the console (stdout)"
    return f"exporter {name}"


def _exporter(name: str) -> Any:
    from importlib.metadata import entry_points

    found = list(entry_points(group=_GROUP, name=name))
    if not found:
        installed = sorted({ep.name for ep in entry_points(group=_GROUP)})
        hint = f"install {_PACKAGES[name]}" if name in _PACKAGES else "check the name"
        raise ConfigError("OTEL_TRACES_EXPORTER", f"no span exporter {name!r} is installed (installed: "
                          f"{', '.join(installed) or 'none'}); {hint}, or unset OTEL_TRACES_EXPORTER and "
                          "OTEL_EXPORTER_OTLP_ENDPOINT to run without spans")
    return found[0].load()()


@contextlib.contextmanager
def process_tracing(service: str, announce: Callable[[str], None],
                    env: Mapping[str, str] | None = None) -> Iterator[bool]:
    """Inside the block, the process's spans go where ``env`` (default: the environment) says, under
    service name ``service`` unless ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` name one;
    ``announce`` gets one line saying where. Leaving the block exports what is left (shutdown).
    Yields whether tracing is on. Raises :class:`~kmq.core.errors.ConfigError` for an exporter
    that is not installed."""
    env = os.environ if env is None else env
    names = exporters_of(env)
    if not names:
        yield False
        return
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        asked = "OTEL_TRACES_EXPORTER" if _get(env, "OTEL_TRACES_EXPORTER") else "OTEL_EXPORTER_OTLP_ENDPOINT"
        announce(f"OpenTelemetry: {asked} is set but opentelemetry-sdk is not installed "
                 f"({install_extra('otel-sdk')}): no spans")
        yield False
        return
    exporters = [_exporter(n) for n in names]  # a name that is not installed is an error either way
    if not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        announce("OpenTelemetry: a tracer provider is already installed (e.g. by opentelemetry-instrument): "
                 "spans go where it sends them")
        yield True
        return
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    announce(f"OpenTelemetry: spans of service {resource.attributes[SERVICE_NAME]!s} go to "
             + ", ".join(destination(n, env) for n in names))
    try:
        yield True
    finally:
        provider.shutdown()  # exports the spans still batched
