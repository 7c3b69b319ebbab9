"""Deterministic partition assignors of the simulated group coordinator.

Two, after kmq's ``consumer.assignor``: ``RANGE`` (eager: every member gives
up everything at each rebalance; Kafka's range assignor) and
``COOPERATIVE-STICKY`` (incremental: partitions stay with their owner where
the balance allows, only the surplus moves). Both are pure functions of the
members (in member-id order) and the partitions, so the same group history
gives the same assignment.
"""

from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["RANGE", "COOPERATIVE_STICKY", "ASSIGNORS", "range_assign", "sticky_assign", "TP"]

RANGE = "RANGE"
COOPERATIVE_STICKY = "COOPERATIVE-STICKY"
ASSIGNORS = (RANGE, COOPERATIVE_STICKY)

TP = tuple[str, int]


def _partitions(members: Sequence[tuple[str, frozenset[str]]], counts: Mapping[str, int]) -> list[TP]:
    topics = sorted({t for _, ts in members for t in ts if t in counts})
    return [(t, p) for t in topics for p in range(counts[t])]


def range_assign(members: Sequence[tuple[str, frozenset[str]]], counts: Mapping[str, int]) -> dict[str, frozenset[TP]]:
    """Per topic, consecutive ranges of partitions to the subscribed members in member-id order
    (the first ``partitions % members`` get one more)."""
    out: dict[str, set[TP]] = {m: set() for m, _ in members}
    for topic in sorted({t for _, ts in members for t in ts if t in counts}):
        subs = sorted(m for m, ts in members if topic in ts)
        per, extra = divmod(counts[topic], len(subs))
        start = 0
        for i, m in enumerate(subs):
            n = per + (1 if i < extra else 0)
            out[m].update((topic, p) for p in range(start, start + n))
            start += n
    return {m: frozenset(ps) for m, ps in out.items()}


def sticky_assign(members: Sequence[tuple[str, frozenset[str], frozenset[TP]]],
                  counts: Mapping[str, int]) -> dict[str, frozenset[TP]]:
    """Balanced (member counts differ by at most one where subscriptions allow), keeping each
    partition with its current owner unless that owner has more than its share; the surplus
    (highest partitions first) and the unowned partitions go to the members with the fewest."""
    order = sorted(m for m, _, _ in members)
    topics = {m: ts for m, ts, _ in members}
    parts = _partitions([(m, ts) for m, ts, _ in members], counts)
    if not order:
        return {}
    kept: dict[str, list[TP]] = {}
    claimed: set[TP] = set()
    valid = set(parts)
    for m in order:
        owned = next(o for mid, _, o in members if mid == m)
        mine = sorted(tp for tp in owned if tp in valid and tp[0] in topics[m] and tp not in claimed)
        kept[m] = mine
        claimed.update(mine)
    base, extra = divmod(len(parts), len(order))
    # Members that hold more keep the "one more" slots: fewer partitions move.
    by_holding = sorted(order, key=lambda m: (-len(kept[m]), m))
    cap = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_holding)}
    for m in order:
        if len(kept[m]) > cap[m]:
            for tp in kept[m][cap[m]:]:
                claimed.discard(tp)
            kept[m] = kept[m][:cap[m]]
    for tp in parts:
        if tp in claimed:
            continue
        eligible = [m for m in order if tp[0] in topics[m]]
        under = [m for m in eligible if len(kept[m]) < cap[m]] or eligible
        chosen = min(under, key=lambda m: (len(kept[m]), m))
        kept[chosen].append(tp)
        claimed.add(tp)
    return {m: frozenset(ps) for m, ps in kept.items()}
