"""Telemetry: Prometheus metrics, logging configuration and OpenTelemetry spans shared by every process."""
