"""kmq.core.due_round over random rounds: partitions caught up or not, with or without due items,
redeliveries taking time, the service stopping, the membership in doubt. No I/O: each action is
answered by the test.

In every round:

* the read-through times of all due partitions are moved on before anything is handed out;
* partitions are handed out least recently served first, only caught up ones, at most ``limit``
  items each, up to their horizon at the time; never once the budget is spent or the service
  stops; one handed items counts as served then;
* every due partition is touched once, served or not (still due: first next step), unless the
  membership came into doubt, which ends the round at once (the service drops its view);
* the look-ups that got no answer, and the catch-up targets, are asked again last, unless the
  service stops or the view was dropped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.core import due_round
from kmq.core.due_round import CLOCK, MONO, RETRY_TARGETS, STOPPING, serve_due

BUDGET_S = 1.0
LIMIT = 4


@dataclass
class State:
    """The lease state's side: how many items are due up to a horizon."""

    due_items: int
    asked: list = field(default_factory=list)

    def due(self, horizon: int, limit: int) -> list:
        self.asked.append((horizon, limit))
        return list(range(min(self.due_items, limit)))


@dataclass(eq=False)
class Part:
    name: int
    state: State
    caught_up: bool
    served: float
    read_through_ms: int

    def horizon(self, now_ms: int) -> int:
        return min(now_ms, self.read_through_ms)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 8), data=st.data())
def test_a_round_serves_least_recently_served_first_within_its_budget_and_touches_every_partition(n, data):
    parts = [Part(i, State(data.draw(st.integers(0, 6), label="due items")), data.draw(st.booleans(), label="caught up"),
                  data.draw(st.floats(0, 100), label="served"), data.draw(st.integers(0, 10_000), label="read through"))
             for i in range(n)]
    before = {p.name: p.served for p in parts}
    order = sorted(parts, key=lambda p: before[p.name])
    began = 200.0
    mono, now = began, 10_000
    stop_at = data.draw(st.none() | st.integers(0, n + 1), label="stops at check")
    touched: list = []
    handed: list = []
    looked_up: list = []
    stops, stopped, retried, doubted = 0, False, False, False
    steps = serve_due(parts, began, BUDGET_S, LIMIT, touched.append)
    first = next(steps)
    assert isinstance(first, due_round.LookUpEnds) and not first.failing and first.partitions == order, \
        "the read-through times not moved on first"
    answer: object = []
    while True:
        try:
            action = steps.send(answer)
        except StopIteration:
            break
        assert not doubted, "the round went on after the membership came into doubt"
        answer = None
        if action is STOPPING:
            answer = stop_at is not None and stops >= stop_at
            stopped = stopped or answer
            stops += 1
        elif action is MONO:
            answer = mono
        elif action is CLOCK:
            now += data.draw(st.integers(0, 50), label="time passes")
            answer = now
        elif isinstance(action, due_round.LookUpEnds):
            assert action.partitions == order
            if action.failing:
                assert not stopped and not retried
                answer = data.draw(st.lists(st.sampled_from(parts), unique=True) if parts else st.just([]),
                                   label="asked")
                looked_up.extend(answer)
            else:
                assert not handed and not touched, "something handed out before the read-through times moved"
                answer = []
        elif isinstance(action, due_round.Redeliver):
            p = action.partition
            assert p.caught_up and 0 < len(action.items) <= LIMIT
            assert p.state.asked[-1] == (min(now, p.read_through_ms), LIMIT), "items beyond its horizon now"
            assert mono - began < BUDGET_S and not stopped, "a partition started after the budget was spent"
            handed.append(p)
            mono += data.draw(st.sampled_from([0.0, 0.2, 0.6, 1.5]), label="redelivery takes")
            answer = copies = data.draw(st.integers(0, 10), label="copies")
        elif isinstance(action, due_round.Doubted):
            assert action.partition is handed[-1] and action.copies == copies
            doubted = answer = data.draw(st.integers(0, 4), label="doubt") == 0
        else:
            assert action is RETRY_TARGETS and not stopped
            retried = True
    assert handed == [p for p in order if p in handed], "not least recently served first"
    for p in parts:
        assert (p.served != before[p.name]) == (p in handed), "served moved without items, or not with them"
        assert p.caught_up or not p.state.asked, "items of a partition not caught up"
    if doubted:
        assert not retried and not looked_up
        return
    assert Counter(touched) == Counter(parts) + Counter(looked_up), "a due partition left untouched, or touched twice"
    assert retried == (not stopped)
