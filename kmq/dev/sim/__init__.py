"""A deterministic simulated Kafka cluster behind kmq's client seam (a development and test tool).

The real kmq consumer and tracker code talks to Kafka only through
:mod:`kmq.client`; this package gives that seam a cluster that lives in one
thread, on a virtual clock, with faults drawn from a seed, so a run is
repeatable byte for byte and a failing seed can be replayed.

* :mod:`~kmq.dev.sim.clock`: the virtual clock and its event queue;
* :mod:`~kmq.dev.sim.log`: one partition's log (log start, high-water mark, transactions and
  the last stable offset, segments);
* :mod:`~kmq.dev.sim.assignors` and :mod:`~kmq.dev.sim.groups`: the group coordinator;
* :mod:`~kmq.dev.sim.faults`: the faults and the :class:`FaultPlan`;
* :mod:`~kmq.dev.sim.cluster`: :class:`SimCluster`, tying them together, with the history;
* :mod:`~kmq.dev.sim.consumer`, :mod:`~kmq.dev.sim.producer`, :mod:`~kmq.dev.sim.reader`:
  the clients kmq sees (a ``GroupConsumerAdapter``, a producer with ``Delivery`` futures,
  the tracker's log reader).

::

    cluster = SimCluster(seed=7, faults=FaultPlan.random(7, topics={"q": 2}, consumers=["w1"], group="g"))
    cluster.create_topic("q", 2)
    producer = SimProducer(cluster)
    producer.send("q", b"v", key=b"k")
    consumer = SimConsumer(cluster, "w1", group_id="g")
    consumer.subscribe(["q"], on_assigned=print, on_revoked=print)
    records = consumer.fetch(1.0, 100)   # simulated seconds

Only tests and the developer tools above the library import it (the
import contracts in ``pyproject.toml`` keep it so).
"""

from __future__ import annotations

from kmq.dev.sim.assignors import COOPERATIVE_STICKY, RANGE
from kmq.dev.sim.clock import VirtualClock
from kmq.dev.sim.cluster import RecordMetadata, SimCluster
from kmq.dev.sim.consumer import SIM, SimConsumer
from kmq.dev.sim.errors import FaultPlanError, SimulationError
from kmq.dev.sim.faults import (
    DELAYED, LOST, BrokerPause, ClockSkew, CommitFault, FaultPlan, MemberJoinsAndLeaves, MemberPause, OpenTransaction,
    ProduceFault, ProducerGoesFatal,
    Retention,
    LaggingRead, LeaderChange, SlowFetch, SlowRead, StaleHighWater, UnexpectedRecord,
)
from kmq.dev.sim.producer import SimDelivery, SimProducer
from kmq.dev.sim.reader import SimLogReader

__all__ = [
    # the cluster and its clients
    "SimCluster", "SimConsumer", "SimProducer", "SimDelivery", "SimLogReader", "RecordMetadata", "VirtualClock",
    "SIM", "RANGE", "COOPERATIVE_STICKY",
    # faults
    "FaultPlan", "SlowFetch", "SlowRead", "LaggingRead", "LeaderChange", "ClockSkew", "StaleHighWater",
    "ProduceFault", "ProducerGoesFatal", "CommitFault", "MemberPause", "BrokerPause",
    "Retention", "UnexpectedRecord", "MemberJoinsAndLeaves", "OpenTransaction", "DELAYED", "LOST",
    # errors
    "SimulationError", "FaultPlanError",
]
