"""The mutation harness (kmq/dev/mutants.py): its table applies to today's code, a snippet that does
not match is an error, and a mutant the simulator cannot miss is reported caught."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kmq.dev.mutants import (
    MUTANTS, Edit, Mutant, MutantError, apply, check_table, copy_tree, markdown, repo_root, run_mutant, select,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_mutant_applies_to_the_code_as_it_is():
    assert repo_root() == ROOT
    check_table(ROOT)
    assert len({m.name for m in MUTANTS}) == len(MUTANTS) >= 20


def test_a_snippet_not_found_exactly_once_is_an_error(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\nx = 1\ny = 2\n")
    absent = Mutant("absent", "nothing", (Edit("a.py", "z = 3", "z = 4"),))
    twice = Mutant("twice", "nothing", (Edit("a.py", "x = 1", "x = 2"),))
    no_file = Mutant("no-file", "nothing", (Edit("b.py", "x", "y"),))
    with pytest.raises(MutantError, match=r"absent: its snippet is found 0 times in a.py"):
        apply(absent, tmp_path)
    with pytest.raises(MutantError, match=r"twice: its snippet is found 2 times"):
        apply(twice, tmp_path)
    with pytest.raises(MutantError, match=r"no-file: b.py does not exist"):
        apply(no_file, tmp_path)
    with pytest.raises(MutantError, match="unknown mutant"):
        select(["no-such-mutant"])
    # Nothing is written unless every edit applies.
    half = Mutant("half", "nothing", (Edit("a.py", "y = 2", "y = 3"), Edit("a.py", "z = 3", "z = 4")))
    with pytest.raises(MutantError):
        apply(half, tmp_path)
    assert (tmp_path / "a.py").read_text() == "x = 1\nx = 1\ny = 2\n"


def test_the_copy_leaves_out_history_and_environments(tmp_path):
    copied = copy_tree(ROOT, tmp_path / "src")
    assert (copied / "kmq" / "dev" / "mutants.py").is_file()
    assert not (copied / ".git").exists() and not (copied / ".venv").exists()


def test_a_mutant_that_loses_every_message_is_caught_by_the_sim_and_a_harmless_one_is_not():
    # The invariant itself mutated: every message counts as lost, whatever the code does.
    blind = Mutant("everything-lost", "nothing is lost", (Edit(
        "kmq/dev/sim/invariants.py", "        if mid not in s.ended and mid not in s.dead:",
        "        if True:"),), ("tests/unit/test_sim_clock.py",))
    r = run_mutant(blind, ROOT, seeds=2, start=0, timeout=120, python=sys.executable)
    assert (r.sim, r.invariants, r.seed, r.tests) == ("caught", ["lost"], 0, "missed"), r
    harmless = Mutant("a-comment", "nothing", (Edit(
        "kmq/core/backoff.py", "    if not attempt >= 1:  # also false for NaN",
        "    if not attempt >= 1:  # a comment changed"),))
    r2 = run_mutant(harmless, ROOT, seeds=1, start=0, timeout=120, tests=False)
    assert (r2.sim, r2.tests) == ("missed", None), r2
    table = markdown([r, r2], seeds=2)
    assert "| `everything-lost` | nothing is lost | caught: `lost` (seed 0) | missed |" in table
    assert "1/2 caught by the simulator over 2 seeds" in table


# What the simulator's newer checks and faults catch, each at the first seed that shows it (the
# seeds follow the simulator's histories: after a change to them, `kmq sim --mutants --mutant NAME
# --seeds 300` finds the new first seed). Before these checks and faults, each of these mutants
# went unseen over seeds 0..299 (docs/architecture.md, "Mutation testing").
@pytest.mark.parametrize("name, seed, invariant", [
    ("commit-past-unacked-start", 11, "commit-before-start-acked"),
    ("hand-over-before-start-acked", 1, "hand-over-before-start-acked"),
    ("backoff-lost", 0, "backoff-early"),
    ("nack-delay-ignored", 0, "backoff-early"),
    ("renew-ignored", 14, "copied-while-leased"),
    ("reject-as-nack", 0, "copied-while-leased"),
    ("max-deliveries-late", 3, "over-max-deliveries"),
    ("unknown-marker-type-as-end", 5, "lost"),  # the foreign marker fault
    ("undecided-copy-closed", 12, "lost"),  # the hung send fault
    ("past-log-end-closed-missing", 4, "lost"),  # the lagging read fault
    ("log-reader-read-committed", 8, "lost"),  # the open transaction fault
    ("due-end-from-cached-high-water", 96, "copied-while-leased"),  # the leader change fault
    ("lease-on-writer-clock", 1, "backoff-early"),  # the clock skew fault
    ("clock-jump-ignored", 1, "backoff-early"),
    ("fatal-producer-kept", 1, "lost"),  # the producer fatal fault
    ("close-strands-take", 4, "stranded-by-close"),  # the close-during-take fault
    ("newer-version-skipped", 5, "lost"),  # the newer-markers fault
])
def test_the_newer_checks_and_faults_catch_their_mutant(name, seed, invariant):
    r = run_mutant(select([name])[0], ROOT, seeds=1, start=seed, tests=False, timeout=120)
    assert r.sim == "caught" and invariant in r.invariants, r
