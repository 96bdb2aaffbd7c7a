"""QA dataset readers: one `QAExample` type for every public format we meet.

Search-R1 / FlashRAG, DeepResearcher, NQ-open and R1-Searcher each ship their
questions differently; the rest of the toolkit only sees `QAExample`. Every
reader is a generator and raises `InputError` naming the file and the line
(jsonl, 1-based) or row (parquet, 0-based) of a bad record, so a broken file
fails with one clear message. pyarrow is imported only when a parquet file is
actually read, keeping `import dgpo_edge.datasets` cheap.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError
from .jsonio import read_jsonl, require_file
from .metrics import normalize_answer
from .termtext import not_utf8

ANSWER_SPLIT = "<|answer_split|>"  # DeepResearcher joins gold aliases with this


@dataclass(frozen=True)
class QAExample:
    """One question with its gold aliases; `meta` keeps format-specific extras."""

    id: str
    question: str
    answers: tuple[str, ...]
    source: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


class _Where:
    """Where a record came from, so every check can name file and line/row."""

    def __init__(self, path: Path, pos: int, kind: str):
        self.path, self.pos, self.kind = path, pos, kind

    def error(self, message: str) -> InputError:
        return InputError(message, self.path, self.pos, where=self.kind)


# ------------------------------------------------------------- field checks

def _question(value: Any, at: _Where, name: str = "question") -> str:
    """A non-empty string, stripped (several real rows carry stray spaces)."""
    if not isinstance(value, str):
        raise at.error(f"'{name}' must be a string, got {type(value).__name__}")
    if not value.strip():
        raise at.error(f"'{name}' is empty")
    _check_unicode(value, at, name)
    return value.strip()


def _check_unicode(text: str, at: _Where, name: str) -> None:
    """Refused here, not as a traceback once an evaluation writes its first prediction."""
    if bad := not_utf8(text):
        raise at.error(f"'{name}' is not valid Unicode text: {bad}")


def _answers(value: Any, at: _Where, name: str) -> tuple[str, ...]:
    """A list of strings with at least one non-blank alias.

    Aliases are stripped and blank ones dropped: a blank alias normalises to ""
    and would make cover-EM accept any prediction.
    """
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
        raise at.error(f"'{name}' must be a list of strings, got {_describe(value)}")
    for a in value:
        _check_unicode(a, at, name)
    answers = tuple(a.strip() for a in value if a.strip())
    if not answers:
        raise at.error(f"'{name}' has no answers")
    return answers


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in value})
        return f"list of {'/'.join(kinds)}" if kinds else "empty list"
    return type(value).__name__


def _source(row: Mapping, path: Path) -> str:
    """`source` or `data_source` when the file names one, else the file stem."""
    for key in ("source", "data_source"):
        if isinstance(row.get(key), str) and row[key]:
            return row[key]
    return path.stem


def _dig(row: Mapping, *keys: str) -> Any:
    """Nested lookup that yields None instead of failing on a missing or non-dict level."""
    value: Any = row
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _extras(row: Mapping, known: Iterable[str]) -> dict:
    """Every field the reader did not consume, kept for later use (hops, type...)."""
    known = set(known)
    return {k: v for k, v in row.items() if k not in known}


# ------------------------------------------------------------- raw iterators

def _iter_parquet(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield (0-based row, dict) batch by batch; unreadable files become InputError."""
    require_file(path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        row = 0
        for batch in pf.iter_batches(batch_size=1024):
            for record in batch.to_pylist():
                yield row, record
                row += 1
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"cannot read parquet: {e}", path) from None


def _iter_rows(path: Path) -> Iterator[tuple[_Where, int, dict]]:
    """(location, 0-based example index, record) for jsonl or parquet alike."""
    if path.suffix == ".parquet":
        for row, rec in _iter_parquet(path):
            yield _Where(path, row, "row"), row, rec
    else:
        for index, (lineno, rec) in enumerate(read_jsonl(path)):
            yield _Where(path, lineno, "line"), index, rec


# ------------------------------------------------------------------ readers

def read_searchr1_parquet(path: str | Path) -> Iterator[QAExample]:
    """Search-R1 processed parquet: `question` + `golden_answers` (FlashRAG columns).

    The `prompt` column holds the whole template, so the plain `question` column
    is used; when `golden_answers` is absent, `reward_model.ground_truth.target`.
    """
    path = Path(path)
    known = ("id", "question", "golden_answers", "source", "data_source", "prompt",
             "reward_model")
    for at, index, row in _iter_rows(path):
        if row.get("golden_answers") is not None:
            answers = _answers(row["golden_answers"], at, "golden_answers")
        else:
            target = _dig(row, "reward_model", "ground_truth", "target")
            answers = _answers(target, at, "reward_model.ground_truth.target")
        yield QAExample(
            id=_id(row.get("id"), path, index),
            question=_question(row.get("question"), at),
            answers=answers,
            source=_source(row, path),
            meta=_extras(row, known),
        )


def read_flashrag_jsonl(path: str | Path) -> Iterator[QAExample]:
    """FlashRAG jsonl: `id`, `question`, `golden_answers`; other keys go to meta."""
    path = Path(path)
    known = ("id", "question", "golden_answers", "source", "data_source")
    for at, index, row in _iter_rows(path):
        yield QAExample(
            id=_id(row.get("id"), path, index),
            question=_question(row.get("question"), at),
            answers=_answers(row.get("golden_answers"), at, "golden_answers"),
            source=_source(row, path),
            meta=_extras(row, known),
        )


def read_deepresearcher_parquet(path: str | Path) -> Iterator[QAExample]:
    """DeepResearcher parquet: question in `prompt[0].content`, answers joined by `<|answer_split|>`.

    `extra_info.index` (e.g. "popqa_3474310") is a real, unique id, so it is used.
    """
    path = Path(path)
    known = ("source", "data_source", "prompt", "reward_model", "extra_info")
    for at, index, row in _iter_rows(path):
        prompt = row.get("prompt")
        if not isinstance(prompt, list) or not prompt or not isinstance(prompt[0], dict):
            raise at.error(f"'prompt' must be a non-empty list of messages, got {_describe(prompt)}")
        truth = _dig(row, "reward_model", "ground_truth")
        if not isinstance(truth, str):
            raise at.error(f"'reward_model.ground_truth' must be a string, got {type(truth).__name__}")
        extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
        yield QAExample(
            id=_id(extra.get("index"), path, index),
            question=_question(prompt[0].get("content"), at, "prompt[0].content"),
            answers=_answers(truth.split(ANSWER_SPLIT), at, "reward_model.ground_truth"),
            source=_source(row, path),
            meta={**_extras(row, known), **{k: v for k, v in extra.items() if k != "index"}},
        )


def read_nq_open_jsonl(path: str | Path) -> Iterator[QAExample]:
    """NQ-open jsonl: `question` + `answer` (a list); the source is always "nq".

    "nq" is the name Search-R1 and DeepResearcher give this dataset, so tables
    line up with theirs.
    """
    path = Path(path)
    for at, index, row in _iter_rows(path):
        yield QAExample(
            id=_id(row.get("id"), path, index),
            question=_question(row.get("question"), at),
            answers=_answers(row.get("answer"), at, "answer"),
            source="nq",
            meta=_extras(row, ("id", "question", "answer")),
        )


def read_r1searcher_jsonl(path: str | Path) -> Iterator[QAExample]:
    """R1-Searcher jsonl: `question` + `answer` (one string), optional `idx`."""
    path = Path(path)
    known = ("idx", "question", "answer", "source", "data_source")
    for at, index, row in _iter_rows(path):
        answer = row.get("answer")
        if not isinstance(answer, str):
            raise at.error(f"'answer' must be a string, got {type(answer).__name__}")
        idx = row.get("idx")
        yield QAExample(
            id=f"{path.stem}-{idx if idx is not None else index}",
            question=_question(row.get("question"), at),
            answers=_answers([answer], at, "answer"),
            source=_source(row, path),
            meta=_extras(row, known),
        )


def _id(value: Any, path: Path, index: int) -> str:
    """The file's own id when it has one, else `{stem}-{index}` (stable across runs)."""
    if value is None or value == "":
        return f"{path.stem}-{index}"
    return str(value)


READERS: dict[str, Callable[[str | Path], Iterator[QAExample]]] = {
    "searchr1": read_searchr1_parquet,
    "flashrag": read_flashrag_jsonl,
    "deepresearcher": read_deepresearcher_parquet,
    "nq_open": read_nq_open_jsonl,
    "r1searcher": read_r1searcher_jsonl,
}


# ----------------------------------------------------------- format dispatch

def detect_format(path: str | Path) -> str:
    """Guess the format from the extension and the first record's keys/columns."""
    path = Path(path)
    require_file(path)
    if path.suffix == ".parquet":
        return _detect_parquet(path)
    if path.suffix in (".jsonl", ".json"):
        return _detect_jsonl(path)
    raise InputError(f"unknown QA file type '{path.suffix}' (expected .parquet or .jsonl)", path)


def _detect_parquet(path: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        columns = set(pq.read_schema(path).names)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"cannot read parquet: {e}", path) from None
    if "question" in columns:
        return "searchr1"
    if {"prompt", "reward_model"} <= columns:
        return "deepresearcher"
    raise InputError(f"unrecognised parquet columns {sorted(columns)}", path)


def _detect_jsonl(path: Path) -> str:
    for lineno, row in read_jsonl(path):
        if "golden_answers" in row:
            return "flashrag"
        if isinstance(row.get("answer"), list):
            return "nq_open"
        if isinstance(row.get("answer"), str):
            return "r1searcher"
        raise InputError(f"unrecognised keys {sorted(row)}: expected golden_answers or answer",
                         path, lineno)
    raise InputError("empty file", path)


def read_qa(path: str | Path, format: str = "auto", limit: int | None = None) -> list[QAExample]:
    """Read a QA file of any known format (or the one named) into a list."""
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in READERS:
        raise InputError(f"unknown format '{fmt}' (known: {', '.join(READERS)})", path)
    return list(itertools.islice(READERS[fmt](path), limit))


# --------------------------------------------------------- dataset hygiene

def find_duplicates(examples: Iterable[QAExample]) -> list[list[QAExample]]:
    """Groups of examples whose questions normalise identically (EM normalisation).

    Duplicates inflate or skew averages and can leak between splits; groups are
    returned in order of first appearance.
    """
    groups: dict[str, list[QAExample]] = {}
    for ex in examples:
        groups.setdefault(normalize_answer(ex.question), []).append(ex)
    return [group for group in groups.values() if len(group) > 1]


@dataclass(frozen=True)
class DatasetSummary:
    """Headline numbers for a QA set, to print before an evaluation run."""

    count: int
    per_source: dict[str, int]
    duplicate_groups: int
    mean_answers: float


def summarize(examples: Iterable[QAExample]) -> DatasetSummary:
    """Count, per-source counts, duplicate-question groups and mean aliases per question."""
    examples = list(examples)
    per_source = dict(sorted(Counter(ex.source for ex in examples).items()))
    total_answers = sum(len(ex.answers) for ex in examples)
    return DatasetSummary(
        count=len(examples),
        per_source=per_source,
        duplicate_groups=len(find_duplicates(examples)),
        mean_answers=total_answers / len(examples) if examples else 0.0,
    )
