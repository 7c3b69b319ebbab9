"""Benchmarks (``kmq bench ...``). Timings live here, never in pass/fail tests.

Each benchmark module exposes ``command`` (a click command) and
``run(**options) -> dict`` (the figures, for ``kmq bench all``'s JSON report).
"""
