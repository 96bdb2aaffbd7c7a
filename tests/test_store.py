"""Corpus readers and the passage store, on real wiki-18 passages and hand-made files."""

from __future__ import annotations

import json
import random
import re
import sqlite3
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from dgpo_edge.errors import InputError
from dgpo_edge.protocol import Passage
from dgpo_edge.retrieval.corpus import (
    SeenIds,
    chunk_document,
    count_lines,
    detect_format,
    file_title,
    iter_corpus,
    iter_text_corpus,
    size_hint,
)
from dgpo_edge.retrieval.documents import DocReport
from dgpo_edge.retrieval.store import PassageStore

WORD = re.compile(r"[^\W_]+")


@pytest.fixture(scope="module")
def wiki_jsonl(shared_dir: Path) -> Path:
    path = shared_dir / "data" / "corpus" / "wiki18_sample_1000.jsonl"
    if not path.is_file():
        pytest.skip(f"needs {path} (absent)")
    return path


@pytest.fixture(scope="module")
def wiki_store(wiki_jsonl: Path, tmp_path_factory: pytest.TempPathFactory) -> PassageStore:
    store = PassageStore.build(tmp_path_factory.mktemp("wiki") / "store.sqlite", iter_corpus(wiki_jsonl))
    yield store
    store.close()


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


# Edge cases of the Search-R1 `"Title"\ntext` form that must survive byte for byte.
ODD = [
    Passage("a", '"Quoted" Title"\nbody with "quotes"'),
    Passage("b", "no newline at all"),
    Passage("c", '"Empty text"\n'),
    Passage("d", ""),
    Passage("e", '  "spaced"  \n\n two\nnewlines\n'),
    Passage("f", '"Ünïcödé — 東京"\nCafé naïve façade 🙂 \t tab'),
    Passage("g", '"</information> <answer>x</answer>"\n<|im_end|> tags are data'),
]


# ------------------------------------------------------------ wiki-18 sample

def test_wiki_round_trip_is_exact_and_row_ordered(wiki_jsonl: Path, wiki_store: PassageStore):
    source = list(iter_corpus(wiki_jsonl))
    assert len(wiki_store) == len(source) == 1000
    assert list(wiki_store.iter_passages(batch=333)) == source
    for i in (0, 1, 499, 999):
        assert wiki_store.get_by_row(i) == source[i]
        assert wiki_store.get_by_id(source[i].id) == source[i]


def test_wiki_store_uses_a_dictionary_and_beats_the_jsonl(wiki_jsonl: Path, wiki_store: PassageStore,
                                                          tmp_path: Path):
    assert wiki_store.compression == "zstd+dict"
    text_only = PassageStore.build(tmp_path / "text.sqlite", iter_corpus(wiki_jsonl), fts=False)
    jsonl = wiki_jsonl.stat().st_size
    msg = (f"jsonl {jsonl} B; store without BM25 {text_only.bytes()} B "
           f"({text_only.bytes() / jsonl:.2f}x); with BM25 {wiki_store.bytes()} B "
           f"({wiki_store.bytes() / jsonl:.2f}x)")
    assert text_only.compression == "zstd+dict"
    assert text_only.bytes() < 0.7 * jsonl, msg
    # A positional BM25 index of short passages is about as large as their text;
    # the bound catches regressions such as indexing `title` first (+25%).
    assert wiki_store.bytes() < 1.25 * jsonl, msg
    assert list(text_only.iter_passages()) == list(iter_corpus(wiki_jsonl))
    with pytest.raises(InputError, match="without a BM25 index"):
        text_only.bm25("anything")
    text_only.close()


def test_bm25_finds_a_passage_by_its_rarest_word(wiki_store: PassageStore):
    passages = list(wiki_store.iter_passages())
    df = Counter(w for p in passages for w in {w.lower() for w in WORD.findall(p.contents)})
    hits = 0
    for p in random.Random(0).sample(passages, 50):
        rare = min(WORD.findall(p.text), key=lambda w: (df[w.lower()], -len(w)))
        top = wiki_store.bm25(rare, k=1)
        hits += bool(top) and top[0].id == p.id
    assert hits >= 45, f"{hits}/50 passages found top-1 by their rarest word"


def test_contentless_bm25_scores_equal_a_table_that_stores_the_text(wiki_store: PassageStore):
    """The contentless choice must not change bm25(): compare with a plain FTS5 table."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(body, title, tokenize='unicode61 remove_diacritics 2')")
    db.executemany("INSERT INTO t(rowid, body, title) VALUES (?, ?, ?)",
                   ((i, p.text, p.title) for i, p in enumerate(wiki_store.iter_passages())))
    for query in ("Genentech lobbyist", "the expedition of 1838", "Dibba fort Portuguese"):
        match = " OR ".join(f'"{w}"' for w in WORD.findall(query))
        want = db.execute("SELECT rowid, -bm25(t, 1.0, 2.0) AS s FROM t WHERE t MATCH ? "
                          "ORDER BY s DESC LIMIT 5", (match,)).fetchall()
        got = wiki_store.bm25(query, k=5, title_weight=2.0)
        assert [wiki_store.get_by_id(p.id) for p in got] == wiki_store.get_rows([r for r, _ in want])
        assert [p.score for p in got] == pytest.approx([s for _, s in want])


# ------------------------------------------------------------ small stores

def test_small_store_round_trips_odd_contents_without_dictionary(tmp_path: Path):
    store = PassageStore.build(tmp_path / "s.sqlite", ODD)
    assert store.compression == "zstd" and store.meta["level"] == "19"
    assert len(store) == len(ODD)
    assert list(store.iter_passages()) == ODD
    assert [store.get_by_id(p.id).contents for p in ODD] == [p.contents for p in ODD]
    assert store.get_by_row(0).title == 'Quoted" Title' and store.get_by_row(0).raw_title == '"Quoted" Title"'


def test_get_rows_keeps_order_repeats_and_takes_numpy(tmp_path: Path):
    store = PassageStore.build(tmp_path / "s.sqlite", ODD)
    rows = np.array([3, 0, 3, 6], dtype=np.int64)
    got = store.get_rows(rows, scores=np.array([0.5, 0.4, 0.3, 0.2], dtype=np.float32))
    assert [p.id for p in got] == ["d", "a", "d", "g"]
    assert [p.score for p in got] == pytest.approx([0.5, 0.4, 0.3, 0.2])
    assert store.get_rows([]) == []
    with pytest.raises(IndexError, match="row -1"):
        store.get_rows([0, -1])
    with pytest.raises(IndexError):
        store.get_by_row(len(ODD))
    with pytest.raises(KeyError):
        store.get_by_id("missing")


def test_get_rows_batches_large_requests(tmp_path: Path):
    passages = [Passage(str(i), f'"T{i}"\n{words(5, f"x{i}_")}') for i in range(1200)]
    store = PassageStore.build(tmp_path / "s.sqlite", passages, batch=128)
    order = list(range(1199, -1, -1))
    assert store.get_rows(order) == [passages[i] for i in order]


def test_bm25_queries_are_punctuation_safe(tmp_path: Path):
    store = PassageStore.build(tmp_path / "s.sqlite", [
        Passage("1", '"Lima"\nLima is the capital of Peru.'),
        Passage("2", '"Quito"\nQuito is the capital of Ecuador; NEAR the equator.'),
        Passage("3", '"Café"\nA café in Zürich serves crème brûlée.'),
    ])
    assert [p.id for p in store.bm25('capital of "Peru"?', k=2)][0] == "1"
    assert store.bm25("zurich creme brulee", k=1)[0].id == "3"  # diacritics folded
    assert store.bm25("Zürich")[0].id == "3"
    for nasty in ('"', "AND OR NOT", "NEAR(equator", "ecuador*", "title:lima", "^quito", "a-b(c)"):
        store.bm25(nasty)  # never an FTS5 syntax error
    assert store.bm25("NEAR(equator")[0].id == "2"
    assert store.bm25("?!.,;") == [] and store.bm25("") == [] and store.bm25("___") == []
    assert store.bm25("capital", k=0) == []
    scores = [p.score for p in store.bm25("capital", k=3)]
    assert len(scores) == 2 and all(s > 0 for s in scores) and scores == sorted(scores, reverse=True)


def test_progress_reports_every_passage(tmp_path: Path):
    seen = []
    passages = [Passage(str(i), f'"T"\nword {i}') for i in range(25)]
    PassageStore.build(tmp_path / "s.sqlite", passages, batch=10, progress=seen.append)
    assert seen == [10, 10, 5]


def test_duplicate_id_in_build_input_is_named(tmp_path: Path):
    passages = [Passage(str(i), f'"T"\n{i}') for i in range(5)] + [Passage("2", '"T"\nagain')]
    with pytest.raises(InputError, match=r"duplicate passage id '2' \(passages 2 and 5\)"):
        PassageStore.build(tmp_path / "s.sqlite", passages, batch=4)
    assert list(tmp_path.iterdir()) == []


def test_build_of_nothing_is_an_error(tmp_path: Path):
    with pytest.raises(InputError, match="empty corpus"):
        PassageStore.build(tmp_path / "s.sqlite", [])
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------ atomicity and corruption

def test_failed_build_leaves_nothing_behind(tmp_path: Path):
    def passages():
        for i in range(5000):
            if i == 3000:
                raise RuntimeError("source died")
            yield Passage(str(i), f'"T{i}"\n{words(20, f"p{i}_")}')

    target = tmp_path / "out" / "store.sqlite"
    with pytest.raises(RuntimeError, match="source died"):
        PassageStore.build(target, passages(), batch=500, dict_sample_bytes=1)
    assert list(target.parent.iterdir()) == []


def test_failed_rebuild_keeps_the_previous_store(tmp_path: Path):
    target = tmp_path / "store.sqlite"
    PassageStore.build(target, ODD).close()
    before = target.read_bytes()

    def broken():
        yield ODD[0]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        PassageStore.build(target, broken())
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store.sqlite"]


def test_truncated_store_is_an_input_error(tmp_path: Path):
    target = tmp_path / "store.sqlite"
    passages = [Passage(str(i), f'"T{i}"\n{words(50, f"t{i}_")}') for i in range(300)]
    PassageStore.build(target, passages).close()
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated") as err:
        PassageStore(target)
    assert str(target) in str(err.value)


@pytest.mark.parametrize("content", [b"", b"not a database at all" * 10, b"SQLite format 3\x00" + bytes(200)])
def test_foreign_files_are_input_errors(tmp_path: Path, content: bytes):
    target = tmp_path / "store.sqlite"
    target.write_bytes(content)
    with pytest.raises(InputError) as err:
        PassageStore(target)
    assert str(target) in str(err.value)


def test_missing_store_and_other_sqlite_files(tmp_path: Path):
    with pytest.raises(InputError, match="no such file"):
        PassageStore(tmp_path / "absent.sqlite")
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE meta (key, value)")
    db.commit()
    db.close()
    with pytest.raises(InputError, match="not a passage store"):
        PassageStore(other)


def test_store_is_opened_read_only(tmp_path: Path):
    store = PassageStore.build(tmp_path / "s.sqlite", ODD)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        store._db.execute("DELETE FROM passages")


# ------------------------------------------------------------ jsonl readers

def test_jsonl_reader_accepts_int_ids_and_blank_lines(tmp_path: Path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": 7, "contents": '"A"\na'}, "",
                                              {"id": "x", "contents": '"B"\nb', "extra": 1}])
    assert list(iter_corpus(path)) == [Passage("7", '"A"\na'), Passage("x", '"B"\nb')]
    assert detect_format(path) == "jsonl"
    assert count_lines(path) == 3 and size_hint(path) == 3


@pytest.mark.parametrize("rows, line, message", [
    ([{"id": "0", "contents": "ok"}, '{"id": "1", "contents": '], 2, "malformed JSON"),
    ([{"id": "0", "contents": "ok"}, {"id": "1"}], 2, 'missing "contents"'),
    ([{"id": "0", "contents": ["not", "text"]}], 1, '"contents" must be a string'),
    ([{"contents": "x"}], 1, 'missing "id"'),
    ([{"id": 1.5, "contents": "x"}], 1, '"id" must be'),
    ([{"id": "0", "contents": "a"}, {"id": "1", "contents": "b"}, {"id": "0", "contents": "c"}], 3,
     "duplicate id '0'"),
    ([{"id": "a", "contents": "a"}, {"id": "a", "contents": "b"}], 2, "duplicate id 'a'"),
    (['{"id": "0", "contents": "\\ud800"}'], 1, "not valid Unicode"),
    (["[1, 2]"], 1, "expected a JSON object"),
])
def test_jsonl_reader_names_file_and_line(tmp_path: Path, rows: list, line: int, message: str):
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(InputError, match=re.escape(message)) as err:
        list(iter_corpus(path))
    assert err.value.path == str(path) and err.value.line == line


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_empty_jsonl_corpus_is_an_error(tmp_path: Path, text: str):
    path = tmp_path / "c.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match="empty corpus") as err:
        list(iter_corpus(path))
    assert err.value.path == str(path)


def test_seen_ids_tells_numeric_spellings_apart():
    seen = SeenIds()
    assert all(seen.add(s) for s in ["0", "1", "01", "1 ", "x", "99999999999999999999", "123456"])
    assert not any(seen.add(s) for s in ["0", "1", "01", "x", "99999999999999999999", "123456"])


def test_factbook_folder_reads_its_corpus(tmp_path: Path):
    row = {"id": "pe-0", "contents": '"Peru — Government"\nCapital: Lima.'}
    write_jsonl(tmp_path / "corpus.jsonl", [row])
    (tmp_path / "stats.json").write_text("{}", encoding="utf-8")
    (tmp_path / "notes.md").write_text("ignored: this is a FactbookQA folder", encoding="utf-8")
    assert detect_format(tmp_path) == "factbook"
    assert list(iter_corpus(tmp_path)) == [Passage("pe-0", '"Peru — Government"\nCapital: Lima.')]
    assert size_hint(tmp_path) == 1


def test_unknown_inputs(tmp_path: Path):
    with pytest.raises(InputError, match="no such file"):
        iter_corpus(tmp_path / "absent.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n", encoding="utf-8")
    with pytest.raises(InputError, match="unknown corpus format"):
        iter_corpus(tmp_path / "data.csv")


# ------------------------------------------------------------ folders of notes

def test_folder_corpus_titles_ids_and_order(tmp_path: Path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD.md").write_text("hidden", encoding="utf-8")
    (tmp_path / ".draft.md").write_text("hidden", encoding="utf-8")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / "b_notes.txt").write_text("# not a heading in .txt\n\nplain text.\n", encoding="utf-8")
    (tmp_path / "sub" / "trip-log_2024.md").write_text(
        "Intro before any heading.\n\n"
        "# Day One #\n"
        "We left\nearly.\n\n"
        "```\n# a comment in code\n```\n\n"
        "## Lunch\n\n"
        "Soup.\n\n"
        "#hashtag is text\n", encoding="utf-8")
    (tmp_path / "a.md").write_text("\ufeff# Heading\nBody.\n", encoding="utf-8")
    got = list(iter_corpus(tmp_path))
    assert [(p.id, p.contents) for p in got] == [
        ("a.md#0", '"a — Heading"\nBody.'),
        ("b_notes.txt#0", '"b notes"\n# not a heading in .txt plain text.'),
        ("sub/trip-log_2024.md#0", '"trip log 2024"\nIntro before any heading.'),
        ("sub/trip-log_2024.md#1", '"trip log 2024 — Day One"\nWe left early. ``` # a comment in code ```'),
        ("sub/trip-log_2024.md#2", '"trip log 2024 — Lunch"\nSoup. #hashtag is text'),
    ]
    assert detect_format(tmp_path) == "text" and size_hint(tmp_path) is None
    assert [p.id for p in iter_corpus(tmp_path / "a.md")] == ["a.md#0"]


def test_folder_chunks_pack_paragraphs_to_about_100_words():
    paragraphs = [words(40, "a"), words(50, "b"), words(30, "c"), words(100, "d"), words(1, "e")]
    chunks = [text for _, text in chunk_document("\n\n".join(paragraphs), "n.txt")]
    assert [len(c.split()) for c in chunks] == [90, 30, 100, 1]
    assert chunks[0] == words(40, "a") + " " + words(50, "b")


def test_long_paragraphs_split_at_sentence_ends():
    sentences = [words(30, f"s{i}_") + "." for i in range(7)]  # one 210-word paragraph
    chunks = [text for _, text in chunk_document(" ".join(sentences), "n.md")]
    assert chunks == [" ".join(sentences[0:3]), " ".join(sentences[3:6]), sentences[6]]
    run_on = words(250, "r")  # no sentence end at all: cut at 100 words
    assert [len(t.split()) for _, t in chunk_document(run_on, "n.md", words=100)] == [100, 100, 50]


def test_headings_end_passages():
    doc = "# One\n" + words(10, "a") + "\n# Two\n" + words(10, "b") + "\n# Empty\n\n# Three\nx"
    assert list(chunk_document(doc, "my_file.md")) == [
        ("my file — One", words(10, "a")), ("my file — Two", words(10, "b")), ("my file — Three", "x")]


def test_file_title():
    assert file_title("my_notes-2024.md") == "my notes 2024"
    assert file_title("a__b--c.txt") == "a b c"
    assert file_title("___.md") == "___"


def test_a_non_utf8_text_file_is_skipped_with_its_line(tmp_path: Path):
    # one note saved in another encoding does not stop a folder's build: it is skipped, and says where
    (tmp_path / "good.md").write_text("fine\n", encoding="utf-8")
    bad = tmp_path / "bad.txt"
    bad.write_bytes("line one\nline two caf".encode() + b"\xe9\n")
    report = DocReport()
    assert [p.id for p in iter_text_corpus(tmp_path, report=report)] == ["good.md#0"]
    (skipped,) = report.skipped
    assert skipped.path == "bad.txt" and skipped.reason.startswith("not UTF-8 (line 2, byte 21")
    # alone, it is an empty corpus that says why
    with pytest.raises(InputError, match=r"empty corpus.*bad.txt: not UTF-8 \(line 2, byte 21") as err:
        list(iter_corpus(bad))
    assert err.value.path == str(bad)


def test_empty_folder_is_an_error(tmp_path: Path):
    (tmp_path / "blank.md").write_text("\n\n   \n", encoding="utf-8")
    with pytest.raises(InputError, match="empty corpus"):
        list(iter_corpus(tmp_path))


def test_folder_corpus_builds_a_searchable_store(tmp_path: Path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "peru.md").write_text("# Geography\nThe Andes cross Peru.\n\n# Food\nCeviche is popular.\n",
                                   encoding="utf-8")
    store = PassageStore.build(tmp_path / "s.sqlite", iter_corpus(notes))
    top = store.bm25("ceviche", k=1)[0]
    assert (top.id, top.title, top.text) == ("peru.md#1", "peru — Food", "Ceviche is popular.")
    assert store.bm25("food", k=1)[0].id == "peru.md#1"  # titles are indexed too


# ------------------------------------------------------------ implicit ids (format 2)

def test_row_number_ids_are_not_stored_but_found(tmp_path: Path):
    passages = [Passage(str(i), f'"T{i}"\nbody {i}') for i in range(5)]
    passages += [Passage("007", '"padded"\nkept as written'), Passage("x", '"named"\nkept too')]
    store = PassageStore.build(tmp_path / "s.sqlite", passages)
    db = sqlite3.connect(tmp_path / "s.sqlite")
    stored = [pid for (pid,) in db.execute("SELECT id FROM passages ORDER BY row")]
    db.close()
    assert stored == [None] * 5 + ["007", "x"]  # "0".."4" equal their rows: implicit
    assert list(store.iter_passages()) == passages
    assert store.get_by_id("3") == passages[3] and store.get_by_id("007") == passages[5]
    for absent in ("5", "6", "7", "03", "-1", "99"):  # rows 5 and 6 have explicit ids
        with pytest.raises(KeyError):
            store.get_by_id(absent)
    store.close()


@pytest.mark.parametrize("ids", [["0", "1", "1"], ["2", "b", "2"], ["x", "1", "1"]])
def test_explicit_id_equal_to_an_implicit_one_is_a_duplicate(tmp_path: Path, ids: list[str]):
    passages = [Passage(pid, f'"t"\n{j}') for j, pid in enumerate(ids)]
    with pytest.raises(InputError, match="duplicate passage id"):
        PassageStore.build(tmp_path / "s.sqlite", passages)
    assert not (tmp_path / "s.sqlite").exists()


def test_a_format_1_store_is_refused_with_a_rebuild_hint(tmp_path: Path):
    path = tmp_path / "old.sqlite"
    PassageStore.build(path, [Passage("a", '"t"\nx')]).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = 'dgpo-edge/passage-store/1' WHERE key = 'format'")
    db.commit()
    db.close()
    with pytest.raises(InputError, match="rebuild it"):
        PassageStore(path)


def test_dictionary_level_depends_on_whether_the_corpus_fits_the_sample(tmp_path: Path):
    rng = random.Random(0)
    words = ["river", "mountain", "capital", "border", "export", "population", "climate", "coast"]
    passages = [Passage(str(i), f'"Country {i % 40}"\n' + " ".join(rng.choice(words) for _ in range(30)))
                for i in range(1200)]
    whole = PassageStore.build(tmp_path / "whole.sqlite", passages, fts=False)
    head = PassageStore.build(tmp_path / "head.sqlite", passages, fts=False, dict_sample_bytes=1)
    assert whole.compression == head.compression == "zstd+dict"
    assert (whole.meta["level"], head.meta["level"]) == ("19", "9")  # head: 1,000 of 1,200 sampled
    assert list(whole.iter_passages()) == list(head.iter_passages()) == passages
    whole.close()
    head.close()
