"""FAISS helpers: index plans, training, nprobe, thread counts and atomic index files.

Every dense index here uses the inner-product metric on L2-normalised vectors
(cosine similarity), like Search-R1's e5 indexes; `normalize` is applied to
passages and queries alike, so an encoder that does not normalise still gets
cosine scores. FAISS row i is passage store row i.

Sizing rules (`plan_index`), shared by `dgpo-edge index build` (`build.py`)
and `dgpo-edge index compact` (`compact.py`), so a corpus built from text and
a Search-R1 Flat index of the same size compacted with the same options get
the same factory string. n = passages, d = vector dimension, T = training
sample (n unless an explicit train size is given):

- **nlist** (IVF lists): the power of two nearest to 4·√n (FAISS's guideline
  for < 1M vectors is 4√n to 16√n), capped at the largest power of two
  ≤ T / 39 so every list gets FAISS's minimum of 39 training points (no
  "please provide at least …" warnings, no degenerate lists). 300 passages →
  4 lists, 1,000 → 16, 9,984 → 256 (capped), 1M → 4096, 21M → 16384.
- **OPQ by default** from T ≥ 8·d training vectors (3,072 for 384-d MiniLM,
  6,144 for 768-d e5); `--opq`/`--no-opq` force it. Measured on FactbookQA
  (10,303 passages, MiniLM int8, 1,379 questions; docs/benchmarks.md): at the
  same 32-byte code, OPQ raised the gold-answer hit@3 from 0.960× to 1.003×
  Flat's, and its rotation to D = 4M = 128 dimensions shrinks the IVF
  centroids and PQ codebooks, which dominate the file at that size: the
  index went from 11.6× (the old IVF256,PQ48 default) to 18–20× smaller
  than Flat. Below 8·d vectors the rotation is trained on too little
  (and FAISS crashes below d, see OPQ below), so it stays off.
- **PQ code size** (`pq`, bytes per vector; the M of `PQ{M}` at 8 bits): one
  byte per 8 dimensions, or per 12 with OPQ, at most 64 (PQ64, the DESIGN §3
  default for wiki-18): 384-d MiniLM → 48 bytes (32 with OPQ), 768-d e5 → 64. The code size is what is
  kept when fewer bits are used: M grows by 8/bits (to the largest valid M),
  so `--pq 48` means 48 bytes of code per vector at any corpus size.
- **PQ bits**: 8 when T ≥ 39·256 = 9,984 (every sub-quantizer gets 256
  centroids with 39 points each); below that the largest b with 39·2^b ≤ T,
  but never below 4. 1,000 e5 passages → `IVF16,PQ128x4`, 300 MiniLM
  passages → `IVF4,PQ96x4`, 9,983 → 7 bits. Below 78 passages (2 · 39, two
  IVF lists) the plan falls back to exact `Flat`, which is tiny at that size.

  Why a floor of 4 bits and a fixed code size (measured with faiss-cpu
  1.15.1, 3 seeds/subsets each; recall@10 against Flat, mean ± ≤ 0.03):
  on the 1,000-passage wiki-18 sample with its e5 vectors (768-d; subsets of
  150/300/600 rows drawn from it; queries = the passages' own vectors plus
  Gaussian noise of norm 0.2, as `compact` reports) three candidate rules gave

  | n     | old dense: 39·2^b, ≥ 1 bit | old compact: ≥ 4 bits, M fixed | this rule     |
  |-------|----------------------------|--------------------------------|---------------|
  | 150   | PQ384x1 (48 B) 0.595       | PQ64x4 (32 B) 0.640            | PQ128x4 0.709 |
  | 300   | PQ256x2 (64 B) 0.628       | PQ64x4 (32 B) 0.593            | PQ128x4 0.676 |
  | 600   | PQ128x3 (48 B) 0.600       | PQ64x4 (32 B) 0.575            | PQ128x4 0.660 |
  | 1,000 | PQ128x4 (64 B) 0.670       | PQ64x4 (32 B) 0.579            | PQ128x4 0.670 |

  (default `pq`, 64 B: this rule's codes are all 64 B, the old rules' vary).
  With `pq=48`: 300 → PQ192x2 0.578 / PQ48x4 0.560 / PQ96x4 0.623; 1,000 →
  PQ96x4 0.627 / PQ48x4 0.554 / PQ96x4 0.627. Noisier queries (norm 0.6)
  keep the order. So did real questions: MiniLM-int8 vectors of those
  passages, queried with 1,000 NQ-open dev questions, recall@10 with 48 B
  codes at n = 150/300/1,000: 1 or 2 bits 0.653/0.626/0.619 (old dense),
  `PQ48x4` 0.610/0.520/0.453 (old compact), 4 bits 0.729/0.672/0.619 (this
  rule). At a fixed code size more bits always won (300 e5 passages, 48 B:
  1 bit 0.567, 2 bits 0.578, 3 bits 0.604, 4 bits 0.623, 6 bits 0.692), so
  the rule keeps the bytes and takes the most bits it can train. It stops
  at 4 because codebooks cost d·2^b floats whatever n is: 49 KB for 768-d at
  4 bits, 197 KB at 6 and 786 KB at 8, next to a 922 KB Flat file for 300
  passages (8 bits reached 0.89-0.90 there, saving nothing over Flat).
  4-bit PQ needs only 16 training points; below 624 it gets fewer than 39
  per centroid, which `train_index` accepts without FAISS's warning. An
  exact "MxB" `pq` (e.g. "48x8") overrides the rule.
- **nprobe** (lists searched): nlist/16, within [8, 128] and at most nlist
  (all lists for tiny corpora); 4096 lists → 128.
- **training sample**: max(64·nlist, 256·2^bits) vectors, at most n (an
  explicit train size is used as given); wiki-18: 1,048,576. `build` takes
  evenly spaced rows (a corpus in article order is covered end to end),
  `compact` seeded random rows; FAISS's own k-means subsamples to 256
  points per centroid anyway.
- **OPQ** (`OPQ{M}_{D},IVF…,PQ{M}x{b}`) rotates and projects the vectors
  to D = 4M dimensions before IVF and PQ (FAISS's "D = 4M often good"), or
  keeps D = d when 4M > d; so M must satisfy 4M ≤ d or divide d
  (`valid_pq`). On the 1,000-passage e5 sample `OPQ128_512,IVF16,PQ128x4`
  reached recall@10 0.730 (35 s training) against 0.708 for `OPQ128` (D = d,
  68 s) and 0.672 without OPQ. OPQ training crashes FAISS 1.15 (heap
  corruption or a segfault, not an exception) when given fewer training
  vectors than its output dimension D (seen: 200 vectors for
  `OPQ64_256`, 700 for `OPQ64` on 768-d); `plan_index` refuses OPQ when the
  training sample is smaller than d, which covers every D.

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
MIN_PQ_BITS = 4  # the fewest bits per sub-quantizer a default plan uses (see the module docstring)
MIN_IVFPQ = 2 * MIN_POINTS  # fewer passages (or training vectors) than this: no IVF-PQ
MAX_CODE_BYTES = 64
MIN_NPROBE, MAX_NPROBE = 8, 128
OPQ_AUTO_POINTS = 8  # OPQ is on by default from 8·d training vectors (see the module docstring)
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
    """Resolve the index for `n` vectors of `dim` dimensions (rules in the module docstring).

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
    At the 4-bit floor (see the module docstring) fewer than 39 points per PQ
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
