"""bench/provenance.py: the commit a benchmark's results record, also on a GPU machine whose copy of
the checkout has no git (the lease exports COMMIT there)."""

from __future__ import annotations

import re
import subprocess


def test_commit_is_commit_from_the_environment_first(bench_script, monkeypatch):
    provenance = bench_script("provenance")
    monkeypatch.setenv("COMMIT", "f7b6397")
    assert provenance.commit() == "f7b6397"


def test_commit_falls_back_to_git_and_then_to_nothing(bench_script, monkeypatch):
    provenance = bench_script("provenance")
    monkeypatch.delenv("COMMIT", raising=False)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=provenance.ROOT, capture_output=True,
                          text=True, check=False)
    if head.returncode == 0:   # a checkout (CI's is one)
        assert provenance.commit() == head.stdout.strip() and re.fullmatch(r"[0-9a-f]{7,}", provenance.commit())
    monkeypatch.setenv("PATH", "/nonexistent")   # as on a machine without git
    assert provenance.commit() == ""
