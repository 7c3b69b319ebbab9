"""``python -m kmq`` runs the CLI."""

from kmq.cli import main

main()
