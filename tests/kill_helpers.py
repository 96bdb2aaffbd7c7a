"""kill -9 at a chosen step, for the tests of what an interrupted write leaves: a child process
whose os.replace ends it (os._exit: no cleanup, no finally) at its Nth call."""

from __future__ import annotations

#: Python source to put before the code a child runs: its os.replace exits 137 at call sys.argv[1].
KILL_AT_NTH_REPLACE = ("import os, sys\n"
                       "real, at, calls = os.replace, int(sys.argv[1]), [0]\n"
                       "def replace(src, dst, **kw):\n"
                       "    calls[0] += 1\n"
                       "    if calls[0] == at:\n"
                       "        os._exit(137)\n"
                       "    return real(src, dst, **kw)\n"
                       "os.replace = replace\n")


def killed_at(code: str, at: int) -> int:
    """Run `code` in a child whose `at`-th os.replace kills it: 137 when it did, 0 when the code ended first."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", KILL_AT_NTH_REPLACE + code, str(at)], capture_output=True, text=True)
    assert run.returncode in (0, 137), run.stderr
    return run.returncode
