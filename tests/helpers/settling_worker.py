"""A ``KmqConsumer`` on its own thread that hands each message to a settle function,
as a real application's worker does: the shared shape of the tests' scripted workers.

The worker processes beside it are for tests that kill a worker, and each does what no other
does: ``workers.py`` pauses a KmqConsumer at a fetcher stage (to SIGKILL it at exactly that
step), ``ordered_worker.py`` runs ``consumer.ordering: key`` on a handler pool and prints
completions, ``marked_worker.py`` is a user's confluent-kafka loop with ``@kmq.marked``;
``kmq work`` is the CLI's own worker."""

from __future__ import annotations

import threading
from typing import Any, Callable

from kmq import KmqConsumer


class SettlingWorker:
    """Polls ``queue`` and calls ``settle(msg)`` for every message until :meth:`close`.

    ``settle`` decides the outcome (ack, nack, reject, renew, hold) and keeps whatever
    the test counts; it runs on the worker's thread. An exception it raises stops the worker
    and is kept in :attr:`errors`, for the test to raise."""

    def __init__(self, cfg: Any, queue: str, settle: Callable[[Any], None], batch_size: int = 50) -> None:
        self.consumer = KmqConsumer(cfg, queue=queue, batch_size=batch_size)
        self._settle = settle
        self.errors: list[BaseException] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"settling-worker-{queue}")
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                for msg in self.consumer.poll(timeout=0.2):
                    self._settle(msg)
        except BaseException as exc:  # noqa: BLE001 - raised by the test's thread
            self.errors.append(exc)

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(10)
        self.consumer.close()
