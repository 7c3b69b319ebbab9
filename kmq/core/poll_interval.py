"""Whether an application still takes messages: ``consumer.max_poll_interval``, pure.

A Kafka consumer that is not polled for ``max.poll.interval.ms`` leaves its
group, so its partitions go to a member that works. A kmq consumer's own Kafka
poll runs on its fetcher thread, which keeps polling whatever the application
does; without this rule an application that stopped taking messages (a hung
loop, a deadlock, a consumer dropped without ``close()``) kept its partitions
for ever, and the messages fetched for it waited behind it.

:class:`PollInterval` is fed by the fetcher: the count of takes so far (the
application bumps it on each ``poll``, iteration step or worker take: no clock
read, no lock) and whether messages are ready for it. Its clock runs only
while messages are ready and none is taken, so an application that idles on
an empty queue is not stalled, and a take resets it. Past ``interval`` it says
:data:`LEAVE` once; the next take after that says :data:`REJOIN`.
"""

from __future__ import annotations

__all__ = ["PollInterval", "LEAVE", "REJOIN"]

#: The application took nothing for ``interval`` while messages were ready: give the partitions up.
LEAVE = "leave"
#: The application took again after :data:`LEAVE`: join the group again.
REJOIN = "rejoin"


class PollInterval:
    """The stall state of one consumer's application.

    :param interval: seconds messages may be ready with none taken before :data:`LEAVE`.
    :param now: the time the watch starts (monotonic seconds), e.g. the fetcher's start.
    """

    __slots__ = ("interval", "left", "_takes", "_since")

    def __init__(self, interval: float, now: float) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0, got {interval!r}")
        self.interval = interval
        #: :data:`LEAVE` was said and no take came since (the member is out of the group).
        self.left = False
        self._takes: int | None = None  # the count last seen (None: not looked yet)
        self._since = now  # since when messages have been ready with none taken

    def look(self, now: float, takes: int, ready: bool) -> str | None:
        """The fetcher looks at ``now``: ``takes`` is the application's take count, ``ready``
        whether messages wait to be taken. Returns :data:`LEAVE`, :data:`REJOIN` or None."""
        if takes != self._takes:
            first = self._takes is None
            self._takes = takes
            self._since = now
            if self.left and not first:
                self.left = False
                return REJOIN
            return None
        if self.left:
            return None
        if not ready:
            self._since = now  # nothing waits for the application: its clock does not run
            return None
        if now - self._since >= self.interval:
            self.left = True
            return LEAVE
        return None

    def stalled_for(self, now: float) -> float:
        """Seconds messages have waited with none taken (as of the last :meth:`look` with them ready)."""
        return now - self._since
