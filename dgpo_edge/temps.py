"""Temporary files and folders that a writer holds while it writes, and the sweep of those a killed
writer left behind.

Every artifact is written under a temporary name beside its target and renamed into place
(`jsonio.atomic_path`, `jsonio.atomic_dir`, `index compact`'s `.partial-*`, the work folders of
`export gguf` and `export onnx`: `work_dir`). Ctrl-C removes the
temporary; a kill -9 or a power cut cannot, and a GGUF export or a compaction leaves hundreds of
megabytes under a hidden name. So the writer holds an advisory `flock` on its temporary (a file
or a folder: the lock is on the inode, so it follows the rename), and the next writer of the same
target removes every temporary of that target that no process holds. The kernel drops a lock when
its process ends, however it ends, so "not held" means "its writer is gone".

Only names a writer here makes are swept (`.NAME.` + mkstemp's eight characters + `.tmp`, or
`.partial-` + eight), never a link, and never one changed in the last STALE_AFTER_S seconds: a
writer takes its lock just after it creates the temporary, and the age closes that gap. On a
system without `fcntl` (Windows) nothing is held and nothing is swept.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:   # Windows
    fcntl = None

STALE_AFTER_S = 60.0
_RANDOM = r"[a-z0-9_]{8}"   # what tempfile.mkstemp / mkdtemp put between prefix and suffix


def temp_pattern(prefix: str, suffix: str = "") -> re.Pattern[str]:
    """The names tempfile.mkstemp(prefix=, suffix=) and mkdtemp make."""
    return re.compile(re.escape(prefix) + _RANDOM + re.escape(suffix))


def make_readable(path: str | Path) -> None:
    """mkstemp creates files 0600; give them the mode a plain open() would (0666 & ~umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _open(path: str | Path) -> int:
    """A descriptor of the regular file or folder `path` to lock: never a link followed, and never
    blocking on a FIFO or touching a device that a name happens to match (OSError for those)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    if not (stat.S_ISREG(mode := os.fstat(fd).st_mode) or stat.S_ISDIR(mode)):
        os.close(fd)
        raise OSError(f"not a regular file or folder: {path}")
    return fd


def new(parent: str | Path, prefix: str, suffix: str = ".tmp", folder: bool = False) -> Path:
    """A new temporary file (empty) or folder `parent/PREFIX????????SUFFIX`, once the ones of the
    same prefix and suffix that killed writers left are swept. Hold it (`holding`) at once."""
    sweep(parent, temp_pattern(prefix, suffix))
    if folder:
        return Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=parent)
    os.close(fd)
    return Path(name)


@contextlib.contextmanager
def holding(path: str | Path) -> Iterator[None]:
    """Hold the lock on the temporary file or folder `path` for the block, so a sweep leaves it
    alone, and remove it if the block raises (unless the block renamed it away: then it is gone)."""
    fd = _open(path) if fcntl is not None else None
    try:
        # Just made by us, so nobody else holds it. A filesystem without flock (some network ones)
        # refuses: the write goes on unheld, and a sweep there cannot take the lock either, so it
        # never removes the temporary.
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    except BaseException:
        _remove(Path(path))
        raise
    finally:
        if fd is not None:
            os.close(fd)   # drops the lock


def _remove(path: Path) -> None:
    """Remove the file or folder `path` (a link itself, never what it points to); quietly gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[bool | None]:
    """Try to take `path`'s lock and hold it for the block. Yields True when taken (nobody else
    holds it: whoever wrote it is gone, and no one else settles it meanwhile), False when another
    open of it holds it (its writer is alive) or it was replaced since it was opened (a new
    writer's), None when it cannot be told (no such file, not a file, no flock here)."""
    if fcntl is None:
        yield None
        return
    try:
        fd = _open(path)
    except OSError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        except OSError:
            yield None
            return
        try:   # still the file under that name, not one removed (settled) and written anew since
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except OSError:
            same = False
        yield same
    finally:
        os.close(fd)   # (the lock taken, if it was, goes with it)


def held(path: str | Path) -> bool:
    """Whether another open of `path` holds its lock: a writer alive (False when it cannot be told)."""
    with locked(path) as free:
        return free is False


@contextlib.contextmanager
def held_file(path: Path, text: str) -> Iterator[None]:
    """Write `text` as `path` (beside it, then renamed, readable as open() makes files) and hold its
    lock from before it appears under that name until the block ends: a reader that settles by
    it (`locked`) leaves it alone meanwhile (the lock is on the inode: it follows the rename). The
    block may remove `path`. One a kill left before its rename is swept by the next."""
    tmp = new(path.parent, f".{path.name}.")
    with holding(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        make_readable(tmp)
        os.replace(tmp, path)
        yield


def _abandoned(path: Path, now: float) -> bool:
    """Whether no process holds `path`'s lock and it has not changed for STALE_AFTER_S."""
    try:
        if path.is_symlink() or now - path.stat().st_mtime < STALE_AFTER_S:
            return False
    except OSError:
        return False
    with locked(path) as free:
        return free is True


def sweep(folder: str | Path, pattern: re.Pattern[str]) -> list[str]:
    """Remove the entries of `folder` whose whole name matches `pattern` and that killed writers
    left (`_abandoned`); the names removed. Best effort: what cannot be listed or removed stays."""
    if fcntl is None:
        return []
    now = time.time()
    try:
        entries = [e for e in os.scandir(folder) if pattern.fullmatch(e.name)]
    except OSError:
        return []
    removed = []
    for entry in entries:
        path = Path(entry.path)
        if not _abandoned(path, now):
            continue
        _remove(path)
        if not os.path.lexists(path):   # (what cannot be removed stays)
            removed.append(entry.name)
    return removed


@contextlib.contextmanager
def work_dir(parent: str | Path, prefix: str) -> Iterator[Path]:
    """A temporary folder `parent/PREFIX????????.tmp` for the block (tempfile.TemporaryDirectory's
    place), held while the block runs and removed after it; the ones of `prefix` that killed
    writers left are swept first."""
    folder = new(parent, prefix, folder=True)   # (.tmp: a person's `.model.20261201` never matches)
    with holding(folder):
        yield folder
    _remove(folder)


__all__ = ["STALE_AFTER_S", "held", "held_file", "holding", "locked", "make_readable", "new", "sweep",
           "temp_pattern", "work_dir"]
