"""Teacher-generated trajectories (`dgpo-edge train tgo`): sample, keep the correct ones.

For each question the teacher plays `n` sampled episodes (train/rollout.py);
episodes whose answer exactly matches a gold alias are written, one JSON line
each, in the shape of FactbookQA's `oracle.jsonl` (`id`, `question`,
`golden_answers`, `response`, `segments` after the prompt), so the SFT/KD
reader (`train/data.py`) serves both. Turn segments keep the `token_ids` the
teacher sampled. Identical responses to one question are written once.

Resumable: questions are processed in chunks; after each chunk its rows are
appended to the output and one line per question (`id`, samples, correct) to
`<out>.progress.jsonl`, each with a single write and an fsync. On restart, a
torn last line is cut off, rows after the last question the progress file names
(a chunk a kill stopped between its two appends) are cut, and every question
named in either file is skipped. Each chunk's seed depends on the run seed and
the chunk's position in the data, so a run resumed at a chunk boundary writes
what an uninterrupted one would have (a chunk cut short by a crash is redone,
its rows not repeated).
Ctrl-C stops with the last whole chunk written, as the trainers stop with their last whole step
saved (plumbing.Interrupts): one while a chunk is written waits until both files have it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..datasets import QAExample
from ..errors import InputError
from ..jsonio import BOM, cut_torn_last_line, iter_lines, parse_json_line
from ..retrieval.base import Retriever
from .plumbing import Interrupts
from .rollout import Rollout, RolloutConfig, generate_rollouts, make_engine


@dataclass(frozen=True)
class TgoConfig:
    """`n` samples per question; `rollout` sets sampling, limits and batch size (episodes)."""

    n: int = 4
    rollout: RolloutConfig = field(default_factory=RolloutConfig)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")

    @property
    def questions_per_chunk(self) -> int:
        return max(1, self.rollout.batch_size // self.n)


def progress_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".progress.jsonl")


def trajectory_row(example: QAExample, rollout: Rollout, sample: int, teacher: str) -> dict:
    """One output line: the oracle.jsonl shape plus where it came from."""
    segments = rollout.transcript.to_dict()["segments"][1:]  # the prompt depends on the chat template
    return {"id": example.id, "question": example.question, "golden_answers": list(example.answers),
            "response": rollout.transcript.response, "segments": segments,
            "sample": sample, "teacher": teacher, "searches": rollout.n_searches}


# What every row of each file carries besides its id: a question file, a corpus or an oracle.jsonl
# given as --out has ids too, and would pass for a finished run (its questions "already done",
# trajectories appended to a corpus).
_ROW_MARKS = {"output": "segments", "progress": "samples"}


def done_ids(out: str | Path) -> set[str]:
    """Questions already handled: those the progress file names, and those with rows in the output
    before the last recorded question's. The rows after it are the chunk a kill (or a second Ctrl-C)
    stopped between its two appends, with no progress lines: they are cut, and the rerun samples that
    chunk whole, as an uninterrupted run does (taking their questions for done, it sampled the
    others as a smaller chunk and wrote other files). An output without a progress file (one copied
    alone) keeps every row's question done."""
    out = Path(out)
    progress = progress_path(out)
    recorded = {i for i, _ in _row_ids(progress, "progress")}
    rows = _row_ids(out, "output")
    if progress.is_file():
        kept = len(rows)
        while kept and rows[kept - 1][0] not in recorded:
            kept -= 1
        if kept < len(rows):
            os.truncate(out, rows[kept - 1][1] if kept else 0)
            rows = rows[:kept]
    return recorded | {i for i, _ in rows}


def _row_ids(path: Path, kind: str) -> list[tuple[str, int]]:
    """(id, byte offset just past its line) of each row of the `kind` file at `path` (none if absent);
    a torn last line that a killed append left is cut."""
    if path.is_dir():
        raise InputError("is a folder; --out names the .jsonl file the trajectories go to", path)
    if not path.is_file():
        return []
    rows: list[tuple[str, int]] = []
    with open(path, "rb") as f:   # iter_lines drops a byte-order mark, which the offsets count
        torn, end = False, len(BOM) if f.read(len(BOM)) == BOM else 0
    for line, raw in iter_lines(path):
        if not raw.endswith(b"\n"):   # a crash's torn append: cut only once every whole line proved ours
            torn = _check_torn(raw, path, line)
            break
        end += len(raw)
        row = parse_json_line(raw, path, line)
        if row is None:
            continue
        missing = [k for k in ("id", _ROW_MARKS[kind]) if k not in row]
        if missing:
            raise InputError(f"row has no {missing[0]!r}; not a `train tgo` {kind} file", path, line)
        rows.append((str(row["id"]), end))
    if torn:
        cut_torn_last_line(path)
    return rows


def _check_torn(raw: bytes, path: Path, line: int) -> bool:
    """A last line without its newline is cut only when it is what a killed append leaves: the start
    of a row (every row begins `{"id": `) that is not yet whole JSON. Anything else is someone's."""
    try:
        whole = isinstance(json.loads(raw), dict)
    except ValueError:
        whole = False
    if whole or not raw.startswith(b'{"id": '):
        raise InputError("the last line has no newline and is no row cut short by a crash; not a `train tgo` "
                         "file (or add the newline)", path, line)
    return True


def _append(path: Path, rows: Sequence[dict]) -> None:
    """Append rows with one write, then fsync (a crash leaves at most one torn line).

    The file is created even for no rows: a run in which no sample was correct still leaves its
    (empty) output, as a finished run should.
    """
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    with open(path, "a", encoding="utf-8") as f:
        if text:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


@dataclass
class TgoStats:
    questions: int = 0          # in the data
    skipped: int = 0            # already done (resume)
    processed: int = 0
    solved: int = 0             # questions with at least one correct sample
    samples: int = 0
    correct: int = 0
    written: int = 0            # rows written (distinct correct responses)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def generate_teacher_trajectories(model: Any, tokenizer: Any, examples: Sequence[QAExample],
                                  retriever: Retriever | None, out: str | Path,
                                  config: TgoConfig = TgoConfig(), teacher: str = "",
                                  on_chunk: Callable[[int], None] | None = None) -> TgoStats:
    """Sample `config.n` episodes per question and append the correct ones to `out`.

    Ctrl-C stops it with the last whole chunk kept (plumbing.Interrupts: one inside a chunk's two
    appends waits for the second) and raises TrainingInterrupted, whose line says how much is done."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = done_ids(out)
    if not out.is_file() or not out.stat().st_size:   # from the first chunk on, rows the progress file
        _append(progress_path(out), [])               # does not name are a chunk cut between its appends
    stats = TgoStats(questions=len(examples))
    interrupts = Interrupts(unit="chunk", finishing="stopping once this chunk's trajectories are written "
                                                    "(Ctrl-C again stops at once, without it)")
    per = config.questions_per_chunk
    try:
        with interrupts.watch():
            engine = make_engine(model, tokenizer, config.rollout)
            for start in range(0, len(examples), per):
                chunk = [e for e in examples[start:start + per] if e.id not in done]
                stats.skipped += min(per, len(examples) - start) - len(chunk)
                if chunk:
                    interrupts.step_begins(start // per + 1)
                    _run_chunk(model, tokenizer, chunk, retriever, out, config, teacher, start, engine, stats,
                               interrupts.commit)
                    interrupts.step_ends()
                if on_chunk is not None:
                    on_chunk(min(per, len(examples) - start))
    except KeyboardInterrupt:   # nothing to save: each chunk was written as it ended
        interrupts.stop(stats.processed, None, lambda: out_holds(out, examples, done, stats.processed))
    return stats


def out_holds(out: Path, examples: Sequence[QAExample], done: set[str], processed: int = 0) -> str:
    """What --out holds after a Ctrl-C, and how to go on: the questions `done` before this run
    (`done_ids`) and those it `processed` since."""
    finished = sum(e.id in done for e in examples) + processed
    if not finished:
        return f"nothing saved ({out} has none of the {len(examples)} questions done yet)"
    return (f"{out} has {finished} of {len(examples)} questions done; run the same command again to resume "
            "from there")


def _run_chunk(model, tokenizer, chunk: list[QAExample], retriever, out: Path, config: TgoConfig,
               teacher: str, start: int, engine, stats: TgoStats, commit: Callable[[], None]) -> None:
    """Sample the chunk, then `commit()` and append its rows and progress lines (its questions counted
    as processed once both are written: a Ctrl-C's line counts whole chunks only)."""
    n = config.n
    rollout_cfg = replace(config.rollout, seed=config.rollout.seed * 1_000_003 + start)
    questions = [e.question for e in chunk for _ in range(n)]
    golds = [e.answers for e in chunk for _ in range(n)]
    rollouts = generate_rollouts(model, tokenizer, questions, golds, retriever, rollout_cfg, engine=engine)
    rows, progress = [], []
    for i, ex in enumerate(chunk):
        mine = rollouts[i * n:(i + 1) * n]
        correct = [(j, r) for j, r in enumerate(mine) if r.score > 0]
        seen: set[str] = set()
        for j, r in correct:
            if r.transcript.response not in seen:
                seen.add(r.transcript.response)
                rows.append(trajectory_row(ex, r, j, teacher))
        progress.append({"id": ex.id, "samples": n, "correct": len(correct), "written": len(seen)})
        stats.solved += bool(correct)
        stats.correct += len(correct)
    # Rows first: rows without their progress lines are a chunk cut between the appends, which the
    # rerun cuts (done_ids). The commit keeps a first Ctrl-C from stopping the chunk there at all.
    commit()
    _append(out, rows)
    _append(progress_path(out), progress)
    stats.processed += len(chunk)
    stats.samples += len(rollouts)
    stats.written += len(rows)
