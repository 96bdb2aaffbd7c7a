"""Batch evaluation of an Agent: predictions appended as they come (resumable), then a report.

The engine behind `dgpo-edge eval` (and `bench/edge.py`). For each question of
each dataset file (any format `datasets.read_qa` knows), the agent runs greedy
and one JSON line is appended to `OUT/predictions.jsonl` (flushed and fsynced):
the prediction, EM / F1 / cover-EM, the ARC facts of the episode (searches,
hit, turns, invalid turns, answered), the stop reason, timings and the search
queries. A rerun with the same `OUT` skips the questions already there (key:
dataset + id), so an interrupted evaluation continues where it stopped;
`OUT/run.json` records the settings and a rerun with other settings is refused (a caller can
make that check before its model loads: `check_settings`).
Only a torn last line of predictions.jsonl (a crash mid-write) is dropped on
resume; a damaged line before it is refused, leaving the file as it is. A run
holds an exclusive lock on `OUT` (`OUT/.lock`): a second one into the same
folder is refused at once instead of writing every record twice.

With `arc=True`, questions that carry gold evidence passage ids (FactbookQA's
`evidence`) also run the evidence-given modes of the DGPO paper: the gold
passages handed to the model, answer directly (source referencing) and answer
after a think step (thinking); `source_ref_em` and `thinking_em` per question.

The report (`report.json`, `report.md`): per dataset and on average (the
papers' macro "Avg") EM, F1, cover-EM, and the ARC figures: hit ratio (query
rewriting), search steps, invalid-action rate per generated turn, answered
rate, plus the evidence-given EMs when run; then where each question ended
(`outcome`: right, or why not), per dataset and per question type when the
questions carry one (a `type` field, as FactbookQA's and the worlds' do).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import arc, metrics
from ..arc import OUTCOMES, outcome_counts
from ..datasets import QAExample, read_qa
from ..errors import InputError
from ..jsonio import check_holds_only, cut_torn_last_line, iter_lines, parse_json_line, write_json, write_text
from ..locks import folder_lock
from ..protocol import Passage
from .agent import Agent

PREDICTIONS = "predictions.jsonl"
RUN = "run.json"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"

BUSY = "another eval is writing into this folder"
OnRecord = Callable[[dict[str, Any], int, int], None]   # (record, done, total)
OnStart = Callable[[list[dict[str, Any]], int], None]     # (the records resumed, total)


@dataclass
class EvalSet:
    """Questions to evaluate, in order, with where they came from."""

    examples: list[QAExample]
    files: list[str] = field(default_factory=list)


def load_questions(files: Sequence[str | Path], limit: int | None = None, fmt: str = "auto") -> EvalSet:
    """Read every file (`limit` questions from each), refusing duplicate (source, id) keys."""
    if not files:
        raise InputError("give at least one --data file")
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be >= 1, got {limit}")
    out: list[QAExample] = []
    seen: set[str] = set()
    names = dataset_names(files)
    for f in files:
        for ex in read_qa(f, format=fmt, limit=limit):
            if ex.source == Path(f).stem:   # named after its file, not by a source field
                ex = replace(ex, source=names[str(f)])
            k = key(ex)
            if k in seen:
                raise InputError(f"duplicate question key {k!r} (dataset/id); evaluate the file once", f)
            seen.add(k)
            out.append(ex)
    return EvalSet(out, [str(f) for f in files])


def dataset_names(files: Sequence[str | Path]) -> dict[str, str]:
    """The dataset name of each file's questions that name no source: the file's stem, or, for two
    files named alike (factbookqa/test.jsonl, records/test.jsonl), FOLDER/STEM, so that two
    datasets never merge into one row. Two different files still named alike are refused; one file
    given twice is left to the duplicate-key check."""
    stems = Counter(Path(f).stem for f in files)
    names = {str(f): Path(f).stem if stems[Path(f).stem] == 1 else f"{Path(f).resolve().parent.name}/{Path(f).stem}"
             for f in files}
    by_name: dict[str, set[Path]] = {}
    for f in files:
        by_name.setdefault(names[str(f)], set()).add(Path(f).resolve())
    for name, paths in by_name.items():
        if len(paths) > 1:
            first, second = sorted(map(str, paths))[:2]
            raise InputError(f"--data {first} and {second} would both be dataset {name!r}; rename one")
    return names


def key(ex: QAExample) -> str:
    return f"{ex.source}/{ex.id}"


def check_out(out: str | Path, overwrite: bool = False) -> None:
    """The checks of `out` that need no model (`evaluate` makes them again, under the lock): someone
    else's files, damaged predictions. For a caller to make before the model loads (or the default
    bundle is built), so that a refusal comes before any long work. Changes nothing."""
    out = Path(out).expanduser()
    _check_own_folder(out)
    if not overwrite:   # --overwrite discards the predictions, damaged or not
        _done_records(out / PREDICTIONS, cut=False)


def _done_records(path: Path, cut: bool = True) -> dict[str, dict[str, Any]]:
    """Records already in predictions.jsonl, read in bounded lines (`jsonio.iter_lines`).

    A torn last line (a crash mid-write: no newline) is cut off (unless not `cut`) so appends start
    on a clean line. Any other damage - a blank, malformed or key-less line anywhere, or a torn line
    that is not the last - is refused naming the line, and the file is left as it is:
    dropping it and what follows would silently lose records.
    """
    if not path.is_file():
        return {}
    done: dict[str, dict[str, Any]] = {}
    for lineno, raw in iter_lines(path):
        if not raw.endswith(b"\n"):   # only the last line can lack its newline
            break
        try:
            rec = parse_json_line(raw, path, lineno)
        except InputError as e:
            raise _damaged(path, lineno, e.message) from None
        if rec is None or not isinstance(rec.get("key"), str):
            raise _damaged(path, lineno, "a blank line" if rec is None else 'a record without "key"')
        if (problem := _record_problem(rec)) is not None:
            raise _damaged(path, lineno, problem)
        done[rec["key"]] = rec
    if cut:
        cut_torn_last_line(path)   # only now that the lines before it all proved sound
    return done


# What the report reads of every record (make_report, arc.outcome): a record without one of these,
# or with a value of another type, would end a long evaluation in a traceback, with no report.
_RECORD_NUMBERS = ("em", "f1", "cover_em", "searches", "hit", "turns", "invalid_turns", "answered")


def _record_problem(rec: dict[str, Any]) -> str | None:
    """Why a predictions record cannot go into the report, or None when it can."""
    if not isinstance(rec.get("source"), str):
        return 'a record without a "source" string'
    for name in _RECORD_NUMBERS:
        if not isinstance(rec.get(name), (int, float)):
            return f'a record whose "{name}" is {"missing" if name not in rec else "not a number"}'
    return None


def _damaged(path: Path, lineno: int, what: str) -> InputError:
    return InputError(f"damaged predictions ({what}); only a torn last line is dropped on resume: "
                      "repair the file, or pass --overwrite to start over", path, lineno)


def _check_own_folder(out: Path) -> None:
    """Refuse an --out that is a file or holds anything but an evaluation's files: they would be
    mixed in, or (--overwrite) someone's report.md or predictions.jsonl replaced."""
    # run.json is written before any prediction or report: without it, those files are someone else's
    check_holds_only(out, {PREDICTIONS, RUN, REPORT_JSON, REPORT_MD}, "an evaluation's",
                     "give it a folder of its own", first=(RUN, "an evaluation"))


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


# A setting not known before the model loads (the engine's name): `check_settings` takes any value
# for it, and `evaluate` compares the real one under its lock.
UNKNOWN: Any = _Unknown()


def run_settings(settings: dict[str, Any] | None, config: Any, run_arc: bool) -> dict[str, Any]:
    """What run.json records: the caller's `settings` (model, index...), `run_arc` and the protocol
    limits of `config` (the agent's `ProtocolConfig`)."""
    return {**(settings or {}), "arc": run_arc, "top_k": config.top_k, "max_searches": config.max_searches,
            "max_turn_tokens": config.max_turn_tokens, "max_obs_tokens": config.max_obs_tokens,
            "max_total_tokens": config.max_total_tokens}


def check_settings(out: str | Path, settings: dict[str, Any], overwrite: bool = False) -> None:
    """`evaluate`'s refusals of an `out` that another run is writing into or that holds other
    settings' predictions (`settings` from `run_settings`), for a caller to make before the model
    loads: a refusal then costs no loading. A value not known yet is `UNKNOWN`. Changes nothing."""
    out = Path(out).expanduser()
    if not (out / RUN).is_file():   # no earlier run (and no lock file to take)
        return
    with folder_lock(out, BUSY):   # as evaluate: a run writing into it is the reason to give
        if not overwrite:   # --overwrite discards the earlier predictions, whatever their settings
            _refuse_other_settings(out, settings)


def _check_run(out: Path, settings: dict[str, Any], overwrite: bool) -> None:
    """Refuse an output folder holding other settings' predictions (or clear it for --overwrite)."""
    if overwrite:
        for name in (PREDICTIONS, RUN, REPORT_JSON, REPORT_MD):
            (out / name).unlink(missing_ok=True)
    else:
        _refuse_other_settings(out, settings)


def _refuse_other_settings(out: Path, settings: dict[str, Any]) -> None:
    run = out / RUN
    if not run.is_file():
        return
    try:
        old = _renamed_keys(json.loads(run.read_text(encoding="utf-8")))
    except ValueError:
        old = None
    if not _same(old, settings):
        raise InputError("holds predictions made with other settings; pass --overwrite to start over, or "
                         "another --out", out)


def _same(old: Any, new: Any) -> bool:
    """`old == new`, but an `UNKNOWN` in `new` matches anything."""
    if new is UNKNOWN:
        return True
    if isinstance(new, dict):
        return isinstance(old, dict) and old.keys() == new.keys() and all(_same(old[k], v) for k, v in new.items())
    return old == new


def _renamed_keys(run: Any) -> Any:
    """An older run.json in today's spelling: it called the search budget `max_turns`."""
    if isinstance(run, dict) and "max_turns" in run and "max_searches" not in run:
        run = {("max_searches" if k == "max_turns" else k): v for k, v in run.items()}
    return run


def evaluate(agent: Agent, questions: EvalSet, out: str | Path, *, run_arc: bool = False,
             settings: dict[str, Any] | None = None, overwrite: bool = False,
             on_record: OnRecord | None = None, on_start: OnStart | None = None) -> dict[str, Any]:
    """Evaluate `agent` on `questions`, writing into `out`; returns the report (also written).

    `settings`: what identifies the predictions (model, index...); with the
    agent's protocol limits and `run_arc` they go to run.json (`run_settings`), and a rerun
    into the same `out` must match them. Which files and how many questions
    do not count: a rerun with a larger `--limit` or one more file extends
    the same predictions (but a file named like one evaluated before renames both datasets,
    `dataset_names`, so the earlier one's questions run again under the new name).
    `on_start(resumed, total)` is called once the output folder is checked, with the records of
    the questions already in predictions.jsonl (a resumed run's), `on_record(record, done, total)`
    after each question.
    """
    out = Path(out).expanduser()
    _check_own_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = run_settings(settings, agent.config, run_arc)
    with folder_lock(out, BUSY):
        _check_run(out, settings, overwrite)
        pred_path = out / PREDICTIONS
        done = _done_records(pred_path)   # before run.json is written: a refusal leaves the folder as it was
        write_json(out / RUN, settings)
        _predict(agent, questions, pred_path, done, run_arc, on_record, on_start)
        wanted = [done[key(ex)] for ex in questions.examples]
        report = make_report(wanted, {**settings, "data": questions.files})
        write_json(out / REPORT_JSON, report)
        write_text(out / REPORT_MD, report_markdown(report))
    return report


def _predict(agent: Agent, questions: EvalSet, pred_path: Path, done: dict[str, dict[str, Any]],
             run_arc: bool, on_record: OnRecord | None, on_start: OnStart | None) -> None:
    """Run every question not in `done`, appending its record (flushed and fsynced) as it finishes."""
    from ..engines.base import GREEDY

    agent.sampling = GREEDY
    store = passage_store(agent.retriever) if run_arc else None
    total = len(questions.examples)
    resumed = [done[key(ex)] for ex in questions.examples if key(ex) in done]   # not those of a larger --limit
    n_done = len(resumed)
    if on_start is not None:   # the checks passed: a caller may start its progress display now
        on_start(resumed, total)
    with open(pred_path, "a", encoding="utf-8") as f:
        for ex in questions.examples:
            if key(ex) in done:
                continue
            rec = run_one(agent, ex, store)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            done[rec["key"]] = rec
            n_done += 1
            if on_record is not None:
                on_record(rec, n_done, total)


def run_one(agent: Agent, ex: QAExample, store: Any = None) -> dict[str, Any]:
    """One question through the agent (and the evidence modes when `store` is given)."""
    t = time.perf_counter()
    r = agent.answer(ex.question)
    wall = time.perf_counter() - t
    ep = arc.episode_arc(r.transcript, ex.answers)
    rec: dict[str, Any] = {
        "key": key(ex), "id": ex.id, "source": ex.source, "question": ex.question,
        "golden_answers": list(ex.answers), "prediction": r.answer,
        **metrics.score_prediction(r.answer, ex.answers),
        "searches": ep.searches, "hit": float(ep.hit), "turns": ep.turns, "invalid_turns": ep.invalid_turns,
        "answered": float(ep.answered), "stop_reason": r.stop_reason, "search_queries": r.searches,
        "seconds": round(wall, 4), "prompt_tokens": r.timings.prompt_tokens, "new_tokens": r.timings.new_tokens,
        "transcript_tokens": r.timings.transcript_tokens, "decode_s": round(r.timings.decode_s, 4),
        "prompt_s": round(r.timings.prompt_s, 4), "retrieval_s": round(r.timings.retrieval_s, 4),
    }
    qtype = ex.meta.get("type") if isinstance(ex.meta, dict) else None
    if isinstance(qtype, str):   # FactbookQA's and the worlds' question types, for the outcome table
        rec["type"] = qtype
    evidence = ex.meta.get("evidence") if isinstance(ex.meta, dict) else None
    if store is not None and isinstance(evidence, list) and evidence:
        passages = _evidence_passages(store, evidence)
        if passages:
            for think, name in ((False, "source_ref"), (True, "thinking")):
                text = evidence_answer(agent, ex.question, passages, think)
                s = arc.evidence_score(text, ex.answers, think)
                rec[f"{name}_em"] = s["em"]
                rec[f"{name}_format"] = s["followed_format"]
    return rec


def evidence_answer(agent: Agent, question: str, passages: Sequence[Passage], think: bool) -> str:
    """Greedy generation for an evidence-given prompt (no search), up to `</answer>`."""
    from ..engines.base import GREEDY

    engine = agent.engine
    message = arc.evidence_message(question, passages, think)
    if engine.chat_template is not None:
        prompt = engine.chat_template.apply_chat_template([{"role": "user", "content": message}],
                                                          tokenize=False, add_generation_prompt=True)
    else:
        prompt = message
    ids = engine.encode(prompt)
    room = min(agent.config.max_turn_tokens, engine.n_ctx - len(ids))
    if room <= 0:
        return ""
    return engine.generate(ids, room, GREEDY, stop=("</answer>",)).result.text


def _evidence_passages(store: Any, ids: Sequence[Any]) -> list[Passage]:
    out = []
    for pid in ids:
        try:
            out.append(store.get_by_id(str(pid)))
        except (KeyError, InputError):
            continue
    return out


def passage_store(retriever: Any) -> Any:
    """The PassageStore behind an in-process retriever (None for e.g. an HTTP one)."""
    for r in (retriever, getattr(retriever, "dense", None), getattr(retriever, "bm25", None)):
        store = getattr(r, "store", None)
        if store is not None and hasattr(store, "get_by_id"):
            return store
    return None


# --- the report ------------------------------------------------------------------------------------

_SCORE_COLS = ("em", "f1", "cover_em", "source_ref_em", "thinking_em")


def make_report(records: Sequence[dict[str, Any]], settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Scores and ARC figures per dataset and averaged (macro over datasets) plus micro "all"."""
    rows = [{"source": r["source"], **{c: r[c] for c in _SCORE_COLS if c in r}} for r in records]
    table = metrics.MetricTable(rows).to_json() if rows else {"columns": [], "sources": {}, "average": {},
                                                                  "all": {}}
    by_src: dict[str, list[arc.EpisodeARC]] = {}
    secs: dict[str, list[float]] = {}
    for r in records:
        by_src.setdefault(r["source"], []).append(arc.EpisodeARC(
            searches=int(r["searches"]), hit=bool(r["hit"]), turns=int(r["turns"]),
            invalid_turns=int(r["invalid_turns"]), answered=bool(r["answered"])))
        secs.setdefault(r["source"], []).append(float(r.get("seconds", 0.0)))
    arc_rows = {src: arc.summarize_arc(eps) for src, eps in sorted(by_src.items())}
    keys = ("hit_ratio", "search_steps", "invalid_action_rate", "answered_rate")
    arc_avg: dict[str, Any] = {"n": sum(v["n"] for v in arc_rows.values())}
    for k in keys:
        arc_avg[k] = sum(v[k] for v in arc_rows.values()) / len(arc_rows) if arc_rows else 0.0
    all_eps = [e for eps in by_src.values() for e in eps]
    all_s = sorted(s for v in secs.values() for s in v)
    return {"n": len(records), "settings": settings or {}, "scores": table,
            "arc": {"sources": arc_rows, "average": arc_avg, "all": arc.summarize_arc(all_eps)},
            "seconds": {"p50": _pct(all_s, 50), "p95": _pct(all_s, 95),
                        "mean": sum(all_s) / len(all_s) if all_s else 0.0},
            "stop_reasons": _count(r.get("stop_reason", "?") for r in records),
            "outcomes": {"sources": outcome_counts(records, "source"), "types": _type_outcomes(records)}}


def _type_outcomes(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Outcomes per question type: per dataset and type when there are several datasets (two
    worlds' "bridge" are other questions), and records without a type (written by a version that
    kept none, then resumed) as "(no type)", so the rows always add up to n. {} when no record
    has a type."""
    if not any("type" in r for r in records):
        return {}
    several = len({r["source"] for r in records}) > 1
    return outcome_counts([{**r, "group": (f"{r['source']}: " if several else "") + r.get("type", "(no type)")}
                           for r in records], "group")


def _pct(xs: Sequence[float], p: float) -> float:
    if not xs:
        return 0.0
    i = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return float(xs[i])


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def report_markdown(report: dict[str, Any]) -> str:
    lines = [f"# Evaluation ({report['n']} questions)", ""]
    if report["n"]:
        lines += ["## Scores", "", _scores_md(report), "",
                  "## ARC", "", _arc_md(report["arc"]), ""]
        s = report["seconds"]
        lines += [f"Seconds per question: p50 {s['p50']:.2f}, p95 {s['p95']:.2f}, mean {s['mean']:.2f}.", "",
                  "Stop reasons: " + ", ".join(f"{k} {v}" for k, v in report["stop_reasons"].items()) + ".", "",
                  "## Outcomes", "", _outcomes_md(report["outcomes"]), ""]
    if report.get("settings"):
        lines += ["## Settings", "", "```json", json.dumps(report["settings"], indent=2), "```", ""]
    return "\n".join(lines)


def _scores_md(report: dict[str, Any]) -> str:
    t = report["scores"]
    cols = t["columns"]
    header = ["dataset", "n", *cols]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in [*t["sources"].items(), ("average", t["average"]), ("all", t["all"])]:
        out.append("| " + " | ".join([name, str(row["n"])] + [_f(row.get(c)) for c in cols]) + " |")
    return "\n".join(out)


def _arc_md(a: dict[str, Any]) -> str:
    keys = ("hit_ratio", "search_steps", "invalid_action_rate", "answered_rate")
    out = ["| dataset | n | hit ratio | search steps | invalid-action rate | answered |", "|---|---|---|---|---|---|"]
    for name, row in [*a["sources"].items(), ("average", a["average"]), ("all", a["all"])]:
        out.append("| " + " | ".join([name, str(row["n"])] + [_f(row.get(k)) for k in keys]) + " |")
    return "\n".join(out)


def _outcomes_md(counts: dict[str, Any]) -> str:
    """Counts per dataset, then per question type: right, or where a question was lost."""
    out = ["Right, or why not: no answer came, answered without a search, the searches never found a "
           "passage with the answer (not found), or found one and answered otherwise (misread).", "",
           "| dataset / type | n | " + " | ".join(k.replace("_", " ") for k in OUTCOMES) + " |",
           "|" + "---|" * (len(OUTCOMES) + 2)]
    groups = [*counts["sources"].items(), *((f"type: {t}", row) for t, row in counts["types"].items())]
    for name, row in groups:
        out.append("| " + " | ".join([name, str(sum(row.values()))] + [str(row[k]) for k in OUTCOMES]) + " |")
    return "\n".join(out)


def _f(v: Any) -> str:
    return "-" if v is None else f"{float(v):.3f}"
