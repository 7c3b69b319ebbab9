"""The example test of docs/testing.md (examples/test_order_handler.py), run as part of kmq's suite:
the documented way to test a handler keeps working."""

from examples.test_order_handler import (  # noqa: F401 - collected by pytest from this module
    test_an_item_never_known_ends_in_the_dlq_after_three_deliveries,
    test_an_unknown_item_is_retried_after_30_seconds,
    test_good_orders_are_acked_and_bad_ones_dead_lettered,
)
