"""Compaction: a Search-R1 Flat index and its corpus -> an IVF-PQ index plus passage store.

The engine behind `dgpo-edge index compact --flat e5_Flat.index --corpus
wiki-18.jsonl --out DIR` (docs/retrieval.md). Search-R1 ships `e5_Flat.index`, a FAISS
`IndexFlatIP` whose row i is the e5 vector of corpus line i: 21,015,324 x 768
float32, 64.6 GB. `compact` turns it into

- `DIR/vectors.faiss`: `[OPQ{M}_{D},]IVF{nlist},PQ{M}[x{bits}]`, inner product,
  row i = passage i (PQ64: 64 B codes + 8 B id per vector, ~1.5 GB for wiki-18);
- `DIR/store.sqlite`: the passage store (`PassageStore`), store row i = line i;
- `DIR/manifest.json`: parameters, encoder, a recall/bytes report, and the
  size and sha256 of both files.

The encoder recorded is the one `encoder` names (`--encoder`): by default
Search-R1's e5-base-v2, 768 dims, with no model needed; a MiniLM name or a
model directory for a Flat index made with another model. Its dimension must
be the vectors': searches encode queries with the model the manifest names.

How the Flat index is read. `faiss.read_index(path, IO_FLAG_MMAP_IFC)` maps
the vectors instead of loading them (faiss's plain `IO_FLAG_MMAP` only maps
inverted lists and still copies a Flat index into RAM: measured with faiss
1.15.1, +587 MB RSS for a 614 MB Flat file with IO_FLAG_MMAP, +1 MB with
IO_FLAG_MMAP_IFC). Training rows, added chunks and the exact ground truth
are all read through that map. Before faiss sees the file its 45-byte header
is parsed, so a foreign, non-Flat, L2 or truncated file is an InputError
naming the file, not a faiss traceback.

Parameter choices (`plan_ivfpq`) are `dense.plan_index`'s, the rules that
`dgpo-edge index build` uses too, so compacting a Flat index and building from
the corpus give the same factory for the same options (docs/retrieval.md: the
rules and the measurements behind them). `pq` is the code size in bytes per
vector (the M of `PQ{M}` at 8 bits; default 64 for e5's 768 dims); with fewer
than 9,984 training rows PQ gets fewer bits (never under 4) and M grows so the
code keeps its size: the 1,000-passage sample gets `IVF16,PQ128x4`, wiki-18
`IVF16384,PQ64` (nlist 4*sqrt(n) as a power of two, at least 39 training rows
per list) trained on 1,048,576 rows. `opq` gives `OPQ{M}_{4M}` (or `_{d}`
when 4M > d), refused with fewer training rows than dimensions (FAISS's OPQ
training crashes the process there). What `compact` does its own way:

- Training sample: `train_size` rows (default `dense`'s size) drawn at random
  with the seed, read through the map in row order. An explicit
  `train_size` also caps nlist and sets the PQ bits.
- Polysemous training (the factory's default for IVF-PQ) is switched off
  (`dense.train_index`): it only serves Hamming pre-filtering
  (`polysemous_ht`), which is never used here, and it took 10 s of the 10.2 s
  training time on the 1,000-row sample.

Recall report. There is no query encoder here, so the queries are database
vectors: `eval_queries` rows picked with the seed (outside the training sample
when the corpus is large enough), plus isotropic Gaussian noise of expected
norm `query_noise` (0.2; cosine to the source passage about 0.98), then L2
normalised. They are passage-like queries, not real questions: real e5
question vectors sit further from their passages, so treat the numbers as a
measure of what PQ and IVF lose against Flat, not of end-to-end accuracy. The
ground truth is the Flat index's exact top-k (searched through the map);
recall@k = |Flat top-k ∩ compact top-k| / k, averaged over queries. The sweep
runs nprobe in 1, 4, 16, 64, 256 (capped at nlist); unless `nprobe` is given
the default nprobe is the smallest swept value whose recall@max(k) is within
0.01 of the best swept value (without a recall report, `dense`'s default).

An index already in DIR is refused unless `overwrite=True` (`--overwrite`), and
a DIR holding anything but an index dgpo-edge wrote is refused even then, as
`index build` does (`check_index_out`).

Atomicity: everything is built in `DIR/.partial-*` and renamed into DIR at the
end, manifest last (an old manifest is removed first, so a manifest is only
ever beside the files it describes; `install_files`, shared with `index build`
and `index update`). An exception during those renames, Ctrl-C included,
finishes them first, so DIR holds the old index or the new one, whole; a kill
between them leaves the marker `DIR/.dgpo-edge-swap`, which lets the rerun
replace the half-renamed files (with `--overwrite` when they were replacing an
index). Any exception removes the partial folder, and DIR itself when this call
created it and it is still empty; a partial folder that a killed compaction left is removed by
the next compaction into DIR (`temps.sweep`: one no process holds).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__, jsonio, temps
from ..errors import InputError
from ..jsonio import file_digest, iter_lines, require_file
from .base import EncoderSpec
from .corpus import count_lines, iter_jsonl_corpus
from .store import PassageStore

INDEX_FILE = "vectors.faiss"
STORE_FILE = "store.sqlite"
MANIFEST_FILE = "manifest.json"
KIND = "ivfpq"
E5_NAME, E5_DIM = "e5-base-v2", 768   # Search-R1's e5_Flat.index: intfloat/e5-base-v2

NPROBE_SWEEP = (1, 4, 16, 64, 256)
NPROBE_TOLERANCE = 0.01
QUERY_NOISE = 0.2
SMALL_JOB = 20_000  # below this many vectors faiss runs on one thread (OpenMP overhead dominates)

# --- the Flat file header -------------------------------------------------------------------

# faiss write_index for IndexFlat: fourcc, d (int32), ntotal (int64), two int64
# placeholders, is_trained (1 byte), metric_type (int32), then the vector array
# as its float count (uint64) and the floats.
_HEADER = struct.Struct("<4siqqq?i")
_HEADER_BYTES = _HEADER.size + 8  # 45: the data starts here
_FLAT_IP = b"IxFI"
_OTHER_INDEXES = {  # a few fourccs users may pass by mistake, for a clearer message
    b"IxF2": "IndexFlatL2 (L2 metric)", b"IxFl": "IndexFlat (other metric)",
    b"IwPQ": "IndexIVFPQ", b"IwFl": "IndexIVFFlat", b"IwSq": "IndexIVFScalarQuantizer",
    b"IHNf": "IndexHNSWFlat", b"IxPQ": "IndexPQ", b"IxSQ": "IndexScalarQuantizer",
    b"IxPT": "IndexPreTransform", b"IxMp": "IndexIDMap", b"IxM2": "IndexIDMap2",
    b"IwFs": "IndexIVFPQFastScan", b"IxRF": "IndexRefineFlat",
}


@dataclass(frozen=True)
class FlatHeader:
    """What the header of a FAISS IndexFlatIP file says."""

    dim: int
    count: int
    bytes: int


def read_flat_header(path: str | Path) -> FlatHeader:
    """Check that `path` is a whole FAISS IndexFlatIP file, reading 45 bytes.

    InputError (naming the file) for a missing file, a file that is not a
    FAISS index, a FAISS index of another type or metric, an empty index, and
    a file whose size does not match 45 + 4*d*n bytes (truncated or padded).
    """
    path = Path(path)
    require_file(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(_HEADER_BYTES)
    fourcc = head[:4]
    if len(head) >= 4 and fourcc in _OTHER_INDEXES:
        raise InputError(f"a FAISS {_OTHER_INDEXES[fourcc]}, not a Flat inner-product index; compact "
                         f"reads an IndexFlatIP such as Search-R1's e5_Flat.index", path)
    if len(head) < 4 or fourcc != _FLAT_IP:
        raise InputError(f"not a FAISS Flat index (starts with {fourcc!r}, expected {_FLAT_IP!r}, "
                         f"an IndexFlatIP such as Search-R1's e5_Flat.index)", path)
    if len(head) < _HEADER_BYTES:
        raise InputError(f"truncated FAISS index: {size} bytes, shorter than its {_HEADER_BYTES}-byte header",
                         path)
    _, d, n, _, _, _, metric = _HEADER.unpack_from(head)
    (floats,) = struct.unpack_from("<Q", head, _HEADER.size)
    if metric != 0:
        raise InputError(f"a Flat index with metric type {metric}, expected 0 (inner product)", path)
    if d <= 0 or n < 0 or floats != d * n:
        raise InputError(f"corrupt FAISS Flat header (dim {d}, {n} vectors, {floats} floats)", path)
    if n == 0:
        raise InputError("the Flat index holds no vectors", path)
    want = _HEADER_BYTES + 4 * d * n
    if size != want:
        what = "truncated" if size < want else "has trailing bytes"
        raise InputError(f"{what}: {size:,} bytes, but {n:,} vectors of dim {d} take {want:,} bytes", path)
    return FlatHeader(dim=d, count=n, bytes=size)


def open_flat(path: str | Path) -> Any:
    """The IndexFlatIP at `path`, memory-mapped where faiss can (not loaded into RAM)."""
    faiss = _faiss()
    path = Path(path)
    header = read_flat_header(path)
    flag = getattr(faiss, "IO_FLAG_MMAP_IFC", None)  # faiss >= 1.11
    flags = 0 if flag is None else flag | faiss.IO_FLAG_READ_ONLY
    try:
        index = faiss.read_index(str(path), flags)
    except RuntimeError as e:
        raise InputError(f"cannot read the FAISS index ({_faiss_message(e)})", path) from None
    if not isinstance(index, faiss.IndexFlat) or index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise InputError(f"expected an IndexFlatIP, got {type(index).__name__}", path)
    if index.ntotal != header.count or index.d != header.dim:
        raise InputError(f"header says {header.count} x {header.dim}, faiss read "
                         f"{index.ntotal} x {index.d}", path)
    return index


# --- parameters ------------------------------------------------------------------------------

def valid_pq(dim: int, opq: bool = False) -> list[int]:
    """PQ sizes M that `compact` accepts for vectors of dimension `dim` (`dense.valid_pq`).

    Without OPQ, M must divide dim. With OPQ the rotation maps to D = 4M
    dims (any M with 4M <= dim) or, for larger M, to dim itself, which M then
    has to divide.
    """
    return _dense().valid_pq(dim, opq)


def plan_ivfpq(count: int, dim: int, pq: int | None = None, opq: bool | None = None, nlist: int | None = None,
               train_size: int | None = None, where: str | Path | None = None) -> Any:
    """`dense.plan_index` for compacting `count` vectors: a `dense.IndexPlan`, never Flat.

    `pq`: code bytes per vector (None: dense's default, 64 for 768 dims).
    InputError (naming `where`, the Flat file) for a PQ size that does not fit
    `dim`, nlist or train_size out of range, OPQ with fewer training vectors
    than dimensions, or fewer vectors than IVF-PQ needs (78).
    """
    dense = _dense()
    if count < dense.MIN_IVFPQ:
        raise InputError(f"{count} vectors are too few for IVF-PQ (at least {dense.MIN_IVFPQ}); keep the "
                         f"Flat index", where)
    if pq is not None and (isinstance(pq, bool) or not isinstance(pq, int)):
        raise InputError(f"--pq {pq!r}: expected a whole number of code bytes per vector", where)
    try:
        return dense.plan_index(KIND, dim, count, nlist=nlist, pq=pq, opq=opq, train_size=train_size)
    except InputError as e:
        raise InputError(e.message, where) from None


def default_encoder() -> EncoderSpec:
    """Search-R1's e5_Flat.index encoder: intfloat/e5-base-v2, 768 dims, mean pooling, L2 norm, e5
    prefixes. Its dimension is the model's, never the Flat file's: a 384-d index recorded as e5
    would have its queries encoded by a model of another space."""
    return EncoderSpec(name=E5_NAME, variant="search-r1-flat", dim=E5_DIM, normalize=True,
                       query_prefix="query: ", passage_prefix="passage: ")


def compact_encoder(encoder: str | Path | EncoderSpec | None = None) -> EncoderSpec:
    """The spec `--encoder` records: e5-base-v2 (None, the default) for Search-R1's e5_Flat.index,
    needing no model; else any `index build --encoder` value (`encoders.encoder_spec`)."""
    if isinstance(encoder, EncoderSpec):
        return encoder
    if encoder is None or str(encoder) == E5_NAME:
        return default_encoder()
    from .encoders import encoder_spec

    return encoder_spec(encoder, also_known=(E5_NAME,))   # its refusal lists the default too


def _check_encoder_dim(spec: EncoderSpec, dim: int, flat_path: Path) -> None:
    """Refuse an encoder whose vectors are not the Flat index's: the manifest would name the wrong
    model for the queries."""
    if spec.dim == dim:
        return
    from .encoders import MINILM_DIM, MINILM_NAME

    known = {MINILM_DIM: f"minilm-int8 for {MINILM_NAME}",
             E5_DIM: f"{E5_NAME}, the default, for Search-R1's e5_Flat.index"}
    hint = f" ({known[dim]}, dim {dim})" if dim in known else ""
    raise InputError(f"encoder {spec.name!r} has dim {spec.dim} but the index vectors have dim {dim}; pass "
                     f"--encoder with the model that made them{hint}", flat_path)


# --- manifest --------------------------------------------------------------------------------

def write_manifest(out_dir: str | Path, *, files: Iterable[str], **fields: Any) -> dict[str, Any]:
    """Write `out_dir/manifest.json` atomically and return it.

    `fields` become top-level keys in the order given (`kind`, `encoder`,
    `count`, `dim`, `params`, `report`, ...); `files` names files inside
    `out_dir`, recorded as {name: {bytes, sha256}}; `produced_by` defaults to
    this package's version.
    """
    out_dir = Path(out_dir)
    manifest = dict(fields)
    manifest["files"] = {name: file_digest(out_dir / name) for name in files}
    manifest.setdefault("produced_by", f"dgpo-edge {__version__}")
    jsonio.write_json(out_dir / MANIFEST_FILE, manifest)
    return manifest


# --- the engine ------------------------------------------------------------------------------

def compact(flat_path: str | Path, corpus_path: str | Path, out_dir: str | Path, pq: int | None = None,
            opq: bool | None = None, nlist: int | None = None, nprobe: int | None = None,
            train_size: int | None = None, chunk: int = 100_000, eval_queries: int = 500,
            k_values: Sequence[int] = (1, 3, 10), encoder: str | Path | EncoderSpec | None = None,
            seed: int = 0,
            progress: Callable[[int], None] | None = None, *, query_noise: float = QUERY_NOISE,
            fts: bool = True, threads: int | None = None, overwrite: bool = False,
            log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Compact a Search-R1 Flat index and its jsonl corpus into `out_dir`; return the report.

    Writes `out_dir/vectors.faiss`, `store.sqlite` and `manifest.json` (see
    the module docstring for the choices and the recall method). `progress(n)`
    is called with the vectors just added and, separately, the passages just
    stored (a tqdm `update`; the total is 2 x the passage count). `log(msg)`
    gets one line per stage. `fts=False` builds the store without BM25.
    `encoder`: the spec recorded for the vectors, or a name for `compact_encoder`
    (None: Search-R1's e5-base-v2, 768 dims).
    An index already in `out_dir` is replaced only with `overwrite=True`, and a
    folder holding anything else never (`check_index_out`, as `index build`).
    `threads` sets faiss's OpenMP threads for the call (restored after);
    None means all cores, except one thread below 20,000 vectors.

    InputError, before anything is written, for: a Flat file that is missing,
    not an IndexFlatIP, or truncated; a corpus whose line count differs from
    the index's row count; a PQ size that does not fit the dimension; bad
    nlist/nprobe/train_size/eval values; OPQ with fewer training vectors than
    dimensions; an encoder of another dimension than the vectors (a MiniLM
    index without `encoder="minilm-int8"`). `pq` (code bytes per
    vector), `opq`, `nlist` and `train_size` are planned by `dense.plan_index`
    (None: its defaults).
    Corpus lines that fail to parse raise InputError (file and line) while
    the store is built, and leave nothing behind either.
    """
    t_start = time.perf_counter()
    say = log or (lambda _msg: None)
    flat_path, corpus_path, out_dir = Path(flat_path), Path(corpus_path), Path(out_dir)
    faiss = _faiss()

    # -- everything cheap is checked before any file is created
    flat = open_flat(flat_path)
    n, d = int(flat.ntotal), int(flat.d)
    plan = plan_ivfpq(n, d, pq=pq, opq=opq, nlist=nlist, train_size=train_size, where=flat_path)
    if nprobe is not None and not 1 <= nprobe <= plan.nlist:
        raise InputError(f"--nprobe {nprobe} is out of range: 1..{plan.nlist} (nlist)")
    ks = sorted({int(k) for k in k_values})
    if not ks or ks[0] < 1:
        raise InputError(f"k values must be positive integers, got {list(k_values)}")
    if eval_queries < 0:
        raise InputError(f"eval queries must be >= 0, got {eval_queries}")
    if chunk < 1:
        raise InputError(f"chunk must be >= 1, got {chunk}")
    if query_noise < 0:
        raise InputError(f"query noise must be >= 0, got {query_noise}")
    check_index_out(out_dir, overwrite)
    spec = compact_encoder(encoder)   # a model directory is loaded: after the cheaper checks
    _check_encoder_dim(spec, d, flat_path)
    _check_corpus_count(corpus_path, n, flat_path)

    created = not out_dir.exists()
    with jsonio.making_folder(out_dir):   # /proc/x, a read-only disk: an error naming --out
        out_dir.mkdir(parents=True, exist_ok=True)
        partial = temps.new(out_dir, ".partial-", suffix="", folder=True)   # killed ones' swept first
    try:
        with temps.holding(partial):   # (removed if the block raises)
            with _threads(faiss, threads if threads is not None else (1 if n < SMALL_JOB else None)):
                report = _build(faiss, flat, flat_path, corpus_path, partial, plan, n, d, nprobe, chunk,
                                eval_queries, ks, seed, progress, query_noise, fts, say)
            report["seconds"]["total"] = round(time.perf_counter() - t_start, 2)
            params = {"factory": plan.factory, "nlist": plan.nlist, "nprobe": report["nprobe"],
                      "pq": plan.pq, "pq_bits": plan.pq_bits, "opq": plan.opq, "opq_dim": plan.opq_dim,
                      "train_size": plan.train_points, "seed": seed}
            write_manifest(partial, files=(INDEX_FILE, STORE_FILE), kind=KIND, encoder=spec.to_dict(),
                           count=n, dim=d, metric="ip", params=params,
                           store={"bm25": fts, "compression": report.pop("store_compression")},
                           source={"flat": flat_path.name, "flat_bytes": report["bytes"]["flat"],
                                   "corpus": corpus_path.name, "corpus_bytes": report["bytes"]["jsonl"]},
                           report=report,
                           produced_by=f"dgpo-edge {__version__}, faiss {faiss.__version__}")
            install_files(partial, out_dir, [INDEX_FILE, STORE_FILE])
            partial.rmdir()
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                out_dir.rmdir()  # only if empty
        raise
    finally:
        del flat  # unmap
    say(f"wrote {out_dir} ({report['bytes']['index']:,} B index, {report['bytes']['store']:,} B store)")
    return report


def _build(faiss: Any, flat: Any, flat_path: Path, corpus_path: Path, work: Path, plan: Any, n: int,
           d: int, nprobe: int | None, chunk: int, eval_queries: int, ks: list[int], seed: int,
           progress: Callable[[int], None] | None, query_noise: float, fts: bool,
           say: Callable[[str], None]) -> dict[str, Any]:
    """Store, train, add, evaluate and write into `work`; return the report (`plan`: a dense.IndexPlan)."""
    dense = _dense()
    seconds: dict[str, float] = {}
    rng = np.random.default_rng(seed)

    # the store first: it is what can still fail on user input (a bad line deep in the file)
    t = time.perf_counter()
    say(f"building the passage store from {corpus_path.name}")
    store = PassageStore.build(work / STORE_FILE, iter_jsonl_corpus(corpus_path), progress=progress, fts=fts)
    try:
        stored, compression = len(store), store.compression
    finally:
        store.close()
    if stored != n:
        raise InputError(f"{stored:,} passages in the corpus but {n:,} vectors in the Flat index "
                         f"{flat_path}; row i of the index must be passage i", corpus_path)
    seconds["store"] = round(time.perf_counter() - t, 2)

    # train on a seeded random sample, read through the map in sorted order
    t = time.perf_counter()
    size = plan.train_points
    train_rows = np.sort(rng.choice(n, size=size, replace=False)) if size < n else np.arange(n)
    say(f"training {plan.factory} on {size:,} of {n:,} vectors")
    index = dense.new_index(plan, d)
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    ivf.cp.seed = seed
    ivf.pq.cp.seed = seed
    xt = _rows(flat, train_rows, chunk)
    dense.train_index(index, xt)  # polysemous training off, OPQ's PQ at the index's bits
    del xt
    seconds["train"] = round(time.perf_counter() - t, 2)

    t = time.perf_counter()
    say(f"adding {n:,} vectors in chunks of {chunk:,}")
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        index.add(flat.reconstruct_n(start, m))
        if progress is not None:
            progress(m)
    seconds["add"] = round(time.perf_counter() - t, 2)

    t = time.perf_counter()
    if eval_queries > 0:
        say(f"measuring recall against Flat on {min(eval_queries, n)} queries")
        recall = _evaluate(faiss, flat, index, plan.nlist, train_rows, eval_queries, ks, rng, query_noise,
                           nprobe)
        chosen = recall["nprobe"]
    else:
        recall = None
        chosen = nprobe or plan.nprobe
    faiss.extract_index_ivf(index).nprobe = chosen
    seconds["eval"] = round(time.perf_counter() - t, 2)

    faiss.write_index(index, str(work / INDEX_FILE))
    sizes = {"flat": flat_path.stat().st_size, "index": (work / INDEX_FILE).stat().st_size,
             "store": (work / STORE_FILE).stat().st_size, "jsonl": corpus_path.stat().st_size}
    sizes["ratio"] = round((sizes["index"] + sizes["store"]) / (sizes["flat"] + sizes["jsonl"]), 4)
    sizes["vector_compression"] = round(sizes["flat"] / sizes["index"], 2)
    sizes["index_bytes_per_vector"] = round(sizes["index"] / n, 2)
    sizes["code_bytes_per_vector"] = plan.code_bytes
    return {"factory": plan.factory, "count": n, "dim": d, "nlist": plan.nlist, "nprobe": chosen,
            "train_size": plan.train_points, "recall": recall, "bytes": sizes, "seconds": seconds,
            "store_compression": compression}


def _evaluate(faiss: Any, flat: Any, index: Any, nlist: int, train_rows: np.ndarray,
              eval_queries: int, ks: list[int], rng: np.random.Generator, noise: float,
              nprobe: int | None) -> dict[str, Any]:
    """Recall of `index` against the exact Flat top-k on noisy database-vector queries."""
    n, d = int(flat.ntotal), int(flat.d)
    q = min(eval_queries, n)
    if n - len(train_rows) >= q:  # held out from training when the corpus allows it
        pool = np.setdiff1d(np.arange(n), train_rows, assume_unique=True)
        rows = np.sort(rng.choice(pool, size=q, replace=False))
    else:
        rows = np.sort(rng.choice(n, size=q, replace=False))
    x = _rows(flat, rows, 100_000)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    queries = x + rng.standard_normal(x.shape, dtype=np.float32) * np.float32(noise / math.sqrt(d))
    queries /= np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    ks = [k for k in ks if k <= n] or [n]
    kmax = ks[-1]
    _, truth = flat.search(queries, kmax)

    ivf = faiss.extract_index_ivf(index)
    probes = sorted({min(p, nlist) for p in NPROBE_SWEEP} | ({nprobe} if nprobe else set()))
    sweep, found_at = [], {}
    for p in probes:
        ivf.nprobe = p
        t = time.perf_counter()
        _, found = index.search(queries, kmax)
        ms = (time.perf_counter() - t) * 1000 / q
        found_at[p] = found
        row = {"nprobe": p}
        row.update({f"recall@{k}": _recall(truth, found, k) for k in ks})
        row["ms_per_query"] = round(ms, 3)
        sweep.append(row)
    key = f"recall@{kmax}"
    if nprobe is None:
        best = max(r[key] for r in sweep)
        nprobe = next(r["nprobe"] for r in sweep if r[key] >= best - NPROBE_TOLERANCE)
    at = next(r for r in sweep if r["nprobe"] == nprobe)
    found = found_at[nprobe]
    return {
        "method": ("passage-like queries: database vectors + isotropic Gaussian noise of norm "
                   f"{noise}, renormalised (not real questions); truth = Flat exact top-k; "
                   "recall@k = |Flat top-k & compact top-k| / k"),
        "queries": q, "noise": noise, "held_out": bool(n - len(train_rows) >= q), "nprobe": nprobe,
        **{f"recall@{k}": at[f"recall@{k}"] for k in ks},
        "source_in_top": {"k": kmax, "flat": _mean_hit(truth, rows), "compact": _mean_hit(found, rows)},
        "sweep": sweep,
    }


def _recall(truth: np.ndarray, found: np.ndarray, k: int) -> float:
    """Mean over queries of |truth[:k] ∩ found[:k]| / k (faiss's -1 padding never matches)."""
    hits = (found[:, :k, None] == truth[:, None, :k]).any(axis=2).sum()
    return round(float(hits) / (truth.shape[0] * k), 4)


def _mean_hit(found: np.ndarray, rows: np.ndarray) -> float:
    """Share of queries whose source row is among the results."""
    return round(float((found == rows[:, None]).any(axis=1).mean()), 4)


def _rows(flat: Any, rows: np.ndarray, chunk: int) -> np.ndarray:
    """Vectors at sorted `rows`, read through the map in blocks of `chunk` rows."""
    out = np.empty((len(rows), flat.d), dtype=np.float32)
    for start in range(0, len(rows), chunk):
        part = np.ascontiguousarray(rows[start:start + chunk], dtype=np.int64)
        out[start:start + len(part)] = flat.reconstruct_batch(part)
    return out


# --- putting the files in place ----------------------------------------------------------------

# Beside the index files while they are renamed in: whoever finds it knows they are dgpo-edge's, so
# a rerun may replace them, and whether an index stood there before (a plain rerun then still
# needs --overwrite). Hidden, so check_holds_only leaves it alone.
SWAP_MARKER = ".dgpo-edge-swap"


def install_files(work: Path, out: Path, files: list[str], finish_later: bool = False) -> None:
    """Rename `files` and the manifest from `work` into `out`, the manifest last; an index file
    `files` lacks is removed from `out` (a dense index's vectors.faiss under a bm25 one).

    No renaming of several files is atomic, so it is journalled: SWAP_MARKER is written first and
    removed last, and held (`temps.held_file`) while the renames run, so a reader leaves a live
    install alone. An exception on the way (Ctrl-C, a failed rename) finishes the renames from
    `work`, where every new file is whole, and is then raised: the folder holds the new index. A
    kill leaves the marker. With `finish_later` (`index update`, whose work folder is
    `out/.work/update`) the marker names `work` and `files`, and the next command that opens or
    writes the folder finishes the renames (`settle_index`). Otherwise the rerun of the same
    command redoes them (`index build` resumes from its `.work`; `index compact` compacts again),
    the marker vouching for the half-renamed files (`check_index_folder`); finishing them first
    would leave that rerun refused, an index being there already. Renames that keep failing leave
    the marker too."""
    marker = out / SWAP_MARKER
    replacing = (out / MANIFEST_FILE).exists() or _swap_was_replacing(out)
    entry = {"replacing": replacing,
             "made_by": f"dgpo-edge {__version__}: index files are being renamed into this folder; a rerun of "
                        "the command, or for index update the next command that opens it, finishes that"}
    if finish_later and work.absolute().parent.parent == out.absolute():
        entry.update({"from": work.absolute().relative_to(out.absolute()).as_posix(), "files": list(files)})
    with temps.held_file(marker, json.dumps(entry)):
        try:
            _move_in(work, out, files)
        except BaseException:
            with contextlib.suppress(Exception):   # failing again (a disk gone): the marker stays for the rerun
                _move_in(work, out, files)
                marker.unlink()
            raise
        marker.unlink()


def settle_index(out: Path) -> None:
    """Finish the renames of an `install_files(finish_later=True)` that a kill stopped, by its
    marker: from the work folder it names, while that still holds the new manifest (renamed last,
    so every file not yet moved is still there, whole). Done holding the marker's lock, so only
    when its writer is gone and no other command settles it at once; never where that cannot be
    told (no flock), nor for a marker that names no work folder (torn, or from `index build` or
    `index compact`, whose rerun redoes the renames), nor when the work folder is gone with `out`
    still lacking its manifest: the marker then stays, vouching for the half-renamed files that a
    rebuild replaces. Best effort: a folder this process may not write is left as it is."""
    marker = out / SWAP_MARKER
    if not marker.is_file():
        return
    with temps.locked(marker) as free, contextlib.suppress(OSError, ValueError):
        if free is not True:
            return
        entry = json.loads(marker.read_text(encoding="utf-8"))
        work, files = _marked_work(out, entry), entry.get("files") if isinstance(entry, dict) else None
        if work is None or not isinstance(files, list) or not all(isinstance(f, str) for f in files) \
                or not set(files) <= {STORE_FILE, INDEX_FILE}:
            return
        if (work / MANIFEST_FILE).is_file():
            _move_in(work, out, files)
            with contextlib.suppress(OSError):
                work.rmdir()   # emptied
        elif not (out / MANIFEST_FILE).is_file():
            return
        marker.unlink()


def _marked_work(out: Path, entry: Any) -> Path | None:
    """The work folder a marker names: two plain names under `out` (`.work/update`), a real folder there."""
    rel = entry.get("from") if isinstance(entry, dict) else None
    parts = rel.split("/") if isinstance(rel, str) else []
    if len(parts) != 2 or any(p in ("", ".", "..") or "\\" in p for p in parts):
        return None
    work = out.joinpath(*parts)
    return work if work.is_dir() and not any(p.is_symlink() for p in (work, work.parent)) else None


def _move_in(work: Path, out: Path, files: list[str]) -> None:
    """The renames of `install_files`; run again after an interruption, it does what is left."""
    if not (work / MANIFEST_FILE).exists():
        return   # the manifest, renamed last, is in: so is everything else
    with contextlib.suppress(FileNotFoundError):
        os.unlink(out / MANIFEST_FILE)  # from here on, no manifest describes a half-swapped folder
    for name in (STORE_FILE, INDEX_FILE):
        if name not in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(out / name)
        elif (work / name).exists():   # else renamed in before the interruption
            os.replace(work / name, out / name)
    os.replace(work / MANIFEST_FILE, out / MANIFEST_FILE)


def _swap_was_replacing(out: Path) -> bool:
    """Whether `out` holds the marker of renames that were replacing an index when they were
    interrupted (an unreadable marker counts as one: --overwrite is then asked for)."""
    try:
        marker = json.loads((out / SWAP_MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    return not isinstance(marker, dict) or marker.get("replacing") is not False


def check_index_folder(out: Path, own: Iterable[str] = ()) -> None:
    """Refuse an output folder that holds anything but an index: its files are moved into the
    folder, so a person's files there would be mixed with them, or replaced where names meet.
    `own`: what the builder itself leaves there (index build's work folder), which also vouches
    for index files a killed build left without their manifest, as SWAP_MARKER does for those of
    interrupted renames. A killed compaction's .partial-* is hidden, and so left alone here (the
    next compaction into the folder removes it: `temps.sweep`)."""
    index_files = {INDEX_FILE, STORE_FILE, MANIFEST_FILE}
    names = jsonio.check_holds_only(out, index_files, "an index's", "give the index a folder of its own")
    vouched = any((out / n).exists() for n in (*own, SWAP_MARKER))
    if names & index_files and not vouched and not jsonio.ours(out):
        raise InputError(f"holds {', '.join(sorted(names & index_files))} but no index dgpo-edge wrote; "
                         "refusing to replace them", out)


def check_index_out(out: Path, overwrite: bool, own: Iterable[str] = (), hint: str = "") -> None:
    """Refuse the output folder of `index build` or `index compact` unless it is new, empty, or holds
    an index dgpo-edge wrote (or what interrupted renames left of one replaced) and `overwrite` is
    given (`check_index_folder` refuses anything else, with or without it). `hint`: another way
    out, after the one through --overwrite. Renames a kill stopped are finished first (`settle_index`)."""
    settle_index(out)
    check_index_folder(out, own)
    if overwrite:
        return
    if (out / MANIFEST_FILE).exists():
        raise InputError(f"an index already exists here (manifest.json); pass --overwrite to replace it{hint}",
                         out)
    if _swap_was_replacing(out):
        raise InputError(f"holds a half-replaced index (the replacing was interrupted, {SWAP_MARKER}); "
                         "pass --overwrite to replace it", out)


def _check_corpus_count(corpus: Path, n: int, flat_path: Path) -> None:
    """Row i of the index must be line i of the corpus: compare the counts up front.

    Newlines are counted in binary blocks (seconds on wiki-18's 14 GB); only
    when that count differs are blank lines (which the reader skips) excluded
    by a slower line-by-line count, before the mismatch is reported.
    """
    require_file(corpus)
    lines = count_lines(corpus)
    if lines != n:
        lines = sum(1 for _, raw in iter_lines(corpus) if raw.strip())   # bounded lines, as the reader
    if lines != n:
        raise InputError(f"{lines:,} passages (non-blank lines) but the Flat index {flat_path} holds "
                         f"{n:,} vectors; row i of the index must be line i of the corpus", corpus)


@contextlib.contextmanager
def _threads(faiss: Any, threads: int | None):
    if threads is None:
        yield
        return
    old = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(max(1, threads))
    try:
        yield
    finally:
        faiss.omp_set_num_threads(old)


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as e:
        raise InputError(f"index compaction needs the Python package 'faiss' ({e}); install it with "
                         f"`pip install faiss-cpu` or `pip install 'dgpo-edge[edge]'`") from None
    return faiss


def _dense() -> Any:
    """The `dense` module (planning and training), imported only when faiss is there."""
    _faiss()
    from . import dense

    return dense


def _faiss_message(e: BaseException) -> str:
    """The useful tail of a faiss RuntimeError ("Error in ... at file:line: <this>")."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text.split(": ", 2)[-1] if text.startswith("Error in") else text


__all__ = ["FlatHeader", "SWAP_MARKER", "check_index_out", "settle_index", "compact", "compact_encoder", "default_encoder",
           "file_digest", "install_files", "open_flat", "plan_ivfpq", "read_flat_header", "valid_pq",
           "write_manifest"]
