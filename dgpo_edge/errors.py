"""The one error type for bad user input.

Every reader raises `InputError` naming the file (and line or row when there is
one); the CLI turns it into a single line on stderr and exit status 2.
"""

from __future__ import annotations

import errno
from pathlib import Path

#: OSError numbers that the system, not a bug, causes: a folder the user may not write, a read-only
#: or full disk, a name too long for the file system. The CLI reports them as bad input, one
#: `error:` line naming the file (cli.common.user_errors); any other OSError keeps its traceback.
REFUSED_BY_SYSTEM = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                               errno.ENAMETOOLONG})


class InputError(Exception):
    """Bad input: a missing file, a malformed line, a wrong field.

    `line` is 1-based for text files (jsonl) and the 0-based row index for
    tabular files (parquet), as `where` says.
    """

    def __init__(self, message: str, path: str | Path | None = None,
                 line: int | None = None, where: str = "line"):
        self.message = message
        self.path = None if path is None else str(path)
        self.line = line
        self.where = where
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.path is None:
            return self.message
        loc = self.path if self.line is None else f"{self.path}, {self.where} {self.line}"
        return f"{loc}: {self.message}"
