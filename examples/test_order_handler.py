"""Testing a kmq handler without a broker: kmq.testing (docs/testing.md).

``handle_order`` is the application's handler; the tests below are what its
test suite would hold. Run them with ``pytest examples/test_order_handler.py``:
the ``kmq_queue`` fixture comes with kmq (its pytest plugin), each test gets a
fresh in-memory queue with a running tracker, and time is virtual, so the
30-second retry and the backoff cost nothing. kmq's own suite runs this file
(tests/unit/test_testing_example.py).
"""

from __future__ import annotations

import json

import pytest


class BadPayload(Exception):
    """An order that can never be processed: to the DLQ at once."""


class StockUnknown(Exception):
    """The stock service does not know the item yet: ask again later."""


STOCK: dict[str, int] = {"apple": 3}


def handle_order(msg) -> None:
    """Reserve an order's items. Returning acks the message; ``BadPayload`` rejects it
    (``reject_on``); any other exception nacks it with the queue's backoff."""
    order = json.loads(msg.value)
    if "item" not in order:
        raise BadPayload(f"order {order.get('id')} names no item")
    if order["item"] not in STOCK:
        if msg.delivery_count == 1:
            msg.nack(delay=30)  # the stock service learns new items within a minute
            return
        raise StockUnknown(order["item"])
    STOCK[order["item"]] -= 1


def order(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_good_orders_are_acked_and_bad_ones_dead_lettered(kmq_queue):
    kmq_queue.produce(order(id=1, item="apple"), key=b"1")
    kmq_queue.produce(order(id=2), key=b"2")
    kmq_queue.run(handle_order, reject_on=BadPayload)
    assert kmq_queue.acked == [order(id=1, item="apple")]
    [dead] = kmq_queue.dead_letters
    assert dead.reason == "rejected"
    assert dead.error.startswith("BadPayload: order 2 names no item")


def test_an_unknown_item_is_retried_after_30_seconds(kmq_queue):
    kmq_queue.produce(order(id=3, item="pear"))
    kmq_queue.run(handle_order, reject_on=BadPayload)
    assert [n.delay for n in kmq_queue.nacked] == [30.0]
    STOCK["pear"] = 1  # the stock service learns it meanwhile
    kmq_queue.advance(30.0)  # virtual seconds: the tracker redelivers the message
    kmq_queue.run(handle_order, reject_on=BadPayload)
    assert kmq_queue.acked == [order(id=3, item="pear")]
    assert kmq_queue.delivery_counts(order(id=3, item="pear")) == [1, 2]


@pytest.mark.kmq_queue(name="orders", max_deliveries=3)
def test_an_item_never_known_ends_in_the_dlq_after_three_deliveries(kmq_queue):
    kmq_queue.produce(order(id=4, item="durian"))
    kmq_queue.run_until_settled(handle_order, reject_on=BadPayload)
    [dead] = kmq_queue.dead_letters
    assert (dead.reason, dead.delivery_count) == ("nack-limit", 3)
    assert kmq_queue.delivery_counts(order(id=4, item="durian")) == [1, 2, 3]
