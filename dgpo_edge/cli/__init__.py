"""The `dgpo-edge` command line: one Typer sub-app per module."""
