"""`dgpo-edge eval` and agent/evaluate.py: scores, ARC, incremental and resumable predictions, reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bundle_helpers import QUESTIONS, build_tiny_index, smollm2_gguf, write_corpus, write_questions
from cli_helpers import assert_one_line_error, invoke
from engine_fakes import ListRetriever, ScriptedEngine

import dgpo_edge.engines
from dgpo_edge.agent import Agent
from dgpo_edge.agent.evaluate import PREDICTIONS, evaluate, key, load_questions, make_report, report_markdown
from dgpo_edge.arc import outcome
from dgpo_edge.errors import InputError
from dgpo_edge.protocol import Passage


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("idx")
    return build_tiny_index(write_corpus(d / "corpus.jsonl"), d / "index")


# q1: searches then answers right; q2: answers right at once; q3: invalid, then wrong
SCRIPT = ["<search> capital of Peru </search>", "<answer> Lima </answer>",
          "<answer>Nairobi</answer>",
          "I don't know.", "<answer> Kyoto </answer>"]


@pytest.fixture()
def engine_script(monkeypatch, tmp_path: Path):
    turns: list[str] = []
    engines: list[ScriptedEngine] = []
    model = tmp_path / "scripted.gguf"
    model.write_bytes(b"GGUF")

    def fake_open_engine(path, n_ctx=4096, threads=None, **kw):
        engines.append(ScriptedEngine(list(turns), n_ctx=n_ctx))
        return engines[-1]

    monkeypatch.setattr(dgpo_edge.engines, "open_engine", fake_open_engine)
    return turns, model, engines


def test_eval_scores_arc_and_report(engine_script, index_dir: Path, tmp_path: Path):
    turns, model, _ = engine_script
    turns += SCRIPT
    data = write_questions(tmp_path / "fbqa.jsonl")
    out = tmp_path / "out"
    r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out)
    assert r.exit_code == 0, r.output
    preds = [json.loads(line) for line in (out / PREDICTIONS).read_text().splitlines()]
    assert [p["prediction"] for p in preds] == ["Lima", "Nairobi", "Kyoto"]
    assert [p["em"] for p in preds] == [1.0, 1.0, 0.0]
    assert preds[0]["searches"] == 1 and preds[0]["hit"] == 1.0 and preds[0]["search_queries"] == ["capital of Peru"]
    assert preds[2]["invalid_turns"] == 1 and preds[2]["turns"] == 2
    report = json.loads((out / "report.json").read_text())
    row = report["scores"]["sources"]["fbqa"]
    assert row["n"] == 3 and row["em"] == pytest.approx(2 / 3) and row["cover_em"] == pytest.approx(2 / 3)
    a = report["arc"]["sources"]["fbqa"]
    assert a["hit_ratio"] == pytest.approx(1 / 3) and a["search_steps"] == pytest.approx(1 / 3)
    assert a["invalid_action_rate"] == pytest.approx(1 / 5) and a["answered_rate"] == 1.0
    assert report["scores"]["average"]["em"] == pytest.approx(2 / 3)
    md = (out / "report.md").read_text()
    assert "| fbqa | 3 | 0.667" in md and "hit ratio" in md
    assert "fbqa" in r.flat and "report:" in r.flat
    # q1 and q2 right; q3 answered "Kyoto" without a search
    assert report["outcomes"]["sources"]["fbqa"] == {"right": 2, "no_answer": 0, "no_search": 1, "not_found": 0,
                                                     "misread": 0}
    assert report["outcomes"]["types"] == {}   # these questions carry no type
    assert "| fbqa | 3 | 2 | 0 | 1 | 0 | 0 |" in md
    assert "outcomes: right 2, no answer 0, no search 1, not found 0, misread 0" in r.flat


def test_outcomes_tell_retrieval_from_reading_failures_per_type():
    def rec(em, answered, searches, hit, qtype):
        return {"source": "w", "em": em, "f1": em, "cover_em": em, "searches": searches, "hit": hit, "turns": 2,
                "invalid_turns": 0, "answered": answered, "type": qtype}

    records = [rec(1.0, 1.0, 1, 1.0, "fact"),
               rec(0.0, 1.0, 1, 1.0, "fact"),      # found the passage, answered something else
               rec(0.0, 1.0, 2, 0.0, "bridge"),    # searched twice, never found the answer
               rec(0.0, 0.0, 4, 1.0, "bridge"),    # found it, but the turns ran out: no answer wins
               rec(0.0, 1.0, 0, 0.0, "comparison")]
    assert [outcome(r) for r in records] == ["right", "misread", "not_found", "no_answer", "no_search"]
    o = make_report(records)["outcomes"]
    assert o["sources"] == {"w": {"right": 1, "no_answer": 1, "no_search": 1, "not_found": 1, "misread": 1}}
    assert o["types"]["bridge"] == {"right": 0, "no_answer": 1, "no_search": 0, "not_found": 1, "misread": 0}
    assert list(o["types"]) == ["bridge", "comparison", "fact"]
    md = report_markdown(make_report(records))
    assert "| type: fact | 2 | 1 | 0 | 0 | 0 | 1 |" in md
    # a record resumed from a version that kept no type, and a second dataset: the rows add up to n
    mixed = [*records, {**records[0], "source": "v", "type": "fact"}]
    del mixed[1]["type"]
    types = make_report(mixed)["outcomes"]["types"]
    assert sorted(types) == ["v: fact", "w: (no type)", "w: bridge", "w: comparison", "w: fact"]
    assert sum(sum(row.values()) for row in types.values()) == len(mixed)


def test_eval_json_prints_the_report_and_keeps_the_bar_on_stderr(engine_script, index_dir: Path, tmp_path: Path):
    turns, model, _ = engine_script
    turns += SCRIPT
    data = write_questions(tmp_path / "fbqa.jsonl")
    out = tmp_path / "out"
    r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out, "--json", "-k", 2)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report == json.loads((out / "report.json").read_text())
    assert report["scores"]["average"]["em"] == pytest.approx(2 / 3)
    assert "evaluating" in r.stderr and "3/3 questions" in r.stderr


def test_eval_resume_runs_only_missing_questions(engine_script, index_dir: Path, tmp_path: Path):
    turns, model, engines = engine_script
    data = write_questions(tmp_path / "fbqa.jsonl")
    out = tmp_path / "out"
    turns += SCRIPT[:3]
    agent_engine_calls = []

    def run(script):
        turns.clear()
        turns.extend(script)
        r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out)
        agent_engine_calls.append(engines[-1].calls)
        return r

    # first run dies on q3 (the script runs out: an empty turn is invalid, then the final turn fails)
    r = run(SCRIPT[:3])
    assert r.exit_code == 0
    lines = (out / PREDICTIONS).read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["prediction"] is None
    # drop q3's line as if the run had been killed, and tear the file
    (out / PREDICTIONS).write_text("\n".join(lines[:2]) + "\n" + lines[2][:20])
    r = run(SCRIPT[3:])
    assert r.exit_code == 0, r.output
    preds = [json.loads(line) for line in (out / PREDICTIONS).read_text().splitlines()]
    assert [p["id"] for p in preds] == ["q1", "q2", "q3"] and preds[2]["prediction"] == "Kyoto"
    assert agent_engine_calls[-1] == 2     # only q3 ran
    # a larger --limit or another data file is not a change of settings; --top-k is
    r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out, "--limit", "3")
    assert r.exit_code == 0 and agent_engine_calls[-1] == 2
    # a run.json from before the rename (`max_turns` for the search budget) is the same settings
    run = json.loads((out / "run.json").read_text())
    run = {("max_turns" if k == "max_searches" else k): v for k, v in run.items()}
    (out / "run.json").write_text(json.dumps(run))
    r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out)
    assert r.exit_code == 0, r.output
    assert json.loads((out / "run.json").read_text())["max_searches"] == 4
    r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out, "--top-k", "1")
    assert_one_line_error(r, "other settings", "--overwrite")
    turns[:] = SCRIPT
    r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out, "--top-k", "1",
               "--overwrite")
    assert r.exit_code == 0 and len((out / PREDICTIONS).read_text().splitlines()) == 3


def test_eval_resume_shows_the_em_of_every_answered_question(engine_script, index_dir: Path, tmp_path: Path):
    """The bar's EM after a resume counted only the questions answered in this process."""
    turns, model, _ = engine_script
    data = write_questions(tmp_path / "fbqa.jsonl")
    out = tmp_path / "out"
    turns += SCRIPT
    args = ("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out)
    assert invoke(*args).exit_code == 0
    lines = (out / PREDICTIONS).read_text().splitlines()
    (out / PREDICTIONS).write_text("\n".join(lines[:2]) + "\n")   # killed before q3's line
    turns[:] = SCRIPT[3:]
    r = invoke(*args)   # q1 and q2 resumed (right), q3 answered now (wrong)
    assert r.exit_code == 0, r.output
    assert "3/3 questions" in r.stderr and "EM 0.667" in r.stderr, r.stderr
    r = invoke(*args)   # nothing left to answer: the resumed questions' EM, not "-"
    assert r.exit_code == 0 and "EM 0.667" in r.stderr, r.stderr


def test_eval_refuses_other_settings_before_the_model_loads(engine_script, index_dir: Path, tmp_path: Path,
                                                           monkeypatch):
    """An --out made with other settings was refused only once the model had loaded (a minute)."""
    data, model, out = _evaluated(engine_script, index_dir, tmp_path)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the settings were compared")

    monkeypatch.setattr(dgpo_edge.engines, "open_engine", no_model)
    r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out, "--top-k", "1")
    assert_one_line_error(r, "other settings", "--overwrite", str(out))
    # a model path that is not there is another setting too: the refusal comes before the model is looked at
    r = invoke("eval", "--data", data, "--model", tmp_path / "gone.gguf", "--index", index_dir, "--out", out)
    assert_one_line_error(r, "other settings")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # the same settings (the engine's name not known yet), or --overwrite, pass on to the model
    for extra in ((), ("--top-k", "1", "--overwrite")):
        r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out, *extra)
        assert isinstance(r.exception, AssertionError) and "model loaded" in str(r.exception)


def _evaluated(engine_script, index_dir: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(questions, model, out) of a finished evaluation of the scripted questions."""
    turns, model, _ = engine_script
    turns += SCRIPT
    data = write_questions(tmp_path / "fbqa.jsonl")
    out = tmp_path / "out"
    assert invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out).exit_code == 0
    return data, model, out


@pytest.mark.parametrize("damage", [b"\n", b"{not json\n", b'{"no_key": 1}\n'])
def test_eval_resume_refuses_a_damaged_line_before_the_last(engine_script, index_dir: Path, tmp_path: Path,
                                                           damage: bytes):
    """Only a torn last line is dropped on resume; damage before it is refused and nothing is cut."""
    data, model, out = _evaluated(engine_script, index_dir, tmp_path)
    lines = (out / PREDICTIONS).read_bytes().splitlines(keepends=True)
    damaged = lines[0] + damage + b"".join(lines[1:])
    (out / PREDICTIONS).write_bytes(damaged)
    run_json = (out / "run.json").read_bytes()
    r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out)
    assert_one_line_error(r, f"{PREDICTIONS}, line 2", "--overwrite")
    assert (out / PREDICTIONS).read_bytes() == damaged and (out / "run.json").read_bytes() == run_json


@pytest.mark.parametrize("edit", [lambda rec: {"key": rec["key"]}, lambda rec: {**rec, "em": "1.0"},
                                  lambda rec: {**rec, "searches": None}], ids=["key-only", "em-text", "searches-null"])
def test_eval_resume_refuses_a_record_the_report_cannot_read_before_the_model_loads(engine_script, index_dir: Path,
                                                                                   tmp_path: Path, monkeypatch, edit):
    """A record with its key but a field the report needs missing or of another type (a hand edit):
    one error line naming the line, before the model loads, not a KeyError once every question ran.
    A folder of someone else's files is refused before the model loads too."""
    data, model, out = _evaluated(engine_script, index_dir, tmp_path)
    lines = (out / PREDICTIONS).read_text().splitlines(keepends=True)
    damaged = lines[0] + json.dumps(edit(json.loads(lines[1]))) + "\n" + lines[2]
    (out / PREDICTIONS).write_text(damaged)

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before --out was checked")

    monkeypatch.setattr(dgpo_edge.engines, "open_engine", no_model)
    r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out)
    assert_one_line_error(r, f"{PREDICTIONS}, line 2", "damaged predictions")
    assert (out / PREDICTIONS).read_text() == damaged
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.md").write_text("mine")
    r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", theirs)
    assert_one_line_error(r, str(theirs), "not an evaluation's")


def test_eval_refuses_a_second_run_into_the_same_folder(engine_script, index_dir: Path, tmp_path: Path):
    """Two evals into one --out would both write every record: the second is refused at once."""
    import threading

    data = write_questions(tmp_path / "fbqa.jsonl")
    out = tmp_path / "out"
    started, release = threading.Event(), threading.Event()
    engine = ScriptedEngine(SCRIPT)
    results: list = []

    def first() -> None:
        with Agent(engine, ListRetriever([Passage("0", '"Peru"\nLima')])) as agent:
            results.append(evaluate(agent, load_questions([data]), out,
                                    on_start=lambda resumed, total: started.set(),
                                    on_record=lambda rec, done, total: release.wait(30)))

    worker = threading.Thread(target=first)
    worker.start()
    try:
        assert started.wait(30)
        second = Agent(ScriptedEngine(SCRIPT), ListRetriever([Passage("0", '"Peru"\nLima')]))
        with pytest.raises(InputError, match="another eval"):
            evaluate(second, load_questions([data]), out)
        _, model, _ = engine_script
        r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out)
        assert_one_line_error(r, "another eval", str(out))
    finally:
        release.set()
        worker.join(60)
    assert results and results[0]["n"] == 3
    assert len((out / PREDICTIONS).read_text().splitlines()) == 3
    # once the first run is over, the folder is free again
    again = Agent(ScriptedEngine([]), ListRetriever([Passage("0", '"Peru"\nLima')]))
    assert evaluate(again, load_questions([data]), out)["n"] == 3


@pytest.mark.parametrize("theirs", [{"notes.md": "mine"}, {"report.md": "my report", "predictions.jsonl": "{}"}],
                         ids=["notes", "eval-names"])
def test_eval_refuses_a_folder_of_someone_elses_files(engine_script, index_dir: Path, tmp_path: Path, theirs):
    """--out naming a person's folder: nothing mixed in, and --overwrite deletes none of their files."""
    data = write_questions(tmp_path / "fbqa.jsonl")
    out = tmp_path / "theirs"
    out.mkdir()
    for name, text in theirs.items():
        (out / name).write_text(text)
    for overwrite in (False, True):
        agent = Agent(ScriptedEngine([]), ListRetriever([Passage("0", '"Peru"\nLima')]))
        with pytest.raises(InputError, match="not an evaluation's|without the run.json") as e:
            evaluate(agent, load_questions([data]), out, overwrite=overwrite)
        assert e.value.path == str(out)
    _, model, _ = engine_script
    r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--out", out, "--overwrite")
    assert_one_line_error(r, str(out))
    assert {p.name: p.read_text() for p in out.iterdir()} == theirs


def test_eval_leaves_hidden_files_alone_and_runs_beside_them(tmp_path: Path):
    """A Finder .DS_Store, or the temp file of a write that was killed, does not make a folder foreign."""
    data = write_questions(tmp_path / "fbqa.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".DS_Store").write_bytes(b"\0")
    (out / ".run.json.abc123.tmp").write_text("{")
    agent = Agent(ScriptedEngine(SCRIPT), ListRetriever([Passage("0", '"Peru"\nLima')]))
    assert evaluate(agent, load_questions([data]), out)["n"] == 3
    assert (out / ".DS_Store").read_bytes() == b"\0"


def test_eval_arc_evidence_modes(index_dir: Path, tmp_path: Path):
    from dgpo_edge.retrieval.retrievers import open_index

    data = write_questions(tmp_path / "fbqa.jsonl", n=1)
    # agent run: answer at once; then source referencing (no think) and thinking
    engine = ScriptedEngine(["<answer>Lima</answer>", "<answer> Lima </answer>",
                             "<think>Doc 1 is about Peru.</think><answer>Cuzco</answer>"])
    with Agent(engine, open_index(index_dir)) as agent:
        report = evaluate(agent, load_questions([data]), tmp_path / "out", run_arc=True)
    rec = json.loads((tmp_path / "out" / PREDICTIONS).read_text())
    assert rec["source_ref_em"] == 1.0 and rec["thinking_em"] == 0.0
    assert rec["source_ref_format"] == 1.0 and rec["thinking_format"] == 1.0
    # the evidence prompt held the gold passage
    assert report["scores"]["columns"] == ["em", "f1", "cover_em", "source_ref_em", "thinking_em"]


def test_eval_several_files_macro_average(tmp_path: Path):
    a = write_questions(tmp_path / "a.jsonl", n=2)
    b = write_questions(tmp_path / "b.jsonl", n=1)
    engine = ScriptedEngine(["<answer>Lima</answer>", "<answer>x</answer>", "<answer>Lima</answer>"])
    agent = Agent(engine, ListRetriever([Passage("0", '"Peru"\nLima')]))
    report = evaluate(agent, load_questions([a, b]), tmp_path / "out")
    s = report["scores"]
    assert s["sources"]["a"]["em"] == 0.5 and s["sources"]["b"]["em"] == 1.0
    assert s["average"]["em"] == 0.75 and s["all"]["em"] == pytest.approx(2 / 3)


def test_a_questions_type_is_kept_in_its_record_and_counted(tmp_path: Path):
    data = tmp_path / "w.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": "Capital of Peru?", "golden_answers": ["Lima"],
                                        "type": t}) + "\n" for i, t in enumerate(["fact", "bridge"])))
    engine = ScriptedEngine(["<answer>Lima</answer>", "<answer>Cusco</answer>"])
    agent = Agent(engine, ListRetriever([Passage("0", '"Peru"\nLima')]))
    report = evaluate(agent, load_questions([data]), tmp_path / "out")
    preds = [json.loads(line) for line in (tmp_path / "out" / PREDICTIONS).read_text().splitlines()]
    assert [p["type"] for p in preds] == ["fact", "bridge"]
    assert report["outcomes"]["types"]["bridge"]["no_search"] == 1 and report["outcomes"]["types"]["fact"]["right"] == 1


def test_two_files_named_alike_are_two_datasets(tmp_path: Path):
    # factbookqa/test.jsonl and records/test.jsonl: the same stem and the same ids, other questions
    for world in ("factbookqa", "records"):
        (tmp_path / world).mkdir()
    a = write_questions(tmp_path / "factbookqa" / "test.jsonl", n=2)
    b = write_questions(tmp_path / "records" / "test.jsonl", n=1)
    questions = load_questions([a, b])
    assert [key(ex) for ex in questions.examples] == ["factbookqa/test/q1", "factbookqa/test/q2", "records/test/q1"]
    engine = ScriptedEngine(["<answer>Lima</answer>", "<answer>x</answer>", "<answer>Lima</answer>"])
    agent = Agent(engine, ListRetriever([Passage("0", '"Peru"\nLima')]))
    report = evaluate(agent, questions, tmp_path / "out")
    assert report["scores"]["sources"]["factbookqa/test"]["n"] == 2 and report["scores"]["sources"]["records/test"]["em"] == 1.0
    assert [ex.source for ex in load_questions([a]).examples] == ["test", "test"]   # alone: named as before
    # still alike after the folder (a/x/test.jsonl, b/x/test.jsonl): refused, not merged
    for root in ("a", "b"):
        (tmp_path / root / "x").mkdir(parents=True)
        write_questions(tmp_path / root / "x" / "test.jsonl", n=1)
    with pytest.raises(InputError, match="would both be dataset 'x/test'"):
        load_questions([tmp_path / "a" / "x" / "test.jsonl", tmp_path / "b" / "x" / "test.jsonl"])
    with pytest.raises(InputError, match="duplicate question key"):   # one file twice
        load_questions([a, a])


def test_load_questions_checks():
    with pytest.raises(InputError):
        load_questions([])
    with pytest.raises(InputError, match="--limit"):
        load_questions(["x"], limit=0)


def test_eval_bad_input(tmp_path: Path, index_dir: Path):
    assert_one_line_error(invoke("eval", "--data", tmp_path / "missing.jsonl", "--index", index_dir,
                                 "--out", tmp_path / "o"), "no such file")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "golden_answers": ["a"]}\n{broken\n')
    assert_one_line_error(invoke("eval", "--data", bad, "--index", index_dir, "--out", tmp_path / "o"),
                          "bad.jsonl, line 2")
    data = write_questions(tmp_path / "d.jsonl")
    assert_one_line_error(invoke("eval", "--data", data, "--data", data, "--index", index_dir,
                                 "--out", tmp_path / "o"), "duplicate question key")


def test_make_report_empty():
    r = make_report([])
    assert r["n"] == 0 and r["arc"]["all"]["n"] == 0


@pytest.mark.slow
def test_eval_real_smollm2(index_dir: Path, tmp_path: Path):
    gguf = smollm2_gguf()
    data = write_questions(tmp_path / "fbqa.jsonl", n=2)
    r = invoke("eval", "--data", data, "--model", gguf, "--index", index_dir, "--out", tmp_path / "out",
               "--threads", "1", "--max-searches", "1", "--arc")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["n"] == 2 and "source_ref_em" in report["scores"]["columns"]
    assert len(QUESTIONS) >= 2
