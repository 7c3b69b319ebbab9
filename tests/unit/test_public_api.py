"""The public surface of ``kmq`` is exactly what the design names (plus errors)."""

from __future__ import annotations

import __future__

import kmq

DESIGN_NAMES = {"Config", "KmqConsumer", "MarkerWriter", "marked", "IdempotencyGuard"}


def test_all_matches_what_is_exported():
    exported = {
        name
        for name in dir(kmq)
        if not name.startswith("_")
        and not isinstance(getattr(kmq, name), (type(kmq), __future__._Feature))  # submodules, `annotations`
    }
    assert set(kmq.__all__) - {"__version__"} == exported


def test_design_names_are_public():
    assert DESIGN_NAMES <= set(kmq.__all__)


def test_errors_share_one_base():
    for name in kmq.__all__:
        obj = getattr(kmq, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, kmq.KmqError), name
