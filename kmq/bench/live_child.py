"""A benchmark child process fed by a live producer: the one loop the latency benches share."""

from __future__ import annotations

import json
import subprocess
import threading

import click

__all__ = ["result_of_fed_child"]


def result_of_fed_child(proc: subprocess.Popen, producer: threading.Thread, stop: threading.Event, what: str) -> dict:
    """Start ``producer`` once ``proc`` prints READY (its group is joined: records sent from then on
    meet no backlog) and return the JSON of its ``RESULT`` line; ``stop`` ends the producer. The child
    is killed if it is still there at the end; no RESULT is one clear error naming ``what``."""
    res = None
    err = ""
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("READY"):
                producer.start()
            elif line.startswith("RESULT "):
                res = json.loads(line[7:])
        err = proc.stderr.read()  # type: ignore[union-attr]
        proc.wait(30)
    finally:
        stop.set()
        if producer.is_alive():
            producer.join(15)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    if res is None:
        raise click.ClickException(f"{what} failed (exit {proc.returncode}): {err.strip()[-2000:]}")
    return res
