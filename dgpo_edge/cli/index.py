"""`dgpo-edge index ...`: build, compact, search, inspect and serve retrieval indexes."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.progress import Progress

from ..errors import InputError
from ..progress import add_stage, stage_progress
from ..termtext import printable
from .common import PlainTable, check_utf8, console, err_console, user_errors

app = typer.Typer(help="Build, compact, search and serve retrieval indexes.", no_args_is_help=True)

_STAGES = {"scan": "checking files", "fingerprint": "reading corpus", "store": "storing passages",
           "embed": "embedding passages", "train": "building index", "add": "adding vectors",
           "write": "writing files"}


@contextlib.contextmanager
def _progress_bar() -> Iterator[Progress]:
    """A live progress display; on bad input it is cleared, so the `error:` line stands alone."""
    bar = stage_progress(err_console)   # stderr: stdout keeps only the result
    bar.start()
    try:
        yield bar
    except (InputError, OSError, sqlite3.Error):   # user_errors may report these as one line too (a full disk)
        # Clear the display without Progress.stop(), which also prints a blank line when not on a
        # terminal: no half-drawn bars or blank line go to stdout before the error line.
        bar.live.transient = True
        bar.live.stop()
        raise
    except BaseException:
        bar.stop()
        raise
    bar.stop()


def _stage_tasks(bar: Progress) -> Callable[[str, int, "int | None"], None]:
    """A build's `progress(stage, done, total)` drawn as one bar per stage."""
    tasks: dict[str, int] = {}

    def progress(stage: str, done: int, total: int | None) -> None:
        if stage not in tasks:
            tasks[stage] = add_stage(bar, _STAGES.get(stage, stage), stage, done, total)
        bar.update(tasks[stage], completed=done, total=total)

    return progress


_OVERWRITE_HELP = "Replace an existing index in --out (never a folder that holds anything else)."


@app.command("build")
@user_errors
def build(
    corpus: Path = typer.Argument(..., help="Search-R1 jsonl, a folder of documents (.txt, .md, .pdf, .html), or a FactbookQA directory."),
    out: Path = typer.Option(..., "--out", help="Index directory to write."),
    encoder: str = typer.Option("minilm-int8", help="minilm-int8 (torch-free), minilm (torch), or a local model directory (e5-base-v2)."),
    kind: Optional[str] = typer.Option(None, help="flat, ivfpq, bm25 or hybrid (ivfpq + bm25 fused). Default: hybrid "
                                       "for documents (a notes folder), ivfpq for a .jsonl or FactbookQA corpus."),
    nlist: Optional[int] = typer.Option(None, help="IVF lists (default about 4*sqrt(n), see docs/retrieval.md)."),
    pq: Optional[str] = typer.Option(None, help="PQ code bytes per vector, or MxBITS (e.g. 48 or 48x4)."),
    opq: Optional[bool] = typer.Option(None, "--opq/--no-opq", help="Rotate vectors with OPQ before PQ (default: on from 8*dim passages)."),
    nprobe: Optional[int] = typer.Option(None, min=1, help="IVF lists searched per query (saved as the default)."),
    threads: Optional[int] = typer.Option(None, min=1, help="Encoder and FAISS threads (default: library defaults)."),
    chunk: int = typer.Option(1024, help="Passages per embedding chunk (the unit a rerun resumes from)."),
    overwrite: bool = typer.Option(False, help=_OVERWRITE_HELP),
) -> None:
    """Build an index. Interrupted runs resume: rerun the same command."""
    from ..retrieval.build import build_index

    with _progress_bar() as bar:
        manifest = build_index(corpus, out, encoder_spec=encoder, kind=kind or default_kind(corpus), nlist=nlist,
                               pq=pq, opq=opq,
                               nprobe=nprobe, chunk=chunk, threads=threads, progress=_stage_tasks(bar),
                               overwrite=overwrite)
    _print_info(out, manifest)
    print_documents(manifest)
    _print_links_not_followed(corpus)


def default_kind(corpus: Path) -> str:
    """Hybrid for documents: on the notes world's questions it finds the gold note in the top 3 more
    often than dense or BM25 alone (docs/retrieval.md); IVF-PQ for large jsonl corpora."""
    from ..retrieval.corpus import detect_format

    return "hybrid" if detect_format(corpus) == "text" else "ivfpq"


@app.command("update")
@user_errors
def update(
    folder: Path = typer.Argument(..., help="The folder of documents the index was built from."),
    out: Path = typer.Option(..., "--out", help="The index directory to update (from `index build FOLDER --out DIR`)."),
    threads: Optional[int] = typer.Option(None, min=1, help="Encoder and FAISS threads (default: library defaults)."),
    force: bool = typer.Option(False, "--force", help="Update even from a folder of another name than the "
                               "index's, or when more than half of its passages would be deleted."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Re-read only new and changed files, drop deleted ones; no retraining until the index doubles."""
    from ..retrieval.update import update_index

    if as_json:  # nothing but the JSON on stdout
        report = update_index(folder, out, threads=threads, force=force)
        report.pop("manifest")
        typer.echo(json.dumps(report, ensure_ascii=False, indent=2))
        return
    with _progress_bar() as bar:
        report = update_index(folder, out, threads=threads, progress=_stage_tasks(bar), force=force)
    manifest = report.pop("manifest")
    _print_update(report)
    print_documents(manifest)


def _print_update(r: dict) -> None:
    for s in r["unlisted"]:   # its notes stay in the index: not known to be gone
        _print_skipped(s)
    if not (r["added"] or r["changed"] or r["deleted"] or r["passages_added"] or r["passages_removed"]):
        console.print(f"up to date: {r['unchanged']} file(s) unchanged, {r['count']:,} passages", highlight=False)
        return
    for what in ("added", "changed", "deleted"):
        for path in r[what]:   # a file name may hold terminal escapes (a downloaded archive's)
            console.print(f"  {what} {escape(printable(path))}", highlight=False)
    how = "rebuilt (grown past the retraining factor)" if r["retrained"] else "updated in place"
    console.print(f"{how}: {len(r['added'])} added, {len(r['changed'])} changed, {len(r['deleted'])} deleted, "
                  f"{r['unchanged']} unchanged file(s); +{r['passages_added']} -{r['passages_removed']} passages, "
                  f"{r['count']:,} in all", highlight=False)


@app.command("compact")
@user_errors
def compact(
    flat: Path = typer.Option(..., "--flat", help="A Search-R1 Flat index (e5_Flat.index), or any FAISS "
                              "IndexFlatIP with its --encoder; row i = corpus line i."),
    corpus: Path = typer.Option(..., "--corpus", help="The matching Search-R1 jsonl corpus (wiki-18.jsonl)."),
    out: Path = typer.Option(..., "--out", help="Directory for vectors.faiss, store.sqlite, manifest.json."),
    encoder: str = typer.Option("e5-base-v2", help="The encoder that made the Flat vectors, recorded for "
                                "searches: e5-base-v2 (Search-R1's e5_Flat.index, dim 768; no model needed), "
                                "minilm-int8, minilm or all-MiniLM-L6-v2 (dim 384), or a local model directory "
                                "(loaded for its dim). Its dim must be the index's."),
    pq: int = typer.Option(64, "--pq", help="PQ code bytes per vector: an M that divides the dimension (with "
                                             "OPQ, also any M with 4*M <= dim). Below 8-bit codes (small "
                                             "corpora) M is re-planned for the bits; the log names the index."),
    opq: Optional[bool] = typer.Option(None, "--opq/--no-opq", help="Rotate with OPQ before PQ (default: on from 8*dim training vectors)."),
    nlist: Optional[int] = typer.Option(None, help="IVF lists (default about 4*sqrt(n))."),
    nprobe: Optional[int] = typer.Option(None, help="Default lists searched (default: chosen from a recall sweep)."),
    eval_queries: int = typer.Option(500, help="Held-out query vectors for the recall report."),
    threads: Optional[int] = typer.Option(None, min=1, help="FAISS threads."),
    overwrite: bool = typer.Option(False, help=_OVERWRITE_HELP),
) -> None:
    """Turn a Search-R1 Flat index into IVF-PQ plus a compressed passage store; report recall@k."""
    from ..retrieval.compact import compact as run_compact
    from ..retrieval.corpus import count_lines

    # vectors added + passages stored; a missing corpus is left to run_compact's "no such file"
    total = 2 * count_lines(corpus) if corpus.is_file() else None
    with _progress_bar() as bar:
        task = bar.add_task("compacting", total=total, unit="rows")
        report = run_compact(flat, corpus, out, encoder=encoder, pq=pq, opq=opq, nlist=nlist, nprobe=nprobe,
                             eval_queries=eval_queries, threads=threads, overwrite=overwrite,
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
    k: int = typer.Option(3, "--top-k", "-k", min=1, max=100, help="Passages to return."),
    as_json: bool = typer.Option(False, "--json", help="Print Search-R1's /retrieve result shape as JSON."),
    kind: Optional[str] = typer.Option(None, help="Override the index's kind: dense (its vectors), bm25 or hybrid."),
    encoder: Optional[str] = typer.Option(None, help="Query encoder (default: the one the index calls for)."),
    nprobe: Optional[int] = typer.Option(None, min=1, help="IVF lists searched (default: the index's)."),
    threads: Optional[int] = typer.Option(None, min=1, help="Encoder and FAISS threads."),
) -> None:
    """Search an index and print the top passages."""
    if not query.strip():
        raise InputError("the query is empty")
    check_utf8(query, "the query")
    from ..retrieval.retrievers import open_index
    from ..retrieval.server import result_json

    with open_index(index, encoder=encoder, nprobe=nprobe, kind=kind, threads=threads) as retriever:
        timed = retriever.search_timed([query], k=k)
    passages = timed.passages[0]
    if as_json:
        typer.echo(json.dumps(result_json([passages], return_scores=True), ensure_ascii=False, indent=2))
        return
    console.print(f"[dim]encode {timed.encode_ms:.1f} ms · search {timed.search_ms:.1f} ms · fetch {timed.fetch_ms:.1f} ms[/]")
    if not passages:   # BM25 finds only passages sharing a word with the query: say so, not a bare timing line
        console.print("no passage matches the query (BM25 needs a word of it in the passage)", highlight=False)
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
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON (with `verified`)."),
) -> None:
    """Show what an index holds: kind, encoder, counts, parameters, files."""
    from ..retrieval.build import verify_files

    manifest = verify_files(index, full=verify)
    if as_json:
        typer.echo(json.dumps({**manifest, "verified": verify}, indent=2, ensure_ascii=False))
        return
    _print_info(index, manifest, verified=verify)
    print_documents(manifest)


def _print_info(index: Path, m: dict, verified: bool = False) -> None:
    table = PlainTable(f"index {index}", show_header=False)
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


def print_documents(m: dict) -> None:
    """Which files of a documents folder were read and which were skipped, and why (never silent)."""
    docs = (m.get("source") or {}).get("documents")
    if not docs:
        return
    types = ", ".join(f"{n} {suffix}" for suffix, n in docs["read_by_type"].items())
    console.print(f"read {docs['read']} file(s) ({types or 'none'}) into {docs['passages']:,} passages; "
                  f"skipped {len(docs['skipped'])}", highlight=False)
    for s in docs["skipped"]:
        _print_skipped(s)


def _print_skipped(s: dict) -> None:
    """`  skipped PATH: REASON`; names and parser messages come from the files: no terminal escapes."""
    console.print(f"  skipped {escape(printable(s['path']))}: {escape(printable(s['reason']))}", highlight=False)


@app.command("serve")
@user_errors
def serve(
    index: Path = typer.Argument(..., help="Index directory."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
    port: int = typer.Option(8000, help="Port (0 picks a free one)."),
    kind: Optional[str] = typer.Option(None, help="Override: dense, bm25 or hybrid."),
    topk: int = typer.Option(3, "--top-k", "-k", help="Passages per query when a request gives no topk."),
    old_topk: Optional[int] = typer.Option(None, "--topk", hidden=True, help="Deprecated: --top-k."),
    max_queries: int = typer.Option(256, help="Largest batch of queries one request may hold."),
    threads: Optional[int] = typer.Option(None, min=1, help="Encoder and FAISS threads."),
) -> None:
    """Serve Search-R1's POST /retrieve API for an index (Ctrl-C or SIGTERM stops).

    Each request must arrive within 10 s; 32 are handled at once and 64 more
    wait, the rest get 503 (see docs/retrieval.md).
    """
    from ..retrieval.retrievers import open_index
    from ..retrieval.server import Limits
    from ..retrieval.server import serve as run_server

    topk = old_topk if old_topk is not None else topk   # the old spelling, hidden from --help
    # Checked before the index is opened (loading an encoder takes seconds).
    if not 0 <= port <= 65535:
        raise InputError(f"--port must be in 0..65535, got {port}")
    if not 1 <= topk <= Limits.max_topk:
        raise InputError(f"--top-k must be in 1..{Limits.max_topk}, got {topk}")
    if max_queries < 1:
        raise InputError(f"--max-queries must be >= 1, got {max_queries}")
    with open_index(index, kind=kind, threads=threads) as retriever:
        run_server(retriever, host=host, port=port, default_topk=topk, max_queries=max_queries)
