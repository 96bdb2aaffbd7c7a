"""`dgpo-edge index ...`: build, compact, search, inspect and serve retrieval indexes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ..errors import InputError
from ..termtext import printable
from .common import console, user_errors

app = typer.Typer(help="Build, compact, search and serve retrieval indexes.", no_args_is_help=True)

_STAGES = {"fingerprint": "reading corpus", "store": "storing passages", "embed": "embedding passages",
           "train": "building index", "add": "adding vectors", "write": "writing files"}


@contextlib.contextmanager
def _progress_bar() -> Iterator[Progress]:
    """A live progress display; on bad input it is cleared, so the `error:` line stands alone."""
    bar = Progress(TextColumn("{task.description:<20}"), BarColumn(), MofNCompleteColumn(),
                   TimeRemainingColumn(), console=console, transient=False)
    bar.start()
    try:
        yield bar
    except InputError:
        # Clear the display without Progress.stop(), which also prints a blank line when not on a
        # terminal: no half-drawn bars or blank line go to stdout before the error line.
        bar.live.transient = True
        bar.live.stop()
        raise
    except BaseException:
        bar.stop()
        raise
    bar.stop()


@app.command("build")
@user_errors
def build(
    corpus: Path = typer.Argument(..., help="Search-R1 jsonl, a folder of .txt/.md files, or a FactbookQA directory."),
    out: Path = typer.Option(..., "--out", help="Index directory to write."),
    encoder: str = typer.Option("minilm-int8", help="minilm-int8 (torch-free), minilm (torch), or a local model directory (e5-base-v2)."),
    kind: str = typer.Option("ivfpq", help="flat, ivfpq, bm25 or hybrid (ivfpq + bm25 fused)."),
    nlist: Optional[int] = typer.Option(None, help="IVF lists (default about 4*sqrt(n), see docs/retrieval.md)."),
    pq: Optional[str] = typer.Option(None, help="PQ code bytes per vector, or MxBITS (e.g. 48 or 48x4)."),
    opq: Optional[bool] = typer.Option(None, "--opq/--no-opq", help="Rotate vectors with OPQ before PQ (default: on from 8*dim passages)."),
    nprobe: Optional[int] = typer.Option(None, min=1, help="IVF lists searched per query (saved as the default)."),
    threads: Optional[int] = typer.Option(None, min=1, help="Encoder and FAISS threads (default: library defaults)."),
    chunk: int = typer.Option(1024, help="Passages per embedding chunk (the unit a rerun resumes from)."),
    overwrite: bool = typer.Option(False, help="Replace an existing index in --out."),
) -> None:
    """Build an index. Interrupted runs resume: rerun the same command."""
    from ..retrieval.build import build_index

    with _progress_bar() as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int | None) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(_STAGES.get(stage, stage), total=total)
            bar.update(tasks[stage], completed=done, total=total)

        manifest = build_index(corpus, out, encoder_spec=encoder, kind=kind, nlist=nlist, pq=pq, opq=opq,
                               nprobe=nprobe, chunk=chunk, threads=threads, progress=progress,
                               overwrite=overwrite)
    _print_info(out, manifest)
    _print_links_not_followed(corpus)


@app.command("compact")
@user_errors
def compact(
    flat: Path = typer.Option(..., "--flat", help="A Search-R1 Flat index (e5_Flat.index); row i = corpus line i."),
    corpus: Path = typer.Option(..., "--corpus", help="The matching Search-R1 jsonl corpus (wiki-18.jsonl)."),
    out: Path = typer.Option(..., "--out", help="Directory for vectors.faiss, store.sqlite, manifest.json."),
    pq: int = typer.Option(64, "--pq", help="PQ code bytes per vector; must divide the dimension."),
    opq: Optional[bool] = typer.Option(None, "--opq/--no-opq", help="Rotate with OPQ before PQ (default: on from 8*dim training vectors)."),
    nlist: Optional[int] = typer.Option(None, help="IVF lists (default about 4*sqrt(n))."),
    nprobe: Optional[int] = typer.Option(None, help="Default lists searched (default: chosen from a recall sweep)."),
    eval_queries: int = typer.Option(500, help="Held-out query vectors for the recall report."),
    threads: Optional[int] = typer.Option(None, min=1, help="FAISS threads."),
) -> None:
    """Turn a Search-R1 Flat index into IVF-PQ plus a compressed passage store; report recall@k."""
    from ..retrieval.compact import compact as run_compact
    from ..retrieval.corpus import count_lines

    # vectors added + passages stored; a missing corpus is left to run_compact's "no such file"
    total = 2 * count_lines(corpus) if corpus.is_file() else None
    with _progress_bar() as bar:
        task = bar.add_task("compacting", total=total)
        report = run_compact(flat, corpus, out, pq=pq, opq=opq, nlist=nlist, nprobe=nprobe,
                             eval_queries=eval_queries, threads=threads,
                             progress=lambda n: bar.advance(task, n),
                             log=lambda msg: bar.console.print(escape(msg), highlight=False))
    console.print_json(json.dumps(report))


def _print_links_not_followed(corpus: Path) -> None:
    """Say which links the folder walker left alone: a notes folder never reads through a link out of it."""
    from ..retrieval.corpus import links_not_followed

    links = links_not_followed(corpus) if corpus.is_dir() else []
    for rel in links:
        console.print(f"  not followed: {escape(printable(rel))}", highlight=False)
    if links:
        console.print(f"{len(links)} link(s) not followed: links to folders, and links to files outside "
                      f"the folder, are never read", highlight=False)


@app.command("search")
@user_errors
def search(
    index: Path = typer.Argument(..., help="Index directory."),
    query: str = typer.Argument(..., help="The query text."),
    k: int = typer.Option(3, "-k", min=1, max=100, help="Passages to return."),
    as_json: bool = typer.Option(False, "--json", help="Print Search-R1's /retrieve result shape as JSON."),
    kind: Optional[str] = typer.Option(None, help="Override the index's kind: dense (its vectors), bm25 or hybrid."),
    encoder: Optional[str] = typer.Option(None, help="Query encoder (default: the one the index calls for)."),
    nprobe: Optional[int] = typer.Option(None, min=1, help="IVF lists searched (default: the index's)."),
    threads: Optional[int] = typer.Option(None, min=1, help="Encoder and FAISS threads."),
) -> None:
    """Search an index and print the top passages."""
    if not query.strip():
        raise InputError("the query is empty")
    from ..retrieval.retrievers import open_index
    from ..retrieval.server import result_json

    with open_index(index, encoder=encoder, nprobe=nprobe, kind=kind, threads=threads) as retriever:
        timed = retriever.search_timed([query], k=k)
    passages = timed.passages[0]
    if as_json:
        typer.echo(json.dumps(result_json([passages], return_scores=True), ensure_ascii=False, indent=2))
        return
    console.print(f"[dim]encode {timed.encode_ms:.1f} ms · search {timed.search_ms:.1f} ms · fetch {timed.fetch_ms:.1f} ms[/]")
    for rank, p in enumerate(passages, start=1):
        score = "" if p.score is None else f" [dim]({p.score:.3f})[/]"
        title, pid, text = printable(p.title), printable(p.id), printable(p.text)  # no terminal escapes
        console.print(f"[bold]{rank}. {escape(title)}[/] [cyan]id {escape(pid)}[/]{score}", highlight=False)
        console.print(escape(text if len(text) < 400 else text[:397] + "..."), highlight=False)


@app.command("info")
@user_errors
def info(
    index: Path = typer.Argument(..., help="Index directory."),
    verify: bool = typer.Option(False, help="Also check every file's sha256 (reads every byte)."),
) -> None:
    """Show what an index holds: kind, encoder, counts, parameters, files."""
    from ..retrieval.build import verify_files

    _print_info(index, verify_files(index, full=verify), verified=verify)


def _print_info(index: Path, m: dict, verified: bool = False) -> None:
    table = Table(title=f"index {index}", show_header=False)
    table.add_row("kind", m["kind"])
    enc = m.get("encoder")
    table.add_row("encoder", "none (BM25)" if not enc else f"{enc['name']} ({enc['variant']}, dim {enc['dim']})")
    table.add_row("passages", f"{m['count']:,}")
    params = {k: v for k, v in (m.get("params") or {}).items() if v not in (None, False)}
    if params:
        table.add_row("parameters", ", ".join(f"{k}={v}" for k, v in params.items()))
    for name, f in m["files"].items():
        table.add_row(name, f"{f['bytes']:,} bytes" + ("  sha256 ok" if verified else ""))
    table.add_row("produced by", str(m.get("produced_by", "?")))
    console.print(table)


@app.command("serve")
@user_errors
def serve(
    index: Path = typer.Argument(..., help="Index directory."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
    port: int = typer.Option(8000, help="Port (0 picks a free one)."),
    kind: Optional[str] = typer.Option(None, help="Override: dense, bm25 or hybrid."),
    topk: int = typer.Option(3, help="Passages per query when a request gives no topk."),
    max_queries: int = typer.Option(256, help="Largest batch of queries one request may hold."),
    threads: Optional[int] = typer.Option(None, min=1, help="Encoder and FAISS threads."),
) -> None:
    """Serve Search-R1's POST /retrieve API for an index (Ctrl-C stops)."""
    from ..retrieval.retrievers import open_index
    from ..retrieval.server import serve as run_server

    with open_index(index, kind=kind, threads=threads) as retriever:
        run_server(retriever, host=host, port=port, default_topk=topk, max_queries=max_queries)
