"""Mutation testing of the simulator: small named defects of product code, and whether ``kmq sim`` sees them.

Each :class:`Mutant` is one small way to break the at-least-once guarantee or
a documented promise: one or more :class:`Edit` s (file, exact original
snippet, replacement). :func:`run_mutant` copies the source tree (not
``.git``, not a virtualenv) to a temporary directory, applies the edits (a
snippet not found exactly once is a :class:`MutantError`: the table cannot
rot silently when the code moves), runs ``python -m kmq sim --seeds N -q
--no-shrink --fail-fast`` there (the copy's code is imported: it is the
working directory) and, optionally, the unit tests named for the mutant, each
within a time limit. :func:`markdown` makes the table ``kmq sim --mutants``
prints. Mutants run one at a time: each is a full simulation.

::

    results = [run_mutant(m, repo_root(), seeds=300) for m in MUTANTS]
    print(markdown(results))
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from kmq.core.errors import KmqError

__all__ = ["Edit", "Mutant", "MutantError", "MutantResult", "MUTANTS", "apply", "check_table", "copy_tree", "run_all",
           "markdown", "repo_root", "run_mutant", "select"]

#: Not copied: history, environments, caches and build outputs.
_IGNORED = (".git", ".venv", "venv", "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", ".ruff_cache",
            "node_modules", "build", "dist", "*.egg-info", ".hypothesis")
_SEED_LINE = re.compile(r"^seed (\d+): \d+ violation")
_VIOLATION_LINE = re.compile(r"^violation ([\w-]+):")


class MutantError(KmqError):
    """A mutant cannot be applied (its snippet is not in the code exactly once) or the tree is not a
    source checkout; the message names the mutant, the file and the fix."""


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (found exactly once in ``path``, relative to the repository root) by ``new``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    """One named defect: what promise it breaks, its edits, and the unit tests of the touched code."""

    name: str
    breaks: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...] = ()


@dataclass
class MutantResult:
    """What caught ``mutant``. ``sim``: "caught", "missed", "timeout" or "error";
    ``tests``: the same, or None when no unit tests ran."""

    mutant: Mutant
    sim: str
    invariants: list[str] = field(default_factory=list)
    seed: int | None = None
    tests: str | None = None
    detail: str = ""
    seconds: float = 0.0

    @property
    def caught(self) -> bool:
        return self.sim == "caught" or self.tests == "caught"


def _m(name: str, breaks: str, path: str, old: str, new: str, tests: Sequence[str]) -> Mutant:
    return Mutant(name, breaks, (Edit(path, old, new),), tuple(tests))


_REDELIVER_TESTS = ("tests/unit/test_tracker_redeliver.py", "tests/unit/test_redelivery_chunks.py",
                    "tests/unit/test_redelivery_run_properties.py")
_PIPELINE_TESTS = ("tests/unit/test_fetch_pipeline.py", "tests/unit/test_fetch_pipeline_properties.py",
                   "tests/unit/test_give_back.py")
_LEASE_TESTS = ("tests/unit/test_lease_state.py",)
_TRACKER_TESTS = ("tests/unit/test_tracker_step.py", "tests/unit/test_tracker_read_through.py")

#: The table: each breaks the at-least-once guarantee or a documented promise in one small way.
MUTANTS: tuple[Mutant, ...] = (
    _m("closed-before-copy-acked", "CLOSED only once Kafka acknowledged the copy (written before the flush)",
       "kmq/core/redelivery_run.py",
       "        judged: Judged = self._answer((yield Judge(tuple(b.handle for b in pending.started), REDELIVERIES)))\n",
       "        yield from self._write_outcomes({Outcome.REDELIVERED: [\n"
       "            s.offset for b in pending.started for s in b.sends if s.step.value == \"copy\"]})\n"
       "        judged: Judged = self._answer((yield Judge(tuple(b.handle for b in pending.started), REDELIVERIES)))\n",
       _REDELIVER_TESTS),
    _m("undecided-copy-closed", "a send the producer left undecided is retried (on a new producer), not closed",
       "tracker/redeliver.py",
       "            if verdict is None:\n                results[i] = SENT",
       "            if verdict is None or verdict is client_api.UNDECIDED:\n                results[i] = SENT",
       _REDELIVER_TESTS),
    _m("failed-copy-closed", "a failed copy send is retried, not closed (settled.retry closed as redelivered)",
       "kmq/core/redelivery_run.py",
       "                    retry.extend(s.offset for s in settled.retry)",
       "                    closed[Outcome.REDELIVERED].extend(s.offset for s in settled.retry)",
       _REDELIVER_TESTS),
    _m("commit-past-unacked-start", "a commit never passes a record whose START is not acknowledged",
       "kmq/consumer/fetch_pipeline.py",
       "        while n < len(pending) and pending[n].state is STARTED:",
       "        while n < len(pending) and pending[n].state is not START_FAILED:",
       _PIPELINE_TESTS),
    _m("hand-over-before-start-acked", "hand_over: started hands a batch over only once its START is acknowledged",
       "kmq/consumer/fetch_pipeline.py",
       "                    if b.state is not STARTED:\n                        break",
       "                    if b.state is START_FAILED:\n                        break",
       _PIPELINE_TESTS),
    _m("give-back-without-seek-back", "a failed START or commit seeks back, so the records are fetched again",
       "kmq/consumer/fetch_pipeline.py",
       "        out.append(SeekBack(first, why, start_failed))",
       "        pass  # mutant: no SeekBack",
       _PIPELINE_TESTS),
    _m("renew-ignored", "a RENEW extends the lease",
       "kmq/core/lease_state.py",
       "                if s.reason is Reason.TIMEOUT:\n                    s.deadline_ms = deadline",
       "                if False:\n                    s.deadline_ms = deadline",
       _LEASE_TESTS),
    _m("end-closes-one-more", "an END closes exactly its offsets",
       "kmq/core/lease_state.py",
       "            n = self._remove(r.first, r.end)",
       "            n = self._remove(r.first, r.end + 1)",
       _LEASE_TESTS),
    _m("max-deliveries-early", "a message is dead-lettered only after max_deliveries deliveries",
       "kmq/core/lease_state.py",
       "        if count >= self.max_deliveries:",
       "        if count + 1 >= self.max_deliveries:",
       _LEASE_TESTS),
    _m("max-deliveries-late", "at most max_deliveries deliveries, then the DLQ",
       "kmq/core/lease_state.py",
       "        if count >= self.max_deliveries:",
       "        if count > self.max_deliveries:",
       _LEASE_TESTS),
    _m("nack-delay-ignored", "a NACK's delay holds the redelivery back",
       "kmq/core/lease_state.py",
       "                self._reschedule(s, ts_ms + self._hold(marker.delay_ms))",
       "                self._reschedule(s, ts_ms)",
       _LEASE_TESTS),
    _m("lease-ignored", "a START's lease is honoured before the offset is due",
       "kmq/core/lease_state.py",
       "        deadline = ts + self._hold(m.lease_ms)\n        due = deadline + self._backoff_ms(1)",
       "        deadline = ts\n        due = deadline + self._backoff_ms(1)",
       _LEASE_TESTS),
    _m("tracker-commit-past-open-start", "the tracker's markers commit stays below the oldest open START",
       "kmq/core/lease_state.py",
       "        return heap[0] if heap else self.position",
       "        return self.position",
       _LEASE_TESTS + _TRACKER_TESTS),
    Mutant("delivery-count-not-incremented", "a copy's kmq-delivery-count is one more than its original's", (
        Edit("kmq/core/copies.py",
             "    return count if reason == Reason.RELEASE.value else count + 1",
             "    return count"),
        Edit("kmq/core/copies.py",
             "    headers.append((HEADER_DELIVERY_COUNT, str(count + 1 if counted else count).encode()))",
             "    headers.append((HEADER_DELIVERY_COUNT, str(count).encode()))"),
        Edit("kmq/core/copies.py",
             "        return group_headers([(HEADER_DELIVERY_COUNT, str(count + 1 if counted else count).encode()),",
             "        return group_headers([(HEADER_DELIVERY_COUNT, str(count).encode()),")),
        ("tests/unit/test_copies.py", "tests/unit/test_redelivery_plan.py")),
    _m("key-released-early", "ordering: key holds a key until its copy comes (or the bound runs out)",
       "kmq/core/key_order.py",
       "            k.awaiting = origin if k.awaiting is None else max(k.awaiting, origin)",
       "            pass  # mutant: the key is not held for the copy",
       ("tests/unit/test_key_order.py",)),
    _m("catch-up-to-cached-high-water", "catch-up reads the markers log's end, not the consumer's cached mark",
       "tracker/catch_up.py",
       "        self.read_targets(owned, hw_reader)\n",
       "        for o in map(owned.get, self.pending):\n"
       "            if o is not None and o.positioned and o.target is None:\n"
       "                hw = consumer.highwater(o.topic, o.partition)\n"
       "                if hw is not None:\n"
       "                    o.target, o.target_ms = hw, self._now_ms()\n"
       "        self.read_targets(owned, hw_reader)\n",
       _TRACKER_TESTS),
    _m("due-end-from-cached-high-water", "due offsets wait for the markers read up to the log's end, as looked up",
       "tracker/service.py",
       "            got = self._hw_reader.log_ends({o.tp: o.state.position for o in asked})",
       "            got = type(self._hw_reader.log_ends({}))({o.tp: hw for o in asked if (hw := "
       "self._consumer.highwater(*o.tp)) is not None}, {})",
       _TRACKER_TESTS),
    _m("backoff-lost", "redeliveries wait their backoff",
       "kmq/core/backoff.py",
       "    if not attempt >= 1:  # also false for NaN\n        return 0.0",
       "    if True:  # mutant: no backoff\n        return 0.0",
       ("tests/unit/test_settlement_bounds.py",)),
    _m("unknown-marker-type-as-end", "a marker of an unknown type is skipped (or holds the partition), never an END",
       "kmq/core/markers.py",
       "        mtype = MarkerType(code)\n    except ValueError:\n        raise MarkerDecodeError",
       "        mtype = MarkerType(code) if code in _TYPES else MarkerType.END\n    except ValueError:\n"
       "        raise MarkerDecodeError",
       ("tests/unit/test_markers.py",)),
    _m("newer-version-skipped", "a marker of a newer wire version and a known type is read by its version-1 fields, "
       "never skipped", "kmq/core/markers.py",
       "    rd.pos = _HEAD.size\n    try:\n        return _decode_body(rd, code, version, newer=True)",
       "    raise MarkerDecodeError(f\"unknown marker version {version}\")  # skipped like a bad record\n"
       "    rd.pos = _HEAD.size\n    try:\n        return _decode_body(rd, code, version, newer=True)",
       ("tests/unit/test_markers.py",)),
    _m("past-log-end-closed-missing", "offsets at or past the end a read ran into are held back, never closed missing",
       "kmq/core/redelivery_plan.py",
       "        gone.remove(log_end, _MAX_OFFSET - log_end)",
       "        gone.add(log_end, _MAX_OFFSET - log_end)",
       ("tests/unit/test_redelivery_plan.py",)),
    _m("log-reader-read-committed", "the tracker's log reader sees every record a worker could be handed (reads "
       "uncommitted), also those of an open or aborted transaction",
       "kmq/client/api.py",
       "LOG_READER_ISOLATION = READ_UNCOMMITTED",
       "LOG_READER_ISOLATION = READ_COMMITTED",
       ("tests/unit/test_sim_transactions.py",)),
    _m("lease-on-writer-clock", "leases are judged on the tracker's clock, not on the writer's record timestamps",
       "kmq/core/marker_clock.py",
       "        return ts_ms if floor_ms <= ts_ms <= read_ms else read_ms\n"
       "    return min(ts_ms + SKEW_ALLOWANCE_MS, read_ms)",
       "        return ts_ms  # mutant: the writer's clock\n    return ts_ms",
       ("tests/unit/test_marker_clock.py", "tests/unit/test_tracker_clock_skew.py")),
    _m("clock-jump-ignored", "a tracker whose own clock jumps re-reads every partition before judging a lease",
       "kmq/core/marker_clock.py",
       "        return moved if abs(moved) > self.bound_ms else 0",
       "        return 0  # mutant: no jump is ever seen",
       ("tests/unit/test_marker_clock.py", "tests/unit/test_tracker_clock_skew.py")),
    _m("fatal-producer-kept", "a producer in a fatal state is replaced (it sends nothing more)",
       "tracker/redeliver.py",
       "        ``reason``: the label of ``kmq_tracker_producer_replacements_total``.\"\"\"\n",
       "        ``reason``: the label of ``kmq_tracker_producer_replacements_total``.\"\"\"\n"
       "        if reason == \"fatal\":\n            return  # mutant: the fatal producer is kept\n",
       _REDELIVER_TESTS),
    Mutant("close-strands-take", "a close during a take for iteration gives back what the take brought "
           "(nothing stranded: never handed out, never given back)", (
        Edit("kmq/consumer/take_ahead.py",
             "            if msgs and self._closed is not None:  # the close came meanwhile: none of them goes out\n"
             "                self.keep(msgs, leased_at, gen)\n"
             "                return None\n",
             ""),
        Edit("kmq/consumer/take_ahead.py",
             "            if closed is None:\n                self._held.append(",
             "            if True:  # mutant: kept whatever the close did\n                self._held.append(")),
        ("tests/unit/test_take_ahead.py",)),
    _m("reject-as-nack", "a rejected message is dead-lettered at once",
       "kmq/core/lease_state.py",
       "                s.reason, s.error = Reason.REJECT, marker.reason",
       "                s.reason, s.error = Reason.NACK, marker.reason",
       _LEASE_TESTS),
)


def repo_root(start: Path | None = None) -> Path:
    """The source checkout kmq runs from (the directory with ``pyproject.toml``, ``kmq/`` and ``tracker/``)."""
    here = (start or Path(__file__)).resolve()
    for d in [here, *here.parents]:
        if (d / "pyproject.toml").is_file() and (d / "kmq").is_dir() and (d / "tracker").is_dir():
            return d
    raise MutantError(f"no kmq source checkout above {here}: mutation testing edits the source, so run it from a "
                      f"git clone of kmq (pip install -e .), not from an installed wheel")


def select(names: Iterable[str], table: Sequence[Mutant] = MUTANTS) -> list[Mutant]:
    """The mutants named (all of ``table`` when none are); an unknown name is a :class:`MutantError`."""
    wanted = list(names)
    if not wanted:
        return list(table)
    by_name = {m.name: m for m in table}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise MutantError(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    return [by_name[n] for n in wanted]


def _edited(mutant: Mutant, root: Path) -> dict[Path, str]:
    """The mutated text of each file the mutant touches (edits applied in order)."""
    texts: dict[Path, str] = {}
    for e in mutant.edits:
        path = root / e.path
        if path not in texts:
            if not path.is_file():
                raise MutantError(f"mutant {mutant.name}: {e.path} does not exist; update its entry in "
                                  f"kmq/dev/mutants.py")
            texts[path] = path.read_text(encoding="utf-8")
        n = texts[path].count(e.old)
        if n != 1:
            raise MutantError(f"mutant {mutant.name}: its snippet is found {n} times in {e.path} (must be exactly "
                              f"once); the code moved: update its entry in kmq/dev/mutants.py. Snippet:\n{e.old}")
        texts[path] = texts[path].replace(e.old, e.new)
    return texts


def check_table(root: Path, table: Sequence[Mutant] = MUTANTS) -> None:
    """Raise :class:`MutantError` unless every mutant of ``table`` applies to the tree at ``root``."""
    for m in table:
        _edited(m, root)


def apply(mutant: Mutant, root: Path) -> None:
    """Apply ``mutant``'s edits to the tree at ``root`` (a copy!); nothing is written unless all apply."""
    for path, text in _edited(mutant, root).items():
        path.write_text(text, encoding="utf-8")


def copy_tree(root: Path, dest: Path) -> Path:
    """Copy the source tree at ``root`` to ``dest`` (made), without ``.git``, environments and caches."""
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns(*_IGNORED), symlinks=True)
    return dest


def _run(cmd: list[str], cwd: Path, timeout: float) -> tuple[int | None, str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)  # the copy (the working directory) must be what is imported
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return None, out
    return done.returncode, done.stdout + done.stderr


def _verdict_of_sim(code: int | None, out: str) -> tuple[str, list[str], int | None, str]:
    seeds = [int(m.group(1)) for line in out.splitlines() if (m := _SEED_LINE.match(line))]
    names = list(dict.fromkeys(m.group(1) for line in out.splitlines() if (m := _VIOLATION_LINE.match(line))))
    if code is None:
        return "timeout", names, seeds[0] if seeds else None, "time limit"
    if code == 0:
        return "missed", [], None, ""
    if code == 1 and seeds:
        return "caught", names, seeds[0], ""
    return "error", names, None, _tail(out)


def _tail(out: str, lines: int = 6) -> str:
    return " / ".join(line.strip() for line in out.strip().splitlines()[-lines:])


def run_mutant(mutant: Mutant, root: Path, seeds: int, *, start: int = 0, sim_args: Sequence[str] = (),
               tests: bool = True, timeout: float = 300.0, python: str = sys.executable) -> MutantResult:
    """Run ``kmq sim`` (and, with ``tests``, the mutant's unit tests) on a copy of ``root`` with
    ``mutant`` applied; ``timeout``: seconds for each of the two runs."""
    began = time.perf_counter()
    _edited(mutant, root)  # fails before anything is copied
    with tempfile.TemporaryDirectory(prefix=f"kmq-mutant-{mutant.name}-") as tmp:
        tree = copy_tree(root, Path(tmp) / "src")
        apply(mutant, tree)
        code, out = _run([python, "-m", "kmq", "sim", "--seeds", str(seeds), "--start", str(start), "-q",
                          "--no-shrink", "--fail-fast", *sim_args], tree, timeout)
        sim, names, seed, detail = _verdict_of_sim(code, out)
        verdict = None
        if tests and mutant.tests:
            tcode, tout = _run([python, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider",
                                *mutant.tests], tree, timeout)
            verdict = {None: "timeout", 0: "missed", 1: "caught"}.get(tcode, "error")
            if verdict == "error":
                detail = (detail + " " if detail else "") + f"tests: {_tail(tout)}"
    return MutantResult(mutant, sim, names, seed, verdict, detail, time.perf_counter() - began)


def run_all(mutants: Sequence[Mutant], root: Path, seeds: int, *, on_result: Callable[[MutantResult], None]
            | None = None, **kwargs) -> list[MutantResult]:
    """:func:`run_mutant` for each of ``mutants``, one at a time (each is a full simulation)."""
    out = []
    for m in mutants:
        r = run_mutant(m, root, seeds, **kwargs)
        out.append(r)
        if on_result is not None:
            on_result(r)
    return out


def markdown(results: Sequence[MutantResult], seeds: int | None = None) -> str:
    """The results as a markdown table (one row per mutant) and a count line."""
    rows = ["| mutant | breaks | sim | unit tests |", "| --- | --- | --- | --- |"]
    for r in results:
        if r.sim == "caught":
            sim = f"caught: {', '.join(f'`{n}`' for n in r.invariants)} (seed {r.seed})"
        else:
            sim = r.sim + (f" ({r.detail})" if r.detail and r.sim in ("error", "timeout") else "")
        rows.append(f"| `{r.mutant.name}` | {r.mutant.breaks} | {sim} | {r.tests or 'not run'} |")
    by_sim = sum(r.sim == "caught" for r in results)
    either = sum(r.caught for r in results)
    seeds_text = f" over {seeds} seeds" if seeds is not None else ""
    rows.append("")
    rows.append(f"{by_sim}/{len(results)} caught by the simulator{seeds_text}; {either}/{len(results)} by the "
                f"simulator or the unit tests.")
    return "\n".join(rows)
