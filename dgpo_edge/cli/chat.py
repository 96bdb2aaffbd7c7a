"""`dgpo-edge chat`: the Textual chat app over a bundle, or a model and an index.

The agent is loaded before the app starts, so a missing file or an unreadable
model is one `error:` line and exit status 2 rather than a message inside a
full-screen app (and a default bundle being built shows its progress on a
normal terminal). Textual and the app are imported only when the command runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from ..errors import InputError
from .common import (GPU_LAYERS_HELP, check_search_options, max_searches_of, max_searches_option,
                     old_max_turns_option, top_k_option, user_errors)


@user_errors
def chat(
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="A bundle directory (model + index). "
                                          "Default: the built-in default bundle."),
    model: Optional[Path] = typer.Option(None, "--model", help="A model: .gguf file, ONNX or transformers folder."),
    index: Optional[Path] = typer.Option(None, "--index", help="An index directory (`dgpo-edge index build`)."),
    top_k: Optional[int] = top_k_option(),
    max_searches: Optional[int] = max_searches_option(),
    old_max_turns: Optional[int] = old_max_turns_option(),
    gpu_layers: Optional[int] = typer.Option(None, "--gpu-layers", min=-1, help=GPU_LAYERS_HELP),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="CPU threads for the model."),
    history: Optional[Path] = typer.Option(None, "--history", help="Chat history file. "
                                           "Default: $XDG_DATA_HOME/dgpo-edge/chats.sqlite."),
) -> None:
    """Chat with the search agent in the terminal: Esc stops, Ctrl+O past chats, Ctrl+S settings."""
    app = build_app(bundle=bundle, model=model, index=index, top_k=top_k,
                    max_searches=max_searches_of(max_searches, old_max_turns),
                    threads=threads, history=history, gpu_layers=gpu_layers, need_terminal=True)
    app.run()


def build_app(bundle: Path | None = None, model: Path | None = None, index: Path | None = None,
              top_k: int | None = None, max_searches: int | None = None, threads: int | None = None,
              history: Path | None = None, gpu_layers: int | None = None, need_terminal: bool = False) -> Any:
    """Check the arguments, open the chat history, load the agent; return the (not yet running) app.

    `need_terminal`: refuse, before the model loads, when stdin or stdout is not a terminal (a
    full-screen app there would wait for keys that never come)."""
    check_search_options(top_k, max_searches)
    check_sources(bundle, model, index)
    try:
        from ..apps.chat.app import ChatApp
        from ..apps.chat.screens import Settings
        from ..apps.chat.storage import ChatStore, check_history
    except ImportError as e:
        raise InputError(f"the chat app needs Textual ({e.name} is missing): "
                         "pip install 'dgpo-edge[edge]'") from None
    from ..bundle import load_agent, open_bundle

    if bundle is not None:
        open_bundle(bundle)      # cheap (manifest and sizes): a bad bundle is named before "no terminal"
    check_history(history)       # a broken history file is reported before a model loads
    if need_terminal:
        check_terminal()

    # Progress bars (stderr) show only if the default bundle has to be built first.
    agent = load_agent(bundle=bundle, model=model, index=index, threads=threads, top_k=top_k,
                       max_searches=max_searches, gpu_layers=gpu_layers)
    store = ChatStore(history)   # made only now: a chat refused above leaves no new history file
    settings = Settings(top_k=agent.config.top_k, max_searches=agent.config.max_searches)
    return ChatApp(lambda: agent, store, settings=settings, description=describe(agent, bundle, model, index))


def check_terminal() -> None:
    closed = [name for name, f in (("stdin", sys.stdin), ("stdout", sys.stdout)) if not f.isatty()]
    if closed:
        verb = "is" if len(closed) == 1 else "are"
        raise InputError(f"chat needs a terminal ({' and '.join(closed)} {verb} not one); without a terminal, "
                         "ask one question at a time with `dgpo-edge ask \"...\"` (--json for scripts)")


def check_sources(bundle: Path | None, model: Path | None, index: Path | None) -> None:
    """Paths that must exist. As for `ask` and `eval`, --model/--index replace that part of the
    bundle (the default bundle when none is given)."""
    # worded as `ask` and `eval` word them (bundle.core, engines, retrieval.build)
    for path, what in ((bundle, "bundle folder"), (model, "model file or folder"), (index, "index folder")):
        if path is not None and not path.expanduser().exists():
            raise InputError(f"no such {what}", path)
    for path in (bundle, index):
        if path is not None and not path.expanduser().is_dir():
            raise InputError("not a directory", path)


def describe(agent: Any, bundle: Path | None, model: Path | None, index: Path | None) -> str:
    """The header's subtitle: what the agent runs (from `agent.info` when the loader filled it in)."""
    info = getattr(agent, "info", None) or {}
    model_name = info.get("model") or (model.name if model else None)
    index_name = info.get("index") or (index.name if index else None)
    parts = [str(Path(str(p)).name) for p in (model_name, index_name) if p]
    if bundle is not None and not parts:
        parts = [bundle.name]
    return " · ".join(parts) or "default bundle"
