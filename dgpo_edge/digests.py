"""Verified digests: hash a bundle's or an index's file once per change, not on every load.

Opening a bundle or an index checks sizes (cheap), which misses a same-size
corruption: a flipped byte in `vectors.faiss` or a GGUF body. So the first
open after a file changes reads it whole and compares its sha256 with the
manifest; the result is remembered, keyed by the file's resolved path and its
size, mtime_ns, ctime_ns, inode and device, so later opens of the unchanged
file skip the hash. Any write changes mtime or ctime (ctime cannot be set back
by `touch`), which makes the next open hash again.

The cache is one small JSON file, `$XDG_CACHE_HOME/dgpo-edge/verified-digests.json`
(`~/.cache/...` when the variable is unset; `$DGPO_EDGE_DIGEST_CACHE` names
another file): {resolved path: [size, mtime_ns,
ctime_ns, inode, device, sha256]}, at most `MAX_ENTRIES` files, newest kept.
Deleting it is always safe: the next opens hash again. A cache that cannot be
read or written is ignored (then every open hashes).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from .jsonio import file_digest, write_json

CACHE_NAME = "verified-digests.json"
ENV_CACHE = "DGPO_EDGE_DIGEST_CACHE"
MAX_ENTRIES = 4096


def cache_path() -> Path:
    """`$DGPO_EDGE_DIGEST_CACHE` when set (tests point it at a temporary file), else the file in
    dgpo-edge's cache folder (the default bundle's, `bundle.default.cache_root`; core code does
    not import the bundle package, so the XDG rule is spelled here too)."""
    override = os.environ.get(ENV_CACHE)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or ""
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "dgpo-edge" / CACHE_NAME


def _key(path: Path) -> tuple[str, list[int]]:
    st = path.stat()
    return str(path.resolve()), [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _load() -> dict[str, list]:
    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(data: dict[str, list]) -> None:
    if len(data) > MAX_ENTRIES:
        data = dict(list(data.items())[-MAX_ENTRIES:])
    with contextlib.suppress(OSError):  # a read-only home: no cache, every open hashes
        cache_path().parent.mkdir(parents=True, exist_ok=True)
        write_json(cache_path(), data)


def matches(path: str | Path, sha256: str) -> bool:
    """Whether the file's sha256 is `sha256`: from the cache when the file is unchanged since
    it was last verified, else by reading it whole (and remembering a match)."""
    p = Path(path)
    name, stat = _key(p)
    entry = _load().get(name)
    if isinstance(entry, list) and entry[:-1] == stat and entry[-1] == sha256:
        return True
    if file_digest(p)["sha256"] != sha256:
        return False
    record_many([(p, sha256)])
    return True


def record_many(pairs: list[tuple[Path, str]]) -> None:
    """Remember that each file, as it is now, has its sha256 (the caller has just hashed or
    written it); one read and one write of the cache."""
    data = _load()
    for p, sha in pairs:
        with contextlib.suppress(OSError):
            name, stat = _key(Path(p))
            data.pop(name, None)  # re-inserted last: the newest entries survive the cap
            data[name] = [*stat, sha]
    _save(data)


__all__ = ["CACHE_NAME", "cache_path", "matches", "record_many"]
