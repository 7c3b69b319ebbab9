"""Telemetry: Prometheus metrics and logging configuration shared by every process."""
