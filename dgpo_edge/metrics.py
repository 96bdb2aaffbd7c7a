"""Answer scoring (EM, F1, cover-EM) and per-dataset metric tables.

The scores follow Search-R1 / FlashRAG exactly, so numbers computed here are
comparable with the DGPO and Search-R1 papers: SQuAD normalisation, exact match
against any gold alias, token F1 with FlashRAG's yes/no rule, and Search-R1's
"subem" (a gold alias appears inside the prediction). Stdlib only.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL = ("yes", "no", "noanswer")
BASE_COLUMNS = ("em", "f1", "cover_em")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower -> drop punctuation -> drop articles -> collapse spaces.

    The order matters and is SQuAD's: punctuation goes before articles, so
    "a.b" becomes "ab" (not an article) while "A+" becomes "a" and then "".
    """
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _gold_list(golds: str | Sequence[str]) -> list[str]:
    """Accept one gold string or a sequence of aliases (a bare str is one alias, not chars)."""
    return [golds] if isinstance(golds, str) else list(golds)


def exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold alias (the RL reward)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _gold_list(golds)))


def cover_exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """Search-R1's "subem": 1.0 when any normalised gold is a substring of the prediction.

    Like Search-R1 this is a plain substring test, so a gold that normalises to
    "" (e.g. "---" in NQ-open) is covered by every prediction.
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(g) in pred for g in _gold_list(golds)))


def _token_f1(pred: str, gold: str) -> float:
    """SQuAD token F1 of two normalised strings, with FlashRAG's yes/no/noanswer rule."""
    if (pred in _SPECIAL or gold in _SPECIAL) and pred != gold:
        return 0.0
    pred_toks, gold_toks = pred.split(), gold.split()
    same = sum((Counter(pred_toks) & Counter(gold_toks)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golds: str | Sequence[str]) -> float:
    """Token F1 against the best-matching gold alias (0.0 for a missing prediction)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return max((_token_f1(pred, normalize_answer(g)) for g in _gold_list(golds)), default=0.0)


def score_prediction(prediction: str | None, golds: str | Sequence[str]) -> dict[str, float]:
    """All three scores at once, keyed as in a metric record."""
    return {
        "em": exact_match(prediction, golds),
        "f1": f1_score(prediction, golds),
        "cover_em": cover_exact_match(prediction, golds),
    }


# ---------------------------------------------------------------- aggregation

def _metric_columns(records: Sequence[Mapping]) -> list[str]:
    """em, f1, cover_em first, then any other numeric keys in first-seen order."""
    extra: list[str] = []
    for rec in records:
        for key, value in rec.items():
            if (key not in BASE_COLUMNS and key != "source" and key not in extra
                    and isinstance(value, (int, float)) and not isinstance(value, bool)):
                extra.append(key)
    return list(BASE_COLUMNS) + extra


def _mean_row(records: Sequence[Mapping], columns: Sequence[str]) -> dict:
    """Mean of each column over the records that have it (None when none do)."""
    row: dict = {"n": len(records)}
    for col in columns:
        values = [float(r[col]) for r in records if r.get(col) is not None]
        row[col] = sum(values) / len(values) if values else None
    return row


def _macro_row(rows: Sequence[Mapping], columns: Sequence[str]) -> dict:
    """Mean of per-source means: the papers' "Avg", where every dataset weighs the same."""
    row: dict = {"n": sum(r["n"] for r in rows)}
    for col in columns:
        values = [r[col] for r in rows if r[col] is not None]
        row[col] = sum(values) / len(values) if values else None
    return row


class MetricTable:
    """Per-source means, a macro "average" row and a micro "all" row.

    Built from records like {"source": "nq", "em": 1.0, "f1": 1.0, "cover_em": 1.0};
    other numeric keys (e.g. "turns") become extra columns.
    """

    def __init__(self, records: Iterable[Mapping]):
        records = list(records)
        self.columns = _metric_columns(records)
        by_source: dict[str, list[Mapping]] = {}
        for rec in records:
            by_source.setdefault(str(rec["source"]), []).append(rec)
        self.rows: dict[str, dict] = {
            src: _mean_row(recs, self.columns) for src, recs in sorted(by_source.items())
        }
        self.average = _macro_row(list(self.rows.values()), self.columns)
        self.all = _mean_row(records, self.columns)

    def to_json(self) -> dict:
        """{"columns": [...], "sources": {src: row}, "average": row, "all": row}."""
        return {"columns": list(self.columns), "sources": self.rows,
                "average": self.average, "all": self.all}

    def to_markdown(self) -> str:
        """A markdown table, one row per source then average and all, 3 decimals."""
        header = ["dataset", "n", *self.columns]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        named = [*self.rows.items(), ("average", self.average), ("all", self.all)]
        for name, row in named:
            cells = [name, str(row["n"])] + [_fmt(row[c]) for c in self.columns]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table_to_json(records: Iterable[Mapping] | MetricTable) -> dict:
    """JSON-ready summary of records (or of an already built MetricTable)."""
    table = records if isinstance(records, MetricTable) else MetricTable(records)
    return table.to_json()


def table_to_markdown(records: Iterable[Mapping] | MetricTable) -> str:
    """Markdown table of records (or of an already built MetricTable)."""
    table = records if isinstance(records, MetricTable) else MetricTable(records)
    return table.to_markdown()
