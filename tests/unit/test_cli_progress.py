"""kmq.cli.common.ProgressLine: rewritten in place with \\r on a terminal, plain lines elsewhere."""

from __future__ import annotations

import io
import sys

import pytest

from kmq.cli.common import ProgressLine


class _Stderr(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize("tty, shown", [
    (True, "\rscanning 1/3\rscanning 3/3\n"),  # 2/3 came 0.1 s after 1/3: skipped
    (False, "scanning 1/3\nscanning 3/3\n"),
])
def test_progress_is_rewritten_on_a_terminal_and_plain_lines_elsewhere(monkeypatch, tty, shown):
    err = _Stderr(tty)
    monkeypatch.setattr(sys, "stderr", err)
    now = iter([0.0, 0.1, 0.15])
    line = ProgressLine(clock=lambda: next(now))
    line.show("scanning 1/3")
    line.show("scanning 2/3")
    line.show("scanning 3/3", final=True)
    line.close()
    assert err.getvalue() == shown


def test_plain_lines_come_at_most_once_a_second(monkeypatch):
    err = _Stderr(False)
    monkeypatch.setattr(sys, "stderr", err)
    now = iter([0.0, 0.5, 1.2, 1.3])
    line = ProgressLine(clock=lambda: next(now))
    for i in range(4):
        line.show(f"n={i}")
    assert err.getvalue() == "n=0\nn=2\n"
