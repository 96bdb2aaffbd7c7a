"""The commit a benchmark ran at, for the `commit` field of its results.

A GPU machine gets a copy of the checkout without .git, so git cannot say there: start a lease's work
with COMMIT exported (bench/lease/prepare.sh), and it wins. Here, git's short HEAD; "" when neither
is known.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    if os.environ.get("COMMIT"):
        return os.environ["COMMIT"]
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=30, check=False)
    except OSError:   # no git on this machine
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""
