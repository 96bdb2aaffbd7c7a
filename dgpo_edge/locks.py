"""An exclusive, non-blocking lock on a folder, so two runs never write into one at once.

`index build` holds it on its work folder and `eval` on its output folder: two runs into
one place would each write every record (or trample each other's files). The lock is an
advisory `flock` on a small file inside the folder; the kernel drops it when the process
ends, even by kill -9, so a crash never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from .errors import InputError

LOCK_FILE = ".lock"


@contextlib.contextmanager
def folder_lock(folder: str | Path, busy: str, name: str = LOCK_FILE, where: str | Path | None = None
                ) -> Iterator[None]:
    """Hold the lock on `folder` for the block; InputError(`busy`, `where` or `folder`) if it is taken."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks here; writes are still atomic per file
        yield
        return
    with open(Path(folder) / name, "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(busy, folder if where is None else where) from None
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
