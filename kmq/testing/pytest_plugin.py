"""The pytest plugin of :mod:`kmq.testing`: the ``kmq_queue`` fixture.

Registered through the ``pytest11`` entry point of the kmq distribution, so a test
suite with kmq installed has the fixture without configuration (a suite that
turns entry-point plugins off adds ``pytest_plugins = ["kmq.testing.pytest_plugin"]``
to its ``conftest.py``). The only module of kmq that imports pytest.

Settings of the queue come from the ``kmq_queue`` marker::

    @pytest.mark.kmq_queue(name="orders", max_deliveries=3, backoff={"initial": "5s"})
    def test_orders(kmq_queue): ...
"""

from __future__ import annotations

from typing import Iterator

import pytest

from kmq.testing.queue import TestQueue

__all__ = ["kmq_queue"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kmq_queue(name='orders', partitions=1, **queue_settings): settings of the kmq_queue fixture's "
        "TestQueue (kmq.testing)")


@pytest.fixture
def kmq_queue(request: pytest.FixtureRequest) -> Iterator[TestQueue]:
    """A fresh :class:`~kmq.testing.TestQueue` per test (settings from the ``kmq_queue`` marker), closed after it."""
    marker = request.node.get_closest_marker("kmq_queue")
    kwargs = dict(marker.kwargs) if marker is not None else {}
    with TestQueue(**kwargs) as queue:
        yield queue
