"""The KMQ redelivery tracker: a separately scaled service next to Kafka.

``Tracker(cfg).run()`` (or ``kmq tracker run``) joins the tracker consumer
group on the markers topics, keeps the open leases per markers partition
(:mod:`kmq.core.lease_state`, pure), redelivers expired messages or moves them
to the DLQ (:mod:`tracker.redeliver`) and serves /metrics, /healthz and
/readyz (:mod:`tracker.http`).
"""

from __future__ import annotations

from tracker.service import Tracker

__all__ = ["Tracker"]
