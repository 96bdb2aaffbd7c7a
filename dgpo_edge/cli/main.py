"""`dgpo-edge`: the root Typer app. Each sub-app lives in its own module."""

from __future__ import annotations

import typer

from .. import __version__
from . import data, index

app = typer.Typer(
    name="dgpo-edge",
    help="Teach a compact model to search like an agent, then run it offline.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(data.app, name="data")
app.add_typer(index.app, name="index")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dgpo-edge {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Teach a compact model to search like an agent, then run it offline."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
