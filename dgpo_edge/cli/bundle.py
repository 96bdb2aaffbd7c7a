"""`dgpo-edge bundle info|verify`: what a bundle holds; check every file's hash."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import InputError
from .common import console, user_errors

app = typer.Typer(help="Inspect and verify bundles (model + index + query encoder + manifest).",
                  no_args_is_help=True)


@app.command("info")
@user_errors
def info(
    bundle: Optional[Path] = typer.Argument(None, help="A bundle folder (default: the default bundle)."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Show what a bundle holds (the default bundle when none is named)."""
    from ..bundle import default_bundle_dir, open_bundle

    if bundle is None:
        d = default_bundle_dir()
        if not (d / "manifest.json").is_file():
            console.print(f"default bundle: {escape(str(d))} [yellow](not built yet)[/]", highlight=False)
            console.print("It is built on first use of `dgpo-edge ask`, `eval` or `chat`, from installed "
                          "packages only.", highlight=False)
            return
        bundle = d
    b = open_bundle(bundle)
    if as_json:
        import json

        typer.echo(json.dumps(b.manifest, indent=2, ensure_ascii=False))
        return
    print_info(b)


def print_info(b: Any, verified: bool = False) -> None:
    m = b.manifest
    table = Table(title=f"bundle {b.path}", show_header=False)
    model = m["model"]
    mbytes = sum(f["bytes"] for n, f in m["files"].items() if n.startswith("model/"))
    table.add_row("model", f"{model['format']}: {model['path']} ({mbytes:,} bytes)")
    idx = m["index"]
    enc = idx.get("encoder")
    table.add_row("index", f"{idx['kind']}, {idx['count']:,} passages"
                  + (f", encoder {enc['name']} ({enc['dim']}-d)" if enc else ", BM25"))
    e = m.get("encoder")
    table.add_row("query encoder", "none (BM25)" if not e else f"{e['format']} in {e['path']}/")
    p = m.get("protocol") or {}
    table.add_row("protocol", f"{p.get('template', '?')}: top-k {p.get('top_k')}, max turns {p.get('max_turns')}, "
                  f"{p.get('max_turn_tokens')}/{p.get('max_obs_tokens')}/{p.get('max_total_tokens')} tokens "
                  f"(turn/observation/total)")
    parity = m.get("parity")
    table.add_row("parity", "none recorded" if parity is None else _short(parity))
    data = sorted(n for n in m["files"] if n.startswith("data/"))
    if data:
        table.add_row("data", ", ".join(data))
    src = m.get("source") or {}
    if src:
        table.add_row("made from", ", ".join(f"{k} {v}" for k, v in src.items()))
    table.add_row("files", f"{len(m['files'])} files, {b.total_bytes:,} bytes" + ("  sha256 ok" if verified else ""))
    v = m.get("versions") or {}
    table.add_row("versions", ", ".join(f"{k} {x}" for k, x in v.items()))
    table.add_row("created", f"{m.get('created')} by {m.get('produced_by')}")
    console.print(table)


def _short(parity: Any) -> str:
    import json

    s = json.dumps(parity, ensure_ascii=False)
    return s if len(s) < 200 else s[:197] + "..."


@app.command("verify")
@user_errors
def verify_command(
    bundle: Path = typer.Argument(..., help="A bundle folder."),
) -> None:
    """Check every file's size and sha256 against the manifest (exit 2 on any difference)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from ..bundle import verify

    bar = Progress(TextColumn("verifying"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                   console=console, transient=True)
    task = None

    def progress(stage: str, done: int, total: int | None) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("verify", total=total)
        bar.update(task, completed=done, total=total)

    try:
        b = verify(bundle, progress=progress)
    except InputError:
        # Clear the bar without Progress.stop(), which prints a blank line when not on a terminal.
        bar.live.transient = True
        bar.live.stop()
        raise
    bar.stop()
    console.print(f"ok: {len(b.manifest['files'])} files, {b.total_bytes:,} bytes match the manifest "
                  f"({escape(str(b.path))})", highlight=False)
