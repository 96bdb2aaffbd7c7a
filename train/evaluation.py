"""Evaluation during training: the retriever a run searches with, and the dev-EM hook.

`open_retriever` opens what `data.retriever` names: an index directory (the laptop's
`open_index`) or a Search-R1 corpus .jsonl searched with BM25 in memory (`CorpusBM25`, no
index build). `make_eval_fn` gives the trainers their evaluation hook: greedy multi-turn
rollouts (rollout.evaluate_em) with the run's own protocol limits on `data.dev`, whose
`dev_*` metrics choose the best checkpoint, and, when `data.report` is set, the same on a
split kept for the record (`evaluate_split`: EM per question type and hop count, ARC, the
per-question scores), which the trainers append to report.jsonl and nothing ever reads to
choose: a run cut short still leaves its test numbers behind.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dgpo_edge.errors import InputError
from dgpo_edge.protocol import Passage
from dgpo_edge.retrieval.base import Retriever


class CorpusBM25(Retriever):
    """BM25 over a Search-R1 corpus .jsonl held in memory (SQLite FTS5; no index build needed)."""

    def __init__(self, corpus: str | Path):
        from dgpo_edge.fts import BM25Index
        from dgpo_edge.jsonio import read_jsonl

        passages = []
        for line, row in read_jsonl(corpus):
            if "id" not in row or not isinstance(row.get("contents"), str):
                raise InputError("expected {\"id\", \"contents\"}", corpus, line)
            passages.append(Passage(str(row["id"]), row["contents"]))
        self.index = BM25Index(passages)

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        return self.index.search_many(queries, k=k)

    def close(self) -> None:
        self.index.close()


def open_retriever(spec: str) -> Retriever:
    """An index directory (open_index) or a corpus .jsonl (in-memory BM25)."""
    path = Path(spec)
    if path.is_file() and path.suffix == ".jsonl":
        return CorpusBM25(path)
    if path.is_dir():
        from dgpo_edge.retrieval.retrievers import open_index
        return open_index(path)
    raise InputError("expected an index directory or a corpus .jsonl", path)


def make_eval_fn(config: Any, tokenizer: Any) -> Callable[..., dict] | None:
    """The trainers' evaluation hook, or None without data.dev and data.report.

    The episodes have the run's own limits (`config.protocol`, the section an RL run's rollouts
    use too), so that a run is evaluated on the kind of episode it trains on. The hook returns
    the `dev_*` metrics and, with data.report, the report split's row under "_report" (for
    report.jsonl; never a metric to choose by). Its `rollout` attribute is the RolloutConfig
    it uses. `evaluate(model, step, engine)`: a decoder built for `model` and kept by the caller
    (the RL loop's, with its captured graphs) is used as it is; without one each call builds its own.
    """
    data = config.data
    if not data.dev and not data.report:
        return None
    try:
        from .rollout import RolloutConfig, evaluate_em
    except ImportError as e:
        raise InputError(f"data.dev is set but dev EM needs dgpo_edge.train.rollout ({e})") from None
    dev = _questions(data.dev, data.dev_limit, "data.dev") if data.dev else None
    report = _questions(data.report, data.report_limit, "data.report") if data.report else None
    retriever = open_retriever(data.retriever)
    e = config.eval
    rollout = RolloutConfig(protocol=config.protocol, greedy=True,
                            batch_size=e.batch_size, engine=e.engine, chat_template=data.chat_template)

    def evaluate(model: Any, step: int, engine: Any | None = None) -> dict:
        out: dict[str, Any] = {}
        if dev:
            result = evaluate_em(model, tokenizer, dev, retriever, rollout, engine=engine)
            out.update({f"dev_{k}": v for k, v in result.items() if isinstance(v, (int, float))})
        if report:
            out["_report"] = {"split": str(data.report),
                              **evaluate_split(model, tokenizer, report, retriever, rollout, engine=engine)}
        return out

    evaluate.rollout = rollout
    return evaluate


def check_questions(data: Any) -> None:
    """data.dev's and data.report's questions read, before any model loads (make_eval_fn, which
    reads them for the run, needs the tokenizer): a bad line was named only after loading."""
    for key in ("dev", "report"):
        path = getattr(data, key)
        if path:
            _questions(path, getattr(data, f"{key}_limit"), f"data.{key}")


def _questions(path: str, limit: int | None, key: str) -> list:
    from dgpo_edge.datasets import read_qa

    examples = read_qa(path, limit=limit)
    if not examples:
        raise InputError(f"{key} gives no questions to evaluate (limit {limit})", path)
    return examples


def evaluate_split(model: Any, tokenizer: Any, examples: Sequence[Any], retriever: Retriever | None,
                   rollout: Any, engine: Any | None = None) -> dict:
    """Greedy EM of QA examples in detail: EM and F1, EM per question type and hop count (the
    examples' `type` and `hops` fields), ARC (hit ratio, search steps, invalid actions), the
    model's parameter count (as shipped: see `_params`) and weight dtype, how many questions of
    each type were right or lost where (`dgpo_edge.arc.outcome`), and the per-question EM, outcome,
    answer and search queries in file order, so two evaluations can be compared question by question
    and a miss looked into."""
    from dgpo_edge.arc import episode_arc, outcome, outcome_counts, summarize_arc
    from dgpo_edge.metrics import f1_score

    from .rollout import greedy_rollouts

    t0 = time.perf_counter()
    rollouts = greedy_rollouts(model, tokenizer, examples, retriever, rollout, engine)
    scores = [r.score for r in rollouts]
    episodes = [episode_arc(r.transcript, r.golds) for r in rollouts]
    arc = summarize_arc(episodes)
    # right, or where each question was lost (no answer, no search, not found, misread)
    types = [x.meta.get("type", "?") for x in examples]
    facts = [{"em": s, "answered": e.answered, "searches": e.searches, "hit": e.hit, "type": t}
             for s, e, t in zip(scores, episodes, types)]
    n = len(rollouts)
    return {
        "n": n, "em": sum(scores) / n, "params": _params(model),
        # the weights decoded: an RL run's evaluations read its bf16 copy on a GPU (greedy ties can differ)
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "f1": sum(f1_score(r.answer, r.golds) for r in rollouts) / n,
        "em_by_type": _by_group(types, scores),
        "em_by_hops": _by_group([x.meta.get("hops", "?") for x in examples], scores),
        "hit_ratio": arc["hit_ratio"], "search_steps": arc["search_steps"],
        "invalid_action_rate": arc["invalid_action_rate"], "answered_rate": arc["answered_rate"],
        "generated_tokens": sum(r.n_generated for r in rollouts) / n,
        "outcomes_by_type": outcome_counts(facts, "type"),
        "seconds": round(time.perf_counter() - t0, 1), "scores": [int(s) for s in scores],
        "outcomes": [outcome(f) for f in facts],
        # what each question was answered and searched, so a miss can be looked into (bench/misreads.py)
        "answers": [r.answer or "" for r in rollouts],
        "search_queries": [[s.query for s in r.transcript.searches()] for r in rollouts],
    }


def _params(model: Any) -> int:
    """Parameters of the model as it ships: a LoRA adapter's own weights are left out (they merge
    into the weights they adapt), a tied embedding counted once."""
    return sum(p.numel() for name, p in model.named_parameters() if "lora_" not in name)


def _by_group(keys: list, scores: list[float]) -> dict:
    sums, counts = defaultdict(float), defaultdict(int)
    for k, s in zip(keys, scores):
        sums[str(k)] += s
        counts[str(k)] += 1
    return {k: round(sums[k] / counts[k], 4) for k in sorted(sums)}
