"""`dgpo-edge serve`: the agent behind an OpenAI-compatible HTTP API on 127.0.0.1 (docs/serve.md)."""

from __future__ import annotations

import math

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..errors import InputError
from .ask import BUNDLE_HELP, INDEX_HELP, MODEL_HELP
from .common import (GPU_LAYERS_HELP, check_search_options, console, err_console, max_searches_of,
                     max_searches_option, old_max_turns_option, top_k_option, user_errors)


@user_errors
def serve(
    bundle: Optional[Path] = typer.Option(None, "--bundle", help=BUNDLE_HELP),
    model: Optional[Path] = typer.Option(None, "--model", help=MODEL_HELP),
    index: Optional[Path] = typer.Option(None, "--index", help=INDEX_HELP),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback by default)."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="Port (0 picks a free one)."),
    engines: int = typer.Option(1, "--engines", min=1, max=64,
                                help="Engines, each answering one request at a time (each holds the model)."),
    queue: int = typer.Option(8, "--queue", min=0, help="Requests that may wait for an engine; more get 503."),
    timeout: float = typer.Option(300.0, "--timeout",
                                  help="Seconds a request may wait for an engine, and then to answer."),
    model_name: str = typer.Option("dgpo-edge", "--model-name", help="The model id /v1/models lists."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="CPU threads per engine."),
    top_k: Optional[int] = top_k_option(),
    max_searches: Optional[int] = max_searches_option(),
    old_max_turns: Optional[int] = old_max_turns_option(),
    gpu_layers: Optional[int] = typer.Option(None, "--gpu-layers", help=GPU_LAYERS_HELP),
) -> None:
    """Serve the agent with OpenAI's chat-completions API (plus /retrieve); Ctrl-C stops.

    Then point any OpenAI client at http://127.0.0.1:8080/v1 (any API key).
    """
    from ..agent.http_app import ServeLimits, listen, make_app, make_server
    from ..bundle import load_pool
    from ..retrieval.http_checks import is_loopback

    if not 0 < timeout < math.inf:   # nan passes `<= 0` and never times out
        raise InputError(f"--timeout must be a number of seconds > 0, got {timeout}")
    max_searches = max_searches_of(max_searches, old_max_turns)
    check_search_options(top_k, max_searches)
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise InputError("serve needs starlette and uvicorn: pip install 'dgpo-edge[serve]'") from None
    local = host == "localhost" or is_loopback(host)
    sock = listen(host, port)
    try:
        pool = load_pool(engines, queue, bundle=bundle, model=model, index=index, threads=threads, top_k=top_k,
                         max_searches=max_searches, timeout_s=timeout,
                         gpu_layers=gpu_layers)
        try:
            app = make_app(pool, model_name, ServeLimits(timeout=timeout), local_only=local)
            url = f"http://{host}:{sock.getsockname()[1]}/v1"
            console.print(f"serving {escape(pool.info['model'])} + {escape(str(pool.info['index']))} on {url} "
                          f"({engines} engine(s), queue {queue}); Ctrl-C stops", highlight=False,
                          soft_wrap=True)   # one line: a script reads the URL from it
            if not local:
                err_console.print(f"[bold yellow]warning:[/] bound to {escape(host)}: anyone who can reach "
                                  "this machine can query the index", highlight=False)
            make_server(app, host, port).run(sockets=[sock])
        finally:
            pool.close()
    finally:
        sock.close()
