"""FAISS helpers: index plans, training, nprobe, thread counts and atomic index files.

Every dense index here uses the inner-product metric on L2-normalised vectors
(cosine similarity), like Search-R1's e5 indexes; `normalize` is applied to
passages and queries alike, so an encoder that does not normalise still gets
cosine scores. FAISS row i is passage store row i.

Sizing: `plan_index` holds the one rule that `dgpo-edge index build`
(`build.py`) and `dgpo-edge index compact` (`compact.py`) share, so a corpus
built from text and a Search-R1 Flat index of the same size get the same
factory string: nlist near 4·√n with FAISS's 39 training points per list,
OPQ from 8·d training vectors, a PQ code of fixed bytes whose bits drop
(never below 4) when the sample is too small for 8, nprobe nlist/16 within
[8, 128], exact Flat below 78 passages. The rule with examples and reasons is
in docs/retrieval.md ("Index sizing rules"); the recall measured behind it in
docs/benchmarks.md ("The IVF-PQ sizing rule on small corpora").

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
from ..jsonio import atomic_path, require_file

DENSE_KINDS = ("flat", "ivfpq", "hybrid")
MIN_POINTS = 39  # FAISS's min_points_per_centroid: fewer training points per centroid and it warns
MIN_PQ_BITS = 4  # the fewest bits per sub-quantizer a default plan uses (docs/retrieval.md)
MIN_IVFPQ = 2 * MIN_POINTS  # fewer passages (or training vectors) than this: no IVF-PQ
MAX_CODE_BYTES = 64
MIN_NPROBE, MAX_NPROBE = 8, 128
OPQ_AUTO_POINTS = 8  # OPQ is on by default from 8·d training vectors (docs/retrieval.md)
OPQ_DIMS_PER_BYTE = 12  # default code size with OPQ: one byte per 12 dimensions


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
    opq_dim: int | None = None  # D of OPQ{M}_{D}: the dimension PQ and IVF work in

    @property
    def code_bytes(self) -> int | None:
        """Bytes of PQ code per vector (an IVF list adds an 8-byte id); None for Flat."""
        if self.pq is None or self.pq_bits is None:
            return None
        return (self.pq * self.pq_bits + 7) // 8

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def floor_pow2(x: float) -> int:
    """Largest power of two <= x (1 for x < 2)."""
    return 1 << max(0, math.floor(math.log2(x))) if x >= 1 else 1


def default_nlist(n: int, train: int | None = None) -> int:
    """Power of two nearest to 4·sqrt(n), capped so each list has >= 39 of the `train` (default n) points."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    t = n if train is None else min(n, train)
    target = 1 << max(0, round(math.log2(4 * math.sqrt(n))))
    return max(1, min(target, floor_pow2(t / MIN_POINTS)))


def default_pq_bits(t: int) -> int:
    """Bits per sub-quantizer for `t` training vectors (0: too few for IVF-PQ).

    8 when t >= 39·256; else the largest b with 39·2^b <= t, at least 4.
    """
    if t < MIN_IVFPQ:
        return 0
    return max(MIN_PQ_BITS, min(8, int(math.log2(t / MIN_POINTS))))


def default_code_bytes(dim: int, opq: bool = False) -> int:
    """One byte per 8 dimensions (per 12 with OPQ), at most 64, as a valid PQ M at 8 bits."""
    per = OPQ_DIMS_PER_BYTE if opq else 8
    limit = max(1, min(MAX_CODE_BYTES, dim // per))
    if opq:
        return limit  # any M with 4M <= dim is valid under OPQ
    return largest_divisor_at_most(dim, limit)


def default_nprobe(nlist: int) -> int:
    """nlist/16 within [8, 128], never more than nlist."""
    return min(nlist, max(MIN_NPROBE, min(MAX_NPROBE, nlist // 16)))


def largest_divisor_at_most(dim: int, limit: int) -> int:
    """Largest divisor of `dim` that is <= limit (at least 1)."""
    for m in range(min(dim, max(1, limit)), 0, -1):
        if dim % m == 0:
            return m
    return 1


def valid_pq(dim: int, opq: bool = False) -> list[int]:
    """PQ sizes M accepted for vectors of dimension `dim`, ascending.

    Without OPQ, M must divide dim. With OPQ the rotation maps to D = 4M
    dims (any M with 4M <= dim) or, for larger M, to dim itself, which M then
    has to divide.
    """
    divisors = [m for m in range(1, dim + 1) if dim % m == 0]
    if not opq:
        return divisors
    return sorted(set(range(1, dim // 4 + 1)) | set(divisors))


def is_valid_pq(m: int, dim: int, opq: bool = False) -> bool:
    """Whether M = m is in `valid_pq(dim, opq)` (without listing them)."""
    return 1 <= m <= dim and (dim % m == 0 or (opq and 4 * m <= dim))


def opq_out_dim(m: int, dim: int) -> int:
    """D of `OPQ{M}_{D}`: 4M, or dim when 4M > dim."""
    return min(4 * m, dim)


def pq_for_bits(code_bytes: int, dim: int, bits: int, opq: bool = False) -> int:
    """M for a `code_bytes`-byte code at `bits` bits: the largest valid M <= 8·code_bytes/bits."""
    for m in range(min(dim, max(1, code_bytes * 8 // bits)), 0, -1):
        if is_valid_pq(m, dim, opq):
            return m
    return 1


def train_points(n: int, nlist: int, bits: int) -> int:
    """Training sample size: max(64·nlist, 256·2^bits), at most n."""
    return min(n, max(64 * nlist, 256 * (1 << bits)))


def pq_error(pq: Any, dim: int, opq: bool) -> InputError:
    """The InputError for a `pq` that does not fit `dim` (listing the valid values)."""
    if opq:
        big = [m for m in valid_pq(dim, opq) if 4 * m > dim]
        listing = f"1..{dim // 4}" + (f", or {', '.join(map(str, big))}" if big else "")
        return InputError(f"--pq {pq} does not fit OPQ on dimension {dim}: M must satisfy 4*M <= {dim} "
                          f"or divide {dim}; valid values: {listing}")
    return InputError(f"--pq {pq} does not divide the vector dimension {dim}; valid values: "
                      f"{', '.join(map(str, valid_pq(dim)))}")


def plan_index(kind: str, dim: int, n: int, nlist: int | None = None, pq: int | str | None = None,
               opq: bool | None = None, nprobe: int | None = None, train_size: int | None = None) -> IndexPlan:
    """Resolve the index for `n` vectors of `dim` dimensions (rules: docs/retrieval.md).

    `kind`: "flat", or "ivfpq"/"hybrid" (the same vectors). `pq` is the code
    size in bytes (an int, the M of `PQ{M}` at 8 bits; it must be a valid M
    itself), or an exact "MxB" (e.g. "96x4") that is used as given.
    `train_size`: train on that many vectors (at most n) instead of the
    default sample; nlist and bits then follow it. `opq`: None decides by the
    training sample (on from 8·d vectors), True/False force it. Bad values
    raise InputError (they come from the command line); the caller adds the file.
    """
    if kind not in DENSE_KINDS:
        raise InputError(f"unknown dense index kind {kind!r}: expected one of {', '.join(DENSE_KINDS)}")
    if dim < 1 or n < 1:
        raise ValueError(f"dim and n must be >= 1, got dim={dim}, n={n}")
    if kind == "flat":
        if opq or pq is not None or nlist is not None or train_size is not None:
            raise InputError("--nlist, --pq, --opq and a train size apply to --kind ivfpq or hybrid, "
                             "not flat")
        return IndexPlan("Flat")
    _, exact = _parse_pq(pq, dim, opq is not False)  # syntax first, before the sample size decides OPQ
    if train_size is not None and (isinstance(train_size, bool) or train_size < 1):
        raise InputError(f"train size must be >= 1, got {train_size}")
    if nprobe is not None and nprobe < 1:
        raise InputError(f"--nprobe must be >= 1, got {nprobe}")
    if n < MIN_IVFPQ:  # too few vectors to train IVF-PQ: exact search is tiny here anyway
        if opq or nlist is not None or train_size is not None or exact is not None:
            raise InputError(f"{n} passages are too few to train IVF-PQ (needs {MIN_IVFPQ}); "
                             "drop --nlist/--pq/--opq to get an exact Flat index")
        return IndexPlan("Flat")
    t = n if train_size is None else min(train_size, n)
    if t < MIN_IVFPQ:
        raise InputError(f"a training sample of {t} vectors is too small for IVF-PQ (needs {MIN_IVFPQ})")
    if opq is None:
        opq = t >= OPQ_AUTO_POINTS * dim
    code, exact = _parse_pq(pq, dim, opq)
    if nlist is None:
        nlist = default_nlist(n, t)
    elif not 1 <= nlist <= n:
        raise InputError(f"--nlist {nlist} is out of range: it must be between 1 and the number of "
                         f"passages" + ("" if n >= 1 << 40 else f" ({n:,})"))
    elif nlist > t:
        raise InputError(f"--nlist {nlist} needs at least {nlist} training vectors, got {t}")
    if exact is not None:
        m, bits = exact
        if t < (1 << bits):
            raise InputError(f"--pq {pq!r} needs at least {1 << bits} training vectors, got {t}")
    else:
        bits = default_pq_bits(t)
        m = pq_for_bits(code, dim, bits, opq)  # fewer bits: more sub-quantizers, same code size
    if opq and t < dim:  # FAISS 1.15's OPQ training crashes below D (<= dim) training vectors
        have = f"the corpus has {n}" if t == n else f"the training sample has {t}"
        raise InputError(f"--opq needs at least {dim} passages to train (one per dimension); {have}")
    d_out = opq_out_dim(m, dim) if opq else None
    code_part = f"PQ{m}" if bits == 8 else f"PQ{m}x{bits}"
    factory = (f"OPQ{m}_{d_out}," if opq else "") + f"IVF{nlist},{code_part}"
    return IndexPlan(factory, nlist=nlist, pq=m, pq_bits=bits, opq=opq,
                     nprobe=default_nprobe(nlist) if nprobe is None else min(nprobe, nlist),
                     train_points=t if train_size is not None else train_points(n, nlist, bits),
                     opq_dim=d_out)


def factory_string(kind: str, dim: int, n: int, nlist: int | None = None, pq: int | str | None = None,
                   opq: bool | None = None) -> str:
    """FAISS factory string: "Flat", "IVF{nlist},PQ{M}[x{bits}]" or "OPQ{M}_{D},IVF{nlist},PQ{M}[x{bits}]".

    The factory of `plan_index` for the same arguments; `x8` is left out.
    """
    if kind == "flat":
        return "Flat"
    return plan_index(kind, dim, n, nlist=nlist, pq=pq, opq=opq).factory


def _parse_pq(pq: int | str | None, dim: int, opq: bool) -> tuple[int, tuple[int, int] | None]:
    """(code bytes, None) for None or a byte count; (0, (M, bits)) for an exact "MxB"."""
    if isinstance(pq, str) and "x" in pq.lower():
        try:
            m, bits = (int(part) for part in pq.lower().split("x"))
        except ValueError:
            raise InputError(f"--pq {pq!r}: expected M or MxBITS, e.g. 48 or 96x4") from None
        if not 1 <= bits <= 8:
            raise InputError(f"--pq {pq!r}: bits must be between 1 and 8")
        if not is_valid_pq(m, dim, opq):
            raise pq_error(pq, dim, opq)
        return 0, (m, bits)
    if pq is None:
        return default_code_bytes(dim, opq), None
    if isinstance(pq, bool):
        raise InputError(f"--pq {pq!r}: expected M or MxBITS, e.g. 48 or 96x4")
    try:
        code = int(pq)
    except ValueError:
        raise InputError(f"--pq {pq!r}: expected M or MxBITS, e.g. 48 or 96x4") from None
    if code < 1:
        raise InputError(f"--pq must be >= 1, got {code}")
    if not is_valid_pq(code, dim, opq):
        raise pq_error(code, dim, opq)
    return code, None


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
            train_index(index, prepare(train))
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


def train_index(index: faiss.Index, x: np.ndarray) -> None:
    """index.train(x), with polysemous training off and OPQ's inner PQ at the index's bit width.

    Polysemous training (on by default for factory IVF-PQ) only serves Hamming
    pre-filtering, which is never used here, and is most of the training time.
    OPQMatrix otherwise trains an 8-bit PQ of its own, which needs 256·39
    points and would warn (and fit badly) on the small corpora that get fewer bits.
    At the 4-bit floor (docs/retrieval.md) fewer than 39 points per PQ
    centroid is the plan, not a mistake: FAISS's warning is turned off there.
    """
    ivfpq = faiss.downcast_index(faiss.extract_index_ivf(index)) if _is_ivf(index) else None
    if isinstance(ivfpq, faiss.IndexIVFPQ):
        ivfpq.do_polysemous_training = False
        _accept_small_sample(ivfpq.pq, len(x))
    opq, helper = None, None
    if isinstance(index, faiss.IndexPreTransform) and isinstance(ivfpq, faiss.IndexIVFPQ):
        for i in range(index.chain.size()):
            vt = faiss.downcast_VectorTransform(index.chain.at(i))
            if isinstance(vt, faiss.OPQMatrix) and ivfpq.pq.nbits != 8:
                opq = vt
                helper = faiss.ProductQuantizer(vt.d_out, vt.M, ivfpq.pq.nbits)
                _accept_small_sample(helper, len(x))
                opq.pq = helper
    try:
        index.train(x)
    finally:
        if opq is not None:
            opq.pq = None  # the helper is Python-owned: leave no dangling pointer behind
        del helper


def _accept_small_sample(pq: faiss.ProductQuantizer, points: int) -> None:
    """Lower the PQ's warning threshold to what it gets, for codes of at most MIN_PQ_BITS bits.

    min_points_per_centroid only decides FAISS's "please provide at least"
    warning; the k-means itself is unchanged.
    """
    if pq.nbits <= MIN_PQ_BITS:
        pq.cp.min_points_per_centroid = max(1, min(MIN_POINTS, points >> pq.nbits))


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
    require_file(path)
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
