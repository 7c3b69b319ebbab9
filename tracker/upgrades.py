"""Markers of a newer wire version than this tracker reads (docs/protocol.md, "Rolling upgrades").

Workers upgraded before the trackers write markers of a version the trackers do
not know yet. The wire format keeps every type's version-1 layout and only
appends fields (:mod:`kmq.core.markers`), so:

* a marker of a known type is read by its version-1 fields: counted, logged once
  per partition (the tracker works as before; the fields it does not know are
  what the upgrade brings);
* one it cannot read so (a new type, a body that does not parse) but that has a
  marker's header and ranges *holds the partition* at it. Skipping it could lose
  a lease (a START) or take one over too early (a RENEW); guessing could close a
  message that was never handled. So nothing after it is applied, its offset stays
  the partition's position, which the committed offset never passes, and no lease
  written after it is judged (the read-through time stops before it); leases due
  earlier are still judged, and the other partitions go on. One error line names
  the version and the fix, the gauge ``kmq_tracker_held_partitions`` shows it, and
  nothing restarts: a tracker that reads the version resumes from that marker.
"""

from __future__ import annotations

import logging
from typing import Iterable

from kmq.core.markers import VERSION, BadMarker
from kmq.telemetry.metrics import TrackerMetrics
from tracker.partition import OwnedPartition

__all__ = ["note_newer", "hold", "publish_held"]

log = logging.getLogger(__name__)


def note_newer(owned: OwnedPartition, version: int, metrics: TrackerMetrics) -> None:
    """A marker of wire ``version`` was read by its version-1 fields."""
    metrics.newer_markers.labels(owned.queue.label, str(version), "read").inc()
    if version not in owned.newer_seen:
        owned.newer_seen.add(version)
        log.warning("%s[%d]: markers of wire version %d are read by their version-%d fields, the rest ignored: the "
                    "workers run a newer kmq than this tracker. Upgrade the tracker (kmq_tracker_newer_markers_total)",
                    owned.topic, owned.partition, version, VERSION)


def hold(owned: OwnedPartition, offset: int, marker: BadMarker, metrics: TrackerMetrics) -> None:
    """Hold ``owned`` at the marker at ``offset`` that this tracker cannot read (see the module docstring)."""
    owned.held = (offset, marker.newer or 0)
    metrics.newer_markers.labels(owned.queue.label, str(marker.newer), "held").inc()
    log.error("%s[%d] offset %d: %s. It is not skipped (it may open or keep a lease): the partition is held there. "
              "Nothing after it is applied, no lease written after it is judged and its committed offset stays "
              "there; the other partitions go on. Upgrade the tracker to a kmq that reads marker version %d (the "
              "workers' version): it resumes from this marker (kmq_tracker_held_partitions)",
              owned.topic, owned.partition, offset, marker.reason, marker.newer)


def publish_held(owned: Iterable[OwnedPartition], queues: Iterable[str], metrics: TrackerMetrics) -> None:
    """Set ``kmq_tracker_held_partitions`` of each of ``queues`` from the ``owned`` partitions."""
    counts = dict.fromkeys(queues, 0)
    for o in owned:
        if o.held is not None:
            counts[o.queue.label] = counts.get(o.queue.label, 0) + 1
    for name, n in counts.items():
        metrics.held_partitions.labels(name).set(n)
