"""The `dgpo-edge index` commands: build, compact, search, info and serve, end to end.

Every build embeds with the real int8 MiniLM through the CLI, so builds pass
`--threads 1`: on a small, busy machine onnxruntime's default thread pool
spin-waits and one build can take minutes instead of seconds. The wiki-18
passages are cut to their first words for the same reason (embedding cost
grows with passage length; the CLI path does not depend on it).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest


from cli_helpers import _ANSI, assert_one_line_error, invoke

pytest.importorskip("faiss")

WIKI = "data/corpus/wiki18_sample_1000.jsonl"
WIKI_FLAT = "data/corpus/wiki18_sample_1000.e5_flat.index"
WIKI_ROWS = 120
WIKI_WORDS = 30  # words kept per passage (after the title line)

SHARK = "what did the fermented shark taste like"  # -> iceland.md#1, titled "iceland — Food"
SHARK_ID, SHARK_TITLE = "iceland.md#1", "iceland — Food"




def info_rows(result) -> dict[str, str]:
    """The `index info` table as {first cell: second cell}; wrapped cells are joined."""
    rows: dict[str, str] = {}
    last = None
    for line in result.plain.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line.strip(" │┃|"))]
        if len(cells) != 2:
            continue
        if cells[0]:
            last = cells[0]
            rows[last] = cells[1]
        elif last is not None:
            rows[last] += " " + cells[1]
    return rows


def hits(result) -> list[tuple[str, str]]:
    """(title, id) of each ranked hit `N. TITLE id ID (score)` of `index search`, in order."""
    found = re.findall(r"^(\d+)\. (.+?) id (\S+)(?: \([-\d.]+\))?$", result.plain, flags=re.MULTILINE)
    assert [int(rank) for rank, _, _ in found] == list(range(1, len(found) + 1)), result.plain
    return [(title, pid) for _, title, pid in found]


def manifest(index: Path) -> dict:
    return json.loads((index / "manifest.json").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def notes(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli-index") / "notes"
    d.mkdir()
    (d / "iceland.md").write_text(
        "# Iceland trip\n\nWe drove the ring road in June and saw puffins at Dyrholaey.\n\n"
        "## Food\n\nFermented shark tastes of ammonia; the lamb soup was excellent.\n", encoding="utf-8")
    (d / "work.md").write_text("# Standup\n\nThe database migration is blocked on the schema review.\n",
                               encoding="utf-8")
    (d / "recipes.txt").write_text("Sourdough: feed the starter twice a day, bake at 250 degrees in a "
                                   "Dutch oven.\n", encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def flat_run(notes):
    out = notes.parent / "flat-index"
    return out, invoke("index", "build", notes, "--out", out, "--kind", "flat", "--threads", 1)


@pytest.fixture(scope="module")
def flat_index(flat_run) -> Path:
    out, result = flat_run
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def wiki120(shared_dir, tmp_path_factory) -> Path:
    """The first 120 wiki-18 passages as a Search-R1 jsonl, each cut to its title and first words."""
    src = shared_dir / WIKI
    if not src.is_file():
        pytest.skip(f"{src} is absent")
    out = tmp_path_factory.mktemp("cli-wiki") / "wiki120.jsonl"
    with open(src, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as w:
        for _, line in zip(range(WIKI_ROWS), f):
            row = json.loads(line)
            title, _, text = row["contents"].partition("\n")
            row["contents"] = title + "\n" + " ".join(text.split()[:WIKI_WORDS])
            w.write(json.dumps(row) + "\n")
    return out


@pytest.fixture(scope="module")
def compact_run(shared_dir, tmp_path_factory):
    flat, corpus = shared_dir / WIKI_FLAT, shared_dir / WIKI
    if not (flat.is_file() and corpus.is_file()):
        pytest.skip(f"{flat} or {corpus} is absent")
    out = tmp_path_factory.mktemp("cli-compact") / "wiki-ivfpq"
    return out, invoke("index", "compact", "--flat", flat, "--corpus", corpus, "--out", out, "--pq", 48,
                       "--eval-queries", 100)


@pytest.fixture(scope="module")
def compacted(compact_run) -> Path:
    out, result = compact_run
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def minilm_flat(tmp_path_factory) -> tuple[Path, Path]:
    """A Flat index (`index build --kind flat`, MiniLM, dim 384) of 200 short passages, and its jsonl:
    enough rows for IVF-PQ, a Flat file that `index compact` takes as it takes Search-R1's."""
    d = tmp_path_factory.mktemp("cli-minilm-flat")
    corpus = d / "notes.jsonl"
    rows = [{"id": f"n{i}", "contents": f'"Note {i}"\nRoom {i} stores box {i % 13} of the {i % 7}th shelf.'}
            for i in range(200)]
    rows[57]["contents"] = '"Lighthouse"\nThe lighthouse keeper on Skye paints watercolours of puffins.'
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = d / "flat"
    result = invoke("index", "build", corpus, "--out", out, "--kind", "flat", "--threads", 1)
    assert result.exit_code == 0, result.output
    return out, corpus


# --------------------------------------------------------------------------- help

@pytest.mark.parametrize("args, expected", [
    (["index", "--help"], ["build", "compact", "search", "info", "serve"]),
    (["index", "build", "--help"], ["CORPUS", "--out", "--encoder", "--kind", "--nlist", "--pq", "--opq",
                                    "--nprobe", "--threads", "--chunk", "--overwrite"]),
    (["index", "compact", "--help"], ["--flat", "--corpus", "--out", "--pq", "--opq", "--nlist",
                                      "--eval-queries", "--encoder", "--overwrite"]),
    (["index", "search", "--help"], ["INDEX", "QUERY", "-k", "--json", "--kind", "--encoder", "--nprobe"]),
    (["index", "info", "--help"], ["INDEX", "--verify"]),
    (["index", "serve", "--help"], ["INDEX", "--host", "--port", "--kind", "--top-k"]),
])
def test_help(args, expected):
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.plain
    for word in expected:
        # a whole option or name: "-k" must not be satisfied by "--kind"
        assert re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", result.plain, re.IGNORECASE), (args, word)


def test_index_without_a_subcommand_shows_help():
    result = invoke("index")
    assert "Usage:" in result.plain and "build" in result.plain


# --------------------------------------------------------------------------- a folder of notes

def test_build_flat_prints_the_info_table(flat_run):
    out, result = flat_run
    assert result.exit_code == 0, result.output
    m = manifest(out)
    assert m["kind"] == "flat" and m["count"] == 4  # iceland.md has two sections
    rows = info_rows(result)
    assert rows["kind"] == "flat"
    assert rows["encoder"].startswith("all-MiniLM-L6-v2 (") and "dim 384" in rows["encoder"]
    assert rows["passages"] == "4"
    assert "factory=Flat" in rows["parameters"]
    for name, f in m["files"].items():
        assert rows[name] == f"{f['bytes']:,} bytes"
    assert f"index {out}" in result.flat
    assert "writing files" in result.plain  # the progress display reached its last stage
    assert not (out / ".work").exists()


def test_search_prints_the_matching_note_first(flat_index):
    result = invoke("index", "search", flat_index, SHARK, "-k", 2)
    assert result.exit_code == 0, result.output
    found = hits(result)
    assert len(found) == 2
    assert found[0] == (SHARK_TITLE, SHARK_ID)
    assert "Fermented shark tastes of ammonia" in result.plain
    assert re.search(r"encode [\d.]+ ms · search [\d.]+ ms · fetch [\d.]+ ms", result.plain)


def test_search_json_has_search_r1_shape(flat_index):
    result = invoke("index", "search", flat_index, SHARK, "-k", 3, "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert list(body) == ["result"] and len(body["result"]) == 1
    items = body["result"][0]
    assert len(items) == 3
    for item in items:
        assert set(item) == {"document", "score"}
        assert set(item["document"]) == {"id", "contents"}
        assert isinstance(item["score"], float)
    assert items[0]["document"]["id"] == SHARK_ID
    assert items[0]["document"]["contents"] == f'"{SHARK_TITLE}"\nFermented shark tastes of ammonia; the lamb ' \
                                               "soup was excellent."
    scores = [item["score"] for item in items]
    assert scores == sorted(scores, reverse=True)
    assert len({item["document"]["id"] for item in items}) == 3


def test_build_progress_is_on_stderr_with_units(flat_run):
    out, result = flat_run
    assert "writing files" in result.stderr and "writing files" not in result.stdout
    assert re.search(r"reading corpus .* [\d.]+/[\d.]+ kB", result.stderr)   # the corpus reader counts bytes (a small corpus: kB)
    assert "4/4 passages" in result.stderr and "ETA" in result.stderr


def test_info_json(flat_index):
    result = invoke("index", "info", flat_index, "--json", "--verify")
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert obj["verified"] is True and obj["count"] == 4 and obj["kind"] == "flat"
    assert obj["files"] == manifest(flat_index)["files"]


def test_search_top_k_long_and_short_forms_agree(flat_index):
    long = invoke("index", "search", flat_index, SHARK, "--top-k", 2, "--json")
    short = invoke("index", "search", flat_index, SHARK, "-k", 2, "--json")
    assert long.exit_code == 0 and json.loads(long.stdout)["result"] == json.loads(short.stdout)["result"]


def test_info_verify_checks_every_file(flat_index):
    result = invoke("index", "info", flat_index, "--verify")
    assert result.exit_code == 0, result.output
    rows = info_rows(result)
    files = manifest(flat_index)["files"]
    assert set(files) == {"store.sqlite", "vectors.faiss"}
    for name, f in files.items():
        assert rows[name] == f"{f['bytes']:,} bytes  sha256 ok"
    plain = invoke("index", "info", flat_index)
    assert plain.exit_code == 0 and "sha256" not in plain.plain


def test_bm25_build_and_bm25_search_of_a_dense_index(notes, flat_index, tmp_path):
    out = tmp_path / "bm25-index"
    result = invoke("index", "build", notes, "--out", out, "--kind", "bm25")
    assert result.exit_code == 0, result.output
    rows = info_rows(result)
    assert rows["kind"] == "bm25" and rows["encoder"] == "none (BM25)" and rows["passages"] == "4"
    assert not (out / "vectors.faiss").exists() and set(manifest(out)["files"]) == {"store.sqlite"}

    result = invoke("index", "search", out, "sourdough starter", "-k", 2)
    assert result.exit_code == 0, result.output
    assert hits(result)[0] == ("recipes", "recipes.txt#0")
    # BM25 is built for every kind: the flat index answers --kind bm25 with no encoder involved
    result = invoke("index", "search", flat_index, "fermented shark", "--kind", "bm25", "--json")
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)["result"][0]
    assert items[0]["document"]["id"] == SHARK_ID and items[0]["score"] > 0
    # ...but a BM25-only index has no vectors to search densely
    assert_one_line_error(invoke("index", "search", out, "x", "--kind", "dense"), str(out), "BM25-only")
    # and the options of a vector search are refused on a BM25 one, not ignored
    assert_one_line_error(invoke("index", "search", out, "x", "--nprobe", 4), str(out), "--nprobe", "BM25-only")
    assert_one_line_error(invoke("index", "search", flat_index, "x", "--kind", "bm25", "--encoder", "minilm",
                                 "--nprobe", 2), "--encoder and --nprobe", "--kind bm25")


def test_build_does_not_follow_links_out_of_the_notes_folder(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0 the password is swordfish\n", encoding="utf-8")
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "sub" / "plan.md").write_text("The garden plan: tomatoes by the south wall.\n", encoding="utf-8")
    (notes / "passwd.txt").symlink_to(secret)                   # a file link out of the tree: skipped
    (notes / "outside").symlink_to(tmp_path, target_is_directory=True)  # a folder link: not followed
    (notes / "plan-link.md").symlink_to(notes / "sub" / "plan.md")  # a link inside the tree: read
    out = tmp_path / "index"
    result = invoke("index", "build", notes, "--out", out, "--kind", "bm25")
    assert result.exit_code == 0, result.output
    assert "not followed: outside" in result.plain and "not followed: passwd.txt" in result.plain
    assert "2 link(s) not followed" in result.flat, result.plain
    assert info_rows(result)["passages"] == "2"
    result = invoke("index", "search", out, "swordfish password", "--json")
    assert result.exit_code == 0, result.output
    ids = [item["document"]["id"] for item in json.loads(result.stdout)["result"][0]]
    assert "passwd.txt#0" not in ids and not any("secret" in i for i in ids)


def test_search_prints_passage_text_without_terminal_escapes_or_emoji(tmp_path):
    corpus = tmp_path / "hostile.jsonl"
    contents = ('"passwd \x1b]0;pwned title\x07copy"\n'
                "root:x:0:0:root:/root:/bin/bash \x1b[2J\x1b[31mred\x1b[0m :thumbs_up: \x9b2J end")
    corpus.write_text(json.dumps({"id": "p\x1b[1m1", "contents": contents}) + "\n", encoding="utf-8")
    out = tmp_path / "index"
    assert invoke("index", "build", corpus, "--out", out, "--kind", "bm25").exit_code == 0
    result = invoke("index", "search", out, "root bash")
    assert result.exit_code == 0, result.output
    assert "root:x:0:0:root:/root:/bin/bash" in result.stdout and ":thumbs_up:" in result.stdout
    for bad in ("\x1b]", "\x07", "\x1b[2J", "\x1b[31m", "\x9b", "pwned"):
        assert bad not in result.stdout, bad
    assert hits(result) == [("passwd copy", "p1")]


def test_file_names_with_terminal_escapes_are_printed_without_them(tmp_path):
    """A note's name is data too (a folder unpacked from an archive): the build's summary, `index
    update`'s list and an error line naming it must not set the window title or clear the screen."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "alice.md").write_text("The meeting with Alice is on Tuesday.\n", encoding="utf-8")
    (notes / "\x1b]0;pwned\x07slides.pptx").write_bytes(b"PK\x03\x04")
    out = tmp_path / "index"
    built = invoke("index", "build", notes, "--out", out, "--kind", "bm25")
    assert built.exit_code == 0, built.output
    (notes / "\x1b[2Jnew.md").write_text("Bob likes tea.\n", encoding="utf-8")
    updated = invoke("index", "update", notes, "--out", out)
    assert updated.exit_code == 0, updated.output
    assert "skipped slides.pptx: unsupported type .pptx" in built.plain and "added new.md" in updated.plain
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "\x1b]0;pwned\x07scan.md").write_bytes(b"\xff\xfe")
    error = assert_one_line_error(invoke("index", "build", bad, "--out", tmp_path / "i2", "--kind", "bm25"),
                                  "scan.md: not UTF-8")
    for output in (built.output, updated.output, error):
        for escape in ("\x1b", "\x07", "pwned"):
            assert escape not in output, (escape, output)


# --------------------------------------------------------------------------- a Search-R1 jsonl

@pytest.mark.shared
def test_build_jsonl_ivfpq_then_hybrid_over_it(wiki120, tmp_path):
    out = tmp_path / "wiki-index"
    result = invoke("index", "build", wiki120, "--out", out, "--kind", "ivfpq", "--threads", 1)
    assert result.exit_code == 0, result.output
    rows = info_rows(result)
    assert rows["kind"] == "ivfpq" and rows["passages"] == str(WIKI_ROWS)
    m = manifest(out)
    assert m["count"] == WIKI_ROWS and m["params"]["factory"].startswith("IVF")
    assert f"factory={m['params']['factory']}" in rows["parameters"]
    result = invoke("index", "search", out, "Evan Morris lobbyist for Genentech", "-k", 3)
    assert result.exit_code == 0, result.output
    assert hits(result)[0] == ("Evan Morris", "0")

    # The same --out again: refused before any work, the old index untouched.
    before = (out / "manifest.json").read_bytes()
    error = assert_one_line_error(invoke("index", "build", wiki120, "--out", out, "--kind", "hybrid"),
                                  str(out), "--overwrite")
    assert "already exists" in error
    assert (out / "manifest.json").read_bytes() == before

    result = invoke("index", "build", wiki120, "--out", out, "--kind", "hybrid", "--threads", 1, "--overwrite")
    assert result.exit_code == 0, result.output
    assert info_rows(result)["kind"] == "hybrid" and manifest(out)["kind"] == "hybrid"
    result = invoke("index", "search", out, "Evan Morris lobbyist for Genentech", "-k", 4, "--json")
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)["result"][0]
    assert len(items) == 4 and items[0]["document"]["id"] == "0"
    assert all(0 < item["score"] <= 2 / 61 for item in items)  # reciprocal-rank fusion scores
    assert invoke("index", "info", out, "--verify").exit_code == 0


# --------------------------------------------------------------------------- compact (wiki-18 Flat)

@pytest.mark.shared
def test_compact_prints_a_recall_report(compact_run):
    out, result = compact_run
    assert result.exit_code == 0, result.output
    report = json.loads(_ANSI.sub("", result.stdout))   # stdout is the report alone: progress and log are on stderr
    assert report["count"] == 1000 and report["dim"] == 768
    assert report["factory"] == "IVF16,PQ96x4"  # --pq 48: 48 code bytes at 4 bits on 1,000 passages
    recall = report["recall"]
    assert recall["queries"] == 100
    for k in (1, 3, 10):
        assert 0.0 <= recall[f"recall@{k}"] <= 1.0
    assert recall["recall@1"] >= 0.5
    assert {"vectors.faiss", "store.sqlite", "manifest.json"} <= {p.name for p in out.iterdir()}


@pytest.mark.shared
def test_compacted_index_info(compacted):
    result = invoke("index", "info", compacted)
    assert result.exit_code == 0, result.output
    rows = info_rows(result)
    assert rows["kind"] == "ivfpq"
    assert rows["encoder"].startswith("e5-base-v2 (") and "dim 768" in rows["encoder"]
    assert rows["passages"] == "1,000"


@pytest.mark.shared
def test_compacted_dense_search_without_e5_fails_cleanly(compacted, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./e5-base-v2 folder for the encoder lookup to find
    result = invoke("index", "search", compacted, "x")
    if result.exit_code == 0:
        pytest.skip("an e5-base-v2 model is available locally, so the dense search works")
    error = assert_one_line_error(result, str(compacted), "'e5-base-v2'")
    assert "local path" in error and "Hugging Face cache" in error


@pytest.mark.shared
def test_compacted_bm25_search(compacted):
    result = invoke("index", "search", compacted, "Evan Morris", "--kind", "bm25", "-k", 2)
    assert result.exit_code == 0, result.output
    found = hits(result)
    assert len(found) == 2 and found[0] == ("Evan Morris", "0")


def test_compact_records_the_encoder_that_made_the_flat_vectors(minilm_flat, tmp_path):
    """A MiniLM Flat index (dim 384) was compacted into a manifest saying e5-base-v2 with dim 384, so
    searches encoded queries with the wrong model: the default e5 (dim 768) is refused for it, and
    `--encoder minilm-int8` records MiniLM, whose searches find what the Flat index finds."""
    built, corpus = minilm_flat
    flat = built / "vectors.faiss"
    args = ("index", "compact", "--flat", flat, "--corpus", corpus, "--pq", 16, "--eval-queries", 20,
            "--threads", 1)
    out = tmp_path / "compacted"
    assert_one_line_error(invoke(*args, "--out", out), str(flat), "encoder 'e5-base-v2' has dim 768",
                          "index vectors have dim 384", "pass --encoder", "minilm-int8")
    assert not out.exists()
    assert_one_line_error(invoke(*args, "--out", out, "--encoder", "bogus"), "unknown encoder 'bogus'")
    result = invoke(*args, "--out", out, "--encoder", "minilm-int8")
    assert result.exit_code == 0, result.output
    assert manifest(out)["encoder"] == manifest(built)["encoder"]   # the spec `index build` recorded
    query = "who paints puffins at the lighthouse"
    found = [hits(invoke("index", "search", idx, query, "-k", 1, "--kind", "dense", "--threads", 1))
             for idx in (built, out)]
    assert found == [[("Lighthouse", "n57")]] * 2
    if Path("/proc").is_dir():   # an --out no folder can be made in: one error line, as for index build
        assert_one_line_error(invoke(*args, "--out", "/proc/x", "--encoder", "minilm-int8"),
                              "/proc/x: cannot be written (")


def test_a_compaction_interrupted_while_replacing_an_index(minilm_flat, tmp_path, monkeypatch):
    """Renames that failed half way through `index compact --overwrite` left files that every rerun
    refused, --overwrite or not ("no index dgpo-edge wrote"). Now the folder says what happened, in
    one error line, to a search and to a plain rerun, and the rerun with --overwrite replaces it."""
    from dgpo_edge.retrieval.compact import compact

    built, corpus = minilm_flat
    flat, out = built / "vectors.faiss", tmp_path / "idx"
    args = ("index", "compact", "--flat", flat, "--corpus", corpus, "--out", out, "--encoder", "minilm-int8",
            "--pq", 16, "--eval-queries", 0, "--threads", 1)
    assert invoke(*args).exit_code == 0
    real, calls = os.replace, [0]

    def replace(src, dst, **kw):   # every rename from the manifest's on fails: the disk has gone
        calls[0] += 1
        if fail_from and calls[0] >= fail_from:
            raise OSError(5, "Input/output error")
        return real(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)
    again = {"encoder": "minilm-int8", "pq": 8, "eval_queries": 0, "overwrite": True}
    fail_from = 0
    compact(flat, corpus, out, **again)   # counts the renames: the manifest's is the last
    fail_from, calls[0] = calls[0], 0
    with pytest.raises(OSError):
        compact(flat, corpus, out, **again)
    monkeypatch.undo()
    assert not (out / "manifest.json").exists() and (out / "store.sqlite").exists()
    assert_one_line_error(invoke("index", "search", out, "lighthouse", "--kind", "bm25"), str(out),
                          "writing was interrupted", "rerun the `index build` or `index compact`", "--overwrite")
    assert_one_line_error(invoke("index", "info", out), str(out), "writing was interrupted")
    assert_one_line_error(invoke(*args), str(out), "holds a half-replaced index", "pass --overwrite")
    result = invoke(*args, "--overwrite")
    assert result.exit_code == 0, result.output
    assert hits(invoke("index", "search", out, "who paints puffins", "-k", 1, "--kind", "bm25")) == \
        [("Lighthouse", "n57")]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "store.sqlite", "vectors.faiss"]


@pytest.mark.shared
def test_compact_replaces_an_index_only_with_overwrite(shared_dir, compacted, notes, tmp_path):
    """`index compact` replaced an existing --out index without being asked, unlike `index build`;
    --overwrite replaces an index, never a folder of anything else."""
    out = tmp_path / "again"
    shutil.copytree(compacted, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    args = ("index", "compact", "--flat", shared_dir / WIKI_FLAT, "--corpus", shared_dir / WIKI, "--pq", 24,
            "--eval-queries", 0)
    assert_one_line_error(invoke(*args, "--out", out), str(out), "an index already exists here",
                          "pass --overwrite to replace it")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert_one_line_error(invoke(*args, "--out", notes, "--overwrite"), str(notes), "not an index's")
    result = invoke(*args, "--out", out, "--overwrite")
    assert result.exit_code == 0, result.output
    assert manifest(out)["params"]["factory"] == "IVF16,PQ48x4"   # the new one: --pq 24 at 4 bits
    assert manifest(out)["encoder"] == manifest(compacted)["encoder"]   # Search-R1's e5, dim 768


@pytest.mark.shared
def test_compact_missing_corpus(shared_dir, tmp_path):
    flat = shared_dir / WIKI_FLAT
    if not flat.is_file():
        pytest.skip(f"{flat} is absent")
    corpus = tmp_path / "nowhere.jsonl"
    assert_one_line_error(invoke("index", "compact", "--flat", flat, "--corpus", corpus, "--out", tmp_path / "o"),
                          str(corpus), "no such file")


# --------------------------------------------------------------------------- bad input

def test_build_missing_corpus(tmp_path):
    corpus = tmp_path / "nowhere"
    assert_one_line_error(invoke("index", "build", corpus, "--out", tmp_path / "idx"), str(corpus),
                          "no such file")
    assert not (tmp_path / "idx").exists()


def test_build_malformed_jsonl_line(tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"A\\"\\nfirst passage"}\n'
                      '{"id": "2", "contents": \n'
                      '{"id": "3", "contents": "\\"C\\"\\nthird passage"}\n', encoding="utf-8")
    out = tmp_path / "idx"
    assert_one_line_error(invoke("index", "build", corpus, "--out", out, "--kind", "flat", "--threads", 1),
                          str(corpus), "line 2")
    assert not out.exists()  # bad input leaves nothing behind


def test_build_where_the_system_refuses_to_write(notes, tmp_path, monkeypatch):
    """An --out name too long for the file system, or a disk that fills while the store is written:
    one `error:` line (the progress bars cleared), exit 2, not a traceback."""
    import sqlite3

    from dgpo_edge.retrieval.store import PassageStore

    assert_one_line_error(invoke("index", "build", notes, "--out", tmp_path / ("a" * 300), "--kind", "bm25"),
                          "File name too long")

    def disk_full(*args, **kwargs):
        e = sqlite3.OperationalError("database or disk is full")
        e.sqlite_errorname = "SQLITE_FULL"
        raise e

    monkeypatch.setattr(PassageStore, "build", disk_full)
    assert_one_line_error(invoke("index", "build", notes, "--out", tmp_path / "idx", "--kind", "bm25"),
                          "database or disk is full (SQLite); free some space")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="no /proc pseudo-filesystem here")
def test_build_into_a_pseudo_filesystem_is_one_error_line(notes):
    """/proc answers mkdir with ENOENT, an errno outside the ones the CLI reported as the system's:
    every OSError while the output folder is made is one error line naming --out."""
    assert_one_line_error(invoke("index", "build", notes, "--out", "/proc/x", "--kind", "bm25"),
                          "/proc/x: cannot be written (")
    assert_one_line_error(invoke("index", "build", notes, "--out", "/proc/x/y", "--kind", "bm25"),
                          "/proc/x/y: cannot be written (")


def test_build_unknown_kind(notes, tmp_path):
    assert_one_line_error(invoke("index", "build", notes, "--out", tmp_path / "idx", "--kind", "nope"),
                          "'nope'", "flat, ivfpq, bm25, hybrid")
    assert not (tmp_path / "idx").exists()


def test_build_unknown_encoder(notes, tmp_path):
    assert_one_line_error(invoke("index", "build", notes, "--out", tmp_path / "idx", "--encoder", "nosuch"),
                          "'nosuch'", "minilm-int8")
    assert not (tmp_path / "idx").exists()


def test_search_unknown_encoder(flat_index):
    assert_one_line_error(invoke("index", "search", flat_index, "x", "--encoder", "nosuch"), "'nosuch'")


def test_search_unknown_kind(flat_index):
    assert_one_line_error(invoke("index", "search", flat_index, "x", "--kind", "nope"), "'nope'")


def test_search_a_folder_that_is_not_an_index(notes):
    assert_one_line_error(invoke("index", "search", notes, "x"), str(notes), "not an index folder")


def test_search_truncated_vectors(flat_index, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(flat_index, broken)
    vectors = broken / "vectors.faiss"
    with open(vectors, "r+b") as f:
        f.truncate(vectors.stat().st_size // 2)
    assert_one_line_error(invoke("index", "search", broken, "x"), str(vectors), "truncated")
    assert_one_line_error(invoke("index", "info", broken), str(vectors), "truncated")


def test_info_missing_folder(tmp_path):
    missing = tmp_path / "nowhere"
    assert_one_line_error(invoke("index", "info", missing), str(missing), "no such index folder")


def test_compact_missing_flat_and_a_folder_as_corpus(notes, tmp_path):
    flat = tmp_path / "missing.index"
    assert_one_line_error(invoke("index", "compact", "--flat", flat, "--corpus", notes, "--out", tmp_path / "o"),
                          str(flat), "no such file")
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- serve

def _kill_and_close(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()


def _serve(index: Path, sigint: str) -> tuple[subprocess.Popen, queue.Queue]:
    """`python -m dgpo_edge index serve INDEX --port 0` with SIGINT set first to `sigint`
    ("default_int_handler": as a terminal gives it; "SIG_IGN": as a script's background job, and a
    test suite started that way, get it); its stdout line by line in a queue (None at its end)."""
    start = (f"import runpy, signal; signal.signal(signal.SIGINT, signal.{sigint}); "
             "runpy.run_module('dgpo_edge', run_name='__main__', alter_sys=True)")
    proc = subprocess.Popen([sys.executable, "-c", start, "index", "serve", str(index), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def _first_line(proc: subprocess.Popen, lines: queue.Queue) -> str:
    try:
        first = lines.get(timeout=60)
    except queue.Empty:
        pytest.fail("the server printed nothing within 60 s")
    assert first is not None, proc.stderr.read()
    return first


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_serve_answers_search_r1_requests_and_stops_on_sigint(flat_index, stop):
    proc, lines = _serve(flat_index, "default_int_handler")
    try:
        first = _first_line(proc, lines)
        match = re.fullmatch(r"Serving POST (http://127\.0\.0\.1:(\d+)/retrieve) \(Ctrl-C stops\)\n", first)
        assert match and int(match.group(2)) > 0, first
        request = urllib.request.Request(
            match.group(1), method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"queries": [SHARK, "sourdough starter"], "topk": 2,
                             "return_scores": True}).encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            body = json.loads(response.read())
        assert list(body) == ["result"] and [len(r) for r in body["result"]] == [2, 2]
        for item in body["result"][0] + body["result"][1]:
            assert set(item) == {"document", "score"} and set(item["document"]) == {"id", "contents"}
            assert isinstance(item["score"], float)
        assert body["result"][0][0]["document"]["id"] == SHARK_ID
        assert body["result"][1][0]["document"]["id"] == "recipes.txt#0"

        proc.send_signal(stop)  # Ctrl-C, or kill/systemd/docker stop: serve() says so and exits 0
        assert proc.wait(timeout=10) == 0
        rest = "".join(iter(lambda: lines.get(timeout=5), None))
        assert rest == "stopped\n"
        assert "Traceback" not in proc.stderr.read()
    finally:
        _kill_and_close(proc)


def test_a_background_server_ignores_sigint_and_stops_on_sigterm(flat_index):
    # Started as `dgpo-edge index serve DIR &` from a script: SIGINT arrives ignored (the shell's
    # rule for background jobs) and stays so; SIGTERM still stops it cleanly.
    proc, lines = _serve(flat_index, "SIG_IGN")
    try:
        assert _first_line(proc, lines).startswith("Serving POST http://127.0.0.1:")
        proc.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert "".join(iter(lambda: lines.get(timeout=5), None)) == "stopped\n"
        assert "Traceback" not in proc.stderr.read()
    finally:
        _kill_and_close(proc)


@pytest.fixture(scope="module")
def bm25_index(notes) -> Path:
    out = notes.parent / "bm25-serve-index"
    assert invoke("index", "build", notes, "--out", out, "--kind", "bm25").exit_code == 0
    return out


@pytest.mark.parametrize(("options", "needles"), [
    (["--port", "99999"], ["--port", "0..65535", "99999"]),
    (["--port", "-1"], ["--port", "0..65535"]),
    (["--top-k", "0"], ["--top-k", "1..100"]),
    (["-k", "101"], ["--top-k", "1..100", "101"]),
    (["--topk", "0"], ["--top-k", "1..100"]),           # the deprecated spelling is checked the same way
    (["--max-queries", "0"], ["--max-queries", ">= 1"]),
    (["--host", "no-such-host.invalid"], ["no-such-host.invalid", "does not resolve"]),
])
def test_serve_bad_options_are_one_error_line(bm25_index, options, needles):
    assert_one_line_error(invoke("index", "serve", bm25_index, *options), *needles)


def test_serve_on_a_port_in_use_is_one_error_line(bm25_index):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line_error(invoke("index", "serve", bm25_index, "--port", port),
                              f"127.0.0.1:{port}", "in use")


def test_search_with_invalid_utf8_in_the_query_is_one_error_line(flat_index):
    """Python decodes the argv bytes b"caf\\xe9" to "caf\\udce9"; the dense encoder cannot take that."""
    assert_one_line_error(invoke("index", "search", flat_index, "caf\udce9"), "not valid UTF-8", "0xe9")


# ------------------------------------------------------------ options checked before any work

def test_bad_threads_fail_before_anything_is_written(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"T\\"\\nsome text"}\n', encoding="utf-8")
    out = tmp_path / "idx"
    result = invoke("index", "build", corpus, "--out", out, "--kind", "flat", "--threads", "0")
    assert result.exit_code == 2 and "Traceback" not in result.plain
    assert not out.exists()  # rejected before the store or any embedding was started


def test_build_api_rejects_bad_threads_before_work(tmp_path):
    from dgpo_edge.errors import InputError
    from dgpo_edge.retrieval.build import build_index

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"T\\"\\nsome text"}\n', encoding="utf-8")
    with pytest.raises(InputError, match="--threads"):
        build_index(corpus, tmp_path / "idx", kind="bm25", threads=0)
    assert not (tmp_path / "idx").exists()


def test_empty_query_and_wrong_path_types(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# A\n\nApples are red.\n", encoding="utf-8")
    idx = tmp_path / "idx"
    assert invoke("index", "build", notes, "--out", idx, "--kind", "bm25").exit_code == 0
    assert_one_line_error(invoke("index", "search", idx, "   "), "query is empty")
    some_file = notes / "a.md"
    assert_one_line_error(invoke("index", "info", some_file), str(some_file), "is a file")
    assert_one_line_error(invoke("data", "inspect", notes), str(notes), "is a directory")


def test_nlist_range_message_does_not_leak_a_placeholder(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"T\\"\\nsome text"}\n', encoding="utf-8")
    line = assert_one_line_error(invoke("index", "build", corpus, "--out", tmp_path / "o", "--nlist", "0"),
                                 "--nlist 0")
    assert "1099511627776" not in line


def test_info_shows_a_shared_indexs_manifest_as_plain_text(flat_index, tmp_path):
    """An index from someone else: its manifest's strings went to the table as Rich markup ("[bold]"
    rendered, "[/]" an error) and with their terminal escapes."""
    import shutil

    shared = tmp_path / "shared[x]"
    shutil.copytree(flat_index, shared)
    m = manifest(shared)
    m["produced_by"] = "[bold]tool[/] \x1b]0;pwned\x07v1"
    (shared / "manifest.json").write_text(json.dumps(m))
    result = invoke("index", "info", shared)
    assert result.exit_code == 0, result.output
    assert "[bold]tool[/] v1" in result.plain and "\x1b]0" not in result.output
    assert "shared[x]" in result.plain


@pytest.mark.parametrize("source, needle", [
    (5, '"source" must be an object'),
    ({"documents": 3}, '"source.documents" needs'),
    ({"documents": {"read": 1, "read_by_type": {}, "passages": 1, "skipped": ["a.md"]}}, '"source.documents" needs'),
])
def test_a_shared_indexs_malformed_source_is_one_error_line(notes, tmp_path, source, needle):
    """`source` (and its summary of the documents read) is printed by `index info` and read by
    `index update`: a manifest with another shape there was a traceback (AttributeError, TypeError)."""
    idx = tmp_path / "idx"
    assert invoke("index", "build", notes, "--out", idx, "--kind", "bm25").exit_code == 0
    m = manifest(idx)
    m["source"] = source
    (idx / "manifest.json").write_text(json.dumps(m))
    for args in (("index", "info", idx), ("index", "update", notes, "--out", idx)):
        assert_one_line_error(invoke(*args), str(idx / "manifest.json"), needle)


def test_a_bm25_search_that_finds_nothing_says_so(notes, tmp_path):
    """A query sharing no word with any passage printed only the timing line, as if search were broken."""
    idx = tmp_path / "idx"
    assert invoke("index", "build", notes, "--out", idx, "--kind", "bm25").exit_code == 0
    result = invoke("index", "search", idx, "zanzibar quokka")
    assert result.exit_code == 0, result.output
    assert "no passage matches the query" in result.plain and hits(result) == []
    assert json.loads(invoke("index", "search", idx, "zanzibar quokka", "--json").output) == {"result": [[]]}
