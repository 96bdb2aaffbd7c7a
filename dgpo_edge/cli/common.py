"""Shared CLI plumbing: one clear line and exit status 2 for bad input."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import InputError

F = TypeVar("F", bound=Callable)

# emoji=False: rich would turn ":x:" in printed passage text into an emoji ("root:x:0:0" -> "root❌0:0").
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)


def user_errors(fn: F) -> F:
    """Turn InputError (and a missing optional dependency) into `error: ...` and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as e:
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]
