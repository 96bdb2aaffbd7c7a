"""`dgpo-edge index update DIR FOLDER`: bring an index of a documents folder up to date.

A full build re-reads and re-embeds every file; editing one note should not
cost that. The store keeps a record per file (`documents` table: path, size,
mtime, sha256, passages, skip reason), and an update:

1. walks the folder; a file whose size and mtime match its record is taken as
   unchanged without being opened; otherwise its sha256 decides (a touched but
   identical file only gets its new mtime recorded);
2. re-reads new and changed files, and drops the passages of changed and
   deleted ones (their ids are `path#k`, so they are found by id);
3. edits a copy of the store: removed rows are deleted, new passages get new
   rows after the largest one, so every other passage keeps its row and FAISS
   id (`store.edit_store`);
4. dense kinds: removes the old rows' vectors from the FAISS index and adds the
   new passages' vectors under their rows (`add_with_ids`), with the trained
   quantizers as they are: no retraining. An exact Flat index is wrapped in
   an id map on its first update so it can take explicit ids. IVF-PQ is
   retrained, by a full rebuild, only once the index holds more than
   `RETRAIN_FACTOR` times the passages it was trained on (centroids and codebooks
   fitted to half the data start to cost recall); an `ivfpq` index small enough to
   have fallen back to Flat is rebuilt by the same rule, into a real IVF-PQ;
5. writes a new manifest (count, per-file digests, source digest computed from
   the per-file sha256s, so it equals what a fresh build would record) and
   renames the files into place, the manifest last, as a build does.

Nothing under DIR changes until step 5; a crash before it leaves the old index.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..jsonio import check_outside_bundle
from ..protocol import Passage
from .base import Encoder, EncoderSpec
from .build import (DEFAULT_WORDS, LOCK_FILE, WORK_MARKER, Progress, _locked, build_index, claim_work_folder,
                    source_entry, source_fingerprint, source_name, verify_files)
from .compact import INDEX_FILE, MANIFEST_FILE, STORE_FILE, install_files, write_manifest
from .corpus import UNREADABLE, _text_files, detect_format, read_document, read_regular_file
from .documents import READABLE_SUFFIXES, DocRecord, DocReport, Skip, record_for
from .store import PassageStore, edit_store

RETRAIN_FACTOR = 2.0
UPDATE_DIR = "update"


@dataclass
class Changes:
    """What an update found: file paths by fate, the new records, the passages to add and drop."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: int = 0
    records: list[DocRecord] = field(default_factory=list)
    add: list[Passage] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    touched: bool = False  # only mtimes changed: records to rewrite, no passages
    deleted_passages: int = 0  # the passages of deleted files (not of changed ones)
    unlisted: list[dict[str, str]] = field(default_factory=list)  # subfolders that could not be listed, and why

    def report(self) -> dict[str, Any]:
        return {"added": self.added, "changed": self.changed, "deleted": self.deleted,
                "unchanged": self.unchanged, "passages_added": len(self.add), "passages_removed": len(self.drop),
                "unlisted": self.unlisted}


def update_index(folder: str | Path, out: str | Path, *, encoder: str | Encoder | None = None,
                 threads: int | None = None, progress: Progress | None = None,
                 retrain_factor: float = RETRAIN_FACTOR, force: bool = False) -> dict[str, Any]:
    """Update the index in `out` from `folder`; return a report (see `Changes.report`, plus
    `count`, `retrained` and `manifest`). Without `force`, a folder that does not look like the one
    the index was built from (`check_source_name`, `check_deletions`) is refused before anything changes."""
    folder, out = Path(folder), Path(out)
    emit = progress or (lambda stage, done, total: None)
    check_outside_bundle(out)   # a bundle's index/: its manifest lists the sha256 of each file changed here
    m = verify_files(out)
    if (m.get("source") or {}).get("format") != "text":
        raise InputError("index update works on indexes of a folder of documents; rebuild this one with "
                         "`dgpo-edge index build --overwrite`", out)
    if (fmt := detect_format(folder)) != "text":   # the index is fine: the source given is not one
        what = "a FactbookQA or world folder" if fmt == "factbook" else "a .jsonl corpus"
        raise InputError(f"is {what}, not the folder of documents the index was built from "
                         f"({(m.get('source') or {}).get('corpus')!r})", folder)
    with PassageStore(out / STORE_FILE) as store:
        old = {r.path: r for r in store.documents()}
    if not old:
        raise InputError("this index has no per-file records (built before `index update` existed); "
                         "rebuild it once with `dgpo-edge index build --overwrite`", out)
    if not force:   # before the scan reads a wrong folder's every file
        check_source_name(folder, m)
    changes = scan(folder, old, emit)
    if not force:
        check_deletions(folder, m, changes)
    base = {**changes.report(), "count": m["count"], "retrained": False, "manifest": m}
    if not (changes.add or changes.drop or changes.touched or changes.added or changes.changed or changes.deleted):
        return base   # (a file added or changed without passages, a .docx say, still gets its record)
    count = m["count"] - len(changes.drop) + len(changes.add)
    trained_on = (m.get("params") or {}).get("trained_on")
    if m["kind"] in ("ivfpq", "hybrid") and trained_on and count > retrain_factor * trained_on:
        manifest = _rebuild(folder, out, m, encoder, threads, emit)
        return {**base, "count": manifest["count"], "retrained": True, "manifest": manifest}
    work = claim_work_folder(out)   # never a .work of someone else's files: it is emptied below
    with _locked(work):
        stage = work / UPDATE_DIR
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir()
        try:
            manifest = _apply(folder, out, stage, m, changes, encoder, threads, emit)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    if {p.name for p in work.iterdir()} <= {LOCK_FILE, WORK_MARKER}:  # keep an interrupted build's work
        shutil.rmtree(work, ignore_errors=True)
    return {**base, "count": manifest["count"], "manifest": manifest}


def check_source_name(folder: Path, manifest: dict[str, Any]) -> None:
    """Refuse a folder of another name than the one the index was built from: the update deletes every
    document the folder lacks, so a typo (~/notes/teams for ~/notes) would empty the index. The
    manifest keeps the folder's name only (no path: an index may be shared), so a renamed folder
    needs --force. The name as typed or as resolved (a link to the folder, "..") both count."""
    built_from = (manifest.get("source") or {}).get("corpus")
    names = {folder.name, folder.resolve().name}   # source_name(folder) is one of these
    if built_from and built_from not in names:   # an index built from "." before names were kept has ""
        raise InputError(f"this index was built from a folder named {built_from!r}, not {source_name(folder)!r}; "
                         "pass --force to update it from this one (the index's documents it lacks are "
                         "deleted)", folder)


def check_deletions(folder: Path, manifest: dict[str, Any], changes: Changes) -> None:
    """Refuse an update that deletes most of the index: an old copy of the folder, or a folder of the
    same name elsewhere. Counted in passages, so records of files that gave none do not count."""
    if 2 * changes.deleted_passages > manifest["count"]:
        raise InputError(f"the update would delete {len(changes.deleted)} documents, {changes.deleted_passages} "
                         f"of the index's {manifest['count']} passages (this folder lacks them): is it the "
                         "folder the index was built from? Pass --force to delete them", folder)


# --- what changed ------------------------------------------------------------------------------------------

def scan(folder: Path, old: dict[str, DocRecord], emit: Progress) -> Changes:
    """Compare the folder with the records; read only new and changed files."""
    skipped: list[tuple[str, Path]] = []
    files = [(folder.name, folder)] if folder.is_file() else sorted(_text_files(folder, skipped) + skipped)
    # a subfolder that could not be listed (`rel/`) is no file: neither added nor unchanged, only reported
    unlisted = tuple(rel for rel, _ in files if rel.endswith("/"))
    files = [(rel, file) for rel, file in files if not rel.endswith("/")]
    c = Changes(unlisted=[{"path": rel, "reason": read_document(rel, folder / rel)[0].reason} for rel in unlisted])
    for i, (rel, file) in enumerate(files, start=1):
        emit("scan", i, len(files))
        prev = old.pop(rel, None)
        record = _unchanged(prev, rel, file)
        if record is not None:
            c.touched |= record is not prev
            c.unchanged += 1
            c.records.append(record)
            continue
        record, passages = read_document(rel, file, DEFAULT_WORDS)
        c.records.append(record)
        c.add.extend(passages)
        (c.changed if prev is not None else c.added).append(rel)
        if prev is not None:
            c.drop.extend(f"{rel}#{k}" for k in range(prev.passages))
    for rel, prev in sorted(old.items()):
        if rel.endswith("/"):   # a build's record of a folder it could not list: reported anew above, or gone
            continue
        if rel.startswith(unlisted):   # in a folder that could not be listed: not known to be gone
            c.records.append(prev)
            c.unchanged += 1
            continue
        c.deleted.append(rel)
        c.drop.extend(f"{rel}#{k}" for k in range(prev.passages))
        c.deleted_passages += prev.passages
    return c


def _unchanged(prev: DocRecord | None, rel: str, file: Path) -> DocRecord | None:
    """The file's record when its content is what `prev` recorded (a new record if only the mtime moved)."""
    if prev is None:
        return None
    if (prev.reason or "").startswith(UNREADABLE):   # a chmod changes neither size nor mtime: try it
        try:
            read_regular_file(file)
        except Skip:
            return prev   # still unreadable: unchanged, not "changed" at every update
        return None
    try:
        st = file.stat()
        if st.st_size == prev.size and st.st_mtime_ns == prev.mtime_ns:
            return prev
        if st.st_size != prev.size or not file.name.lower().endswith(READABLE_SUFFIXES):
            return None
        now = record_for(rel, file, read_regular_file(file))
    except (OSError, Skip):   # gone or unreadable since listed: read_document records why
        return None
    if now.sha256 != prev.sha256:
        return None
    now.passages, now.reason = prev.passages, prev.reason
    return now


# --- applying it ------------------------------------------------------------------------------------------

def _apply(folder: Path, out: Path, stage: Path, m: dict[str, Any], c: Changes,
           encoder: str | Encoder | None, threads: int | None, emit: Progress) -> dict[str, Any]:
    """Edit copies of the store and vectors in `stage`, write the manifest, rename into place."""
    shutil.copyfile(out / STORE_FILE, stage / STORE_FILE)
    emit("store", 0, 1)
    dropped, rows = edit_store(stage / STORE_FILE, c.drop, c.add, c.records)
    emit("store", 1, 1)
    files = [STORE_FILE]
    if m["kind"] != "bm25":
        _update_vectors(out, stage, m, dropped, rows, c.add, encoder, threads, emit)
        files.append(INDEX_FILE)
    with PassageStore(stage / STORE_FILE) as store:
        count = len(store)
    report = DocReport(c.records)
    fp = source_fingerprint(source_name(folder), "text", [(r.path, r.size, r.sha256) for r in c.records if r.sha256])
    fields = {k: v for k, v in m.items() if k not in ("files", "count", "source", "updated")}
    fields.update(count=count, source=source_entry(fp, report.summary()),
                  updated=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    emit("write", 0, 1)
    manifest = write_manifest(stage, files=files, **fields)
    install_files(stage, out, files, finish_later=True)   # killed there: the next command finishes it
    emit("write", 1, 1)
    return manifest


def _update_vectors(out: Path, stage: Path, m: dict[str, Any], dropped: list[int], rows: list[int],
                    add: list[Passage], encoder: str | Encoder | None, threads: int | None,
                    emit: Progress) -> None:
    """Remove the dropped rows' vectors, add the new passages' under their rows; no retraining."""
    from . import dense

    index = with_ids(dense.read_index(out / INDEX_FILE))
    if dropped:
        removed = index.remove_ids(np.asarray(dropped, dtype=np.int64))
        if removed != len(dropped):
            raise InputError(f"the FAISS index held {removed} of the {len(dropped)} vectors to remove; "
                             "rebuild it with --overwrite", out / INDEX_FILE)
    if add:
        enc = _encoder(m, encoder, threads, out)
        emit("embed", 0, len(add))
        vectors = np.asarray(enc.encode_passages([p.contents for p in add]), dtype=np.float32)
        emit("embed", len(add), len(add))
        with dense.faiss_threads(threads):
            index.add_with_ids(dense.normalize(vectors), np.asarray(rows, dtype=np.int64))
    dense.write_index(index, stage / INDEX_FILE)


def with_ids(index: Any) -> Any:
    """An index that takes explicit ids: IVF ones do; an exact Flat is copied into an IndexIDMap2."""
    import faiss

    from . import dense

    if dense._is_ivf(index) or isinstance(index, faiss.IndexIDMap):
        return index
    mapped = faiss.IndexIDMap2(faiss.IndexFlatIP(index.d))
    if index.ntotal:  # a built Flat index holds row i at position i
        mapped.add_with_ids(index.reconstruct_n(0, index.ntotal), np.arange(index.ntotal, dtype=np.int64))
    return mapped


def _encoder(m: dict[str, Any], encoder: str | Encoder | None, threads: int | None, out: Path) -> Encoder:
    """The index's own passage encoder (or a compatible one the caller names)."""
    from .retrievers import _query_encoder

    return _query_encoder(EncoderSpec.from_dict(m["encoder"]), encoder, threads, out / MANIFEST_FILE)


def _rebuild(folder: Path, out: Path, m: dict[str, Any], encoder: str | Encoder | None,
             threads: int | None, emit: Progress) -> dict[str, Any]:
    """A full build with the index's kind and encoder: the grown index gets new centroids and codebooks."""
    spec = encoder if encoder is not None else _encoder(m, None, threads, out)
    return build_index(folder, out, encoder_spec=spec, kind=m["kind"], threads=threads, progress=emit,
                       overwrite=True, bm25=bool((m.get("store") or {}).get("bm25", True)))
