"""Shared CLI plumbing: one clear line and exit status 2 for bad input."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import InputError
from ..protocol import MAX_SEARCHES, MAX_TOP_K

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


# One spelling and one meaning per option, on every command that has it.
TOP_K_HELP = "Passages per search"
MAX_SEARCHES_HELP = "Searches before the final, search-free answer turn (Search-R1's max_turns)"
GPU_LAYERS_HELP = ("Model layers llama.cpp offloads to the GPU of a Metal or CUDA build (0 none, -1 all; "
                   "default: the bundle's, else 0).")


def old_max_turns_option(**limits: Any) -> Any:
    """`--max-turns`, the old spelling of `--max-searches`: still read, hidden from --help.

    It named `ProtocolConfig.max_searches`, yet an episode has one more turn than that."""
    return typer.Option(None, "--max-turns", hidden=True, help="Deprecated: --max-searches.", **limits)


def max_searches_of(max_searches: int | None, old_max_turns: int | None) -> int | None:
    """`--max-searches`, or the old `--max-turns` when that was given (as `index serve --topk`)."""
    return max_searches if old_max_turns is None else old_max_turns


def top_k_option() -> Any:
    """The agent's `--top-k` (ask, chat, eval, serve); `check_search_options` checks it."""
    return typer.Option(None, "--top-k", "-k", help=f"{TOP_K_HELP}, 1 to {MAX_TOP_K} (default: the bundle's, "
                                                    "else 3).")


def max_searches_option() -> Any:
    """The agent's `--max-searches` (ask, chat, eval, serve); `check_search_options` checks it."""
    return typer.Option(None, "--max-searches", help=f"{MAX_SEARCHES_HELP}, 0 to {MAX_SEARCHES} (default: the "
                                                     "bundle's, else 4).")


def check_search_options(top_k: int | None, max_searches: int | None) -> None:
    """The agent's --top-k and --max-searches (ask, chat, eval, serve), named as the user typed them,
    in the ranges the chat's settings screen also keeps (protocol.MAX_TOP_K, protocol.MAX_SEARCHES)."""
    if top_k is not None and not 1 <= top_k <= MAX_TOP_K:
        raise InputError(f"--top-k must be in 1..{MAX_TOP_K}, got {top_k}")
    if max_searches is not None and not 0 <= max_searches <= MAX_SEARCHES:
        raise InputError(f"--max-searches must be in 0..{MAX_SEARCHES}, got {max_searches}")


# What each extra's install line is; train needs torch first (its build depends on the machine).
EXTRA_INSTALL = {"train": "pip install torch && pip install 'dgpo-edge[train]'"}


def needs_extra(extra: str, *modules: str) -> Callable[[F], F]:
    """A command whose dependencies come with `extra`: a missing one is `error:` + the install line.

    `modules` are looked up (not imported) before the command runs, so a laptop install hears
    about the extra before any input is read; a module missing deeper down (ModuleNotFoundError)
    is reported the same way. A missing dgpo_edge module is a packaging bug and keeps its traceback."""
    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            missing = [m for m in modules if not _importable(m)]
            if missing:
                _missing_extra(extra, missing[0])
            try:
                return fn(*args, **kwargs)
            except ModuleNotFoundError as e:
                top = (e.name or "").split(".")[0]
                if not top or top == "dgpo_edge":
                    raise
                _missing_extra(extra, top)

        return wrapper  # type: ignore[return-value]

    return decorate


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _missing_extra(extra: str, module: str) -> None:
    install = EXTRA_INSTALL.get(extra, f"pip install 'dgpo-edge[{extra}]'")
    err_console.print(f"[bold red]error:[/] this command needs the {extra} extra ({escape(module)} is not "
                      f"installed): {escape(install)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)
