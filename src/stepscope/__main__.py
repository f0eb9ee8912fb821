"""``python -m stepscope`` runs the CLI."""

from .cli import main

main()
