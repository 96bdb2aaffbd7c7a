"""What a bundle may hold: every file the loader opens is listed, hashed and inside the bundle.

A manifest's sha256 list protects only the files it names. So before a bundle
is used (or verified), `check_layout` refuses:

- a `model.path`, `index.path`, `encoder.path` or `model.parity_file` that is
  absolute, holds `..`, or names something the manifest's `files` does not
  list (the model file; the query encoder's files);
- any file under the folders the loader reads (the model's folder, `index/`,
  `encoder/`) that `files` does not list: an engine opens whatever its folder
  holds (ONNX external data, a tokenizer file), and SQLite reads a
  `store.sqlite-wal` beside the store;
- a link to a folder anywhere in those folders, and any listed file whose
  real path (links resolved) lies outside the bundle.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import InputError

MANIFEST = "manifest.json"


def check_layout(d: Path, m: dict[str, Any]) -> None:
    """InputError naming the first path that breaks the rules above."""
    listed = set(m["files"])
    root = d.resolve()
    for name in sorted(listed):
        real = (d / name).resolve()
        if not real.is_relative_to(root):
            raise InputError(f"a link out of the bundle (to {real}); a bundle must hold its files", d / name)
    model = m["model"]
    folders = [_folder(model["path"]) if model.get("format") == "gguf" else model["path"], m["index"]["path"]]
    if model.get("format") == "gguf":
        _require_listed(d, model["path"], listed, "model.path")
    if model.get("parity_file"):
        _require_listed(d, model["parity_file"], listed, "model.parity_file")
    enc = m.get("encoder")
    if enc:
        folders.append(enc["path"])
        if enc.get("format") == "minilm-int8-onnx":
            for part in ("model.onnx", "tokenizer.json"):
                _require_listed(d, f"{enc['path']}/{part}", listed, "encoder.path")
    _require_listed(d, f"{m['index']['path']}/{MANIFEST}", listed, "index.path")
    for folder in dict.fromkeys(folders):
        _only_listed(d, folder, listed)


def _folder(rel: str) -> str:
    return str(PurePosixPath(rel).parent)


def _require_listed(d: Path, rel: str, listed: set[str], key: str) -> None:
    name = PurePosixPath(rel).as_posix()
    if name not in listed:
        raise InputError(f"{key} names {rel!r}, which the bundle manifest's files do not list (no sha256 "
                         f"protects it)", d / MANIFEST)


def _only_listed(d: Path, folder: str, listed: set[str]) -> None:
    """Every file under `d/folder` is listed; no link to a folder (os.walk would not see past it)."""
    top = d / folder
    if folder in ("", "."):
        raise InputError("the model, index and encoder must each lie in a folder of the bundle", d / MANIFEST)
    if top.is_symlink():
        raise InputError("a link to a folder; a bundle must hold its files", top)
    for here, dirs, names in os.walk(top):
        for sub in dirs:
            if (Path(here) / sub).is_symlink():
                raise InputError("a link to a folder; a bundle must hold its files", Path(here) / sub)
        for n in names:
            rel = (Path(here) / n).relative_to(d).as_posix()
            if rel not in listed:
                raise InputError("not listed in the bundle manifest, so nothing vouches for it (remove it, "
                                 "or rebuild the bundle)", Path(here) / n)
