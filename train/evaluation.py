"""Evaluation during training: the retriever a run searches with, and the dev-EM hook.

`open_retriever` opens what `data.retriever` names: an index directory (the laptop's
`open_index`) or a Search-R1 corpus .jsonl searched with BM25 in memory (`CorpusBM25`, no
index build). `make_eval_fn` gives the trainers their dev-EM hook: greedy multi-turn
rollouts (rollout.evaluate_em) with the run's own protocol limits.
"""

from __future__ import annotations

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


def make_eval_fn(config: Any, tokenizer: Any) -> Callable[[Any, int], dict] | None:
    """Dev EM through greedy multi-turn rollouts (train/rollout.py), or None without data.dev.

    The episodes have the run's own limits (`config.protocol`, the section an RL run's rollouts
    use too), so that a run is evaluated on the kind of episode it trains on. The returned
    function's `rollout` attribute is the RolloutConfig it uses.
    """
    if not config.data.dev:
        return None
    try:
        from .rollout import evaluate_em
    except ImportError as e:
        raise InputError(f"data.dev is set but dev EM needs dgpo_edge.train.rollout ({e})") from None
    from dgpo_edge.datasets import read_qa

    examples = read_qa(config.data.dev, limit=config.data.dev_limit)
    retriever = open_retriever(config.data.retriever)

    from .rollout import RolloutConfig

    e = config.eval
    rollout = RolloutConfig(protocol=config.protocol, greedy=True,
                            batch_size=e.batch_size, engine=e.engine, chat_template=config.data.chat_template)

    def evaluate(model: Any, step: int) -> dict:
        result = evaluate_em(model, tokenizer, examples, retriever, rollout)
        return {f"dev_{k}": v for k, v in result.items() if isinstance(v, (int, float))}

    evaluate.rollout = rollout
    return evaluate
