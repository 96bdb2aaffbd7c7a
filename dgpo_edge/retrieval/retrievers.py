"""In-process retrievers over an index folder: dense (FAISS), BM25 (FTS5) and hybrid (RRF).

`open_index(dir)` reads the manifest that `build_index` (or `compact`) wrote
and returns the matching `Retriever`:

- `DenseRetriever`: queries are encoded in one batch, searched in FAISS
  (inner product on normalised vectors: cosine, higher is better), and the
  rows fetched from the passage store; FAISS's -1 (fewer hits than k) is
  dropped, so a list can be shorter than k.
- `BM25Retriever`: the store's FTS5 BM25 (scores are negated bm25(), higher
  is better); needs no encoder and no FAISS.
- `HybridRetriever`: reciprocal-rank fusion of both lists, each taken `depth`
  deep: score(p) = Σ over lists of 1 / (rrf_k + rank of p in the list), rank
  counting from 1; the passage's score is that fused score. Ties keep the
  dense list's order first.

All of them are `Searcher`s: `search_timed(queries, k)` also returns the
milliseconds spent encoding queries, searching and fetching passage text,
for benchmarks (bench/ scripts), without a second code path.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..fts import TITLE_WEIGHT
from ..errors import InputError
from ..protocol import Passage
from .base import Encoder, EncoderSpec, Retriever
from .store import PassageStore

DENSE_KINDS = ("flat", "ivfpq", "hybrid")
OPEN_KINDS = ("flat", "ivfpq", "hybrid", "bm25", "dense")


@dataclass
class TimedSearch:
    """Results of one batched search and where the time went (milliseconds)."""

    passages: list[list[Passage]]
    encode_ms: float = 0.0
    search_ms: float = 0.0
    fetch_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_ms(self) -> float:
        return self.encode_ms + self.search_ms + self.fetch_ms


class Searcher(Retriever):
    """A Retriever that can also report its timings."""

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        return self.search_timed(queries, k).passages

    @abstractmethod
    def search_timed(self, queries: Sequence[str], k: int = 3) -> TimedSearch:
        ...


def _ms(t0: float, t1: float) -> float:
    return (t1 - t0) * 1000.0


def _check_queries(queries: Sequence[str]) -> list[str]:
    if isinstance(queries, str):
        raise TypeError("search takes a sequence of queries, not one string")
    return [str(q) for q in queries]


class DenseRetriever(Searcher):
    """FAISS search over a passage store; FAISS row i = store row i.

    `nprobe` (IVF indexes) overrides the value saved with the index.
    `threads` bounds FAISS's OpenMP threads during each search (restored after).
    """

    def __init__(self, store: PassageStore, index: Any, encoder: Encoder, nprobe: int | None = None,
                 threads: int | None = None, batch_size: int = 32):
        from . import dense

        if int(index.d) != encoder.spec.dim:
            raise InputError(f"the query encoder {encoder.spec.name!r} has dim {encoder.spec.dim} but "
                             f"the index vectors have dim {index.d}", store.path.parent)
        if int(index.ntotal) != len(store):
            raise InputError(f"the FAISS index holds {index.ntotal:,} vectors but the passage store "
                             f"{len(store):,} passages; row i must be passage i", store.path.parent)
        self.store, self.index, self.encoder = store, index, encoder
        self.threads, self.batch_size = threads, batch_size
        self.nprobe = dense.set_nprobe(index, nprobe)

    def search_timed(self, queries: Sequence[str], k: int = 3) -> TimedSearch:
        from . import dense

        qs = _check_queries(queries)
        if not qs or k < 1:
            return TimedSearch([[] for _ in qs])
        t0 = time.perf_counter()
        qv = np.asarray(self.encoder.encode_queries(qs, batch_size=self.batch_size), dtype=np.float32)
        t1 = time.perf_counter()
        with dense.faiss_threads(self.threads):
            scores, ids = dense.search(self.index, qv, k)
        t2 = time.perf_counter()
        keep = ids >= 0  # FAISS pads with -1 when a query has fewer than k hits
        flat = self.store.get_rows(ids[keep].tolist(), scores[keep].tolist())
        out, pos = [], 0
        for n in keep.sum(axis=1).tolist():
            out.append(flat[pos:pos + n])
            pos += n
        t3 = time.perf_counter()
        return TimedSearch(out, _ms(t0, t1), _ms(t1, t2), _ms(t2, t3))

    def close(self) -> None:
        self.store.close()


class BM25Retriever(Searcher):
    """The store's FTS5 BM25 (`dgpo_edge.fts`, training's scoring); no encoder, no FAISS."""

    def __init__(self, store: PassageStore, title_weight: float = TITLE_WEIGHT):
        if not store.has_bm25:
            raise InputError("this index was built without BM25 (--no-bm25); use a dense kind or rebuild",
                             store.path)
        self.store, self.title_weight = store, float(title_weight)

    def search_timed(self, queries: Sequence[str], k: int = 3) -> TimedSearch:
        qs = _check_queries(queries)
        t0 = time.perf_counter()
        out = [self.store.bm25(q, k, self.title_weight) if k >= 1 else [] for q in qs]
        return TimedSearch(out, 0.0, _ms(t0, time.perf_counter()), 0.0)

    def close(self) -> None:
        self.store.close()


class HybridRetriever(Searcher):
    """Reciprocal-rank fusion of a dense and a BM25 retriever (see the module docstring)."""

    def __init__(self, dense: Searcher, bm25: Searcher, rrf_k: int = 60, depth: int = 50):
        if rrf_k < 0 or depth < 1:
            raise ValueError(f"rrf_k must be >= 0 and depth >= 1, got {rrf_k}, {depth}")
        self.dense, self.bm25, self.rrf_k, self.depth = dense, bm25, rrf_k, depth

    def search_timed(self, queries: Sequence[str], k: int = 3) -> TimedSearch:
        qs = _check_queries(queries)
        if not qs or k < 1:
            return TimedSearch([[] for _ in qs])
        depth = max(self.depth, k)
        d = self.dense.search_timed(qs, depth)
        b = self.bm25.search_timed(qs, depth)
        t0 = time.perf_counter()
        out = [rrf([dl, bl], k, self.rrf_k) for dl, bl in zip(d.passages, b.passages)]
        fuse_ms = _ms(t0, time.perf_counter())
        return TimedSearch(out, d.encode_ms, d.search_ms + b.total_ms + fuse_ms, d.fetch_ms,
                           {"dense_ms": d.total_ms, "bm25_ms": b.total_ms, "fuse_ms": fuse_ms})

    def close(self) -> None:
        self.dense.close()
        self.bm25.close()


def rrf(lists: Sequence[Sequence[Passage]], k: int, rrf_k: int = 60) -> list[Passage]:
    """Top-k of the reciprocal-rank fusion of ranked lists (by passage id), fused scores attached."""
    score: dict[str, float] = {}
    first: dict[str, Passage] = {}
    for ranked in lists:
        for rank, p in enumerate(ranked, start=1):
            score[p.id] = score.get(p.id, 0.0) + 1.0 / (rrf_k + rank)
            first.setdefault(p.id, p)
    order = sorted(score, key=lambda pid: -score[pid])  # stable: ties keep first-seen order
    return [Passage(first[pid].id, first[pid].contents, score[pid]) for pid in order[:k]]


# --- opening an index folder ---------------------------------------------------------------------------

def open_index(index_dir: str | Path, encoder: str | Encoder | None = None, threads: int | None = None,
               nprobe: int | None = None, *, kind: str | None = None, mmap: bool = False,
               verify: bool = False, title_weight: float = TITLE_WEIGHT, rrf_k: int = 60,
               depth: int = 50) -> Searcher:
    """A retriever for an index folder (`build_index` or `compact` output).

    `encoder`: None picks the query encoder the index's spec calls for
    (`encoder_for_index`; MiniLM indexes get the torch-free int8 one); a name
    or a model directory, or an Encoder, is used when its embedding space and
    dimension match the index's (else InputError naming the folder). `kind`
    overrides the manifest's: "bm25" (any index with BM25), "dense" (its
    vectors only), "hybrid" (vectors + BM25). `nprobe` overrides the saved
    IVF nprobe (`encoder` and `nprobe` are refused for a BM25 search, which
    would ignore them); `threads` goes to the encoder and to FAISS searches; `mmap`
    maps the vectors instead of reading them; `verify=True` checks every
    file's sha256 first. Sizes are always checked, and the sha256 of every
    file changed since it was last verified (`dgpo_edge.digests`), so a
    same-size corruption of `vectors.faiss` is caught on the first open.
    """
    from .build import verify_files
    from .compact import INDEX_FILE, STORE_FILE

    d = Path(index_dir)
    m = verify_files(d, full=verify, cached=True)  # hashes what changed since it was last verified
    want = kind or m["kind"]
    if want not in OPEN_KINDS:
        raise InputError(f"unknown index kind {want!r}: expected one of {', '.join(OPEN_KINDS)}")
    if want != "bm25" and m["kind"] == "bm25":
        raise InputError(f"this is a BM25-only index; it has no vectors for --kind {want}", d)
    store = PassageStore(d / STORE_FILE)
    try:
        if len(store) != m["count"]:
            raise InputError(f"the store holds {len(store):,} passages but the manifest says {m['count']:,}",
                             d / STORE_FILE)
        if want == "bm25":
            unused = [name for name, v in (("--encoder", encoder), ("--nprobe", nprobe)) if v is not None]
            if unused:   # silently searching without them would pass for a search with them
                raise InputError(f"{' and '.join(unused)} set how an index's vectors are searched, but this "
                                 f"search is BM25 ({'--kind bm25' if kind else 'a BM25-only index'}): leave "
                                 f"{'them' if len(unused) > 1 else 'it'} out", d)
            return BM25Retriever(store, title_weight)
        from . import dense

        index = dense.read_index(d / INDEX_FILE, mmap=mmap)
        if int(index.d) != m["dim"] or int(index.ntotal) != m["count"]:
            raise InputError(f"holds {index.ntotal:,} vectors of dim {index.d} but the manifest says "
                             f"{m['count']:,} of dim {m['dim']}", d / INDEX_FILE)
        enc = _query_encoder(EncoderSpec.from_dict(m["encoder"]), encoder, threads, d)
        if nprobe is None:
            nprobe = (m.get("params") or {}).get("nprobe")
        dense_r = DenseRetriever(store, index, enc, nprobe=nprobe, threads=threads)
        if want == "hybrid":
            return HybridRetriever(dense_r, BM25Retriever(store, title_weight), rrf_k=rrf_k, depth=depth)
        return dense_r
    except BaseException:
        store.close()
        raise


def _query_encoder(spec: EncoderSpec, encoder: str | Encoder | None, threads: int | None,
                   where: Path) -> Encoder:
    """The query encoder for an index of `spec`, refusing one from another embedding space."""
    from .encoders import encoder_for_index, load_encoder

    if encoder is None:
        return encoder_for_index(spec, threads=threads, where=where)
    if isinstance(encoder, Encoder):
        spec.check_compatible(encoder.spec, str(where))
        return encoder
    if Path(encoder).expanduser().is_dir():  # a local copy of the model the index names
        return encoder_for_index(spec, threads=threads, path=Path(encoder).expanduser(), where=where)
    enc = load_encoder(encoder, threads=threads)
    spec.check_compatible(enc.spec, str(where))
    return enc


__all__ = ["BM25Retriever", "DenseRetriever", "HybridRetriever", "Searcher", "TimedSearch", "open_index",
           "rrf"]
