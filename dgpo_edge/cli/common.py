"""Shared CLI plumbing: one clear line and exit status 2 for bad input."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import PurePath
from typing import Any, NoReturn, TypeVar, get_args, get_origin

import typer
from rich.console import Console
from typer.core import TyperGroup
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..errors import REFUSED_BY_SYSTEM, InputError
from ..progress import is_terminal
from ..protocol import MAX_SEARCHES, MAX_TOP_K
from ..termtext import not_utf8, printable

F = TypeVar("F", bound=Callable)

# emoji=False: rich would turn ":x:" in printed passage text into an emoji ("root:x:0:0" -> "root❌0:0").
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)


@contextlib.contextmanager
def working(message: str) -> Iterator[None]:
    """A spinner on a terminal. Elsewhere (a log, a pipe) the message as one line once the step has
    run for a moment (DGPO_EDGE_PROGRESS_AFTER seconds, 2 by default: checks of the input end well
    within it, so bad input still gets its one error line alone), so that the log of a minutes-long
    export or merge says what it is doing."""
    if is_terminal(err_console.file):
        with err_console.status(message):
            yield
        return
    text = os.environ.get("DGPO_EDGE_PROGRESS_AFTER", "2")
    try:
        after = float(text)
    except ValueError:
        raise InputError(f"DGPO_EDGE_PROGRESS_AFTER must be seconds (or inf), got {text!r}") from None
    if not math.isfinite(after):   # "inf": never (a timer cannot wait that long)
        yield
        return
    timer = threading.Timer(after, lambda: err_console.print(f"{escape(message)} ...", highlight=False,
                                                             soft_wrap=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def check_utf8(text: str, what: str) -> None:
    """Refuse argv bytes that were not UTF-8 (the engine would fail on them only after the model loaded)."""
    if bad := not_utf8(text, argv=True):
        raise InputError(f"{what} is not valid UTF-8 text ({bad})")


class PlainTable(Table):
    """A Rich table whose title and cells are plain text. Manifests (an index's, a bundle's) can come
    from someone else: their strings are never read as markup ("[bold]", or "[/]", an error) and
    lose their terminal escapes."""

    def __init__(self, title: str, **kwargs: Any):
        super().__init__(title=plain(title), **kwargs)

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        super().add_row(*(plain(c) for c in cells), **kwargs)


def plain(text: Any) -> Text:
    return Text(printable(str(text)))


def fail(message: str, status: int = 2) -> NoReturn:
    """Print `error: MESSAGE` as one line on stderr and exit with `status`. The message may name a
    file whose name holds terminal escapes (a note in a downloaded folder): they are removed."""
    err_console.print(f"[bold red]error:[/] {escape(printable(message))}", highlight=False, soft_wrap=True)
    raise typer.Exit(status) from None


def user_errors(fn: F) -> F:
    """Turn InputError (and a missing optional dependency) into `error: ...` and exit 2, and so an
    OSError the system causes (REFUSED_BY_SYSTEM: `--out` on a read-only disk, a full disk)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as e:
            fail(str(e))
        except OSError as e:
            if e.errno not in REFUSED_BY_SYSTEM:
                raise   # anything else is a bug, and keeps its traceback
            fail(f"{e.filename}: {e.strerror}" if e.filename else str(e.strerror))
        except sqlite3.OperationalError as e:   # a store or an index's BM25 written to a full disk
            if getattr(e, "sqlite_errorname", "") != "SQLITE_FULL":
                raise
            fail(f"{e} (SQLite); free some space and run the command again")

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def stopped_by_ctrl_c(holds: Callable[[], str]) -> Iterator[None]:
    """Ctrl-C in a `train` command: one line saying what is saved and how to go on, and exit status
    130 (a shell's for SIGINT), not click's "Aborted!" and 1. In its loop the stage has kept its last
    whole step and says so (TrainingInterrupted, train/plumbing.py Interrupts); elsewhere (loading, or
    several processes, where it does not save) `holds()` says what the last save left."""
    from ..train.plumbing import TrainingInterrupted

    try:
        yield
    except KeyboardInterrupt as e:
        line = str(e) if isinstance(e, TrainingInterrupted) else f"interrupted: {holds()}"
        if os.environ.get("RANK", "0") == "0":   # one line per run, not per process
            err_console.print(line, highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(130) from None


# click's UsageError (a bad or missing option or argument), or that of the copy of click that
# typer carries from 0.2x on (typer._click): the class typer's public BadParameter derives from.
_UsageError: type[Exception] = typer.BadParameter.__base__


@contextlib.contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    try:
        yield
    except _UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":   # a group given no command: its help, as before
            raise
        ctx = getattr(e, "ctx", None)
        hint = f" (see '{ctx.command_path} -h')" if ctx is not None else ""
        fail(e.format_message().rstrip(".") + hint, e.exit_code)  # type: ignore[attr-defined]


#: Text parameters that name a file or folder, or else a hub id or an encoder name (`export gguf
#: MODEL`, `index build --encoder`): typed str for the names, yet "" reads as the current folder too.
_FOLDER_OR_NAME_PARAMS = ("model", "encoder")


def _names_a_path(param: Any) -> bool:
    """A parameter whose value is a file or folder: typed Path (or a list of them), or one of
    _FOLDER_OR_NAME_PARAMS. Other text keeps "" (`serve --host ""` binds every interface)."""
    descriptor = getattr(param, "type_descriptor", None)   # Typer 0.2x's own parameters
    if descriptor is None:   # older Typer: click's ParamType, click.Path (or Typer's subclass) for a Path
        is_path = any(c.__name__ == "Path" for c in type(param.type).__mro__)
        is_text = getattr(param.type, "name", "") == "text"
    else:
        kind = descriptor.annotation
        kind = (get_args(kind) or (str,))[0] if get_origin(kind) is list else kind
        is_path, is_text = isinstance(kind, type) and issubclass(kind, PurePath), kind is str
    return is_path or (is_text and param.name in _FOLDER_OR_NAME_PARAMS)


def _refuse_empty_path(param: Any) -> None:
    """Make `param` refuse "" before Typer converts it: Path("") is Path("."), so afterwards an
    empty --out or --index cannot be told from "." and would mean the current folder."""
    convert = param.process_value

    def process_value(ctx: Any, value: Any) -> Any:
        if "" in (value if isinstance(value, (list, tuple)) else (value,)):   # one path, or a list of them
            raise typer.BadParameter("an empty path names no file or folder (for this folder, give '.')",
                                     ctx=ctx, param=param)
        return convert(ctx, value)

    param.process_value = process_value


def _refuse_empty_paths(command: Any) -> None:
    """_refuse_empty_path for every parameter that names a file or folder, in every command below."""
    for param in command.params:
        if _names_a_path(param):
            _refuse_empty_path(param)
    for sub in getattr(command, "commands", {}).values():
        _refuse_empty_paths(sub)


class OneLineUsageErrors(TyperGroup):
    """The root group (`dgpo-edge`): a usage error of any command under it (an option out of its
    range, an unknown option, a missing argument, no such command) is one `error:` line and exit
    status 2, as all other bad input is, not click's usage lines and Rich's boxed message. An
    empty path, anywhere, is such an error (_refuse_empty_paths)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)   # Typer passes every command, sub-groups' too, made already
        _refuse_empty_paths(self)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _one_line_usage_errors():   # the root's own options
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with _one_line_usage_errors():   # a command's options and arguments, and any group's between
            return super().invoke(ctx)


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
    """`--max-searches`, or the old `--max-turns` when that was given (as `index serve --topk`),
    range-checked under the name the user typed (check_search_options names --max-searches)."""
    if old_max_turns is not None and not 0 <= old_max_turns <= MAX_SEARCHES:
        raise InputError(f"--max-turns must be in 0..{MAX_SEARCHES}, got {old_max_turns}")
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
EXTRA_INSTALL = {"train": "pip install torch && pip install 'dgpo-edge[train]'",
                 "export": "pip install torch && pip install 'dgpo-edge[export]'"}   # install the torch build first: export brings none, train only a floor


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


def require_extra(extra: str, *modules: str) -> None:
    """needs_extra's check for modules only some runs of a command need (`export gguf`'s check)."""
    missing = [m for m in modules if not _importable(m)]
    if missing:
        _missing_extra(extra, missing[0])


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _missing_extra(extra: str, module: str) -> None:
    install = EXTRA_INSTALL.get(extra, f"pip install 'dgpo-edge[{extra}]'")
    fail(f"this command needs the {extra} extra ({module} is not installed): {install}")
