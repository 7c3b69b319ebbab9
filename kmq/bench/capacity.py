"""``kmq bench capacity``: what a deployment needs for a given load, and the tracker at that scale.

Two parts:

* :func:`plan` (pure): from per-core costs that the other benchmarks measure
  (``kmq bench consumer``: messages/s per worker process and marker records
  per message; ``kmq bench tracker``: markers/s applied and copies/s produced
  per tracker core, bytes per in-flight message; ``kmq bench spark``:
  markers/s per core), the worker processes, tracker replicas, markers topic
  partitions and bytes/s, tracker memory and Spark cores for a message rate,
  a partition count, a failure share, a processing time and a lease;
* :func:`simulate` : the real tracker service loop on the simulated cluster
  (:mod:`kmq.dev.sim`) at that partition count with a steady load and the
  failure share, measuring its step time (wall clock per ``Tracker.step``)
  and the memory its per-partition lease state holds (a deep size of the
  objects, callables and classes left out), at a tenth of the partition
  count and at all of it, side by side.

The defaults of :class:`Costs` are this machine's figures from
docs/benchmarks.md; pass your own (``--worker-msgs`` ...) after measuring on
your hardware.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import statistics
import sys
import time
import types
from dataclasses import asdict, dataclass

import click

__all__ = ["Costs", "Load", "Plan", "plan", "simulate", "command"]


@dataclass(frozen=True, slots=True)
class Costs:
    """Per-core (or per-process) costs, each measured by a ``kmq bench`` command."""

    worker_msgs_per_s: float = 100_000.0  # kmq bench consumer: KmqConsumer, one process, kafka-python
    # kmq bench tracker's workload (START per 500, END flushes of 50 out of order): 0.022; the consumer
    # bench's big fetches write far fewer (0.0006). A slow partition's small batches write more.
    markers_per_message: float = 0.022
    marker_bytes: float = 60.0  # a START/END record with a few ranges, key and headers included
    tracker_markers_per_s: float = 1_870_000.0  # kmq bench tracker: markers decoded + applied, one core
    tracker_copies_per_s: float = 67_000.0  # kmq bench tracker: copies produced for a due backlog (confluent)
    tracker_bytes_per_in_flight: float = 8.0  # kmq bench tracker: 1M in flight with ack holes: 42.5 - 35.3 MB
    tracker_base_mb: float = 36.0  # a tracker process with nothing in flight (interpreter and imports)
    tracker_bytes_per_partition: float = 5_000.0  # kmq bench tracker --idle-partitions: RSS per partition held
    spark_markers_per_core_s: float = 100_000.0  # kmq bench spark: 200,938 markers/s at local[2] on kafka-python (confluent ~2x)


@dataclass(frozen=True, slots=True)
class Load:
    """The deployment's load."""

    msgs_per_s: float = 1_000_000.0
    partitions: int = 1000
    failure_share: float = 0.01  # deliveries nacked or timed out (each becomes a copy)
    processing_s: float = 0.1  # handler time per message (in flight meanwhile)
    ack_flush_s: float = 0.1  # consumer.ack_flush_interval: END markers trail the ack by up to this
    lease_s: float = 30.0  # a timed-out message is in flight for its whole lease
    headroom: float = 0.5  # spare capacity kept on every component (0.5: run at 2/3 of the measured limit)


@dataclass(frozen=True, slots=True)
class Plan:
    """What :func:`plan` sizes (see the module docstring)."""

    worker_processes: int
    markers_per_s: float
    markers_bytes_per_s: float
    markers_partitions: int
    copies_per_s: float
    tracker_replicas: int
    tracker_in_flight: float
    tracker_memory_mb_each: float
    crash_recovery_s: float
    spark_cores: int
    notes: tuple[str, ...]


def plan(load: Load, costs: Costs = Costs()) -> Plan:
    """Size a deployment for ``load`` from measured ``costs`` (pure arithmetic, explained in ``notes``)."""
    if load.msgs_per_s <= 0 or load.partitions < 1 or not 0 <= load.failure_share < 1:
        raise ValueError("a load needs msgs_per_s > 0, partitions >= 1 and 0 <= failure_share < 1")
    spare = 1.0 + load.headroom
    workers = math.ceil(load.msgs_per_s * spare / costs.worker_msgs_per_s)
    notes = []
    if workers > load.partitions:
        notes.append(f"{workers} worker processes exceed {load.partitions} partitions: a partition is consumed by "
                     "one process, so add partitions or handler threads per process")
    copies = load.msgs_per_s * load.failure_share
    # START and END records cover ranges (markers_per_message counts both, as the consumer bench does) for
    # every delivery, originals and copies; each failure adds a NACK (or nothing, on a timeout) and the
    # tracker's CLOSED, counted one record each (the worst case: failures rarely share a range).
    markers = (load.msgs_per_s + copies) * costs.markers_per_message + 2 * copies
    # The tracker applies every marker and produces every copy; replicas split the markers partitions.
    by_markers = markers * spare / costs.tracker_markers_per_s
    by_copies = copies * spare / costs.tracker_copies_per_s
    replicas = max(1, math.ceil(max(by_markers, by_copies)))
    replicas = min(replicas, load.partitions)
    in_flight = (load.msgs_per_s * (load.processing_s + load.ack_flush_s)
                 + load.msgs_per_s * load.failure_share * load.lease_s)
    memory_each = (costs.tracker_base_mb + in_flight / replicas * costs.tracker_bytes_per_in_flight / 1e6
                   + math.ceil(load.partitions / replicas) * costs.tracker_bytes_per_partition / 1e6)
    spark = max(1, math.ceil(markers * spare / costs.spark_markers_per_core_s))
    notes.append(f"tracker replicas: {by_markers:.2f} by markers applied, {by_copies:.2f} by copies produced")
    notes.append(f"in flight: {load.msgs_per_s:,.0f}/s x {load.processing_s + load.ack_flush_s:g} s processing and "
                 f"END flush + {copies:,.0f} failures/s x {load.lease_s:g} s lease")
    return Plan(worker_processes=workers, markers_per_s=markers, markers_bytes_per_s=markers * costs.marker_bytes,
                markers_partitions=load.partitions, copies_per_s=copies, tracker_replicas=replicas,
                tracker_in_flight=in_flight, tracker_memory_mb_each=memory_each,
                crash_recovery_s=in_flight / (replicas * costs.tracker_copies_per_s), spark_cores=spark,
                notes=tuple(notes))


def simulate(partitions: int, messages: int, failure_share: float = 0.01, seed: int = 1) -> dict:
    """The real tracker loop on the simulated cluster at ``partitions``: its step time and the
    memory its state holds at the end of the busiest second (see the module docstring)."""
    from kmq.dev.sim.cluster import SimCluster
    from kmq.dev.sim.faults import FaultPlan
    from kmq.dev.sim.workload import ACK, HANG, NACK, Workload
    from kmq.dev.sim.world import World

    fail = max(0.0, min(0.5, failure_share))
    workload = Workload(partitions=partitions, messages=messages, workers=4, produce_over=20.0, lease=2.0,
                        tracker_crash_chance=0.0, weights=((ACK, 1.0 - fail), (NACK, fail / 2), (HANG, fail / 2)))
    cluster = SimCluster(seed, FaultPlan([]), latency=(0.0005, 0.005))
    world = World(cluster, workload, seed)
    actor = world.tracker
    steps: list[float] = []
    peak = [0]
    real_step = actor.step

    def timed_step() -> None:
        t0 = time.perf_counter()
        real_step()
        steps.append(time.perf_counter() - t0)
        if len(steps) % 50 == 0:
            peak[0] = max(peak[0], _deep_size(list(actor.states.values())))

    actor.step = timed_step  # type: ignore[method-assign]
    quiet, _ = world.run(until=workload.produce_over + 120.0, quiet_after=workload.produce_over, max_steps=10**7)
    end_bytes = _deep_size(list(actor.states.values()))
    steps.sort()
    return {"partitions": partitions, "messages": messages, "quiet": quiet, "steps": len(steps),
            "step_ms_p50": 1000 * statistics.median(steps), "step_ms_p99": 1000 * steps[int(len(steps) * 0.99) - 1],
            "step_ms_max": 1000 * steps[-1], "state_kb_peak": peak[0] / 1024, "state_kb_end": end_bytes / 1024}


_NOT_STATE = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
              functools.partial)


def _deep_size(roots: list) -> int:
    """Bytes of ``roots`` and everything they reference, but code and classes (shared, not state)."""
    seen: set[int] = set()
    todo = list(roots)
    total = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, _NOT_STATE):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


_DEFAULT = Costs()


@click.command("capacity")
@click.option("--rate", default=1_000_000.0, show_default=True, help="Messages per second to size for.")
@click.option("--partitions", default=1000, show_default=True, help="Queue partitions (markers partitions alike).")
@click.option("--failure-share", default=0.01, show_default=True, help="Share of deliveries that fail (become copies).")
@click.option("--processing", "processing_s", default=0.1, show_default=True, help="Handler seconds per message.")
@click.option("--lease", "lease_s", default=30.0, show_default=True, help="The queue's lease in seconds.")
@click.option("--worker-msgs", default=_DEFAULT.worker_msgs_per_s, show_default=True,
              help="Messages/s one worker process handles (kmq bench consumer).")
@click.option("--tracker-copies", default=_DEFAULT.tracker_copies_per_s, show_default=True,
              help="Copies/s one tracker produces (kmq bench tracker).")
@click.option("--spark-markers", default=_DEFAULT.spark_markers_per_core_s, show_default=True,
              help="Markers/s per Spark core (kmq bench spark).")
@click.option("--simulate/--no-simulate", "run_sim", default=True, show_default=True,
              help="Also run the tracker loop on the simulated cluster at 1/10 and all of --partitions.")
@click.option("--sim-messages", default=20_000, show_default=True, help="Messages in each simulated run.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def command(rate: float, partitions: int, failure_share: float, processing_s: float, lease_s: float,
            worker_msgs: float, tracker_copies: float, spark_markers: float, run_sim: bool, sim_messages: int,
            as_json: bool) -> None:
    """Size a deployment (workers, tracker replicas and memory, markers topic, Spark cores) from
    measured per-core costs, and check the tracker's step time and memory at that partition count
    on the simulated cluster."""
    costs = Costs(worker_msgs_per_s=worker_msgs, tracker_copies_per_s=tracker_copies,
                  spark_markers_per_core_s=spark_markers)
    load = Load(msgs_per_s=rate, partitions=partitions, failure_share=failure_share, processing_s=processing_s,
                lease_s=lease_s)
    result: dict = {"load": asdict(load), "costs": asdict(costs), "plan": asdict(plan(load, costs))}
    if run_sim:
        small = max(1, partitions // 10)
        result["simulated"] = [simulate(p, sim_messages, failure_share) for p in (small, partitions)]
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    p = result["plan"]
    click.echo(f"{rate:,.0f} msg/s over {partitions} partitions, {failure_share:.1%} failing, "
               f"{processing_s:g} s processing, lease {lease_s:g} s (50% headroom):")
    click.echo(f"  worker processes     {p['worker_processes']}")
    click.echo(f"  markers topic        {p['markers_partitions']} partitions, {p['markers_per_s']:,.0f} records/s, "
               f"{p['markers_bytes_per_s'] / 1e6:.1f} MB/s")
    click.echo(f"  tracker replicas     {p['tracker_replicas']} ({p['copies_per_s']:,.0f} copies/s; "
               f"{p['tracker_in_flight']:,.0f} in flight, {p['tracker_memory_mb_each']:.0f} MB each)")
    click.echo(f"  fleet crash          every worker killed at once: {p['tracker_in_flight']:,.0f} copies, "
               f"{p['crash_recovery_s']:.0f} s to produce them after their leases end")
    click.echo(f"  Spark cores          {p['spark_cores']}")
    for note in p["notes"]:
        click.echo(f"  - {note}")
    for s in result.get("simulated", []):
        click.echo(f"  simulated tracker at {s['partitions']} partitions, {s['messages']} messages: step p50 "
                   f"{s['step_ms_p50']:.2f} ms, p99 {s['step_ms_p99']:.2f} ms, max {s['step_ms_max']:.1f} ms; state "
                   f"{s['state_kb_peak']:.0f} KB at peak, {s['state_kb_end']:.0f} KB at the end; quiet: {s['quiet']}")
