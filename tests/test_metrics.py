"""EM / F1 / cover-EM against hand-checked values, and the metric tables."""

from __future__ import annotations

import math

import pytest

from dgpo_edge.metrics import (
    MetricTable,
    cover_exact_match,
    exact_match,
    f1_score,
    normalize_answer,
    score_prediction,
    table_to_json,
    table_to_markdown,
)

# ----------------------------------------------------------- normalisation

NORMALIZE_CASES = [
    ("The  Quick, Brown fox!", "quick brown fox"),
    ("AN apple", "apple"),
    ("theater", "theater"),                 # articles only as whole words
    ("the-end", "theend"),                  # punctuation goes first, so "the" is glued on
    ("a.k.a.", "aka"),
    ("1,000", "1000"),
    ("U.S.A.", "usa"),
    ("George VI\n", "george vi"),
    ("\tNew\n York  ", "new york"),
    ("CAFÉ", "café"),                       # unicode letters are lowercased, kept
    ("1–2", "1–2"),                         # an en dash is not in string.punctuation
    ("A+", ""),                             # "a" survives punctuation removal, then is an article
    ("---", ""),
    ("", ""),
]


@pytest.mark.parametrize("text, expected", NORMALIZE_CASES)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


# ------------------------------------------------------- scoring, by hand

# (prediction, golds, em, f1, cover_em)
SCORE_CASES = [
    ("The Eiffel Tower", "eiffel tower", 1, 1, 1),                      # article + case
    ("Paris.", ["paris"], 1, 1, 1),                                      # punctuation
    ("  New   York  City ", "new york city", 1, 1, 1),                  # whitespace
    ("an apple", ["apple"], 1, 1, 1),
    ("1,000", "1000", 1, 1, 1),                                          # comma removed
    ("the a.k.a. name", "aka name", 1, 1, 1),
    ("café", "CAFÉ", 1, 1, 1),                                           # unicode case
    ("Türkiye", "turkiye", 0, 0, 0),                                     # accents are kept
    ("1–2", "12", 0, 0, 0),                                              # en dash kept
    ("Bob Russell", ["Bobby Scott", "Bob Russell"], 1, 1, 1),           # any alias
    ("george  vi", ["George VI\n"], 1, 1, 1),
    ("", ["paris"], 0, 0, 0),                                            # empty prediction
    (None, ["paris"], 0, 0, 0),                                          # no answer at all
    ("p", "paris", 0, 0, 0),                                             # a str gold is one alias
    ("yes", "no", 0, 0, 0),                                              # yes/no rule
    ("yes", ["Yes."], 1, 1, 1),
    ("no way", "no", 0, 0, 1),           # gold "no" differs -> F1 0; substring -> cover 1
    ("no answer", "noanswer", 0, 0, 0),  # "no answer" != "noanswer" and gold is special
    ("the big red barn", "red barn house", 0, 2 / 3, 0),  # 2 common of 3 and 3 tokens
    ("Barack Obama", "Barack Hussein Obama II", 0, 2 / 3, 0),  # P=1, R=1/2
    ("president Barack Obama", "Barack Obama", 0, 0.8, 1),     # P=2/3, R=1
    ("new york", ["york", "new york city"], 0, 0.8, 1),        # max(2/3, 0.8)
    ("the the cat cat", "cat", 0, 2 / 3, 1),                   # "cat cat": P=1/2, R=1
    ("Theatre", "the atre", 0, 0, 1),                          # gold -> "atre", inside "theatre"
    ("anything", "---", 0, 0, 1),        # gold normalises to "": Search-R1 subem accepts it
    ("", "A+", 1, 0, 1),                 # both sides "" -> EM 1, but no tokens -> F1 0
]


@pytest.mark.parametrize("prediction, golds, em, f1, cover", SCORE_CASES)
def test_scores_by_hand(prediction, golds, em, f1, cover):
    assert exact_match(prediction, golds) == em
    assert math.isclose(f1_score(prediction, golds), f1, abs_tol=1e-12)
    assert cover_exact_match(prediction, golds) == cover
    scores = score_prediction(prediction, golds)
    assert set(scores) == {"em", "f1", "cover_em"}
    assert scores["em"] == em and scores["cover_em"] == cover
    assert math.isclose(scores["f1"], f1, abs_tol=1e-12)


def test_scores_are_floats_and_tuple_golds_work():
    assert isinstance(exact_match("x", ("x",)), float)
    assert isinstance(cover_exact_match("x", ("y",)), float)
    assert f1_score("x", []) == 0.0
    assert exact_match("x", []) == 0.0


# ------------------------------------------------------------ aggregation

RECORDS = [
    {"source": "nq", "em": 1, "f1": 1.0, "cover_em": 1, "turns": 2},
    {"source": "nq", "em": 0, "f1": 0.5, "cover_em": 1, "turns": 4},
    {"source": "nq", "em": 0, "f1": 0.0, "cover_em": 0, "turns": 1},
    {"source": "nq", "em": 1, "f1": 1.0, "cover_em": 1, "turns": 1},
    {"source": "popqa", "em": 1, "f1": 1.0, "cover_em": 1, "turns": 3},
    {"source": "bamboogle", "em": 0, "f1": 0.0, "cover_em": 0, "done": True, "note": "x"},
    {"source": "bamboogle", "em": 0, "f1": 0.5, "cover_em": 1},
    {"source": "bamboogle", "em": 0, "f1": 0.25, "cover_em": 0},
]


def test_per_source_macro_and_micro():
    table = MetricTable(RECORDS)
    assert table.columns == ["em", "f1", "cover_em", "turns"]   # bool/str keys ignored
    assert list(table.rows) == ["bamboogle", "nq", "popqa"]
    nq = table.rows["nq"]
    assert (nq["n"], nq["em"], nq["f1"], nq["cover_em"], nq["turns"]) == (4, 0.5, 0.625, 0.75, 2.0)
    assert table.rows["bamboogle"]["turns"] is None               # no record has it
    # macro "average": mean of the three per-source means
    assert math.isclose(table.average["em"], (0.5 + 1 + 0) / 3)
    assert math.isclose(table.average["f1"], (0.625 + 1 + 0.25) / 3)
    assert math.isclose(table.average["cover_em"], (0.75 + 1 + 1 / 3) / 3)
    assert math.isclose(table.average["turns"], (2.0 + 3.0) / 2)  # sources that have it
    # micro "all": mean over the 8 records
    assert table.all["n"] == 8 and table.average["n"] == 8
    assert math.isclose(table.all["em"], 3 / 8)
    assert math.isclose(table.all["f1"], 4.25 / 8)
    assert math.isclose(table.all["cover_em"], 5 / 8)
    assert math.isclose(table.all["turns"], 11 / 5)


def test_table_to_json_shape():
    data = table_to_json(RECORDS)
    assert set(data) == {"columns", "sources", "average", "all"}
    assert data["sources"]["popqa"] == {"n": 1, "em": 1.0, "f1": 1.0, "cover_em": 1.0, "turns": 3.0}
    assert table_to_json(MetricTable(RECORDS)) == data


def test_table_to_markdown_rows():
    lines = table_to_markdown(RECORDS).splitlines()
    assert lines[0] == "| dataset | n | em | f1 | cover_em | turns |"
    assert lines[1] == "|---|---|---|---|---|---|"
    assert lines[2] == "| bamboogle | 3 | 0.000 | 0.250 | 0.333 | - |"
    assert lines[3] == "| nq | 4 | 0.500 | 0.625 | 0.750 | 2.000 |"
    assert lines[4] == "| popqa | 1 | 1.000 | 1.000 | 1.000 | 3.000 |"
    assert lines[5] == "| average | 8 | 0.500 | 0.625 | 0.694 | 2.500 |"
    assert lines[6] == "| all | 8 | 0.375 | 0.531 | 0.625 | 2.200 |"
    assert len(lines) == 7


def test_empty_table():
    table = MetricTable([])
    assert table.rows == {} and table.all["n"] == 0 and table.average["em"] is None
    assert "| all | 0 | - | - | - |" in table.to_markdown()
