"""bench/rl_cost.py's report and flags, without a GPU: a cut run (metrics, no summary) is reported from
its last finished step, a run with no finished step is skipped, and the kept cache is on unless
--no-reuse-cache says otherwise; and what `run` prints, from a real DGPO step of tiny models."""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

import pytest

COLUMNS = ["step", "response_length", "rollout_tokens_per_s", "peak_mem_gb", "time_step_s",
           "time_rollout_s", "time_logp_s", "time_critic_s", "time_teacher_s", "time_update_s"]


@pytest.fixture(scope="module")
def bench(bench_script):
    return bench_script("rl_cost")


def _metrics(run: Path, steps: list[dict]) -> None:
    run.mkdir(parents=True)
    with open(run / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(steps)


def _step(step, total, peak):
    return {"step": step, "response_length": 2490.0, "rollout_tokens_per_s": 50000.0 + step, "peak_mem_gb": peak,
            "time_step_s": total, "time_rollout_s": 20.0, "time_logp_s": 9.0, "time_critic_s": 7.0,
            "time_teacher_s": 27.0, "time_update_s": total - 63.0}


def test_report_takes_each_runs_last_step_and_survives_cut_runs(bench, tmp_path, capsys):
    _metrics(tmp_path / "run-done", [_step(1, 160.0, 59.0), _step(2, 150.0, 59.5)])
    (tmp_path / "run-done" / "summary.json").write_text(json.dumps({"processes": 2, "peak_mem_gb": 60.0}))
    _metrics(tmp_path / "run-cut", [_step(1, 140.0, 77.0), _step(2, 124.0, 77.9)])   # killed in step 3
    (tmp_path / "run-empty").mkdir()                                                  # killed in step 1
    _metrics(tmp_path / "run-header", [])                                             # header, no step
    args = argparse.Namespace(work=tmp_path, card="NVIDIA H200", commit="abc1234")
    bench.report(args)
    out = json.loads((tmp_path / "results.json").read_text())
    assert (out["card"], out["commit"]) == ("NVIDIA H200", "abc1234")
    rows = {r["run"]: r for r in out["rows"]}
    assert set(rows) == {"run-done", "run-cut"}
    assert (rows["run-done"]["step"], rows["run-done"]["step_s"], rows["run-done"]["update"]) == (2, 150.0, 87.0)
    assert (rows["run-done"]["processes"], rows["run-done"]["peak_mem_gb"]) == (2, 60.0)     # from the summary
    assert (rows["run-cut"]["step"], rows["run-cut"]["peak_mem_gb"]) == (2, 77.9)            # from the metrics
    assert rows["run-cut"]["processes"] is None                                              # unknown when cut
    assert rows["run-cut"]["teacher_share_of_step"] == pytest.approx(27.0 / 124.0)
    printed = capsys.readouterr().out
    assert "skipped run-empty" in printed and "skipped run-header" in printed


@pytest.mark.parametrize("flags,kept", [([], True), (["--reuse-cache"], True), (["--no-reuse-cache"], False)])
def test_the_kept_cache_is_the_default_and_can_be_turned_off(bench, monkeypatch, flags, kept):
    seen = {}
    monkeypatch.setattr(bench, "run", lambda args: seen.update(reuse=args.reuse_cache))
    monkeypatch.setattr("sys.argv", ["rl_cost.py", "run", *flags])
    bench.main()
    assert seen["reuse"] is kept


def test_the_before_variant_decodes_without_the_kept_cache(bench, monkeypatch, tmp_path):
    # the first version had no kept cache: --variant before turns it off whatever the flag says
    pytest.importorskip("torch")
    import dgpo_edge.train.rl.config as rl_config
    import dgpo_edge.train.rl.loop as rl_loop

    seen = []
    monkeypatch.setattr(rl_loop, "run_rl", lambda config: seen.append(config) or {})
    monkeypatch.setattr(rl_config, "validate_rl", lambda config, where: None)
    for variant in ("before", "after"):
        bench.run(argparse.Namespace(work=tmp_path, data=tmp_path / "train.jsonl", retriever=tmp_path / "corpus.jsonl",
                                     prompts=8, batch_size=8, micro_batch=2, forward_batch=16, checkpointing=False, compile=True,
                                     steps=1, reuse_cache=True, tag=variant, variant=variant))
    assert [c.rollout.reuse_cache for c in seen] == [False, True]
    assert (seen[0].rollout.weights, seen[1].rollout.weights) == ("training", "auto")
    # the first version's update: checkpointed, no-grad passes of one micro-batch
    assert [(c.model.gradient_checkpointing, c.ppo.forward_batch) for c in seen] == [(True, 0), (False, 16)]
    assert [c.ppo.compile for c in seen] == [False, True]      # the first version compiled nothing


def test_speed_keeps_earlier_blocks_and_drops_the_replaced_fields(bench, tmp_path):
    row = lambda step_s, tok_s: {"step": 2, "response_length": 2494, "rollout_tokens_per_s": tok_s,  # noqa: E731
                                 "peak_mem_gb": 50, "time_step_s": step_s, "time_rollout_s": 25, "time_logp_s": 9,
                                 "time_critic_s": 3, "time_teacher_s": 19, "time_update_s": 34}
    _metrics(tmp_path / "run-before", [row(275.0, 7600.0)])
    _metrics(tmp_path / "run-after", [row(90.0, 50000.0)])
    engine = {"batch": 256, "qwen2.5-0.5b": {"fast_sampled": {"tokens_per_s": 60000.0}}}
    (tmp_path / "b256.json").write_text(json.dumps(engine))
    out = tmp_path / "rl_speed.json"
    out.write_text(json.dumps({"paper_step_s_after": 1.0, "note": "the replaced run's",
                               "older_run": {"commit": "abc1234", "paper_step_s": 101.8}}))
    bench.speed(argparse.Namespace(work=tmp_path, rollout_json=tmp_path / "b256.json", standalone_json=None,
                                   factbook_metrics=None, card="NVIDIA H200", commit="def5678", out=out))
    got = json.loads(out.read_text())
    assert got["older_run"] == {"commit": "abc1234", "paper_step_s": 101.8}
    assert "note" not in got and got["commit"] == "def5678"
    assert (got["paper_step_s_before"], got["paper_step_s_after"], got["speedup"]) == (275.0, 90.0, 3.06)
    assert got["rollout_in_rl_vs_standalone"] == pytest.approx(50000 / 60000, abs=1e-3)
    assert got["engine_b512_sampled_tok_s"] is None          # the engine JSON was not at batch 512


@pytest.mark.slow
def test_a_run_prints_its_summary_alone_on_stdout_and_the_trainers_progress_on_stderr(bench, tmp_path, capsys,
                                                                                     request, tmp_path_factory):
    """The trainer prints plain progress lines where stderr is no terminal, and `log.progress=false`, which
    `run` sets, asks for them on a terminal too: they go to stderr, so `run`'s stdout stays its summary."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import test_rollout_support as support

    tokenizer = support.smol_tok_fixture(request, tmp_path_factory)
    retriever = support.bm25_retriever(tmp_path)
    model = support.memorized_fixture(tokenizer, retriever, request, tmp_path_factory)
    retriever.close()
    for name in ("student", "teacher"):   # where `prepare` puts the paper-shape ones
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    question, gold = support.EPISODES[0][:2]
    data, corpus = tmp_path / "train.jsonl", tmp_path / "corpus.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": question, "golden_answers": [gold]}) + "\n"
                            for i in range(2)))
    corpus.write_text("".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in support.CORPUS))
    capsys.readouterr()
    bench.run(argparse.Namespace(work=tmp_path, data=data, retriever=corpus, prompts=2, batch_size=2, micro_batch=2,
                                 forward_batch=0, checkpointing=False, compile=False, steps=1, reuse_cache=True,
                                 tag="t", variant="after"))
    printed = capsys.readouterr()
    summary = [json.loads(line) for line in printed.out.splitlines()]
    assert [(s["algorithm"], s["steps"], s["rollouts"]) for s in summary] == [("dgpo", 1, 2)], printed.out
    progress = [line for line in printed.err.splitlines() if line.startswith("train ")]
    assert len(progress) == 1 and re.fullmatch(r"train dgpo: step 1/1, reward -?\d\.\d{4}, elapsed \d+:\d\d:\d\d, "
                                               r"eta 0:00:00", progress[0]), printed.err
