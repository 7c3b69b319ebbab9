"""The ``kmq`` command line (click). Commands are thin: parse, call, print.

Subcommands load lazily so ``kmq --help`` never imports pyspark or the
tracker. Exit codes: 0 ok, 1 runtime failure (one clear line on stderr),
2 usage error, 3 an HTTP port that cannot be bound (taken; one clear line).
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from kmq import __version__
from kmq.core.errors import CannotListen, KmqError

__all__ = ["cli", "main", "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_CANNOT_LISTEN", "exit_code"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CANNOT_LISTEN = 0, 1, 2, 3


def exit_code(exc: KmqError) -> int:
    """The exit code of an expected failure: 3 for a port that cannot be bound (a supervisor may pick
    another), 1 for the rest."""
    return EXIT_CANNOT_LISTEN if isinstance(exc, CannotListen) else EXIT_FAILURE

# name -> "module:attribute"; a module that is not there (yet) hides its command.
COMMANDS = {
    "topics": "kmq.cli.topics:topics",
    "dev": "kmq.cli.dev:dev",
    "produce": "kmq.cli.work:produce",
    "work": "kmq.cli.work:work",
    "tracker": "kmq.cli.tracker:tracker",
    "status": "kmq.cli.status:status",
    "dlq": "kmq.cli.dlq:dlq",
    "lag-job": "kmq.cli.lagjob:lag_job",
    "demo": "kmq.cli.demo:demo",
    "bench": "kmq.cli.bench:bench",
    "trace": "kmq.cli.trace:trace",
    "ui": "kmq.cli.ui:ui",
    "sim": "kmq.cli.sim:sim",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if self._spec_exists(name))

    @staticmethod
    def _spec_exists(name: str) -> bool:
        module = COMMANDS[name].split(":")[0]
        return importlib.util.find_spec(module) is not None

    def invoke(self, ctx: click.Context):
        # Expected failures become one line and exit 1, also under CliRunner.
        try:
            return super().invoke(ctx)
        except KmqError as exc:
            err = click.ClickException(str(exc))
            err.exit_code = exit_code(exc)  # type: ignore[misc]  # click's stubs say ClassVar; click reads the instance's
            raise err from exc

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not self._spec_exists(name):
            return None
        module, attr = COMMANDS[name].split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kmq")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """kmq: individual acks, timeout redelivery, lease renewal and dead letters on any Kafka."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    before = set(logging.getLogger().handlers)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in set(logging.getLogger().handlers) - before:
        # Commands that load kmq.yaml replace this default with `logging:` (kmq.telemetry.logs).
        handler._kmq_default = True  # type: ignore[attr-defined]
    # kafka-python logs every refused connection at ERROR, over and over; by default our own
    # one-line error says what failed (kmq.client.diagnose). -v shows the client's warnings and errors
    # (the TLS or SASL detail behind a failure), -vv everything.
    logging.getLogger("kafka").setLevel(logging.CRITICAL if verbose == 0 else logging.WARNING if verbose == 1 else logging.DEBUG)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: expected failures become one line and exit 1."""
    try:
        cli.main(args=argv, prog_name="kmq", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KmqError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exit_code(exc))
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(EXIT_OK)
