"""A test kit for handler code: a kmq queue in memory, on a virtual clock (docs/testing.md).

::

    from kmq.testing import TestQueue

    def test_orders(kmq_queue):          # the pytest fixture (kmq.testing.pytest_plugin)
        kmq_queue.produce(b"order-1", key=b"k1")
        kmq_queue.run(handle_order, reject_on=BadPayload)
        assert kmq_queue.acked == [b"order-1"]

The consumers are kmq's own and the tracker is the real one, over a simulated
cluster (:mod:`kmq.dev.sim`) passed in as their clients; what a test reads back is
decoded from the topics they wrote. No broker, no pytest needed to import it (only
:mod:`kmq.testing.pytest_plugin` imports pytest).
"""

from __future__ import annotations

from kmq.testing.queue import TestQueue, TestQueueError
from kmq.testing.results import DeadLetter, Delivered, Nacked, Rejected

__all__ = [
    # the queue
    "TestQueue", "TestQueueError",
    # what a test reads back
    "Delivered", "Nacked", "Rejected", "DeadLetter",
]
