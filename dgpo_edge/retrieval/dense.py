"""FAISS helpers: index plans, training, nprobe, thread counts and atomic index files.

Every dense index here uses the inner-product metric on L2-normalised vectors
(cosine similarity), like Search-R1's e5 indexes; `normalize` is applied to
passages and queries alike, so an encoder that does not normalise still gets
cosine scores. FAISS row i is passage store row i.

Sizing rules (`plan_index`; n = passages, d = encoder dimension):

- **nlist** (IVF lists): the power of two nearest to 4·√n (FAISS's guideline
  for < 1M vectors is 4√n to 16√n), capped at the largest power of two
  ≤ n / 39 so every list gets FAISS's minimum of 39 training points (no
  "please provide at least …" warnings, no degenerate lists). 300 passages →
  4 lists, 10k → 256 (capped), 1M → 4096, 21M → 16384.
- **PQ code size**: one byte per 8 dimensions, at most 64 bytes (PQ64, the
  DESIGN §3 default for wiki-18): 384-d MiniLM → 48 bytes, 768-d e5 → 64.
  `pq` overrides it (bytes at 8 bits, i.e. M of `PQ{M}`).
- **PQ bits**: 8 when n ≥ 39·256 = 9,984 (every sub-quantizer has 256
  centroids with 39 points each); below that the largest b with 39·2^b ≤ n,
  e.g. 300 passages → 2 bits. With fewer bits the number of sub-quantizers
  grows by 8/b (rounded down to a divisor of d), so the code stays the same
  size: 300 MiniLM passages get `IVF4,PQ192x2` (48 bytes per vector). On 300
  wiki-18 passages, queried with their first sentences, that keeps top-1
  agreement with Flat at 0.8-0.9, where `PQ48x2` gives 0.4. Below 78 passages (2 · 39: not even 1-bit PQ can be
  trained) the plan falls back to exact `Flat`, which is tiny at that size.
- **nprobe** (lists searched): nlist/16, within [8, 128] and at most nlist
  (all lists for tiny corpora); 4096 lists → 128.
- **training sample**: max(64·nlist, 256·2^bits) vectors, at most n, taken at
  evenly spaced rows (a corpus in article order is covered end to end);
  FAISS's own k-means subsamples to 256 points per centroid anyway.
- **OPQ** (`OPQ{M},IVF…,PQ{M}x{b}`) rotates the space before PQ. Its training
  crashes FAISS 1.15 (heap corruption, not an exception) when given fewer
  vectors than dimensions, so `plan_index` refuses OPQ for n < d.

Nothing happens at import: thread counts are set only through an explicit
`threads` argument (`faiss_threads`), and restored afterwards.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from ..errors import InputError
from ..jsonio import atomic_path

DENSE_KINDS = ("flat", "ivfpq", "hybrid")
MIN_POINTS = 39  # FAISS's min_points_per_centroid: fewer training points per centroid and it warns
MAX_CODE_BYTES = 64
MIN_NPROBE, MAX_NPROBE = 8, 128


# --- planning -------------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexPlan:
    """What `train_and_add` builds: the factory string and the numbers behind it."""

    factory: str
    nlist: int | None = None
    pq: int | None = None  # sub-quantizers (M of PQ{M}); bytes per code = pq * pq_bits / 8
    pq_bits: int | None = None
    opq: bool = False
    nprobe: int | None = None
    train_points: int = 0  # 0: the index needs no training

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def floor_pow2(x: float) -> int:
    """Largest power of two <= x (1 for x < 2)."""
    return 1 << max(0, math.floor(math.log2(x))) if x >= 1 else 1


def default_nlist(n: int) -> int:
    """Power of two nearest to 4·sqrt(n), capped so each list has >= 39 training points."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    target = 1 << max(0, round(math.log2(4 * math.sqrt(n))))
    return max(1, min(target, floor_pow2(n / MIN_POINTS)))


def default_pq_bits(n: int) -> int:
    """8 when n >= 39·256; else the largest b with 39·2^b <= n (0: too few for any PQ)."""
    if n < 2 * MIN_POINTS:
        return 0
    return min(8, int(math.log2(n / MIN_POINTS)))


def default_code_bytes(dim: int) -> int:
    """One byte per 8 dimensions, at most 64, as a divisor of `dim` (PQ M at 8 bits)."""
    return largest_divisor_at_most(dim, max(1, min(MAX_CODE_BYTES, dim // 8)))


def default_nprobe(nlist: int) -> int:
    """nlist/16 within [8, 128], never more than nlist."""
    return min(nlist, max(MIN_NPROBE, min(MAX_NPROBE, nlist // 16)))


def largest_divisor_at_most(dim: int, limit: int) -> int:
    """Largest divisor of `dim` that is <= limit (at least 1)."""
    for m in range(min(dim, max(1, limit)), 0, -1):
        if dim % m == 0:
            return m
    return 1


def train_points(n: int, nlist: int, bits: int) -> int:
    """Training sample size: max(64·nlist, 256·2^bits), at most n."""
    return min(n, max(64 * nlist, 256 * (1 << bits)))


def plan_index(kind: str, dim: int, n: int, nlist: int | None = None, pq: int | str | None = None,
               opq: bool = False, nprobe: int | None = None) -> IndexPlan:
    """Resolve the index for `n` vectors of `dim` dimensions (see the module docstring).

    `kind`: "flat", or "ivfpq"/"hybrid" (the same vectors). `pq` is the code
    size in bytes at 8 bits (an int), or an exact "MxB" (e.g. "96x4") that is
    used as given. Bad values raise InputError (they come from the command line).
    """
    if kind not in DENSE_KINDS:
        raise InputError(f"unknown dense index kind {kind!r}: expected one of {', '.join(DENSE_KINDS)}")
    if dim < 1 or n < 1:
        raise ValueError(f"dim and n must be >= 1, got dim={dim}, n={n}")
    if kind == "flat":
        if opq or pq is not None or nlist is not None:
            raise InputError("--nlist, --pq and --opq apply to --kind ivfpq or hybrid, not flat")
        return IndexPlan("Flat")
    m, bits = _resolve_pq(pq, dim, n)
    if bits == 0:  # too few vectors to train any quantizer: exact search is tiny here anyway
        if opq or nlist is not None:
            raise InputError(f"{n} passages are too few to train IVF-PQ (needs {2 * MIN_POINTS}); "
                             "drop --nlist/--pq/--opq to get an exact Flat index")
        return IndexPlan("Flat")
    if nlist is None:
        nlist = default_nlist(n)
    elif not 1 <= nlist <= n:
        raise InputError(f"--nlist {nlist} must be between 1 and the number of passages ({n})")
    if opq and n < dim:
        raise InputError(f"--opq needs at least {dim} passages to train (one per dimension); "
                         f"the corpus has {n}")
    if nprobe is None:
        nprobe = default_nprobe(nlist)
    elif nprobe < 1:
        raise InputError(f"--nprobe must be >= 1, got {nprobe}")
    return IndexPlan(factory_string("ivfpq", dim, n, nlist=nlist, pq=f"{m}x{bits}", opq=opq),
                     nlist=nlist, pq=m, pq_bits=bits, opq=opq, nprobe=min(nprobe, nlist),
                     train_points=train_points(n, nlist, bits))


def factory_string(kind: str, dim: int, n: int, nlist: int | None = None, pq: int | str | None = None,
                   opq: bool = False) -> str:
    """FAISS factory string: "Flat", "IVF{nlist},PQ{M}[x{bits}]" or "OPQ{M},IVF{nlist},PQ{M}[x{bits}]".

    Defaults follow the module docstring's rules for `n` vectors; `x8` is left out.
    """
    if kind == "flat":
        return "Flat"
    if kind not in DENSE_KINDS:
        raise InputError(f"unknown dense index kind {kind!r}: expected one of {', '.join(DENSE_KINDS)}")
    m, bits = _resolve_pq(pq, dim, n)
    if bits == 0:
        return "Flat"
    nlist = default_nlist(n) if nlist is None else nlist
    code = f"PQ{m}" if bits == 8 else f"PQ{m}x{bits}"
    return f"{f'OPQ{m},' if opq else ''}IVF{nlist},{code}"


def _resolve_pq(pq: int | str | None, dim: int, n: int) -> tuple[int, int]:
    """(M, bits) for `pq` (None, code bytes, or "MxB"); bits 0 means too few vectors."""
    if isinstance(pq, str) and "x" in pq.lower():
        try:
            m, bits = (int(part) for part in pq.lower().split("x"))
        except ValueError:
            raise InputError(f"--pq {pq!r}: expected M or MxBITS, e.g. 48 or 96x4") from None
        if not 1 <= bits <= 8:
            raise InputError(f"--pq {pq!r}: bits must be between 1 and 8")
        if n < (1 << bits):
            raise InputError(f"--pq {pq!r} needs at least {1 << bits} passages to train; the corpus has {n}")
    else:
        try:
            code = default_code_bytes(dim) if pq is None else int(pq)
        except ValueError:
            raise InputError(f"--pq {pq!r}: expected M or MxBITS, e.g. 48 or 96x4") from None
        bits = default_pq_bits(n)
        if code < 1:
            raise InputError(f"--pq must be >= 1, got {code}")
        if pq is not None and dim % code:
            raise InputError(f"--pq {code} must divide the encoder dimension {dim}")
        if bits == 0:
            return code, 0
        # Fewer bits per sub-quantizer: more sub-quantizers, same code size.
        m = largest_divisor_at_most(dim, code * 8 // bits)
    if dim % m:
        raise InputError(f"--pq {pq!r}: M={m} must divide the encoder dimension {dim}")
    return m, bits


# --- threads ---------------------------------------------------------------------------------

@contextlib.contextmanager
def faiss_threads(threads: int | None) -> Iterator[None]:
    """Run the block with FAISS using `threads` OpenMP threads (None: leave as is), then restore."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise InputError(f"--threads must be >= 1, got {threads}")
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


# --- vectors, training, search ------------------------------------------------------------------

def normalize(vectors: np.ndarray) -> np.ndarray:
    """A C-contiguous float32 copy with unit L2 rows (zero rows stay zero)."""
    v = np.array(vectors, dtype=np.float32, order="C", copy=True)
    if v.ndim != 2:
        raise ValueError(f"expected a 2-d array of vectors, got shape {v.shape}")
    if len(v):
        faiss.normalize_L2(v)
    return v


def _as_float32(vectors: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vectors, dtype=np.float32)


def sample_rows(n: int, m: int) -> np.ndarray:
    """`m` evenly spaced row numbers out of n (all rows when m >= n), ascending."""
    if m >= n:
        return np.arange(n, dtype=np.int64)
    return (np.arange(m, dtype=np.int64) * n) // m


def new_index(plan: IndexPlan | str, dim: int) -> faiss.Index:
    """An empty inner-product index for `plan` (an IndexPlan or a factory string)."""
    factory = plan.factory if isinstance(plan, IndexPlan) else plan
    return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)


def train_and_add(batches: Iterable[np.ndarray], plan: IndexPlan | str, dim: int, *,
                  train: np.ndarray | None = None, threads: int | None = None,
                  progress: Callable[[int], None] | None = None,
                  normalized: bool = False) -> faiss.Index:
    """Build an index from vector batches (row order = FAISS ids 0, 1, …).

    `train` is the training sample, required when the index needs training
    (see `sample_rows`). Batches and sample are normalised here (into copies),
    unless `normalized=True` says they already are: then float32 C-contiguous
    input (memory maps included) goes to FAISS without a copy, which matters
    for a training sample of a million vectors. `progress(k)` is called with
    the number of vectors added after each batch. With an IndexPlan, its
    nprobe is set before returning (and saved with the index).
    """
    prepare = _as_float32 if normalized else normalize
    index = new_index(plan, dim)
    with faiss_threads(threads):
        if not index.is_trained:
            if train is None:
                raise ValueError(f"index {index_factory_of(plan)!r} needs a training sample")
            _train(index, prepare(train))
        for batch in batches:
            if batch.shape[1:] != (dim,):
                raise ValueError(f"expected vectors of dimension {dim}, got shape {batch.shape}")
            index.add(prepare(batch))
            if progress is not None:
                progress(len(batch))
    if isinstance(plan, IndexPlan) and plan.nprobe is not None:
        set_nprobe(index, plan.nprobe)
    return index


def index_factory_of(plan: IndexPlan | str) -> str:
    return plan.factory if isinstance(plan, IndexPlan) else plan


def _train(index: faiss.Index, x: np.ndarray) -> None:
    """index.train(x), with polysemous training off and OPQ's inner PQ at the index's bit width.

    Polysemous training (on by default for factory IVF-PQ) only serves Hamming
    pre-filtering, which is never used here, and is most of the training time.
    OPQMatrix otherwise trains an 8-bit PQ of its own, which needs 256·39
    points and would warn (and fit badly) on the small corpora that get fewer bits.
    """
    ivfpq = faiss.downcast_index(faiss.extract_index_ivf(index)) if _is_ivf(index) else None
    if isinstance(ivfpq, faiss.IndexIVFPQ):
        ivfpq.do_polysemous_training = False
    opq, helper = None, None
    if isinstance(index, faiss.IndexPreTransform) and isinstance(ivfpq, faiss.IndexIVFPQ):
        for i in range(index.chain.size()):
            vt = faiss.downcast_VectorTransform(index.chain.at(i))
            if isinstance(vt, faiss.OPQMatrix) and ivfpq.pq.nbits != 8:
                opq = vt
                helper = faiss.ProductQuantizer(vt.d_out, vt.M, ivfpq.pq.nbits)
                opq.pq = helper
    try:
        index.train(x)
    finally:
        if opq is not None:
            opq.pq = None  # the helper is Python-owned: leave no dangling pointer behind
        del helper


def _is_ivf(index: faiss.Index) -> bool:
    try:
        faiss.extract_index_ivf(index)
    except RuntimeError:
        return False
    return True


def set_nprobe(index: faiss.Index, nprobe: int | None) -> int | None:
    """Set the lists searched per query on an IVF index (OPQ/PreTransform-wrapped too).

    Clamped to [1, nlist]; returns the value set, or None for a non-IVF index
    (Flat), where it means nothing. `nprobe=None` just reports the current value.
    """
    if not _is_ivf(index):
        return None
    ivf = faiss.extract_index_ivf(index)
    if nprobe is not None:
        if nprobe < 1:
            raise InputError(f"--nprobe must be >= 1, got {nprobe}")
        ivf.nprobe = min(int(nprobe), ivf.nlist)
    return int(ivf.nprobe)


def search(index: faiss.Index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids), each [len(queries), k]; ids are -1 where fewer than k were found."""
    return index.search(normalize(queries), k)


# --- files ---------------------------------------------------------------------------------------

def write_index(index: faiss.Index, path: str | Path) -> None:
    """Write `index` atomically (temp file next to `path`, fsync, rename)."""
    with atomic_path(path) as tmp:
        faiss.write_index(index, str(tmp))


def read_index(path: str | Path, mmap: bool = False) -> faiss.Index:
    """Read a FAISS index; a missing, truncated or foreign file raises InputError naming it.

    `mmap=True` maps a Flat index's vectors or an IVF index's lists from disk
    instead of reading them into RAM (slower first queries, far less memory).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path)
    flags = (faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY) if mmap else 0
    try:
        return faiss.read_index(str(path), flags)
    except RuntimeError as e:
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise InputError(f"not a readable FAISS index, truncated or corrupt ({reason})", path) from None


def describe(index: faiss.Index) -> dict[str, Any]:
    """ntotal, d, nlist and nprobe (None when not IVF) of an index, for manifests and logs."""
    ivf = faiss.extract_index_ivf(index) if _is_ivf(index) else None
    return {"ntotal": int(index.ntotal), "dim": int(index.d),
            "nlist": None if ivf is None else int(ivf.nlist),
            "nprobe": None if ivf is None else int(ivf.nprobe)}
