"""Fixtures the unit tests share, from tests/helpers/."""

from tests.helpers.consumer_shell import consumer_on  # noqa: F401  (a fixture: KmqConsumer over fake parts)
