"""`dgpo-edge ask "question"`: one question through the agent, offline.

Default output: the answer and its sources. `--steps` streams what the model
writes, each search and the passages it returned, as they happen. `--json`
prints one object (answer, searches, passages, cited ids, timings, transcript).
Exit status: 0 answered, 1 no answer (turns, budget or timeout ran out), 2 bad
input or an engine/retrieval error.
"""

from __future__ import annotations

import math

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from ..errors import InputError
from ..termtext import printable
from .common import (GPU_LAYERS_HELP, check_search_options, check_utf8, console, err_console, max_searches_of,
                     max_searches_option, old_max_turns_option, top_k_option, user_errors)

BUNDLE_HELP = "A bundle folder (default: the default bundle, built on first use)."
MODEL_HELP = "A model: .gguf file (llama.cpp), ONNX folder (onnxruntime-genai) or transformers folder."
INDEX_HELP = "An index folder (`dgpo-edge index build`); without --model the default model is used."


def agent_options(bundle: Optional[Path], model: Optional[Path], index: Optional[Path], threads: Optional[int],
                  top_k: Optional[int], max_searches: Optional[int], quiet: bool = False,
                  gpu_layers: Optional[int] = None, **kw: Any) -> Any:
    """load_agent with the CLI's options (progress bars on stderr unless quiet)."""
    from ..bundle import load_agent

    check_search_options(top_k, max_searches)
    return load_agent(bundle=bundle, model=model, index=index, threads=threads, top_k=top_k,
                      max_searches=max_searches, progress=not quiet, gpu_layers=gpu_layers, **kw)


@user_errors
def ask(
    question: str = typer.Argument(..., help="The question."),
    bundle: Optional[Path] = typer.Option(None, "--bundle", help=BUNDLE_HELP),
    model: Optional[Path] = typer.Option(None, "--model", help=MODEL_HELP),
    index: Optional[Path] = typer.Option(None, "--index", help=INDEX_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of text."),
    steps: bool = typer.Option(False, "--steps", help="Stream the model's text, searches and passages."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (default: the libraries')."),
    top_k: Optional[int] = top_k_option(),
    max_searches: Optional[int] = max_searches_option(),
    old_max_turns: Optional[int] = old_max_turns_option(),
    gpu_layers: Optional[int] = typer.Option(None, "--gpu-layers", help=GPU_LAYERS_HELP),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Give up after this many seconds."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 is greedy; above 0 samples."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed, 0 or more (with --temperature)."),
) -> None:
    """Answer one question with the search agent, offline."""
    from ..agent import Answered, Failed, PassagesRetrieved, SearchIssued, TokenDelta, TurnStarted
    from ..engines.base import Sampling

    if not question.strip():
        raise InputError("the question is empty")
    check_utf8(question, "the question")
    if timeout is not None and not 0 < timeout < math.inf:   # nan passes `<= 0` and never times out
        raise InputError(f"--timeout must be a number of seconds > 0, got {timeout}")
    if temperature < 0:
        raise InputError(f"--temperature must be >= 0, got {temperature}")
    if seed is not None and seed < 0:   # before the model loads, not as the run's engine error
        raise InputError(f"--seed must be >= 0, got {seed}")
    agent = agent_options(bundle, model, index, threads, top_k, max_searches_of(max_searches, old_max_turns),
                          quiet=as_json, gpu_layers=gpu_layers,
                          timeout_s=timeout,
                          sampling=Sampling(temperature=temperature, seed=seed))
    end: Any = None
    with agent:
        for event in agent.run(question):
            if isinstance(event, (Answered, Failed)):
                end = event
            elif steps and not as_json:
                _print_step(event, TurnStarted, TokenDelta, SearchIssued, PassagesRetrieved)
    r = end.result
    if as_json:
        typer.echo(json.dumps(result_json(r, agent.info, getattr(end, "reason", None)), ensure_ascii=False,
                              indent=2))
    else:
        if steps:
            console.print()
        _print_result(r, end)
    if r.stop_reason == "error":
        if not as_json:
            err_console.print(f"[bold red]error:[/] {escape(end.reason[len('error: '):])}", highlight=False)
        raise typer.Exit(2)
    if r.answer is None:
        raise typer.Exit(1)


def _print_step(event: Any, TurnStarted: Any, TokenDelta: Any, SearchIssued: Any, PassagesRetrieved: Any) -> None:
    if isinstance(event, TurnStarted):
        console.print(f"\n[bold cyan]── turn {event.turn + 1} ──[/]", highlight=False)
    elif isinstance(event, TokenDelta):
        console.out(printable(event.text), end="", highlight=False)  # a split escape loses its ESC
        console.file.flush()
    elif isinstance(event, SearchIssued):
        console.print(f"\n[yellow]search:[/] {escape(printable(event.query))}", highlight=False)
    elif isinstance(event, PassagesRetrieved):
        for i, p in enumerate(event.passages, start=1):
            console.print(f"  [dim]{i}.[/] [bold]{escape(printable(p.title))}[/] [dim](id {escape(printable(p.id))})[/]",
                          highlight=False)
        console.print(f"  [dim]retrieved in {event.retrieval_ms:.0f} ms[/]", highlight=False)


def _print_result(r: Any, end: Any) -> None:
    if r.answer is not None:
        console.print(f"[bold green]Answer:[/] {escape(printable(r.answer))}", highlight=False)
    else:
        reason = end.reason if r.stop_reason != "error" else "error"
        console.print(f"[bold red]No answer[/] ({escape(printable(reason))})", highlight=False)
    sources = r.cited or []
    if sources:
        console.print("[bold]Sources:[/]", highlight=False)
        for p in sources:
            title, pid = escape(printable(p.title)), escape(printable(p.id))
            console.print(f"  • {title} [dim](id {pid})[/]", highlight=False)
    t = r.timings
    tps = t.new_tokens / t.decode_s if t.decode_s else 0.0
    console.print(f"[dim]{len(r.searches)} search(es) · {t.total_s:.1f} s · {t.new_tokens} tokens at "
                  f"{tps:.1f} tok/s · retrieval {t.retrieval_s * 1000:.0f} ms[/]", highlight=False)


def result_json(r: Any, info: dict[str, Any] | None = None, reason: str | None = None) -> dict[str, Any]:
    """The `--json` object for an AgentResult."""
    def passage(p: Any) -> dict[str, Any]:
        return {"id": p.id, "title": p.title, "text": p.text, "score": p.score}

    return {
        "question": r.question, "answer": r.answer, "stop_reason": r.stop_reason,
        "failure": None if r.answer is not None else reason,
        "searches": list(r.searches), "passages": [passage(p) for p in r.passages],
        "cited": [p.id for p in r.cited], "invalid_actions": r.invalid_actions,
        "turns": len(r.transcript.turns()), "timings": dataclasses.asdict(r.timings),
        "agent": info or {}, "transcript": r.transcript.text,
    }
