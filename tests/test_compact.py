"""Flat -> IVF-PQ compaction (`dgpo_edge.retrieval.compact`).

Real data: the 1,000-passage wiki-18 sample with its e5 Flat index (skipped
without ../shared). Compaction plans with `dense.plan_index`, the rule `index
build` uses, so `pq=48` (bytes per vector) gives IVF16,PQ96x4 there and `pq=96`
IVF16,PQ192x4. Measured there with seed 0 (faiss-cpu 1.15.1): PQ96x4
recall@1/3/10 = 0.998/0.70/0.63 at nprobe 4, PQ192x4 1.0/0.79/0.74 at nprobe 16
(the old fixed-M rule's PQ48x4 had 0.99/0.64/0.55); every sampled passage's
own vector finds it in the top 10. The bounds below leave
room for faiss/BLAS differences: recall@10 >= 0.55 (PQ96x4) and PQ192x4 >= PQ96x4.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from dgpo_edge import temps  # noqa: E402
from dgpo_edge.errors import InputError  # noqa: E402
from dgpo_edge.retrieval import dense  # noqa: E402
from dgpo_edge.retrieval.base import EncoderSpec  # noqa: E402
from dgpo_edge.retrieval.build import verify_files  # noqa: E402
from dgpo_edge.retrieval.compact import (  # noqa: E402
    SWAP_MARKER,
    compact,
    file_digest,
    plan_ivfpq,
    read_flat_header,
    valid_pq,
)
from dgpo_edge.retrieval.retrievers import open_index  # noqa: E402
from dgpo_edge.retrieval.store import PassageStore  # noqa: E402

from kill_helpers import KILL_AT_NTH_REPLACE  # noqa: E402

WIKI_N = 21_015_324
TOY = EncoderSpec("toy", "test", 64, True)   # the synthetic vectors' encoder: e5's 768 dims are not theirs


# --- helpers -----------------------------------------------------------------------------------

def write_flat(path: Path, x: np.ndarray) -> Path:
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(np.ascontiguousarray(x, dtype=np.float32))
    faiss.write_index(index, str(path))
    return path


def write_corpus(path: Path, n: int, dup_at: int | None = None) -> Path:
    lines = []
    for i in range(n):
        pid = "0" if dup_at is not None and i == dup_at else str(i)
        text = f'"Title {i}"\npassage number {i} about topic {i % 7}'
        lines.append(json.dumps({"id": pid, "contents": text}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def clustered(n: int, d: int, seed: int = 0, centers: int = 40) -> np.ndarray:
    """Normalised vectors around random centres (uniform random data says nothing about IVF-PQ)."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centers, d))
    x = c[rng.integers(0, centers, n)] + 0.35 * rng.standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def corpus_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def assert_nothing_left(out: Path, existed: bool) -> None:
    if existed:
        assert list(out.iterdir()) == []
    else:
        assert not out.exists()


# --- parameter planning (no files) -----------------------------------------------------------

# (n, dim) of the shared rule's table in test_index_build.py; compact adds nothing of its own
SHARED_SIZES = [(n, dim) for n in (300, 1000, 9984, 10**6, WIKI_N) for dim in (384, 768)]


@pytest.mark.parametrize("n, dim", SHARED_SIZES)
def test_plan_is_the_build_plan(n, dim):
    """A Flat index of n vectors compacts to the factory `index build` gives a corpus of n passages."""
    for pq in (None, dim // 16):  # the default code size and half of it
        for opq in (False, True):
            kw = {"pq": pq, "opq": opq}
            if opq and n < dim:
                with pytest.raises(InputError, match=f"--opq needs at least {dim} passages") as e:
                    plan_ivfpq(n, dim, where="e5_Flat.index", **kw)
                assert e.value.path == "e5_Flat.index"
                continue
            p = plan_ivfpq(n, dim, **kw)
            assert p == dense.plan_index("ivfpq", dim, n, **kw)
            assert p.factory == dense.factory_string("ivfpq", dim, n, **kw)
            assert p.code_bytes == (pq or dense.default_code_bytes(dim, opq))  # bytes per vector, any bits


def test_plan_for_wiki18_and_small_corpora():
    p = plan_ivfpq(WIKI_N, 768, pq=64)
    assert (p.factory, p.nlist, p.train_points, p.pq_bits) == ("OPQ64_256,IVF16384,PQ64", 16384, 64 * 16384, 8)
    assert p.code_bytes == 64 and plan_ivfpq(WIKI_N, 768) == p  # 64 B with OPQ is e5's default
    assert plan_ivfpq(WIKI_N, 768, opq=False).factory == "IVF16384,PQ64"
    p = plan_ivfpq(WIKI_N, 768, pq=48)
    assert p.code_bytes == 48 and 768 * 4 / p.code_bytes == 64  # 3,072 B fp32 -> 48 B of codes
    assert plan_ivfpq(WIKI_N, 768, pq=64, opq=True).factory == "OPQ64_256,IVF16384,PQ64"
    assert plan_ivfpq(WIKI_N, 768, pq=192, opq=True).factory == "OPQ192_768,IVF16384,PQ192"
    # under 9,984 rows: fewer bits (at least 4), more sub-quantizers, the same 48 B
    p = plan_ivfpq(1000, 768, pq=48)  # 1,000 < 8*768 training vectors: no OPQ by default
    assert (p.factory, p.code_bytes, p.train_points, p.nprobe) == ("IVF16,PQ96x4", 48, 1000, 8)
    assert plan_ivfpq(300, 768, pq=48).factory == "IVF4,PQ96x4"
    assert plan_ivfpq(3000, 64, pq=16, opq=False).factory == "IVF64,PQ16x6"  # 16*8/6 -> 16 (divides 64): 12 B
    assert plan_ivfpq(20_000, 768, pq=64).factory == "OPQ64_256,IVF512,PQ64"  # 8-bit from 9,984 rows
    explicit = plan_ivfpq(WIKI_N, 768, pq=64, nlist=65536)
    assert explicit.train_points == 64 * 65536  # an explicit nlist gets its 64 points per list
    small = plan_ivfpq(WIKI_N, 768, pq=64, train_size=5000)  # bits and nlist follow the sample
    assert (small.factory, small.train_points) == ("IVF128,PQ64x7", 5000)  # 56 B: 73 -> M = 64


def test_plan_rejects_bad_values():
    assert valid_pq(768) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 768]
    with pytest.raises(InputError, match=r"--pq 100 does not divide the vector dimension 768; "
                                         r"valid values: .*48, 64, 96") as e:
        plan_ivfpq(1000, 768, pq=100, where="e5_Flat.index")
    assert "e5_Flat.index" in str(e.value)
    assert plan_ivfpq(WIKI_N, 768, pq=100, opq=True).factory.startswith("OPQ100_400,")  # OPQ: 4M <= d
    with pytest.raises(InputError, match=r"4\*M <= 768 or divide 768; "
                                         r"valid values: 1\.\.192, or 256, 384, 768"):
        plan_ivfpq(WIKI_N, 768, pq=200, opq=True)
    with pytest.raises(InputError, match="--nlist 2000 is out of range"):
        plan_ivfpq(1000, 768, pq=48, nlist=2000)
    with pytest.raises(InputError, match="77 vectors are too few for IVF-PQ") as e:
        plan_ivfpq(77, 768, pq=48, where="e5_Flat.index")
    assert e.value.path == "e5_Flat.index"
    with pytest.raises(InputError, match="train size must be >= 1"):
        plan_ivfpq(1000, 768, train_size=0)
    with pytest.raises(InputError, match="--pq '48x4'"):
        plan_ivfpq(1000, 768, pq="48x4")  # compact takes bytes per vector, not MxBITS
    with pytest.raises(InputError, match="--opq needs at least 768 passages to train .* the corpus has 700"):
        plan_ivfpq(700, 768, pq=48, opq=True)  # FAISS's OPQ training would crash the process


# --- the real wiki-18 sample ----------------------------------------------------------------

@pytest.fixture(scope="module")
def wiki(shared_dir: Path) -> tuple[Path, Path]:
    d = shared_dir / "data" / "corpus"
    flat, jsonl = d / "wiki18_sample_1000.e5_flat.index", d / "wiki18_sample_1000.jsonl"
    if not (flat.is_file() and jsonl.is_file()):
        pytest.skip(f"needs {flat} and {jsonl} (absent)")
    return flat, jsonl


@pytest.fixture(scope="module")
def wiki_bundles(wiki, tmp_path_factory) -> dict[int, tuple[Path, dict, int]]:
    """Compact the sample with PQ48 and PQ96; (out dir, report, progress units) per PQ size."""
    flat, jsonl = wiki
    out = {}
    for pq in (48, 96):
        ticks = []
        d = tmp_path_factory.mktemp(f"pq{pq}") / "bundle"
        report = compact(flat, jsonl, d, pq=pq, progress=ticks.append)
        out[pq] = (d, report, sum(ticks))
    return out


def test_wiki_manifest(wiki, wiki_bundles):
    flat, jsonl = wiki
    out, report, ticks = wiki_bundles[48]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "store.sqlite", "vectors.faiss"]
    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    for key in ("kind", "encoder", "count", "dim", "params", "files", "report", "produced_by"):
        assert key in m
    assert (m["kind"], m["count"], m["dim"], m["metric"]) == ("ivfpq", 1000, 768, "ip")
    assert m["params"]["factory"] == "IVF16,PQ96x4"  # what `index build` plans for 1,000 passages
    assert (m["params"]["nlist"], m["params"]["pq"], m["params"]["pq_bits"], m["params"]["opq"]) == \
        (16, 96, 4, False)
    assert m["params"]["train_size"] == 1000
    assert 1 <= m["params"]["nprobe"] <= 16
    assert EncoderSpec.from_dict(m["encoder"]) == EncoderSpec(
        "e5-base-v2", "search-r1-flat", 768, True, "query: ", "passage: ")
    for name in ("vectors.faiss", "store.sqlite"):
        assert m["files"][name] == file_digest(out / name)
    assert m["report"] == report and m["produced_by"].startswith("dgpo-edge ")
    assert ticks == 2 * 1000  # vectors added + passages stored


def test_wiki_store_rows_match_corpus_lines(wiki, wiki_bundles):
    _, jsonl = wiki
    out = wiki_bundles[48][0]
    rows = corpus_lines(jsonl)
    with PassageStore(out / "store.sqlite") as store:
        assert len(store) == 1000
        for i in (0, 1, 17, 499, 500, 998, 999):
            p = store.get_by_row(i)
            assert (p.id, p.contents) == (str(rows[i]["id"]), rows[i]["contents"])


def test_wiki_recall_and_bytes(wiki_bundles):
    r48, r96 = wiki_bundles[48][1], wiki_bundles[96][1]
    rec = r48["recall"]
    assert rec["queries"] == 500 and rec["nprobe"] == r48["nprobe"]
    assert rec["recall@1"] >= 0.9 and rec["recall@10"] >= 0.55
    assert r96["recall"]["recall@10"] >= rec["recall@10"]
    assert [s["nprobe"] for s in rec["sweep"]] == [1, 4, 16]  # capped at nlist
    assert rec["source_in_top"]["flat"] == 1.0
    b = r48["bytes"]
    # 4-bit PQ96 on this tiny corpus: the 48 B of codes per vector that PQ48 has from 9,984 rows;
    # the whole file, centroids and codebooks included, is still > 16x smaller than Flat.
    assert b["code_bytes_per_vector"] == 48
    assert b["vector_compression"] >= 16 and b["flat"] / b["index"] >= 16
    assert b["ratio"] == pytest.approx((b["index"] + b["store"]) / (b["flat"] + b["jsonl"]), abs=1e-4)


def test_wiki_own_vector_finds_its_passage(wiki, wiki_bundles):
    flat_path, _ = wiki
    out = wiki_bundles[48][0]
    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    index = faiss.read_index(str(out / "vectors.faiss"))
    faiss.extract_index_ivf(index).nprobe = m["params"]["nprobe"]
    flat = faiss.read_index(str(flat_path))
    rows = np.random.default_rng(1).choice(1000, 100, replace=False)
    _, found = index.search(flat.reconstruct_batch(rows.astype(np.int64)), 10)
    hits = np.mean([r in f for r, f in zip(rows, found)])
    assert hits >= 0.95  # measured: 1.0


# --- synthetic 64-d data ----------------------------------------------------------------------

@pytest.fixture()
def synthetic(tmp_path: Path) -> tuple[Path, Path]:
    return (write_flat(tmp_path / "flat.index", clustered(3000, 64)),
            write_corpus(tmp_path / "corpus.jsonl", 3000))


def test_synthetic_opq_bundle(synthetic, tmp_path):
    flat, jsonl = synthetic
    out = tmp_path / "out"
    spec = TOY
    report = compact(flat, jsonl, out, pq=16, opq=True, encoder=spec, eval_queries=200, k_values=(1, 10))
    m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert m["params"]["factory"] == "OPQ16_64,IVF64,PQ16x6" and m["params"]["opq"] is True
    assert m["encoder"] == spec.to_dict()
    assert report["recall"]["held_out"] is False and report["recall"]["recall@10"] >= 0.4  # measured 0.51
    assert set(report["recall"]) >= {"recall@1", "recall@10"} and "recall@3" not in report["recall"]
    assert [s["nprobe"] for s in report["recall"]["sweep"]] == [1, 4, 16, 64]
    index = faiss.read_index(str(out / "vectors.faiss"))
    assert index.ntotal == 3000 and index.d == 64
    # a second run into the same folder is refused, leaving the index as it was ...
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(InputError, match="an index already exists here .*pass --overwrite") as e:
        compact(flat, jsonl, out, pq=8, opq=False, nprobe=8, eval_queries=0, encoder=spec)
    assert e.value.path == str(out) and {p.name: p.read_bytes() for p in out.iterdir()} == before
    # ... and with overwrite replaces it, leaving no partial folder
    compact(flat, jsonl, out, pq=8, opq=False, nprobe=8, eval_queries=0, encoder=spec, overwrite=True)
    m2 = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert (m2["params"]["factory"], m2["params"]["nprobe"]) == ("IVF64,PQ8x6", 8)
    assert m2["report"]["recall"] is None
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "store.sqlite", "vectors.faiss"]


# --- bad inputs: InputError, and nothing left behind ------------------------------------------

def test_a_folder_of_someone_elses_files_is_refused(synthetic, tmp_path):
    flat, jsonl = synthetic
    out = tmp_path / "notes"
    out.mkdir()
    (out / "a.md").write_text("mine")
    (out / "store.sqlite").write_text("also mine")
    for overwrite in (False, True):   # --overwrite replaces an index, never a folder of anything else
        with pytest.raises(InputError, match="not an index's") as e:
            compact(flat, jsonl, out, pq=16, encoder=TOY, overwrite=overwrite)
        assert e.value.path == str(out)
    (out / "a.md").unlink()   # index names alone, with no index manifest dgpo-edge wrote
    (out / "manifest.json").write_text('{"produced_by": "someone else"}')
    for overwrite in (False, True):
        with pytest.raises(InputError, match="no index dgpo-edge wrote"):
            compact(flat, jsonl, out, pq=16, encoder=TOY, overwrite=overwrite)
    (out / "manifest.json").unlink()
    assert [(p.name, p.read_text()) for p in out.iterdir()] == [("store.sqlite", "also mine")]
    (out / "store.sqlite").unlink()
    (out / ".DS_Store").write_text("")   # hidden files are left alone, and built beside
    compact(flat, jsonl, out, pq=16, encoder=TOY, eval_queries=0)
    assert sorted(p.name for p in out.iterdir()) == [".DS_Store", "manifest.json", "store.sqlite", "vectors.faiss"]


def test_the_encoder_recorded_is_the_one_that_made_the_vectors(synthetic, tmp_path):
    """A 384-d Flat index (MiniLM's) was recorded as e5-base-v2 "with dim 384", so searches encoded
    queries with e5: the default e5 (768) is refused for it, naming both dims and --encoder, and a
    MiniLM name records MiniLM, with no model loaded."""
    flat = write_flat(tmp_path / "minilm.index", clustered(300, 384))
    jsonl = write_corpus(tmp_path / "corpus300.jsonl", 300)
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"encoder 'e5-base-v2' has dim 768 but the index vectors have dim 384; "
                                         r"pass --encoder .*\(minilm-int8 for all-MiniLM-L6-v2, dim 384\)") as e:
        compact(flat, jsonl, out, pq=16, eval_queries=0)
    assert e.value.path == str(flat)
    assert_nothing_left(out, existed=False)
    for name, variant in (("minilm-int8", "onnx-int8"), ("minilm", "torch-fp32")):
        compact(flat, jsonl, out, pq=16, eval_queries=0, encoder=name, overwrite=True)
        m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
        assert m["encoder"] == EncoderSpec("all-MiniLM-L6-v2", variant, 384, True).to_dict() and m["dim"] == 384
    with pytest.raises(InputError, match=r"encoder 'all-MiniLM-L6-v2' has dim 384 but the index vectors have "
                                         r"dim 64; pass --encoder"):
        compact(synthetic[0], synthetic[1], tmp_path / "other", pq=16, encoder="minilm-int8")
    with pytest.raises(InputError, match="unknown encoder 'e5'; known encoders: 'e5-base-v2', 'minilm-int8'"):
        compact(flat, jsonl, tmp_path / "other", pq=16, encoder="e5")   # the default was not listed
    assert not (tmp_path / "other").exists()


def test_count_mismatch(synthetic, tmp_path):
    flat, _ = synthetic
    short = write_corpus(tmp_path / "short.jsonl", 2999)
    out = tmp_path / "out"
    with pytest.raises(InputError, match="2,999 passages .* holds 3,000 vectors") as e:
        compact(flat, short, out, pq=16, encoder=TOY)
    assert "short.jsonl" in str(e.value) and "flat.index" in str(e.value)
    assert_nothing_left(out, existed=False)


def test_truncated_index(synthetic, tmp_path):
    flat, jsonl = synthetic
    cut = tmp_path / "cut.index"
    cut.write_bytes(flat.read_bytes()[:-100])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError, match=r"cut\.index: truncated: .*3,000 vectors of dim 64"):
        compact(cut, jsonl, out, pq=16)
    assert_nothing_left(out, existed=True)
    (tmp_path / "tiny.index").write_bytes(flat.read_bytes()[:20])
    with pytest.raises(InputError, match=r"tiny\.index: truncated"):
        read_flat_header(tmp_path / "tiny.index")


def test_not_a_flat_index(synthetic, tmp_path):
    _, jsonl = synthetic
    out = tmp_path / "out"
    junk = tmp_path / "notes.index"
    junk.write_text("hello, not an index\n")
    with pytest.raises(InputError, match=r"notes\.index: not a FAISS Flat index"):
        compact(junk, jsonl, out)
    ivf = tmp_path / "ivf.index"
    index = faiss.index_factory(64, "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(clustered(500, 64))
    faiss.write_index(index, str(ivf))
    with pytest.raises(InputError, match=r"ivf\.index: a FAISS IndexIVFFlat, not a Flat"):
        compact(ivf, jsonl, out)
    l2 = tmp_path / "l2.index"
    faiss.write_index(faiss.IndexFlatL2(64), str(l2))
    with pytest.raises(InputError, match=r"l2\.index: a FAISS IndexFlatL2"):
        compact(l2, jsonl, out)
    with pytest.raises(InputError, match=r"missing\.index: no such file"):
        compact(tmp_path / "missing.index", jsonl, out)
    assert_nothing_left(out, existed=False)


def test_pq_must_divide_dim(synthetic, tmp_path):
    flat, jsonl = synthetic
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"flat\.index: --pq 10 does not divide the vector dimension 64; "
                                         r"valid values: 1, 2, 4, 8, 16, 32, 64"):
        compact(flat, jsonl, out, pq=10, opq=False)
    with pytest.raises(InputError, match="encoder 'e5-base-v2' has dim 768"):
        compact(flat, jsonl, out, pq=16, encoder=EncoderSpec("e5-base-v2", "x", 768, True))
    with pytest.raises(InputError, match="--nprobe 65 is out of range: 1..64"):
        compact(flat, jsonl, out, pq=16, nprobe=65)
    assert_nothing_left(out, existed=False)


def test_failures_mid_build_leave_nothing(synthetic, tmp_path):
    flat, _ = synthetic
    dup = write_corpus(tmp_path / "dup.jsonl", 3000, dup_at=2000)  # right count, bad line 2001
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"dup\.jsonl, line 2001: duplicate id '0'"):
        compact(flat, dup, out, pq=16, encoder=TOY)
    assert_nothing_left(out, existed=False)

    good = write_corpus(tmp_path / "good.jsonl", 3000)
    out.mkdir()

    seen: list[int] = []

    def interrupt(n: int) -> None:
        seen.append(n)
        if sum(seen) > 3000:  # the store is done, the index is being filled
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        compact(flat, good, out, pq=16, chunk=500, encoder=TOY, progress=interrupt)
    assert sum(seen) == 3500  # interrupted after the first chunk of vectors
    assert_nothing_left(out, existed=True)


# --- an --overwrite interrupted while its files are renamed in ----------------------------------

OLD_PQ, NEW_PQ = 16, 8   # the index replaced and its replacement, told apart by their factories


def replaced_index(flat: Path, jsonl: Path, out: Path) -> tuple[str, str]:
    """A whole index of pq OLD_PQ in `out` (made anew), and the factories of the old and new ones."""
    shutil.rmtree(out, ignore_errors=True)
    compact(flat, jsonl, out, pq=OLD_PQ, encoder=TOY, eval_queries=0)
    return plan_ivfpq(300, 64, pq=OLD_PQ).factory, plan_ivfpq(300, 64, pq=NEW_PQ).factory


def replace_with_new(flat: Path, jsonl: Path, out: Path) -> None:
    compact(flat, jsonl, out, pq=NEW_PQ, encoder=TOY, eval_queries=0, overwrite=True)


def interrupted_replace(flat: Path, jsonl: Path, out: Path, monkeypatch, at: int, error: BaseException,
                        sticky: bool = False) -> tuple[bool, int, str, str]:
    """A whole old index in `out`, then `replace_with_new` with os.replace raising `error` at its
    `at`-th call (and after it, `sticky`): (whether it completed, os.replace calls, old and new factories)."""
    old, new = replaced_index(flat, jsonl, out)
    real, calls = os.replace, [0]

    def replace(src, dst, **kw):
        calls[0] += 1
        if calls[0] == at or (sticky and calls[0] > at):
            raise error
        return real(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)
    try:
        replace_with_new(flat, jsonl, out)
    except type(error):
        return False, calls[0], old, new
    else:
        return True, calls[0], old, new
    finally:
        monkeypatch.undo()


def assert_whole_and_searchable(out: Path, flat: Path) -> str:
    """The index in `out` matches its manifest byte for byte and searches (dense and BM25); its factory."""
    m = verify_files(out, full=True)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".partial-")) == \
        ["manifest.json", "store.sqlite", "vectors.faiss"]   # no marker beside a whole index
    index = faiss.read_index(str(out / "vectors.faiss"))
    faiss.extract_index_ivf(index).nprobe = 16
    _, found = index.search(faiss.read_index(str(flat)).reconstruct_n(42, 1), 5)
    assert 42 in found[0]
    [[hit]] = open_index(out, kind="bm25").search(["Title 42 passage number 42"], k=1)
    assert hit.id == "42"
    return m["params"]["factory"]


@pytest.fixture()
def small(tmp_path: Path) -> tuple[Path, Path]:
    return (write_flat(tmp_path / "flat.index", clustered(300, 64)),
            write_corpus(tmp_path / "corpus.jsonl", 300))


def test_an_overwrite_interrupted_at_any_rename_leaves_the_old_or_the_new_index(small, tmp_path, monkeypatch):
    """Ctrl-C between the renames of `compact --overwrite` left store.sqlite and vectors.faiss without
    a manifest: no index to search, and a rerun refused them, --overwrite or not ("no index dgpo-edge
    wrote"). Interrupted at each rename in turn, the folder now holds the old index or the new one,
    whole and searchable, and the rerun replaces it."""
    flat, jsonl = small
    out = tmp_path / "idx"
    seen = set()
    for at in range(1, 50):
        done, calls, old, new = interrupted_replace(flat, jsonl, out, monkeypatch, at, KeyboardInterrupt())
        found = assert_whole_and_searchable(out, flat)
        assert found in ((new,) if done else (old, new)), at
        seen.add(found)
        with pytest.raises(InputError, match="an index already exists here .*pass --overwrite") as e:
            compact(flat, jsonl, out, pq=NEW_PQ, encoder=TOY, eval_queries=0)
        assert e.value.path == str(out) and "\n" not in str(e.value)
        replace_with_new(flat, jsonl, out)
        assert assert_whole_and_searchable(out, flat) == new
        if done:
            break
    assert done and calls >= 5 and seen == {old, new}   # the store's, the manifest's into .partial, the 3 in


def test_renames_that_keep_failing_leave_a_folder_the_rerun_replaces(small, tmp_path, monkeypatch):
    """Renames failing from one on (a disk gone away) cannot be finished: the marker stays, so the
    rerun with --overwrite replaces the half-renamed files, and a plain rerun is one error asking for
    --overwrite (it was replacing an index), not "no index dgpo-edge wrote"."""
    flat, jsonl = small
    out = tmp_path / "idx"
    half = 0
    for at in range(1, 50):
        done, _, _, new = interrupted_replace(flat, jsonl, out, monkeypatch, at, OSError(5, "Input/output error"),
                                              sticky=True)
        if not (out / "manifest.json").exists():
            half += 1
            with pytest.raises(InputError, match=r"holds a half-replaced index .*; pass --overwrite") as e:
                compact(flat, jsonl, out, pq=NEW_PQ, encoder=TOY, eval_queries=0)
            assert e.value.path == str(out) and (out / SWAP_MARKER).is_file()
        replace_with_new(flat, jsonl, out)
        assert assert_whole_and_searchable(out, flat) == new
        if done:
            break
    assert done and half >= 2   # failing at the store's rename, at the vectors', at the manifest's


def test_a_compaction_killed_between_its_renames_is_finished_by_the_rerun(small, tmp_path):
    """kill -9 runs no cleanup: whatever rename it stops at, the rerun with --overwrite completes."""
    flat, jsonl = small
    out = tmp_path / "idx"
    script = (KILL_AT_NTH_REPLACE +
              "from dgpo_edge.retrieval.base import EncoderSpec\n"
              "from dgpo_edge.retrieval.compact import compact\n"
              f"compact({str(flat)!r}, {str(jsonl)!r}, {str(out)!r}, pq={NEW_PQ}, eval_queries=0,\n"
              f"        encoder=EncoderSpec.from_dict({TOY.to_dict()!r}), overwrite=True)\n")
    killed = 0
    for at in range(1, 50):
        _, new = replaced_index(flat, jsonl, out)
        run = subprocess.run([sys.executable, "-c", script, str(at)], capture_output=True, text=True)
        assert run.returncode in (0, 137), run.stderr
        killed += run.returncode == 137
        for left in [*out.glob(".partial-*"), *out.glob("..dgpo-edge-swap.*.tmp")]:   # the killed run's, made old
            then = time.time() - 2 * temps.STALE_AFTER_S
            os.utime(left, (then, then))
        replace_with_new(flat, jsonl, out)
        assert assert_whole_and_searchable(out, flat) == new
        assert not list(out.glob(".partial-*")) and not list(out.glob("*.tmp")), at   # the rerun removed them
        if run.returncode == 0:
            break
    assert run.returncode == 0 and killed >= 5


def test_settling_leaves_a_live_install_and_a_marker_naming_elsewhere_alone(tmp_path):
    """`settle_index` finishes a killed install from the work folder its marker names. It does
    nothing while the install's process holds the marker, nor for a marker naming a folder outside
    the index (a hand-edited `..`), which is left for the rerun with --overwrite."""
    from dgpo_edge.retrieval.compact import settle_index

    out = tmp_path / "idx"
    work = out / ".work" / "update"
    work.mkdir(parents=True)
    (work / "store.sqlite").write_text("new store")
    (work / "manifest.json").write_text('{"new": true}')
    (out / "store.sqlite").write_text("old store")
    marker = out / SWAP_MARKER
    for named in ("../../elsewhere", ".work/update/../..", "/abs"):
        marker.write_text(json.dumps({"replacing": True, "from": named, "files": ["store.sqlite"]}))
        settle_index(out)
        assert (out / "store.sqlite").read_text() == "old store" and marker.exists(), named
    marker.write_text(json.dumps({"replacing": True, "from": ".work/update", "files": [["store.sqlite"]]}))
    settle_index(out)   # a hand-edited list of files: nothing done, and no traceback
    assert (out / "store.sqlite").read_text() == "old store" and marker.exists()
    marker.write_text(json.dumps({"replacing": True, "from": ".work/update", "files": ["store.sqlite"]}))
    fcntl = temps.fcntl
    temps.fcntl = None   # no flock here: a live install cannot be told from a killed one, so nothing is done
    try:
        settle_index(out)
    finally:
        temps.fcntl = fcntl
    assert (out / "store.sqlite").read_text() == "old store" and marker.exists()
    with temps.holding(marker):   # the install (or another command settling it) is still at work
        settle_index(out)
        assert (out / "store.sqlite").read_text() == "old store" and marker.exists()
    settle_index(out)   # its process gone
    assert (out / "store.sqlite").read_text() == "new store" and (out / "manifest.json").read_text() == '{"new": true}'
    assert sorted(p.name for p in out.iterdir()) == [".work", "manifest.json", "store.sqlite"]
    assert list((out / ".work").iterdir()) == []   # the emptied work folder removed
