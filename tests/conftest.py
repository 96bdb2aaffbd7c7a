"""Shared pytest fixtures."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import pytest

# The read-only data folder lives beside the checkout: <parent>/shared.
SHARED_DIR = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """Path of ../shared, or skip the test when this checkout has none beside it."""
    if not SHARED_DIR.is_dir():
        pytest.skip(f"needs the shared data folder {SHARED_DIR} (absent)")
    return SHARED_DIR


@pytest.fixture(scope="session")
def qwen_dir(shared_dir: Path) -> Path:
    """The real Qwen2 tokenizer folder in ../shared, or skip."""
    d = shared_dir / "data" / "tokenizers" / "qwen2"
    if not (d / "tokenizer_config.json").is_file() or not (d / "tokenizer.json").is_file():
        pytest.skip(f"needs the Qwen tokenizer in {d} (absent)")
    return d


@pytest.fixture(scope="session", autouse=True)
def _digest_cache(tmp_path_factory) -> None:
    """Keep the verified-digest cache of bundles and indexes opened by tests out of ~/.cache."""
    os.environ["DGPO_EDGE_DIGEST_CACHE"] = str(tmp_path_factory.mktemp("digests") / "verified-digests.json")


@pytest.fixture(scope="session", autouse=True)
def _no_progress_lines() -> None:
    """A CLI step's progress line off a terminal comes after 2 s, and on a loaded machine a bad input
    found after heavy imports can take that long: the error tests read one line, so none in tests
    (tests/test_cli_options.py turns it on to test it)."""
    os.environ["DGPO_EDGE_PROGRESS_AFTER"] = "inf"


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_as_a_terminal_sends_it():
    """A shell without job control starts a background job (`make test &`, `nohup make test &` in a
    script) with SIGINT ignored, and Python then leaves it ignored: the Ctrl-C tests' presses (SIGINT
    to this process, or to a child, which inherits the ignoring) did nothing, and 7 of them failed.
    They test a terminal's Ctrl-C, so the suite gives SIGINT the handler a terminal's Python has."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def bench_script():
    """Load a script of bench/ as a module (they are scripts, not a package): bench_script("rollout")."""
    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load
