"""Atomic file writes and line-numbered JSON-lines reading (the one JSONL reader: bounded lines, BOM).

Every artifact is written to a temporary file in the target's directory and
renamed into place, so a crash never leaves a half-written file behind; the next write of the
same target removes the temporary that a killed one left (`temps`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from . import temps
from .errors import REFUSED_BY_SYSTEM, InputError


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temp path next to `path` for a writer that wants a file name (faiss, sqlite).

    The temp file is fsynced and renamed onto `path` when the block succeeds,
    and removed when it raises.
    """
    path = Path(path)
    if not path.exists():   # a file above it (`--out notes.txt/m.gguf`): no file can be made there
        check_folder_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temps.new(path.parent, f".{path.name}.")   # (what killed writes of `path` left: swept)
    with temps.holding(tmp):   # (removed if the block raises)
        make_readable(tmp)
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[TextIO]:
    """Open a temp file next to `path`; rename it onto `path` only on success."""
    with atomic_path(path) as tmp, open(tmp, mode, encoding=None if "b" in mode else "utf-8") as f:
        yield f
        f.flush()


def replace_dir(src: str | Path, dst: str | Path) -> None:
    """Rename the finished folder `src` onto `dst`, replacing an existing `dst`.

    The old `dst` is first renamed to `.{name}.old` beside it and deleted only once `src` is in
    place. No two renames are atomic, so they are journalled (`.{name}.dgpo-edge-swap` beside `dst`,
    written first and removed last): an exception between them (Ctrl-C, a failed rename) puts the
    old folder back before it is raised, and after a kill the next `settle_dir` (every writer's
    `check_replaceable`, this function, readers of worlds and bundles) does. So `dst` holds the old
    folder or the new one, whole; a `.{name}.old` without the journal is not dgpo-edge's to delete.
    """
    src, dst = Path(src), _absolute(dst)
    settle_dir(dst)
    _check_not_busy(dst)
    if dst.is_dir() and not any(dst.iterdir()):
        _fill(src, dst)
        return
    if not dst.exists():   # nothing to keep aside
        os.replace(src, dst)
        return
    check_aside_free(dst)
    with _journalled(dst, {"replacing": aside(dst).name}):
        os.replace(dst, aside(dst))
        os.replace(src, dst)


def _fill(src: Path, dst: Path) -> None:
    """Move the files of `src` into the empty folder `dst` (`--out .` in a new folder), which is
    filled, not replaced: a shell inside it would be left in a deleted folder. The journal lists
    them, so an interruption part way removes those moved in (`settle_dir`): `dst` is empty again,
    or holds them all. The manifest goes in last."""
    children = sorted(src.iterdir(), key=lambda p: p.name == "manifest.json")
    with _journalled(dst, {"filling": [child.name for child in children]}):
        for child in children:
            os.replace(child, dst / child.name)
    os.rmdir(src)


# Beside a folder NAME while replace_dir puts another in its place; its name is dgpo-edge's, so
# whoever finds it knows that `.NAME.old`, or the files it lists in NAME, are dgpo-edge's too.
SWAP_SUFFIX = ".dgpo-edge-swap"


def aside(dst: Path) -> Path:
    """Where replace_dir keeps the old `dst` until the new one is in place."""
    return dst.with_name(f".{dst.name}.old")


def _journal(dst: Path) -> Path:
    return dst.with_name(f".{dst.name}{SWAP_SUFFIX}")


def _absolute(path: str | Path) -> Path:
    """`path` made absolute, `.` and `..` resolved (`--out .` has no name to put the journal beside),
    links not followed: the link itself is what is replaced."""
    return Path(os.path.abspath(path))


@contextlib.contextmanager
def _journalled(dst: Path, entry: dict[str, Any]) -> Iterator[None]:
    """Write the journal of `dst`, run the block (its renames), then settle, which removes the
    journal (or, failing to delete `.NAME.old`, leaves it for the next run). When the block raises,
    the settling runs first all the same (the old folder put back, or the new one kept when it was
    already in), and the journal stays only when that fails too (a disk gone away). Fsynced before
    any rename: after a power loss no rename it covers is kept without it. Held (`temps`) from
    before it appears under its name until it is removed, so a reader that settles (`settle_dir`)
    leaves a live replacing alone; a killed one's lock is gone with its process."""
    text = json.dumps({**entry, "made_by": f"dgpo-edge: {dst.name} is being replaced; the next dgpo-edge "
                       "command that writes or reads it puts the old folder back, or keeps the new one"})
    with temps.held_file(_journal(dst), text):
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                _settle(dst)
            raise
        with contextlib.suppress(OSError):   # the new folder is in; `.NAME.old` left for the next run to delete
            _settle(dst)


def settle_dir(dst: str | Path) -> None:
    """Settle what an interrupted `replace_dir` of `dst` left, by its journal (none: nothing to do),
    so that `dst` holds the old folder or the new one, whole. Replacing: `.NAME.old` is put back
    when `dst` is missing (killed between the two renames), deleted when `dst` is there (the new
    folder, or the old one not yet moved). Filling: the files moved in are removed, unless all of
    them are (a folder filled part way has no manifest, or not all the files its manifest lists).
    Nothing else is touched, and nothing at all while the journal's writer is alive (it holds the
    journal: another command is replacing `dst` right now). OSError when that fails (the journal
    then stays)."""
    dst = _absolute(dst)
    with temps.locked(_journal(dst)) as free:
        if free is not False:   # held while it settles (None: no journal, or no flock here, as before)
            _settle(dst)


def _settle(dst: Path) -> None:
    """`settle_dir`'s work, by whoever may do it (the journal's writer, or anyone once it is gone)."""
    journal = _journal(dst)
    try:
        entry = json.loads(journal.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):   # no journal; or a path under a file, which callers name
        return
    except ValueError:   # torn: from a dgpo-edge that wrote it in place, killed before the first rename
        entry = {}
    if isinstance(entry, dict) and "replacing" in entry:
        _put_back(dst)
    elif isinstance(entry, dict) and _plain_names(entry.get("filling")):
        _unfill(dst, entry["filling"])
    journal.unlink()


def _put_back(dst: Path) -> None:
    """`.NAME.old` back at `dst` when `dst` is missing, else deleted."""
    old = aside(dst)
    if not _there(dst):
        if _there(old):
            os.replace(old, dst)
        return
    shutil.rmtree(old, ignore_errors=True)
    if _there(old):   # the journal stays: it still vouches for what is left of it
        raise OSError(errno.ENOTEMPTY, "could not be removed", str(old))


def _unfill(dst: Path, names: list[str]) -> None:
    """Remove the files of a fill that stopped part way (all of them in: the new folder is whole)."""
    moved = [dst / name for name in names if _there(dst / name)]
    if len(moved) == len(names):
        return
    for path in moved:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _plain_names(names: Any) -> bool:
    """A journal's list of file names (a hand-edited one naming `..` or a path is not acted on)."""
    return isinstance(names, list) and all(isinstance(n, str) and n not in ("", ".", "..") and "/" not in n
                                           for n in names)


def _there(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _check_not_busy(dst: Path) -> None:
    """Refuse while another process replaces `dst` (it holds the journal): between its two renames
    `dst` is missing, and a second writer's rename there would make the first one's fail."""
    if temps.held(_journal(dst)):
        raise InputError(f"another dgpo-edge command is replacing {dst.name} right now; run this again once it "
                         "is done", dst)


def check_aside_free(dst: str | Path) -> None:
    """Refuse to replace `dst` while `.NAME.old` holds something no journal vouches for (a person's
    backup, or what a dgpo-edge older than the journal left): the old `dst` is renamed there."""
    dst = _absolute(dst)
    _check_not_busy(dst)
    if _there(aside(dst)):
        raise InputError(f"is in the way: {dst.name} is renamed there while it is replaced, and no "
                         f"{_journal(dst).name} beside it says dgpo-edge left it; move it away or remove it",
                         aside(dst))


#: A bundle's manifest "format" (bundle.core.FORMAT), kept here, below both, so that retrieval can
#: tell a bundle given as --index without importing bundle (which imports retrieval).
BUNDLE_FORMAT = "dgpo-edge-bundle"


def our_manifest(out: Path) -> dict | None:
    """The manifest.json of a folder this program wrote ("produced_by": "dgpo-edge ..."), else None."""
    try:
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(manifest, dict) and str(manifest.get("produced_by", "")).startswith("dgpo-edge ")
    return manifest if ok else None


def ours(out: Path) -> bool:
    return our_manifest(out) is not None


def folder_holding(path: str | Path, kind: Callable[[Path], bool]) -> Path | None:
    """The nearest folder above `path` (links followed) that `kind` recognises, or None. `path`
    itself is not inside itself: a command that replaces a bundle or world whole replaces its
    manifest with it."""
    return next((folder for folder in Path(path).resolve().parents if kind(folder)), None)


def is_bundle(folder: Path) -> bool:
    """A folder whose manifest.json is a bundle's (any writer: a hand-made one lists its files too)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == BUNDLE_FORMAT


def bundle_holding(path: str | Path) -> Path | None:
    """The bundle folder `path` lies in (a folder above it, links followed, with a bundle's
    manifest.json), or None. The bundle itself is not inside one: `export bundle --overwrite`
    replaces it whole, manifest and all."""
    return folder_holding(path, is_bundle)


def check_outside_bundle(out: str | Path) -> None:
    """Refuse an output inside a bundle (`--out BUNDLE/model/x.gguf`): the bundle's manifest lists
    the size and sha256 of every file in it, so a file replaced or added there leaves the bundle
    failing its own check (or, added, one `export bundle --overwrite` refuses to replace)."""
    bundle = bundle_holding(out)
    if bundle is not None:
        raise InputError(f"is inside the bundle {bundle}, whose manifest lists every file in it with its sha256; "
                         "write elsewhere (and make a new bundle with `dgpo-edge export bundle`)", out)


def check_replaceable(out: Path, mine: Callable[[Path], bool] = ours, what: str = "a folder dgpo-edge wrote") -> None:
    """Refuse a file, or a non-empty folder that `mine` does not recognise: an --out given by
    mistake (a home folder, a notes folder) must never be replaced, with everything in it. What an
    interrupted replacing of `out` left is settled first (`settle_dir`): the old folder or the new one."""
    settle(out)
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", out)
    check_folder_path(out)   # a file above it (`--out notes.txt/run`): no folder can be made there
    check_outside_bundle(out)
    if not (out.is_dir() and any(out.iterdir())):
        return   # new or empty: filled in place (replace_dir)
    if not mine(out):
        raise InputError(f"exists and is not {what}; refusing to replace it", out)
    if Path.cwd().resolve().is_relative_to(out.resolve()):
        raise InputError("is the folder this command runs in, and it is replaced whole, which would leave "
                         "the shell in a deleted folder: run the command from another folder", out)
    check_aside_free(out)


def settle(out: str | Path) -> None:
    """`settle_dir` for a command about to write or read `out`: a failure is one error line."""
    try:
        settle_dir(out)
    except OSError as e:
        raise InputError(f"could not finish an interrupted replacing of it ({e.strerror or e})", out) from None


def check_folder_path(out: Path, name: str = "the output path") -> None:
    """Refuse a file (or a link to nothing) where the output folder `out` is to be, or where a folder
    above it is (`--out notes.txt/run`): making the folder would fail there. Names the file."""
    for path in (out, *out.parents):
        if path.is_dir():
            return
        if _there(path):
            raise InputError(f"{name} exists and is not a folder" if path == out else
                             f"is not a folder, so {name} {out} cannot be made in it", path)


def check_holds_only(out: Path, allowed: Iterable[str], what: str, fix: str,
                     first: tuple[str, str] | None = None, alone: Iterable[str] = (),
                     hidden: bool = False) -> set[str]:
    """Refuse a file (`check_folder_path`), or a folder holding a visible name outside `allowed`: an
    output folder given by mistake, whose files a writer would mix with its own or replace. Returns
    the names checked (the visible ones, or with `hidden` all).
    Hidden names are left alone (a lock, a killed write's .NAME.*.tmp, a Finder .DS_Store), unless
    `hidden`: for a folder replaced whole, where a .git would go with it.
    `first` = (NAME, WRITER): the file WRITER writes before any other, so the others (but those in
    `alone`) without it are someone else's files of the same names, refused too."""
    check_folder_path(out)
    check_outside_bundle(out)
    names = {p.name for p in out.iterdir() if hidden or not p.name.startswith(".")} if out.is_dir() else set()
    foreign = sorted(names - set(allowed) - {".DS_Store"})
    if foreign:
        more = ", ..." if len(foreign) > 3 else ""
        raise InputError(f"holds files that are not {what} ({', '.join(foreign[:3])}{more}); {fix}", out)
    if first is not None:
        name, writer = first
        theirs = sorted(names - {name} - set(alone))
        if theirs and name not in names:
            raise InputError(f"holds {', '.join(theirs)} without the {name} {writer} writes first; refusing "
                             "to replace them", out)
    return names


def same_path(a: str | Path, b: str | Path) -> bool:
    """Whether `a` and `b` name one file or folder: by path, or (both existing) by samefile, which
    also catches a case-insensitive file system's other spelling (m and M on macOS)."""
    a, b = Path(a), Path(b)
    return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))


def visible_files(folder: Path) -> set[str]:
    """The files under `folder` (posix paths relative to it), hidden ones (.DS_Store) left out."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")}


@contextlib.contextmanager
def making_folder(out: str | Path) -> Iterator[None]:
    """Around the making of the output folder `out` (or of a folder in it or beside it): any OSError
    there is bad input, one InputError naming `out` as given. Not only REFUSED_BY_SYSTEM's errnos
    (a read-only disk, no permission): a pseudo-filesystem such as /proc answers mkdir with ENOENT
    or EACCES as it likes, and a path the system will not make is never a bug of this program."""
    try:
        yield
    except OSError as e:
        raise InputError(f"cannot be written ({e.strerror or type(e).__name__})", out) from None


@contextlib.contextmanager
def atomic_dir(out: str | Path, mine: Callable[[Path], bool] = ours,
               what: str = "a folder dgpo-edge wrote") -> Iterator[Path]:
    """A temp directory beside `out`, renamed onto it (replace_dir) when the block succeeds.

    An existing `out` is replaced only after the new one is complete; on error the temp dir is
    removed and `out` is left as it was. A non-empty `out` that `mine` does not recognise (by
    default: no dgpo-edge manifest.json) is refused before anything is written.
    """
    out = Path(out).absolute()   # `--out .` has no name to put a temp folder beside
    check_replaceable(out, mine, what)
    with making_folder(out):   # named as given, not as the temp folder
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = temps.new(out.parent, f".{out.name}.", folder=True)   # (killed builds' swept first)
    try:
        with temps.holding(tmp):   # (removed if the block raises)
            yield tmp
            os.chmod(tmp, 0o755)
            for f in tmp.rglob("*"):  # some writers create 0600 files (mkstemp); be like open()
                if f.is_file():
                    make_readable(f)
            replace_dir(tmp, out)
    except BaseException as e:
        if isinstance(e, OSError) and e.errno in REFUSED_BY_SYSTEM:   # a full disk: --out, not a temp file
            raise InputError(f"could not be written ({e.strerror}); nothing was written", out) from None
        raise


make_readable = temps.make_readable   # mkstemp's 0600 made what a plain open() makes


def write_text(path: str | Path, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    """Write rows atomically, one JSON object per line; returns the count."""
    n = 0
    with atomic_open(path) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def file_digest(path: str | Path, block: int = 8 << 20) -> dict[str, Any]:
    """{"bytes", "sha256"} of a file, hashed in 8 MiB blocks (stores can be gigabytes)."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
            n += len(chunk)
    return {"bytes": n, "sha256": h.hexdigest()}


def require_file(path: str | Path) -> Path:
    """`path` as a Path if it is a readable file; else InputError saying what it is instead."""
    path = Path(path)
    if path.is_dir():
        raise InputError("is a directory, expected a file", path)
    if not path.is_file():
        raise InputError("no such file", path)
    return path


# A JSON-lines record longer than this is refused rather than read: a file with no newline (a
# binary or a mistaken path) would otherwise be read whole into memory before failing to parse.
# Far above any real record: corpus passages, trajectories and predictions are kilobytes.
MAX_LINE_BYTES = 16 << 20
BOM = b"\xef\xbb\xbf"


def iter_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """Yield (1-based line number, raw bytes with their newline) in bounded memory.

    The last line has no newline when the file does not end with one (a torn write). A
    UTF-8 byte-order mark at the start of the file is dropped. A line longer than
    MAX_LINE_BYTES raises InputError naming the file and line, after reading at most
    that much of it.
    """
    path = require_file(path)
    limit = MAX_LINE_BYTES
    with open(path, "rb") as f:
        lineno = 0
        while raw := f.readline(limit + 1):
            lineno += 1
            if lineno == 1 and raw.startswith(BOM):
                raw = raw[len(BOM):]
            if len(raw) > limit and not raw.endswith(b"\n"):
                raise InputError(f"line longer than {limit:,} bytes: not a JSON-lines record", path, lineno)
            yield lineno, raw


def cut_torn_last_line(path: str | Path) -> int:
    """Truncate a last line that lacks its newline (an append cut short by a crash); the bytes cut.

    Read in bounded lines like every reader: a "torn line" longer than MAX_LINE_BYTES is no
    torn record but someone else's file, refused (InputError) rather than cut to nothing.
    """
    path = Path(path)
    torn = b""
    for _, raw in iter_lines(path):
        torn = b"" if raw.endswith(b"\n") else raw
    if torn:
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size - len(torn))
    return len(torn)


def parse_json_line(raw: bytes, path: Path, lineno: int) -> dict | None:
    """The JSON object on one line, None for a blank line; InputError naming file and line otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 ({e.reason} at byte {e.start})", path, lineno) from None
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON: {e.msg} (column {e.colno})", path, lineno) from None
    if not isinstance(obj, dict):
        raise InputError(f"expected a JSON object, got {type(obj).__name__}", path, lineno)
    return obj


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield (1-based line number, object) for each non-blank line.

    Raises InputError naming the file and line for a missing file, bytes that
    are not UTF-8, malformed JSON, a line that is not a JSON object, or a line
    longer than MAX_LINE_BYTES. A UTF-8 byte-order mark at the start is accepted.
    """
    path = Path(path)
    for lineno, raw in iter_lines(path):
        obj = parse_json_line(raw, path, lineno)
        if obj is not None:
            yield lineno, obj
