"""`dgpo-edge bundle info|verify`: what a bundle holds; check every file's hash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from ..errors import InputError
from .common import PlainTable, console, err_console, user_errors

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
            _not_built(d, as_json)
            return
        bundle = d
    b = open_bundle(bundle)
    if as_json:
        typer.echo(json.dumps(b.manifest, indent=2, ensure_ascii=False))
        return
    print_info(b)


def _not_built(d: Path, as_json: bool) -> None:
    """The default bundle before first use: still JSON under --json (its path, `built: false`)."""
    if as_json:
        typer.echo(json.dumps({"path": str(d), "built": False}, indent=2))
        return
    console.print(f"default bundle: {escape(str(d))} [yellow](not built yet)[/]", highlight=False)
    console.print("It is built on first use of `dgpo-edge ask`, `eval`, `chat` or `serve`, from installed "
                  "packages only.", highlight=False)


def print_info(b: Any, verified: bool = False) -> None:
    from ..bundle.core import manifest_max_searches

    m = b.manifest
    table = PlainTable(f"bundle {b.path}", show_header=False)
    model = m["model"]
    # the model's own file (a GGUF) or folder, without the parity JSON bundled beside or inside it
    path = model["path"].rstrip("/")
    mbytes = sum(f["bytes"] for n, f in m["files"].items()
                 if (n == path or n.startswith(path + "/")) and not n.endswith(".parity.json"))
    table.add_row("model", f"{model['format']}: {model['path']} ({mbytes:,} bytes)")
    idx = m["index"]
    enc = idx.get("encoder")
    table.add_row("index", f"{idx['kind']}, {idx['count']:,} passages"
                  + (f", encoder {enc['name']} ({enc['dim']}-d)" if enc else ", BM25"))
    e = m.get("encoder")
    table.add_row("query encoder", "none (BM25)" if not e else f"{e['format']} in {e['path']}/")
    p = m.get("protocol") or {}
    table.add_row("protocol", f"{p.get('template', '?')}: top-k {p.get('top_k')}, "
                  f"max searches {manifest_max_searches(p)}, "
                  f"{p.get('max_turn_tokens')}/{p.get('max_obs_tokens')}/{p.get('max_total_tokens')} tokens "
                  f"(turn/observation/total)")
    for key, value in parity_rows(m.get("parity")):
        table.add_row(key, value)
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


def parity_rows(parity: Any) -> list[tuple[str, str]]:
    """The export's parity check as (label, text) rows: verdict first, then one row per fact."""
    if parity is None:
        return [("parity", "none recorded")]
    from ..export.parity import format_parity

    try:
        lines = format_parity(parity).splitlines()
    except (KeyError, TypeError, ValueError, AttributeError):
        # Not the exporter's shape (an older or hand-made file): the verdict, then each top-level value.
        if not isinstance(parity, dict):
            return [("parity", json.dumps(parity, ensure_ascii=False)[:120])]
        verdict = [("parity", "passed" if parity["passed"] else "FAILED")] if "passed" in parity else []
        return verdict + [(f"parity {k}", json.dumps(v, ensure_ascii=False)[:120])
                          for k, v in parity.items() if k != "passed"]
    rows = [(f"parity {k}" if k != "parity" else k, v) for k, _, v in (ln.partition(": ") for ln in lines)]
    return rows[-1:] + rows[:-1]


@app.command("verify")
@user_errors
def verify_command(
    bundle: Path = typer.Argument(..., help="A bundle folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON (errors stay one line on stderr)."),
) -> None:
    """Check every file's size and sha256 against the manifest (exit 2 on any difference)."""
    from ..bundle import verify
    from ..progress import StageBars

    bar = StageBars(console=err_console, descriptions={"verify": "verifying"}, transient=True)
    try:
        b = verify(bundle, progress=bar)
    except InputError:
        bar.abandon()
        raise
    bar.close()
    if as_json:
        typer.echo(json.dumps({"ok": True, "path": str(b.path), "files": len(b.manifest["files"]),
                               "bytes": b.total_bytes}, indent=2))
        return
    console.print(f"ok: {len(b.manifest['files'])} files, {b.total_bytes:,} bytes match the manifest "
                  f"({escape(str(b.path))})", highlight=False)
