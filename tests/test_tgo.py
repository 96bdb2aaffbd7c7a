"""`train tgo`: teacher trajectories, correct ones only, incremental and resumable."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import test_rollout_support as support  # noqa: E402
from cli_helpers import assert_one_line_error, invoke  # noqa: E402
from dgpo_edge.train.rollout import RolloutConfig  # noqa: E402
from dgpo_edge.train.tgo import TgoConfig, generate_teacher_trajectories, progress_path  # noqa: E402
from test_rollout_support import CORPUS, EPISODES  # noqa: E402

from dgpo_edge.datasets import QAExample  # noqa: E402
from dgpo_edge.protocol import ProtocolConfig  # noqa: E402

# The memorizer knows q0 only; it answers the others with q0's answer (wrong).
EXAMPLES = [QAExample(f"q{i}", q, (gold,), "test") for i, (q, gold, _, _) in enumerate(EPISODES)] + [
    QAExample("q3", "What is the capital of Latveria", ("Doomstadt",), "test")]


@pytest.fixture(scope="module")
def smol_tok(request, tmp_path_factory):
    return support.smol_tok_fixture(request, tmp_path_factory)


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    r = support.bm25_retriever(tmp_path_factory.mktemp("bm25"))
    yield r
    r.close()


@pytest.fixture(scope="module")
def memorized(smol_tok, retriever, request, tmp_path_factory):
    return support.memorized_fixture(smol_tok, retriever, request, tmp_path_factory)


def _config(n=3, batch_size=6, seed=0):
    # Temperature 0.3: the memorizer stays mostly right, so both kept and dropped samples occur.
    return TgoConfig(n=n, rollout=RolloutConfig(protocol=ProtocolConfig(max_turn_tokens=48),
                                                temperature=0.3, seed=seed, batch_size=batch_size))


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tgo_keeps_correct_trajectories_in_the_oracle_shape(memorized, smol_tok, retriever, tmp_path):
    out = tmp_path / "tgo.jsonl"
    stats = generate_teacher_trajectories(memorized, smol_tok, EXAMPLES, retriever, out, _config(), teacher="mem")
    rows = _rows(out)
    assert stats.processed == 4 and stats.samples == 12 and stats.written == len(rows) > 0
    assert {r["id"] for r in rows} == {"q0"}
    for r in rows:
        assert set(r) >= {"id", "question", "golden_answers", "response", "segments"}
        assert r["segments"][0]["kind"] == "turn"                   # the prompt is not stored
        assert r["response"] == "".join(s["text"] for s in r["segments"])
        assert f"<answer> {r['golden_answers'][0]} </answer>" in r["response"]
    progress = _rows(progress_path(out))
    assert [p["id"] for p in progress] == ["q0", "q1", "q2", "q3"]
    assert sum(p["written"] for p in progress) == len(rows) and progress[0]["correct"] > 0

    # The SFT/KD trainer's reader takes the file as it takes oracle.jsonl.
    from dgpo_edge.train.data import load_trajectories

    examples, load_stats = load_trajectories(out, smol_tok, max_length=4096)
    assert load_stats.kept == len(rows) and all(sum(e.mask) > 0 for e in examples)


def test_tgo_resumes_without_repeating_questions(memorized, smol_tok, retriever, tmp_path):
    full = tmp_path / "full.jsonl"
    generate_teacher_trajectories(memorized, smol_tok, EXAMPLES, retriever, full, _config(batch_size=3))
    # A crash after the first chunk (one question per chunk at n=3, batch 3), mid-write of the second.
    out = tmp_path / "resumed.jsonl"
    generate_teacher_trajectories(memorized, smol_tok, EXAMPLES[:1], retriever, out, _config(batch_size=3))
    first = out.read_text()
    with open(out, "a") as f:
        f.write('{"id": "q1", "question": "torn')
    stats = generate_teacher_trajectories(memorized, smol_tok, EXAMPLES, retriever, out, _config(batch_size=3))
    assert stats.skipped == 1 and stats.processed == 3
    assert out.read_text().startswith(first)
    # Same chunks, same seeds: the resumed file equals the uninterrupted one.
    assert out.read_text() == full.read_text()
    again = generate_teacher_trajectories(memorized, smol_tok, EXAMPLES, retriever, out, _config(batch_size=3))
    assert (again.skipped, again.processed) == (4, 0) and out.read_text() == full.read_text()


@pytest.fixture(scope="module")
def command_inputs(memorized, smol_tok, tmp_path_factory):
    """The command's files: the memorizer as a teacher folder, the questions, the corpus."""
    folder = tmp_path_factory.mktemp("tgo-inputs")
    teacher = folder / "teacher"
    memorized.save_pretrained(teacher)
    smol_tok.save_pretrained(teacher)
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in CORPUS))
    data = folder / "qa.jsonl"
    data.write_text("".join(json.dumps({"id": e.id, "question": e.question, "golden_answers": list(e.answers)})
                            + "\n" for e in EXAMPLES))
    return teacher, data, corpus


def test_tgo_command_end_to_end_and_bad_input(command_inputs, tmp_path):
    teacher, data, corpus = command_inputs
    index = tmp_path / "index"
    assert invoke("index", "build", corpus, "--out", index, "--kind", "bm25").exit_code == 0
    out = tmp_path / "out" / "tgo.jsonl"
    args = ["train", "tgo", "--teacher", teacher, "--data", data, "--index", index, "--out", out,
            "--n", 2, "--limit", 3, "--temperature", 0.3, "--batch-size", 6, "--max-turn-tokens", 48]
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    assert "3 questions sampled (0 already done)" in res.flat
    # Only q0 is answerable by the memorizer; whether a T=0.3 sample gets it right depends on the
    # weights trained for this run, so check what was written against the progress file instead.
    rows, progress = _rows(out), _rows(progress_path(out))
    assert {r["id"] for r in rows} <= {"q0"} and len(progress) == 3
    assert len(rows) == sum(p["written"] for p in progress)
    res = invoke(*args)
    assert res.exit_code == 0 and "0 questions sampled (3 already done)" in res.flat
    # The corpus itself, searched in memory as the training configs' data.retriever does.
    res = invoke(*args[:6], "--index", corpus, "--out", tmp_path / "out" / "tgo-corpus.jsonl", *args[10:])
    assert res.exit_code == 0 and "3 questions sampled (0 already done)" in res.flat, res.output
    assert_one_line_error(invoke(*args[:6], "--index", data.with_suffix(".txt"), *args[8:]), "qa.txt",
                          "expected an index directory or a corpus .jsonl")

    assert_one_line_error(invoke(*args[:2], "--teacher", tmp_path / "nope", *args[4:]), "nope",
                          "not a transformers model folder")
    # the agent commands' ranges: trajectories with settings a student could not run with are refused
    assert_one_line_error(invoke(*args, "-k", 21), "--top-k must be in 1..20, got 21")
    # inf samples uniform noise; it was accepted
    assert_one_line_error(invoke(*args, "--temperature", "inf"), "--temperature must be a finite number > 0")
    assert_one_line_error(invoke(*args, "--max-turns", 17), "--max-turns must be in 0..16, got 17")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x", "golden_answers": ["y"]}\n{oops\n')
    assert_one_line_error(invoke(*args[:4], "--data", bad, *args[6:]), "bad.jsonl", "line 2")
    # --out naming someone's file (last line without its newline): refused, and not cut
    mine = tmp_path / "notes.md"
    mine.write_text("# todo\nbuy milk")
    assert_one_line_error(invoke(*args[:8], "--out", mine, *args[10:]), "notes.md", "line 1")
    assert mine.read_text() == "# todo\nbuy milk"
    assert_one_line_error(invoke(*args[:8], "--out", tmp_path, *args[10:]), "is a folder")
    # a last line without its newline is cut only when it is a row cut short, never a whole record
    # or someone's single line
    for text in ('{"id": "a", "segments": []}\n{"id": "b", "segments": []}', "my important note"):
        mine.write_text(text)
        assert_one_line_error(invoke(*args[:8], "--out", mine, *args[10:]), "notes.md", "no newline")
        assert mine.read_text() == text


def test_ctrl_c_keeps_the_whole_chunks_exits_130_and_the_rerun_writes_what_an_uninterrupted_run_does(
        command_inputs, tmp_path, monkeypatch):
    """Ctrl-C ended `train tgo` without a word (exit 130 from typer; click's "Aborted!" and 1 before
    it), and one that came between a chunk's two appends left its rows in --out but not its progress
    lines: the rerun took the questions with rows for done and sampled the others as a smaller chunk,
    so its files differed from an uninterrupted run's. Now, as in `train sft|kd|ppo|dgpo|grpo`: one
    line saying what --out holds and how to go on, exit 130, the chunk's two appends kept together
    (a second Ctrl-C stops at once, and the rerun cuts the rows it left without progress lines), and
    the resumed run ends with the uninterrupted run's files."""
    import dgpo_edge.cli.train_tgo as cli_tgo
    import dgpo_edge.train.tgo as tgo
    from train_helpers import ctrl_c

    teacher, data, corpus = command_inputs

    def tgo_into(out, expect=0):   # 2 samples a question, 4 episodes a chunk: 2 chunks of 2 questions
        result = invoke("train", "tgo", "--teacher", teacher, "--data", data, "--index", corpus, "--out", out,
                        "--n", 2, "--batch-size", 4, "--temperature", 0.3, "--max-turn-tokens", 48)
        assert result.exit_code == expect and "Traceback" not in result.plain, result.output
        return result

    def stopped(out):   # the lines (transformers' loading bar, the stop) of a run stopped by Ctrl-C
        return [line for line in tgo_into(out, 130).plain.splitlines() if line.strip()]

    whole = tmp_path / "whole.jsonl"
    tgo_into(whole)
    out = tmp_path / "run.jsonl"
    resume = "; run the same command again to resume from there"

    def teacher_interrupted(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:   # while the teacher loads: nothing to keep yet
        m.setattr(cli_tgo, "load_teacher", teacher_interrupted)
        assert stopped(out) == [f"interrupted: nothing saved ({out} has none of the 4 questions done yet)"]

    real_append = tgo._append

    def ctrl_c_after_the_rows(presses):   # between chunk 1's rows and its progress lines
        def append(path, rows):
            real_append(path, rows)
            for _ in range(presses if path.suffix == ".jsonl" and not path.name.endswith(".progress.jsonl") else 0):
                ctrl_c()
        return append

    with monkeypatch.context() as m:
        m.setattr(tgo, "_append", ctrl_c_after_the_rows(1))
        assert stopped(out)[-2:] == ["interrupted: stopping once this chunk's trajectories are written (Ctrl-C again "
                                     "stops at once, without it)", f"interrupted: {out} has 2 of 4 questions done{resume}"]
    assert [r["id"] for r in _rows(progress_path(out))] == ["q0", "q1"]

    real_rollouts = tgo.generate_rollouts
    with monkeypatch.context() as m:   # inside chunk 2's sampling: stopped at once, chunk 1 kept
        m.setattr(tgo, "generate_rollouts", lambda *a, **k: ctrl_c() or real_rollouts(*a, **k))
        assert stopped(out)[-1] == f"interrupted: {out} has 2 of 4 questions done{resume}"

    assert "2 questions sampled (2 already done)" in tgo_into(out).flat
    assert out.read_text() == whole.read_text()
    assert progress_path(out).read_text() == progress_path(whole).read_text()

    with monkeypatch.context() as m:   # twice between the appends: stopped there
        m.setattr(tgo, "_append", ctrl_c_after_the_rows(2))
        cut = tmp_path / "cut.jsonl"
        assert stopped(cut)[-1] == (f"interrupted inside chunk 1: nothing saved ({cut} has none of the 4 "
                                    "questions done yet)")
    assert cut.read_text() and progress_path(cut).read_text() == ""   # chunk 1's rows, not its progress lines
    # its rerun cuts those rows and samples chunk 1 whole (it took q0 and q1 for done, or one of them)
    assert "4 questions sampled (0 already done)" in tgo_into(cut).flat
    assert cut.read_text() == whole.read_text()
    assert progress_path(cut).read_text() == progress_path(whole).read_text()


def test_tgo_refuses_an_out_that_is_its_questions_or_corpus_or_no_tgo_file(tmp_path):
    """--out naming the questions (every one "already done", nothing sampled), the corpus
    (trajectories appended to it) or another file whose rows have ids: one error line, before the
    teacher loads, the file unchanged and no progress file beside it."""
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"id": e.id, "question": e.question, "golden_answers": list(e.answers)})
                            + "\n" for e in EXAMPLES))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in CORPUS))
    other = tmp_path / "other-questions.jsonl"
    other.write_text(data.read_text())
    args = ["train", "tgo", "--teacher", tmp_path / "no-teacher", "--data", data, "--index", corpus]
    for out, needle in ((data, "is also this command's input"), (corpus, "is also this command's input"),
                        (other, "not a `train tgo` output file")):
        before = out.read_text()
        assert_one_line_error(invoke(*args, "--out", out), str(out), needle)
        assert out.read_text() == before and not progress_path(out).exists()


def test_tgo_refuses_two_questions_with_one_id(tmp_path):
    """A resumed run skips the ids it has done: the second question of an id would be lost."""
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"id": "same", "question": q, "golden_answers": ["x"]}) + "\n"
                            for q in ("What is the capital of Avalon?", "What is the capital of Borduria?")))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in CORPUS))
    out = tmp_path / "tgo.jsonl"
    result = invoke("train", "tgo", "--teacher", tmp_path / "no-teacher", "--data", data, "--index", corpus,
                    "--out", out)
    assert_one_line_error(result, str(data), "'same'")
    assert not out.exists()


def test_rows_after_the_last_recorded_question_are_cut_and_an_output_alone_is_kept(tmp_path):
    """done_ids: rows after the last question the progress file names are a chunk a kill stopped
    between its two appends (cut: the rerun samples it whole); rows before it stay done, and an
    output without a progress file (one copied alone) is never cut."""
    from dgpo_edge.train.tgo import done_ids

    def row(i):
        return json.dumps({"id": i, "segments": []}) + "\n"

    out = tmp_path / "t.jsonl"
    out.write_text(row("q0") + row("q1") + row("q1"))
    assert done_ids(out) == {"q0", "q1"} and out.read_text() == row("q0") + row("q1") + row("q1")
    progress_path(out).write_text(json.dumps({"id": "q0", "samples": 2}) + "\n")
    assert done_ids(out) == {"q0"} and out.read_text() == row("q0")
    out.write_text(row("q5") + row("q0") + row("q2"))   # q5: before the last recorded row, so kept
    assert done_ids(out) == {"q0", "q5"} and out.read_text() == row("q5") + row("q0")
    out.write_bytes(b"\xef\xbb\xbf" + (row("q0") + row("q2")).encode())   # a byte-order mark, counted
    assert done_ids(out) == {"q0"} and out.read_bytes() == b"\xef\xbb\xbf" + row("q0").encode()
    progress_path(out).write_text("")
    assert done_ids(out) == set() and out.read_text() == ""
