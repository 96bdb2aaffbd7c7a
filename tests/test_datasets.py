"""QA readers on the real files in ../shared and on small real-shaped files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dgpo_edge.datasets import (
    QAExample,
    detect_format,
    find_duplicates,
    read_deepresearcher_parquet,
    read_flashrag_jsonl,
    read_nq_open_jsonl,
    read_qa,
    read_r1searcher_jsonl,
    read_searchr1_parquet,
    summarize,
)
from dgpo_edge.errors import InputError
from dgpo_edge.metrics import normalize_answer

SEVEN_SOURCES = {"2wiki", "hotpotqa", "musique", "nq", "popqa", "tq"}


@pytest.fixture
def qa_dir(shared_dir: Path) -> Path:
    return shared_dir / "data" / "qa"


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------- real files

@pytest.mark.shared
def test_deepresearcher_test_counts(qa_dir):
    path = qa_dir / "deepresearcher_test.parquet"
    assert detect_format(path) == "deepresearcher"
    examples = read_qa(path)
    summary = summarize(examples)
    assert summary.count == 3197
    assert summary.per_source == {**{s: 512 for s in SEVEN_SOURCES}, "Bamboogle": 125}
    assert len({ex.id for ex in examples}) == 3197          # extra_info.index is unique
    assert all(ex.question == ex.question.strip() and ex.answers for ex in examples)
    assert all(ex.meta["split"] == "dev" for ex in examples)


@pytest.mark.shared
def test_deepresearcher_splits_multi_answers(qa_dir):
    by_id = {ex.id: ex for ex in read_deepresearcher_parquet(qa_dir / "deepresearcher_test.parquet")}
    popqa = by_id["popqa_3474310"]
    assert popqa.question == "What is the capital of Columbia County?"
    assert popqa.answers == ("Bloomsburg", "The Only Town in Pennsylvania", "Eyersburg")
    assert popqa.source == "popqa"
    assert by_id["2wiki_db6a0c8c0bdd11eba7f7acde48001122"].answers == ("20 July 1851",)
    # the raw gold is "George VI\n": aliases are stripped
    bamboogle = [ex for ex in by_id.values()
                 if ex.question == "Who is the predecessor of the longest-reigning British monarch?"]
    assert [ex.answers for ex in bamboogle] == [("George VI",)]
    assert max(len(ex.answers) for ex in by_id.values()) == 178
    assert not any("<|answer_split|>" in a for ex in by_id.values() for a in ex.answers)


@pytest.mark.shared
def test_deepresearcher_dev(qa_dir):
    examples = read_qa(qa_dir / "deepresearcher_dev.parquet")
    assert len(examples) == 875
    assert summarize(examples).per_source == {s: 125 for s in SEVEN_SOURCES | {"Bamboogle"}}
    first = examples[0]
    assert first.source == "tq" and first.id == "tq_qg_3477"
    assert len(first.answers) == 26 and "turkey" in first.answers


@pytest.mark.shared
def test_dev_and_test_overlap(qa_dir):
    """Worth knowing: all 125 Bamboogle questions (and 63 others) are in both files."""
    test_ids = {ex.id for ex in read_qa(qa_dir / "deepresearcher_test.parquet")}
    shared = [ex for ex in read_qa(qa_dir / "deepresearcher_dev.parquet") if ex.id in test_ids]
    assert len(shared) == 188
    assert sum(ex.source == "Bamboogle" for ex in shared) == 125


@pytest.mark.shared
def test_nq_open_dev(qa_dir):
    path = qa_dir / "nq_open_dev.jsonl"
    assert detect_format(path) == "nq_open"
    examples = read_qa(path)
    assert len(examples) == 3610
    assert {ex.source for ex in examples} == {"nq"}
    assert examples[0] == QAExample(
        "nq_open_dev-0", "when was the last time anyone was on the moon",
        ("14 December 1972 UTC", "December 1972"), "nq")
    assert examples[1].answers == ("Bobby Scott", "Bob Russell")
    assert sum(1 for _ in read_nq_open_jsonl(path)) == 3610
    assert [ex.id for ex in read_qa(path, limit=3)] == [f"nq_open_dev-{i}" for i in range(3)]


@pytest.mark.shared
def test_duplicates_on_real_files(qa_dir):
    for name in ("nq_open_dev.jsonl", "deepresearcher_test.parquet"):
        groups = find_duplicates(read_qa(qa_dir / name))
        for group in groups:
            assert len(group) >= 2
            assert len({normalize_answer(ex.question) for ex in group}) == 1
            assert len({ex.id for ex in group}) == len(group)
    assert find_duplicates(read_qa(qa_dir / "nq_open_dev.jsonl")) == []
    # four PopQA questions are ambiguous titles asked twice ("Who was the director of Pilot?")
    groups = find_duplicates(read_qa(qa_dir / "deepresearcher_test.parquet"))
    assert len(groups) == 4 and all(ex.source == "popqa" for g in groups for ex in g)


# ------------------------------------------------- Search-R1 parquet (tmp)

PROMPT = ("Answer the given question. You must conduct reasoning inside <think> and </think> "
          "first every time you get new information. ... Question: {q}\n")

SEARCHR1_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("question", pa.string()),
    ("golden_answers", pa.list_(pa.string())),
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([
        ("ground_truth", pa.struct([("target", pa.list_(pa.string()))])),
        ("style", pa.string()),
    ])),
    ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])),
])


def searchr1_row(i: int, question: str, answers: list[str], source: str = "nq") -> dict:
    """One row laid out like Search-R1's data_process/nq_search.py output."""
    return {
        "id": f"test_{i}",
        "question": question,
        "golden_answers": answers,
        "data_source": source,
        "prompt": [{"content": PROMPT.format(q=question.strip() + "?"), "role": "user"}],
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": {"target": answers}, "style": "rule"},
        "extra_info": {"index": i, "split": "test"},
    }


def write_parquet(path: Path, rows: list[dict], schema: pa.Schema) -> Path:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def test_searchr1_parquet_roundtrip(tmp_path):
    rows = [
        searchr1_row(0, "who got the first nobel prize in physics", ["Wilhelm Conrad Röntgen"]),
        searchr1_row(1, " when is the next deadpool movie being released", ["May 18, 2018"]),
        searchr1_row(2, "which city is older, A or B", ["A", "the city A"], source="hotpotqa"),
    ]
    path = write_parquet(tmp_path / "test.parquet", rows, SEARCHR1_SCHEMA)
    assert detect_format(path) == "searchr1"
    examples = read_qa(path)
    assert [ex.id for ex in examples] == ["test_0", "test_1", "test_2"]
    assert examples[1].question == "when is the next deadpool movie being released"  # not the template
    assert examples[2].answers == ("A", "the city A") and examples[2].source == "hotpotqa"
    assert examples[0].meta["ability"] == "fact-reasoning"
    assert examples[0].meta["extra_info"] == {"index": 0, "split": "test"}
    assert "prompt" not in examples[0].meta


def test_searchr1_parquet_falls_back_to_reward_model(tmp_path):
    schema = pa.schema([f for f in SEARCHR1_SCHEMA if f.name not in ("golden_answers", "id")])
    rows = [searchr1_row(0, "q zero", ["x", "y"]), searchr1_row(1, "q one", ["z"])]
    for row in rows:
        del row["golden_answers"], row["id"]
    path = write_parquet(tmp_path / "train.parquet", rows, schema)
    examples = list(read_searchr1_parquet(path))
    assert [ex.answers for ex in examples] == [("x", "y"), ("z",)]
    assert [ex.id for ex in examples] == ["train-0", "train-1"]


def test_searchr1_parquet_empty_answers_names_row(tmp_path):
    rows = [searchr1_row(0, "fine", ["ok"]), searchr1_row(1, "broken", []), searchr1_row(2, "x", ["y"])]
    path = write_parquet(tmp_path / "bad.parquet", rows, SEARCHR1_SCHEMA)
    with pytest.raises(InputError) as err:
        read_qa(path)
    assert str(path) in str(err.value) and "row 1" in str(err.value)
    assert "no answers" in str(err.value)


def test_deepresearcher_bad_rows_name_row(tmp_path):
    schema = pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        ("extra_info", pa.struct([("index", pa.string()), ("split", pa.string())])),
    ])

    def row(q, truth):
        return {"data_source": "nq", "prompt": [{"content": q, "role": "user"}],
                "reward_model": {"ground_truth": truth, "style": "unknown"},
                "extra_info": {"index": None, "split": "dev"}}

    good = write_parquet(tmp_path / "good.parquet", [row("q?", "a<|answer_split|>b")], schema)
    assert read_qa(good) == [QAExample("good-0", "q?", ("a", "b"), "nq")]
    for rows, needle in [
        ([row("q?", "a"), row("q?", "a"), row("q?", "<|answer_split|> ")], "row 2"),
        ([row("q?", "a"), row("   ", "a")], "row 1"),
        ([row("q?", None)], "row 0"),
    ]:
        path = write_parquet(tmp_path / "bad.parquet", rows, schema)
        with pytest.raises(InputError, match=needle):
            read_qa(path)


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"this is not parquet")
    with pytest.raises(InputError, match="junk.parquet"):
        read_qa(path)
    with pytest.raises(InputError, match="cannot read parquet"):
        list(read_deepresearcher_parquet(path))


# ----------------------------------------------------- jsonl formats (tmp)

def test_flashrag_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "hotpotqa_dev.jsonl", [
        {"id": "5a8b57f2", "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
         "golden_answers": ["yes"], "metadata": {"type": "comparison", "level": "hard"}},
        {"question": "Which magazine was started first?", "golden_answers": ["Arthur's Magazine"]},
        {"id": "x", "question": "q", "golden_answers": ["a", "b"], "data_source": "bamboogle"},
    ])
    assert detect_format(path) == "flashrag"
    first, second, third = read_qa(path)
    assert first.id == "5a8b57f2" and first.source == "hotpotqa_dev"
    assert first.meta == {"metadata": {"type": "comparison", "level": "hard"}}
    assert second.id == "hotpotqa_dev-1"
    assert third.source == "bamboogle" and third.answers == ("a", "b") and third.meta == {}


def test_r1searcher_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "2wiki_500.jsonl", [
        {"idx": 7, "question": "Who was born first?", "answer": "Alice", "type": "comparison"},
        {"question": "Where?", "answer": " Paris "},
    ])
    assert detect_format(path) == "r1searcher"
    first, second = read_qa(path)
    assert first == QAExample("2wiki_500-7", "Who was born first?", ("Alice",), "2wiki_500")
    assert first.meta == {"type": "comparison"}
    assert second.id == "2wiki_500-1" and second.answers == ("Paris",)
    assert list(read_r1searcher_jsonl(path)) == [first, second]


@pytest.mark.parametrize("reader, row, needle", [
    (read_flashrag_jsonl, {"question": "q", "golden_answers": "a"}, "list of strings"),
    (read_flashrag_jsonl, {"question": "q", "golden_answers": ["a", 3]}, "list of strings"),
    (read_flashrag_jsonl, {"question": "q", "golden_answers": []}, "no answers"),
    (read_flashrag_jsonl, {"question": "q", "golden_answers": [" ", ""]}, "no answers"),
    (read_flashrag_jsonl, {"question": "  ", "golden_answers": ["a"]}, "'question' is empty"),
    (read_flashrag_jsonl, {"golden_answers": ["a"]}, "'question' must be a string"),
    # JSON's lone-surrogate escapes: eval died with a traceback writing its first prediction
    (read_flashrag_jsonl, {"question": "q\ud800", "golden_answers": ["a"]},
     "'question' is not valid Unicode text: a lone surrogate (U+D800) at character 2"),
    (read_flashrag_jsonl, {"question": "q", "golden_answers": ["a", "\udc00"]}, "'golden_answers' is not valid Unicode"),
    (read_nq_open_jsonl, {"question": "q", "answer": "a"}, "list of strings"),
    (read_r1searcher_jsonl, {"question": "q", "answer": ["a"]}, "'answer' must be a string"),
    (read_r1searcher_jsonl, {"question": 5, "answer": "a"}, "'question' must be a string"),
])
def test_wrong_field_types_name_line(tmp_path, reader, row, needle):
    good = {"question": "fine", "golden_answers": ["a"], "answer": ["a"]}
    if reader is read_r1searcher_jsonl:
        good["answer"] = "a"
    path = write_jsonl(tmp_path / "data.jsonl", [good, row])
    with pytest.raises(InputError) as err:
        list(reader(path))
    message = str(err.value)
    assert str(path) in message and "line 2" in message and needle in message


def test_bad_json_line_three(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "a", "answer": ["b"]}\n'
                    '{"question": "c", "answer": ["d"]}\n'
                    '{"question": "e", "answer": [\n', encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_qa(path)
    assert str(path) in str(err.value) and "line 3" in str(err.value)


def test_non_utf8(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"question": "a", "answer": ["b"]}\n{"question": "caf\xe9", "answer": ["x"]}\n')
    with pytest.raises(InputError) as err:
        read_qa(path, format="nq_open")
    assert "line 2" in str(err.value) and "not UTF-8" in str(err.value)


def test_byte_order_mark_is_accepted_by_detection_and_the_cli(tmp_path):
    """Files saved by editors that add a UTF-8 BOM read like any other (`data inspect` too)."""
    from cli_helpers import invoke

    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"question": "q", "golden_answers": ["a"]}).encode() + b"\n")
    assert detect_format(path) == "flashrag" and read_qa(path)[0].question == "q"
    r = invoke("data", "inspect", path, "--json")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("name", ["missing.jsonl", "missing.parquet"])
def test_missing_file(tmp_path, name):
    path = tmp_path / name
    with pytest.raises(InputError, match="no such file"):
        read_qa(path)
    with pytest.raises(InputError, match=name):
        list(read_searchr1_parquet(path) if name.endswith("parquet") else read_flashrag_jsonl(path))


def test_detect_format_rejects_unknown(tmp_path):
    csv = tmp_path / "data.csv"
    csv.write_text("question,answer\n")
    with pytest.raises(InputError, match="unknown QA file type"):
        detect_format(csv)
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"q": 1}])
    with pytest.raises(InputError, match="line 1"):
        detect_format(odd)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(InputError, match="empty file"):
        read_qa(empty)
    with pytest.raises(InputError, match="unknown format"):
        read_qa(odd, format="squad")


# ------------------------------------------------------- duplicates, summary

def test_find_duplicates_and_summary():
    def ex(i, q, source="nq", answers=("a",)):
        return QAExample(f"id{i}", q, answers, source)

    examples = [
        ex(0, "Who is the author of America?"),
        ex(1, "Who was the director of Pilot?", "popqa", ("x", "y", "z")),
        ex(2, "who is the author of  america"),
        ex(3, "Who is an author of America", "tq"),       # articles are dropped too
        ex(4, "Who was the director of Pilots?", "popqa"),
        ex(5, "who was the director of pilot", "popqa"),
    ]
    groups = find_duplicates(examples)
    assert [[e.id for e in g] for g in groups] == [["id0", "id2", "id3"], ["id1", "id5"]]
    summary = summarize(examples)
    assert summary.count == 6
    assert summary.per_source == {"nq": 2, "popqa": 3, "tq": 1}
    assert summary.duplicate_groups == 2
    assert summary.mean_answers == pytest.approx(8 / 6)
    assert summarize([]).mean_answers == 0.0


def test_qaexample_equality_ignores_meta():
    a = QAExample("1", "q", ("a",), "nq", {"hops": 2})
    b = QAExample("1", "q", ("a",), "nq")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
