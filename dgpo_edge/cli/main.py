"""`dgpo-edge`: the root Typer app. Each sub-app lives in its own module."""

from __future__ import annotations

import typer

from .. import __version__
from . import ask, bundle, chat, data, examples, export, index, model, plot, serve, train
from . import eval as eval_cli
from .common import OneLineUsageErrors

app = typer.Typer(
    name="dgpo-edge",
    help="Teach a compact model to search like an agent, then run it offline.",
    no_args_is_help=True,
    cls=OneLineUsageErrors,   # a usage error is one `error:` line and exit status 2
    add_completion=True,   # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},   # sub-commands inherit it
)
app.add_typer(data.app, name="data")
app.add_typer(index.app, name="index")
app.add_typer(train.app, name="train")
app.add_typer(export.app, name="export")
app.add_typer(model.app, name="model")
app.command("chat")(chat.chat)
app.command("ask")(ask.ask)
app.command("eval")(eval_cli.eval_command)
app.command("plot")(plot.plot)
app.command("serve")(serve.serve)
app.add_typer(bundle.app, name="bundle")
examples.attach(app)   # a usage example at the end of each command's --help


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
