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
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:   # Windows
    fcntl = None

STALE_AFTER_S = 60.0
_RANDOM = r"[a-z0-9_]{8}"   # what tempfile.mkstemp / mkdtemp put between prefix and suffix


def temp_pattern(prefix: str, suffix: str = "") -> re.Pattern[str]:
    """The names tempfile.mkstemp(prefix=, suffix=) and mkdtemp make."""
    return re.compile(re.escape(prefix) + _RANDOM + re.escape(suffix))


@contextlib.contextmanager
def holding(path: str | Path) -> Iterator[None]:
    """Hold the lock on the temporary file or folder `path` for the block: a sweep leaves it alone."""
    if fcntl is None:
        yield
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        # Just made by us, so nobody else holds it. A filesystem without flock (some network ones)
        # refuses: the write goes on unheld, and a sweep there cannot take the lock either, so it
        # never removes the temporary.
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)   # drops the lock


def _free(path: str | Path) -> bool | None:
    """Whether `path`'s lock could be taken (and was let go at once): True, nobody holds it; False,
    another open of it does (its writer is alive); None, it cannot be told (gone, no flock here)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    finally:
        os.close(fd)   # (the lock taken, if it was, goes with it)
    return True


def held(path: str | Path) -> bool:
    """Whether another open of `path` holds its lock: a writer alive (False when it cannot be told)."""
    return fcntl is not None and _free(path) is False


def lock_open_file(f: Any) -> None:
    """Take the lock of the open file `f` for as long as it stays open (a filesystem without flock:
    not at all, as `holding`)."""
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def _abandoned(path: Path, now: float) -> bool:
    """Whether no process holds `path`'s lock and it has not changed for STALE_AFTER_S."""
    try:
        if path.is_symlink() or now - path.stat().st_mtime < STALE_AFTER_S:
            return False
    except OSError:
        return False
    return _free(path) is True


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
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(entry.name)
    return removed


@contextlib.contextmanager
def work_dir(parent: str | Path, prefix: str) -> Iterator[Path]:
    """A temporary folder `parent/PREFIX????????` for the block (tempfile.TemporaryDirectory's
    place), held while the block runs and removed after it; the ones of `prefix` that killed
    writers left are swept first."""
    sweep(parent, temp_pattern(prefix))
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        with holding(folder):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["STALE_AFTER_S", "held", "holding", "lock_open_file", "sweep", "temp_pattern", "work_dir"]
