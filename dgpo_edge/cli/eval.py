"""`dgpo-edge eval --data FILE ...`: batch evaluation of the agent, greedy, resumable.

Writes into `--out` (default `out/eval`): `predictions.jsonl` (one line per
question, appended as it finishes; a rerun skips what is there, and refuses a
damaged line other than a torn last one), `run.json`
(the settings; a rerun with others is refused unless `--overwrite`, before the model loads),
`report.json` and `report.md` (EM, F1, cover-EM and the ARC figures per dataset
and on average). A run locks `--out`: a second one into it is refused. See
`dgpo_edge/agent/evaluate.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from ..arc import OUTCOMES
from .ask import BUNDLE_HELP, INDEX_HELP, MODEL_HELP, agent_options
from .common import (GPU_LAYERS_HELP, console, err_console, max_searches_of, max_searches_option,
                     old_max_turns_option, top_k_option, user_errors)


@user_errors
def eval_command(
    data: list[Path] = typer.Option(..., "--data", help="A QA file (any format `data inspect` reads); repeat for more."),
    bundle: Optional[Path] = typer.Option(None, "--bundle", help=BUNDLE_HELP),
    model: Optional[Path] = typer.Option(None, "--model", help=MODEL_HELP),
    index: Optional[Path] = typer.Option(None, "--index", help=INDEX_HELP),
    limit: Optional[int] = typer.Option(None, "--limit", help="Evaluate the first N questions of each file."),
    arc: bool = typer.Option(False, "--arc", help="Also run the evidence-given modes where gold evidence is known."),
    out: Path = typer.Option(Path("out/eval"), "--out", help="Folder for predictions and the report."),
    fmt: str = typer.Option("auto", "--format", help="Dataset format (auto-detected by default)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (default: the libraries')."),
    top_k: Optional[int] = top_k_option(),
    max_searches: Optional[int] = max_searches_option(),
    old_max_turns: Optional[int] = old_max_turns_option(),
    gpu_layers: Optional[int] = typer.Option(None, "--gpu-layers", help=GPU_LAYERS_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help="Discard earlier predictions in --out."),
    as_json: bool = typer.Option(False, "--json", help="Print the report (report.json's content) as JSON."),
) -> None:
    """Evaluate the agent on QA files: EM, F1, cover-EM and ARC per dataset and on average."""
    from rich.progress import TextColumn

    from ..agent.evaluate import check_out, evaluate, load_questions
    from ..progress import add_stage, stage_progress

    questions = load_questions(data, limit=limit, fmt=fmt)   # bad files fail before the model loads
    check_out(out, overwrite)   # so does a wrong --out (and before the default bundle is built)
    agent = agent_options(bundle, model, index, threads, top_k, max_searches_of(max_searches, old_max_turns),
                          gpu_layers=gpu_layers, before_load=_settings_check(out, arc, overwrite))
    settings = {"agent": _settings(agent.info)}
    bar = stage_progress(err_console, extra=(TextColumn("EM {task.fields[em]}"),))   # stderr: stdout is the report
    ems: list[float] = []   # of every question answered, in this run or one it resumes
    task = add_stage(bar, "evaluating", "evaluating", 0, len(questions.examples), em="-")

    started = []

    def on_start(resumed: list[dict[str, Any]], total: int) -> None:
        ems.extend(rec["em"] for rec in resumed)
        bar.update(task, completed=len(resumed), base=len(resumed), em=_mean(ems))   # resumed: not in the rate
        bar.start()
        started.append(True)

    def on_record(rec: dict[str, Any], done: int, total: int) -> None:
        ems.append(rec["em"])
        bar.update(task, completed=done, em=_mean(ems))

    with agent:
        try:
            report = evaluate(agent, questions, out, run_arc=arc, settings=settings, overwrite=overwrite,
                              on_record=on_record, on_start=on_start)
        finally:
            if started:
                bar.stop()
    if as_json:
        typer.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    _print_report(report, out)


def _settings(info: dict[str, Any]) -> dict[str, Any]:
    """What identifies a run (not threads: they change speed, not predictions)."""
    return {k: info.get(k) for k in ("bundle", "model", "engine", "index")}


def _settings_check(out: Path, run_arc: bool, overwrite: bool) -> Any:
    """load_agent's `before_load`: an --out of other settings is refused before the model loads.
    The engine's name is known only once it has: the model path, which decides it, is compared
    here, the name by `evaluate`."""
    from ..agent.evaluate import UNKNOWN, check_settings, run_settings

    def check(info: dict[str, Any], config: Any) -> None:
        agent = {**_settings(info), "engine": UNKNOWN}
        check_settings(out, run_settings({"agent": agent}, config, run_arc), overwrite)

    return check


def _mean(ems: list[float]) -> str:
    return f"{sum(ems) / len(ems):.3f}" if ems else "-"


def _print_report(report: dict[str, Any], out: Path) -> None:
    from rich.table import Table

    t = report["scores"]
    table = Table(title=f"{report['n']} questions")
    cols = t["columns"]
    table.add_column("dataset")
    table.add_column("n", justify="right")
    for c in cols:
        table.add_column(c, justify="right")
    arc_cols = ("hit_ratio", "search_steps", "invalid_action_rate", "answered_rate")
    for c in arc_cols:
        table.add_column(c.replace("_", " "), justify="right")
    arc_rows = report["arc"]
    for name, row in [*t["sources"].items(), ("average", t["average"]), ("all", t["all"])]:
        a = arc_rows["sources"].get(name) or arc_rows.get(name) or {}
        table.add_row(escape(name), str(row["n"]), *[_f(row.get(c)) for c in cols], *[_f(a.get(c)) for c in arc_cols])
    console.print(table)
    s = report["seconds"]
    console.print(f"seconds per question: p50 {s['p50']:.2f}, p95 {s['p95']:.2f}", highlight=False)
    totals = {k: sum(row[k] for row in report["outcomes"]["sources"].values()) for k in OUTCOMES}
    by_type = " (by question type in the report)" if report["outcomes"]["types"] else ""
    console.print("outcomes: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in totals.items()) + by_type,
                  highlight=False)
    console.print(f"report: {escape(str(out / 'report.md'))}", highlight=False)


def _f(v: Any) -> str:
    return "-" if v is None else f"{float(v):.3f}"
