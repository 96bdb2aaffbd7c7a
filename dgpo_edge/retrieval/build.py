"""Build a search index from a corpus: passage store, embeddings, FAISS; resumable.

The engine behind `dgpo-edge index build CORPUS --out DIR` (docs/retrieval.md;
resumable and atomic as docs/architecture.md#conventions asks).
`build_index` writes into DIR:

- `store.sqlite`: the passage store (`PassageStore`), row i = i-th corpus passage;
- `vectors.faiss`: Flat or IVF-PQ (optionally OPQ) over L2-normalised vectors,
  inner product, FAISS id i = store row i (absent for `kind="bm25"`);
- `manifest.json`: `kind`, `encoder` (EncoderSpec dict, null for bm25), `count`,
  `dim`, `metric`, `params` {factory, nlist, nprobe, pq, pq_bits, opq, chunk,
  train_points, trained_on (passages when built or retrained)}, `store` {bm25,
  compression}, `source` {corpus, format, files, bytes, sha256, and for a
  folder `documents`: read, read_by_type, passages, skipped [{path, reason}]},
  `produced_by`, `created`, and `files` {name: {bytes, sha256}}.
  The same layout and writer (`compact.write_manifest`) as `dgpo-edge index
  compact`, so `open_index` reads either.

Kinds: `flat` (exact), `ivfpq` (compact; sizing rules in docs/retrieval.md), `hybrid`
(ivfpq vectors + BM25, fused at query time), `bm25` (store only, no encoder).

BM25 is built for every kind by default (`bm25=True`): it costs seconds, not
minutes, next to embedding, it lets `open_index(..., kind="bm25"/"hybrid")`
use a dense index without a rebuild, and it is the search that works when no
encoder is installed. It does roughly double the store on wiki-style passages
(778 KB against 373 KB on the 1,000-passage wiki-18 sample), so `bm25=False`
drops it for flat/ivfpq; the export step makes its own size trade-offs.

Stages, each reported as `progress(stage, done, total)` (total None when
unknown): "fingerprint" (corpus bytes hashed), "store" (passages stored),
"embed" (passages embedded, including chunks found done), "train" (0/1, 1/1),
"add" (vectors added), "write" (0/1, 1/1).

Resuming. Work happens in `DIR/.work/`, marked as the tool's by the file
`.work/.dgpo-edge-work`; a `.work` without that marker (someone else's files,
or a link) is refused and never emptied; an empty one (or one holding only
the lock file) is adopted. The store is built there first (one
streaming pass, `PassageStore.build`), then passages are read back from it
`chunk` rows at a time, embedded, and saved as `emb-{i:06d}.npy` (written
atomically, normalised float32). `state.json` records the corpus fingerprint
(sha256 of every corpus file's name, size and bytes) and the embedding key
(corpus fingerprint + passage count + encoder spec + chunk size). A rerun
after a crash (even kill -9) reuses the store when the corpus fingerprint
matches, and every chunk file whose key matches and whose shape is exactly
(rows of that chunk, dim); a changed corpus empties `.work`, a changed
encoder or chunk size drops the chunk files. FAISS is then trained on an
evenly spaced sample and filled from the memory-mapped chunk files, so no
step holds the corpus or all its vectors in memory (the training sample
excepted, see `dense`).

Atomicity: final files are renamed into DIR only at the end, an old
manifest first removed and the new one renamed in last, so a manifest is
only ever beside the files it describes; an exception during those renames
finishes them, and a kill leaves a marker the rerun honours
(`compact.install_files`). An existing index in DIR is refused
unless `overwrite=True`. Bad corpus input (malformed line, non-UTF-8, empty
corpus) raises InputError naming file and line and leaves nothing behind
(`.work` and DIR itself, when this call created it, are removed); other
failures (a crash, Ctrl-C, an encoder error) keep `.work` for the rerun.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__, digests, jsonio
from ..errors import InputError
from ..locks import LOCK_FILE, folder_lock
from .base import Encoder, EncoderSpec
from .compact import (INDEX_FILE, MANIFEST_FILE, STORE_FILE, SWAP_MARKER, check_index_out, file_digest,
                      install_files, settle_index, write_manifest)
from .corpus import DEFAULT_WORDS, _text_files, detect_format, iter_corpus, size_hint
from .documents import DocReport
from .store import PassageStore, write_documents

KINDS = ("flat", "ivfpq", "bm25", "hybrid")
WORK_DIR = ".work"
WORK_MARKER = ".dgpo-edge-work"
STATE_FILE = "state.json"
STATE_VERSION = 1

UNKNOWN_COUNT = 1 << 40  # stands for "any number of passages" in early option checks
Progress = Callable[[str, int, "int | None"], None]


# --- the build ------------------------------------------------------------------------------

def build_index(corpus: str | Path, out: str | Path, encoder_spec: str | Encoder = "minilm-int8",
                kind: str = "ivfpq", nlist: int | None = None, pq: int | str | None = None,
                opq: bool | None = None, nprobe: int | None = None, chunk: int = 1024,
                threads: int | None = None, progress: Progress | None = None, *,
                overwrite: bool = False, bm25: bool = True, batch_size: int = 32) -> dict[str, Any]:
    """Build an index of `corpus` in `out`; return the manifest (see the module docstring).

    `encoder_spec`: a `load_encoder` name or model directory, or an Encoder
    (ignored for bm25). `nlist`/`pq`/`opq`/`nprobe`: IVF-PQ overrides (`dense`
    documents the defaults; `pq` is code bytes or "MxBITS"). `chunk`: passages
    per embedding chunk file (the unit of resumption). `threads`: encoder and
    FAISS threads (None: their defaults). `batch_size`: encoder batch size.
    """
    corpus, out = Path(corpus), Path(out)
    emit = progress or (lambda stage, done, total: None)
    if kind not in KINDS:
        raise InputError(f"unknown index kind {kind!r}: expected one of {', '.join(KINDS)}")
    if chunk < 1:
        raise InputError(f"--chunk must be >= 1, got {chunk}")
    if threads is not None and threads < 1:
        raise InputError(f"--threads must be >= 1, got {threads}")
    if batch_size < 1:
        raise InputError(f"batch size must be >= 1, got {batch_size}")
    if kind in ("bm25", "hybrid") and not bm25:
        raise InputError(f"--kind {kind} needs the BM25 index; drop --no-bm25")
    if kind == "bm25" and (nlist is not None or pq is not None or opq or nprobe is not None):
        raise InputError("--nlist, --pq, --opq and --nprobe apply to dense indexes, not --kind bm25")
    fmt = detect_format(corpus)  # a missing or unknown corpus fails before anything is created
    # a file, or a folder of anything but an index, is refused; an index without --overwrite too
    check_index_out(out, overwrite, own=(WORK_DIR,),
                    hint="; or `dgpo-edge index update` to bring it up to date" if fmt == "text" else "")

    encoder = None
    if kind != "bm25":
        from . import dense

        encoder = _encoder(encoder_spec, threads)
        # Syntax and divisibility of nlist/pq/opq/nprobe, before hours of work (n is not known yet).
        # The passage count is not known yet: check with an unbounded one (the
        # real count is checked again once the store is built).
        dense.plan_index(kind, encoder.spec.dim, UNKNOWN_COUNT, nlist=nlist, pq=pq, opq=opq, nprobe=nprobe)

    created = not out.exists()
    work = claim_work_folder(out)
    with _locked(work):
        state = _open_state(work, _fingerprint(corpus, fmt, work, out, created, emit))
        store = _ensure_store(corpus, work, state, bm25, emit, created, out)
        try:
            count, compression = len(store), store.compression
            plan, dim = None, None
            if encoder is not None:
                # Options that depend on the passage count (--opq needs n >= dim), before embedding.
                dim = encoder.spec.dim
                plan = dense.plan_index(kind, dim, count, nlist=nlist, pq=pq, opq=opq, nprobe=nprobe)
                _embed(store, encoder, work, state, chunk, batch_size, emit)
                _build_vectors(work, count, dim, chunk, plan, threads, emit)
        finally:
            store.close()
        emit("write", 0, 1)
        manifest = _finish(out, work, state, kind, encoder, count, dim, plan, chunk, bm25, compression)
        emit("write", 1, 1)
    # Just hashed into the manifest: the first open need not read every byte again.
    digests.record_many([(out / name, entry["sha256"]) for name, entry in manifest["files"].items()])
    shutil.rmtree(work, ignore_errors=True)
    return manifest


def _encoder(spec: str | Encoder, threads: int | None) -> Encoder:
    if isinstance(spec, Encoder):
        return spec
    from .encoders import load_encoder

    return load_encoder(spec, threads=threads)


# --- stage 0: the work folder and its state ---------------------------------------------------------

def corpus_fingerprint(corpus: str | Path, fmt: str | None = None,
                       progress: Progress | None = None) -> dict[str, Any]:
    """sha256 over the names, sizes and sha256s of the files `iter_corpus` reads, in its order.

    The files: the jsonl file, a FactbookQA folder's corpus.jsonl, or every
    readable document of a folder (hidden ones skipped, as the reader does).
    Hashing each file on its own lets `index update` recompute the digest from
    the per-file digests it keeps, without rereading unchanged files.
    """
    corpus = Path(corpus)
    fmt = fmt or detect_format(corpus)
    if fmt == "jsonl":
        files = [(corpus.name, corpus)]
    elif fmt == "factbook":
        files = [("corpus.jsonl", corpus / "corpus.jsonl")]
    else:
        files = [(corpus.name, corpus)] if corpus.is_file() else _text_files(corpus)
    sizes = [_size(f, fmt) for _, f in files]
    total, done = sum(size or 0 for size in sizes), 0
    entries = []
    for (rel, path), size in zip(files, sizes):
        if size is None:
            continue
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while block := f.read(8 << 20):
                    h.update(block)
                    done += len(block)
                    if progress is not None:
                        progress("fingerprint", done, total)
        except OSError as e:
            _unreadable(path, fmt, e)
            continue   # a note the reader will record as skipped, with the reason; not in the digest
        entries.append((rel, size, h.hexdigest()))
    return source_fingerprint(source_name(corpus), fmt, entries)


def _size(path: Path, fmt: str) -> int | None:
    """A file's size; None for a note that cannot be read (it is skipped, as `read_document` does)."""
    try:
        return path.stat().st_size
    except OSError as e:
        _unreadable(path, fmt, e)
        return None


def _unreadable(path: Path, fmt: str, e: OSError) -> None:
    """A jsonl corpus that cannot be read is an error naming it; one note of a folder is only skipped."""
    if fmt != "text":
        raise InputError(f"cannot read it ({e.strerror or type(e).__name__})", path) from None


def source_name(path: Path) -> str:
    """The name the manifest keeps for the corpus (`index update` compares it): as given, but the
    folder's own name for "." or "..", which name no folder."""
    return path.name if path.name not in ("", "..") else path.resolve().name


def source_fingerprint(name: str, fmt: str, entries: list[tuple[str, int, str]]) -> dict[str, Any]:
    """The manifest's `source` digest from (relative path, size, sha256) per file, in path order."""
    h = hashlib.sha256(f"{fmt}\0{DEFAULT_WORDS}\0".encode())
    for rel, size, digest in entries:
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + struct.pack("<Q", size) + bytes.fromhex(digest))
    return {"name": name, "format": fmt, "words": DEFAULT_WORDS, "files": len(entries),
            "bytes": sum(size for _, size, _ in entries), "sha256": h.hexdigest()}


def claim_work_folder(out: Path) -> Path:
    """`out/.work`, made and marked here, or found marked (or empty); InputError otherwise.

    The work folder is emptied when the corpus changes and removed when the build ends, so
    only a folder this tool made may be used: a `.work` holding anyone else's files (or a
    link to another folder) is refused, with or without --overwrite.
    """
    work = out / WORK_DIR
    with jsonio.making_folder(out):   # /proc/x, a read-only disk: an error naming --out
        out.mkdir(parents=True, exist_ok=True)
        try:
            work.mkdir()
        except FileExistsError:
            # ours: marked, or holding nothing but a lock file (nothing of anyone's to lose)
            if work.is_symlink() or not work.is_dir() or not (
                    (work / WORK_MARKER).is_file() or {p.name for p in work.iterdir()} <= {LOCK_FILE}):
                raise InputError(f"dgpo-edge did not make this folder (no {WORK_MARKER} marker) and a build "
                                 "would empty it; move it out of the way", work) from None
        (work / WORK_MARKER).write_text("made by `dgpo-edge index build`: its resumable work, removed when "
                                        "the build ends\n", encoding="utf-8")
    return work


def _discard_work(work: Path, out: Path, created: bool) -> None:
    """After bad input: remove the work folder, and `out` when this build made it (it is empty then)."""
    shutil.rmtree(work, ignore_errors=True)
    if created:
        with contextlib.suppress(OSError):
            out.rmdir()


def _fingerprint(corpus: Path, fmt: str, work: Path, out: Path, created: bool,
                 emit: Progress) -> dict[str, Any]:
    """`corpus_fingerprint`, leaving no trace when the corpus cannot be read (a jsonl file without
    read permission): the folders made for the build would only stand in the way. A work folder
    that already holds an interrupted build's work is kept: the error may pass (a network folder
    that is away), and that work can be hours of embeddings."""
    try:
        return corpus_fingerprint(corpus, fmt, emit)
    except InputError:
        if {p.name for p in work.iterdir()} <= {WORK_MARKER, LOCK_FILE}:
            _discard_work(work, out, created)
        raise


def _open_state(work: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The work folder's state, emptied first when it belongs to another corpus (or is unreadable)."""
    try:
        state = json.loads((work / STATE_FILE).read_text(encoding="utf-8"))
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            state = None
    except (OSError, ValueError):
        state = None
    if state is None or state.get("corpus") != fingerprint:
        _clear(work)
        state = {"version": STATE_VERSION, "corpus": fingerprint, "store": None, "embed_key": None}
        _save_state(work, state)
    return state


def _save_state(work: Path, state: dict[str, Any]) -> None:
    jsonio.write_json(work / STATE_FILE, state)


def _clear(work: Path, pattern: str = "*") -> None:
    """Remove what `pattern` matches in the work folder (never the lock file or the marker)."""
    for p in work.glob(pattern):
        if p.name in (LOCK_FILE, WORK_MARKER):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def _locked(work: Path) -> contextlib.AbstractContextManager[None]:
    """Hold an exclusive lock on the work folder: two builds into one folder would trample each other."""
    return folder_lock(work, "another build is writing into this folder", LOCK_FILE, where=work.parent)


# --- stage 1: the passage store ---------------------------------------------------------------------

def _ensure_store(corpus: Path, work: Path, state: dict[str, Any], bm25: bool, emit: Progress,
                  created: bool, out: Path) -> PassageStore:
    """The work folder's store, reused when complete and built with the wanted BM25 setting."""
    path = work / STORE_FILE
    info = state.get("store")
    if info and info.get("bm25") == bm25 and path.is_file() and path.stat().st_size == info.get("bytes"):
        with contextlib.suppress(InputError):
            store = PassageStore(path)
            if len(store) == info.get("count"):
                emit("store", len(store), len(store))
                return store
            store.close()
    state["store"] = None
    _save_state(work, state)
    _clear(work, f".{STORE_FILE}.*")  # a temp file left by a killed build
    total = size_hint(corpus)
    done = 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        emit("store", done, total)

    emit("store", 0, total)
    report = DocReport()
    try:
        store = PassageStore.build(path, iter_corpus(corpus, report=report), progress=step, fts=bm25)
    except InputError as e:
        # Bad input: nothing worth resuming. Leave no trace, and name the corpus if the store could not.
        _discard_work(work, out, created)
        if e.path is None:
            raise InputError(e.message, corpus) from None
        raise
    if state["corpus"]["format"] == "text":  # what each document gave, for the summary and `index update`
        store.close()
        write_documents(path, report.records)
        store = PassageStore(path)
    state["store"] = {"bm25": bm25, "count": len(store), "bytes": path.stat().st_size,
                      "documents": report.summary() if state["corpus"]["format"] == "text" else None}
    _save_state(work, state)
    emit("store", len(store), len(store))
    return store


# --- stage 2: embeddings --------------------------------------------------------------------------------

def chunk_path(work: Path, i: int) -> Path:
    return work / f"emb-{i:06d}.npy"


def _embed_key(state: dict[str, Any], count: int, spec: EncoderSpec, chunk: int) -> str:
    key = {"corpus": state["corpus"]["sha256"], "count": count, "encoder": spec.to_dict(), "chunk": chunk}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _chunk_ok(path: Path, rows: int, dim: int) -> bool:
    """Whether `path` is a complete chunk: float32 of exactly (rows, dim)."""
    try:
        a = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError):
        return False
    ok = a.dtype == np.float32 and a.shape == (rows, dim)
    del a
    return ok


def _embed(store: PassageStore, encoder: Encoder, work: Path, state: dict[str, Any], chunk: int,
           batch_size: int, emit: Progress) -> None:
    """Embed every passage into chunk files, skipping the chunks a previous run finished."""
    from . import dense

    n, spec = len(store), encoder.spec
    key = _embed_key(state, n, spec, chunk)
    if state.get("embed_key") != key:
        _clear(work, "emb-*.npy")
        _clear(work, ".emb-*")
        state["embed_key"] = key
        state["encoder"] = spec.to_dict()
        state["chunk"] = chunk
        _save_state(work, state)
    starts = range(0, n, chunk)
    todo = [i for i, s in enumerate(starts) if not _chunk_ok(chunk_path(work, i), min(chunk, n - s), spec.dim)]
    done = n - sum(min(chunk, n - starts[i]) for i in todo)
    emit("embed", done, n)
    for i in todo:
        start = starts[i]
        rows = min(chunk, n - start)
        texts = [p.contents for p in store.get_rows(range(start, start + rows))]
        vectors = np.asarray(encoder.encode_passages(texts, batch_size=batch_size))
        if vectors.shape != (rows, spec.dim):
            raise InputError(f"the encoder {spec.name!r} returned vectors of shape {vectors.shape} for "
                             f"{rows} passages; its spec says dimension {spec.dim}")
        with jsonio.atomic_open(chunk_path(work, i), "wb") as f:
            np.save(f, dense.normalize(vectors))
        done += rows
        emit("embed", done, n)


def _iter_chunks(work: Path, n: int, chunk: int) -> Iterator[np.ndarray]:
    """The chunk files as memory maps, one open at a time (wiki-18 has 20k of them)."""
    for i in range((n + chunk - 1) // chunk):
        yield np.load(chunk_path(work, i), mmap_mode="r")


def _gather(work: Path, rows: np.ndarray, chunk: int, dim: int) -> np.ndarray:
    """The vectors at ascending `rows`, read from the chunk files, as one array."""
    out = np.empty((len(rows), dim), dtype=np.float32)
    which, local = np.divmod(rows, chunk)
    for c in np.unique(which):
        sel = which == c
        part = np.load(chunk_path(work, int(c)), mmap_mode="r")
        out[sel] = part[local[sel]]
        del part
    return out


# --- stage 3: FAISS -------------------------------------------------------------------------------------

def _build_vectors(work: Path, n: int, dim: int, chunk: int, plan: Any, threads: int | None,
                   emit: Progress) -> None:
    """Train (on an evenly spaced sample) and fill the index from the chunk files; write it."""
    from . import dense

    train = None
    emit("train", 0, 1)
    if plan.train_points:
        train = _gather(work, dense.sample_rows(n, plan.train_points), chunk, dim)
    added = 0

    def step(k: int) -> None:
        nonlocal added
        if added == 0:
            emit("train", 1, 1)
        added += k
        emit("add", added, n)

    # chunk files hold normalised vectors already (see _embed): no copies of them are made
    index = dense.train_and_add(_iter_chunks(work, n, chunk), plan, dim, train=train, threads=threads,
                                progress=step, normalized=True)
    del train
    if index.ntotal != n:
        raise RuntimeError(f"FAISS holds {index.ntotal} vectors, expected {n}")
    dense.write_index(index, work / INDEX_FILE)


# --- stage 4: manifest and files into place ---------------------------------------------------------------

def _finish(out: Path, work: Path, state: dict[str, Any], kind: str, encoder: Encoder | None,
            count: int, dim: int | None, plan: Any, chunk: int, bm25: bool,
            compression: str) -> dict[str, Any]:
    files = [STORE_FILE] if plan is None else [STORE_FILE, INDEX_FILE]
    params = {"factory": None, "nlist": None, "nprobe": None, "pq": None, "pq_bits": None, "opq": False,
              "chunk": None, "train_points": None, "trained_on": None}
    producer = f"dgpo-edge {__version__}"
    if plan is not None:
        import faiss

        params.update(factory=plan.factory, nlist=plan.nlist, nprobe=plan.nprobe, pq=plan.pq,
                      pq_bits=plan.pq_bits, opq=plan.opq, chunk=chunk, train_points=plan.train_points,
                      trained_on=count)
        producer += f", faiss {faiss.__version__}"
    fp = state["corpus"]
    manifest = write_manifest(
        work, files=files, kind=kind, encoder=None if encoder is None else encoder.spec.to_dict(),
        count=count, dim=dim, metric=None if plan is None else "ip", params=params,
        store={"bm25": bm25, "compression": compression},
        source=source_entry(fp, state["store"].get("documents")),
        produced_by=producer, created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    install_files(work, out, files)   # a killed build's rerun resumes from .work and installs again
    return manifest


def source_entry(fp: dict[str, Any], documents: dict[str, Any] | None) -> dict[str, Any]:
    """The manifest's `source`: the corpus digest, plus for a folder what each document gave."""
    source = {"corpus": fp.get("name"), "format": fp["format"], "files": fp["files"], "bytes": fp["bytes"],
              "sha256": fp["sha256"]}
    if documents is not None:
        source["documents"] = documents
    return source


# --- reading manifests back -----------------------------------------------------------------------------

def load_manifest(index_dir: str | Path) -> dict[str, Any]:
    """The manifest of an index folder, checked for the fields readers rely on.

    InputError naming the folder or manifest.json for: no folder, no
    manifest (not an index, or a build that never finished), malformed JSON,
    an unknown kind, or missing fields.
    """
    d = Path(index_dir)
    if d.is_file():
        raise InputError("is a file, not an index folder", d)
    if not d.is_dir():
        raise InputError("no such index folder", d)
    path = d / MANIFEST_FILE
    if (d / SWAP_MARKER).exists():   # renames a kill stopped: finished here, if they can be
        settle_index(d)
    if not path.is_file() and (d / SWAP_MARKER).exists():
        raise InputError(f"holds an index whose writing was interrupted ({SWAP_MARKER}, no manifest.json); rerun "
                         "the `index build` or `index compact` that wrote it, with --overwrite", d)
    if not path.is_file():
        raise InputError("not an index folder: no manifest.json (build one with `dgpo-edge index build`)", d)
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 ({e.reason} at byte {e.start})", path) from None
    except ValueError as e:
        raise InputError(f"malformed manifest ({e})", path) from None
    if not isinstance(m, dict):
        raise InputError("malformed manifest: expected a JSON object", path)
    if m.get("format") == jsonio.BUNDLE_FORMAT:   # `--index B` for `--bundle B`
        raise InputError(f"is a bundle, not an index folder: give it as --bundle, or its index as "
                         f"{d / 'index'}", d)
    if m.get("kind") not in KINDS:
        raise InputError(f"unknown index kind {m.get('kind')!r}: expected one of {', '.join(KINDS)}", path)
    files = m.get("files")
    if not isinstance(files, dict) or STORE_FILE not in files:
        raise InputError(f'malformed manifest: "files" must list {STORE_FILE}', path)
    for name, entry in files.items():
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise InputError(f"malformed manifest: file name {name!r} is not a plain name", path)
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) \
                or not isinstance(entry.get("sha256"), str):
            raise InputError(f'malformed manifest: files[{name!r}] needs "bytes" and "sha256"', path)
    if not isinstance(m.get("count"), int) or isinstance(m.get("count"), bool):
        raise InputError('malformed manifest: "count" must be an integer', path)
    if m["kind"] != "bm25":
        if INDEX_FILE not in files:
            raise InputError(f'malformed manifest: a {m["kind"]} index must list {INDEX_FILE}', path)
        if not isinstance(m.get("dim"), int) or not isinstance(m.get("encoder"), dict):
            raise InputError('malformed manifest: a dense index needs "dim" and "encoder"', path)
        try:
            EncoderSpec.from_dict(m["encoder"])
        except (KeyError, TypeError) as e:
            raise InputError(f'malformed manifest: "encoder" lacks {e}', path) from None
    if not isinstance(m.get("params", {}), dict):
        raise InputError('malformed manifest: "params" must be an object', path)
    _check_source(m, path)
    return m


def _check_source(m: dict[str, Any], path: Path) -> None:
    """`source` and its `documents` summary, which `index info` prints and `index update` reads: an
    object, and the summary's fields of the types `source_entry` writes (a shared index's manifest
    of another shape was a traceback)."""
    source = m.get("source") or {}
    if not isinstance(source, dict):
        raise InputError('malformed manifest: "source" must be an object', path)
    docs = source.get("documents")
    if docs is None:
        return
    skipped = docs.get("skipped") if isinstance(docs, dict) else None
    if not (isinstance(docs, dict) and isinstance(docs.get("read"), int) and isinstance(docs.get("passages"), int)
            and isinstance(docs.get("read_by_type"), dict) and isinstance(skipped, list)
            and all(isinstance(s, dict) and isinstance(s.get("path"), str) and isinstance(s.get("reason"), str)
                    for s in skipped)):
        raise InputError('malformed manifest: "source.documents" needs "read", "read_by_type", "passages" and '
                         '"skipped" (each a path and a reason)', path)


def verify_files(index_dir: str | Path, full: bool = False, cached: bool = False) -> dict[str, Any]:
    """Check the files the manifest lists; return the manifest.

    Always: each file exists with the recorded size (cheap, catches truncation
    and partial copies). `full=True` also compares sha256 (reads every byte);
    `cached=True` compares it for the files changed since they were last
    verified (`dgpo_edge.digests`: the first open after a change hashes).
    InputError naming the offending file otherwise.
    """
    d = Path(index_dir)
    m = load_manifest(d)
    for name, entry in m["files"].items():
        path = d / name
        if not path.is_file():
            raise InputError("missing: the index manifest lists this file", path)
        size = path.stat().st_size
        if size != entry["bytes"]:
            what = "truncated" if size < entry["bytes"] else "changed"
            raise InputError(f"{what}: {size:,} bytes, the manifest says {entry['bytes']:,}", path)
    if not (full or cached):
        return m
    for name, entry in m["files"].items():  # sizes of all first: a truncation is named before hashing
        if full:
            ok = file_digest(d / name)["sha256"] == entry["sha256"]
        else:
            ok = digests.matches(d / name, entry["sha256"])
        if not ok:
            raise InputError("corrupt: its sha256 does not match the manifest", d / name)
    if full:
        digests.record_many([(d / name, entry["sha256"]) for name, entry in m["files"].items()])
    return m


__all__ = ["KINDS", "build_index", "chunk_path", "corpus_fingerprint", "load_manifest", "verify_files"]
