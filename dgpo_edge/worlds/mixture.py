"""A mixture of worlds written as one dataset folder, with one world held out.

    world folders (built, or read when already built) -> union corpus (ids "world:id")
    -> per split: questions drawn by the weights with the seed (ids and evidence rewritten)
    -> oracle trajectories re-searched on the union corpus (BM25), kept when they still hit
    -> the same files as a world: corpus, train/dev/test, oracle, stats, manifest

A mixture entry is a world's name, built with the mixture's seed, or `NAME@SEED`: the same
world built with another seed, in its own folder (WORLDS_DIR/NAME@SEED). For a generated world
(notes) another seed is another set of people, teams and projects, so several seeds give more
questions per relation than one world holds. NAME@SEED at the mixture's own seed is NAME
(resolve_entries), so no world is built twice. Training reads a mixture exactly as it reads a world,
so nothing in train/ knows about mixtures. The held-out world adds nothing to the mixture (no passage, no question): its own
folder keeps its test split for leave-one-world-out evaluation. Byte-identical for the same
world folders, weights, sizes and seed.
"""

from __future__ import annotations

import json
import math
import random
import re
import shlex
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, jsonio, protocol
from ..errors import InputError
from ..fts import BM25Index
from ..metrics import normalize_answer
from ..protocol import Passage
from ..transcript import Transcript
from . import registry
from .pipeline import FILES, OPTIONS, SPLITS, atomic_dir, check_replaceable

TOP_K = 3  # the oracle's top-k (worlds.oracle), which training's dev rollouts use too


@dataclass
class WorldData:
    """One built world folder, read whole."""

    name: str
    manifest: dict
    corpus: list[dict]
    splits: dict[str, list[dict]]
    oracle: dict[str, dict]  # by question id


def split_entry(name: str) -> tuple[str, int | None]:
    """`"notes@2"` -> ("notes", 2); `"notes"` -> ("notes", None). The world must be known, and a
    seed is only for a generated world: another seed of a package world asks about the same facts
    with its entities split otherwise, so its train questions would be another seed's test ones."""
    world, sep, seed_text = name.partition("@")
    if sep and not (seed_text.isdigit() and world):
        raise InputError(f"--world {name!r}: expected NAME or NAME@SEED with a seed of digits, e.g. notes@2")
    spec = registry.get(world)
    if sep and spec.package:
        raise InputError(f"--world {name!r}: NAME@SEED needs a generated world (notes); {world} is built from "
                         f"{spec.source}, and another seed would put its test entities into train")
    return world, int(seed_text) if sep else None


def check_distinct(weights: dict[str, float], seed: int) -> None:
    """Refuse two entries that are one world built with one seed (`notes` and `notes@0` at seed 0):
    every question of the second would be dropped as a duplicate and the mixture left empty."""
    seen: dict[tuple[str, int], str] = {}
    for name in weights:
        world, own = split_entry(name)
        key = (world, seed if own is None else own)
        if key in seen:
            raise InputError(f"--world {name} is the same world as --world {seen[key]} "
                             f"({world} at seed {key[1]}, the mixture's seed for a bare name)")
        seen[key] = name


def parse_weights(specs: list[str]) -> dict[str, float]:
    """`["factbook=0.5", "notes=1", "notes@2=1"]` -> {name: weight}; known worlds, each entry given once."""
    weights: dict[str, float] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        name = name.strip()
        try:
            weight = float(text)
        except ValueError:
            weight = math.nan
        # a denormal weight (1e-320) is above 0 yet holds a few bits: its share of a split rounds to
        # no question, and shares of such weights are not the ratios typed
        if not sep or not math.isfinite(weight) or weight < sys.float_info.min:
            raise InputError(f"--world {spec!r}: expected NAME=WEIGHT with a weight above 0 "
                             f"({sys.float_info.min:.1e} or more), e.g. factbook=0.5")
        split_entry(name)
        if name in weights:
            raise InputError(f"--world {name} is given twice")
        weights[name] = weight
    if not weights:
        raise InputError("a mixture needs at least one --world NAME=WEIGHT")
    if not math.isfinite(sum(weights.values())):   # the shares divide by it: each would be 0
        raise InputError(f"--world weights {', '.join(specs)} add up past the largest number; weights are "
                         "relative, so give smaller ones (0.5 and 1 mean 1:2)")
    return weights


def resolve_entries(weights: dict[str, float], seed: int, worlds_dir: Path) -> dict[str, float]:
    """The weights with each `NAME@S` at the mixture's seed S named `NAME`: a bare NAME is built with
    the mixture's seed in WORLDS_DIR/NAME, so NAME@S would build the same world a second time in
    WORLDS_DIR/NAME@S. Only where WORLDS_DIR/NAME holds that seed (or nothing yet, so it is built
    with it): a NAME folder built with another seed is another world, and NAME@S keeps its own.
    Listing NAME and NAME@S both is refused before (check_distinct)."""
    resolved = {}
    for name, weight in weights.items():
        world, own = split_entry(name)
        if own == seed and _built_seed(worlds_dir / world) in (None, seed):
            name = world
        resolved[name] = weight
    return resolved


def _built_seed(folder: Path) -> int | None:
    """The seed the world in `folder` was built with; None when nothing is built there."""
    path = folder / "manifest.json"
    return _read_json(path).get("seed") if path.is_file() else None


def ensure_world(name: str, folder: Path, seed: int, say: Callable[[str], None]) -> dict:
    """The manifest of the world built in `folder`, building it first when the folder has none.

    An existing folder is checked against its manifest's digests, so a stale or hand-edited
    world is refused rather than mixed in.
    """
    jsonio.settle(folder)   # a rebuild of it killed part way: the old world back, or the new one kept
    manifest_path = folder / "manifest.json"
    world, own_seed = split_entry(name)
    seed = seed if own_seed is None else own_seed
    if not manifest_path.is_file():
        say(f"building world {name} into {folder}")
        registry.build(world, folder, seed=seed, say=say)
    manifest = _read_json(manifest_path)
    kind, its_seed = manifest.get("kind"), manifest.get("seed")
    # mixed in under this name, another world's questions (the held-out one's, say) would train the
    # student; a NAME@SEED folder must hold that seed (a plain NAME is that world as built there: the
    # mixture's --seed draws the questions)
    if kind != registry.get(world).manifest_kind or (own_seed is not None and its_seed != own_seed):
        want = f"the {world} world" + (f" with seed {own_seed}" if own_seed is not None else "")
        raise InputError(f"holds {kind or 'something else'} (seed {its_seed}), not {want}: give each world its "
                         f"own folder, WORLDS_DIR/NAME or WORLDS_DIR/NAME@SEED", folder)
    if (path := _changed_file(folder, manifest)) is not None:
        raise InputError(f"does not match {manifest_path} (rebuild the world with "
                         f"`{rebuild_command(world, manifest, seed, folder)}`)", path)
    return manifest


def rebuild_command(world: str, manifest: dict, seed: int, folder: Path) -> str:
    """The `data build` that makes again, byte for byte, the world `manifest` records: its own seed
    (else `seed`) and build options (`--size 24`, `--oracle-search asked`: without one the rebuild
    is another world, which the mixture would then take for this one), and `--as-folder` where the
    folder holds the notes/ that writes: the rebuild replaces the folder whole."""
    its_seed = manifest.get("seed")
    options = "".join(f" --{key.replace('_', '-')} {value}" for key, value in built_with(manifest).items())
    if registry.get(world).folder and (folder / "notes").is_dir():
        options += " --as-folder"
    return (f"dgpo-edge data build {world} --seed {its_seed if isinstance(its_seed, int) else seed}{options} "
            f"--out {shlex.quote(str(folder))}")


def _changed_file(folder: Path, manifest: dict) -> Path | None:
    """The first file of a world's or mixture's manifest that is missing or differs from its digest."""
    for file, digest in manifest.get("files", {}).items():
        path = folder / file
        if not path.is_file() or jsonio.file_digest(path) != digest:
            return path
    return None


def read_world(name: str, folder: Path, manifest: dict) -> WorldData:
    corpus = [row for _, row in jsonio.read_jsonl(folder / "corpus.jsonl")]
    splits = {s: [row for _, row in jsonio.read_jsonl(folder / f"{s}.jsonl")] for s in SPLITS}
    oracle = {row["id"]: row for _, row in jsonio.read_jsonl(folder / "oracle.jsonl")}
    return WorldData(name, manifest, corpus, splits, oracle)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"unreadable manifest ({e})", path) from None


# --- drawing questions --------------------------------------------------------------------

def shares(weights: dict[str, float]) -> dict[str, float]:
    """Each world's fraction of the total weight. fsum is exact and so the same in any order: a plain
    sum of 0.5, 0.1, 0.1, 0.08, 0.1 differs in its last bit from that of the same weights sorted by
    name, so the order the worlds were named in changed the shares, and `--keep` refused a finished
    mixture whose manifest (names sorted) held the very weights asked."""
    total = math.fsum(weights.values())
    return {name: weights[name] / total for name in sorted(weights)}


def allocate(share: dict[str, float], available: dict[str, int], size: int | None) -> dict[str, int]:
    """Questions per world for one split: `size` split by the shares, never more than a world has.

    Without `size`, the largest mixture with these shares that repeats no question: the world
    that runs out first at its share sets the total.
    """
    most = math.floor(min(available[n] / s for n, s in share.items()))
    total = most if size is None else min(size, most)
    counts = {n: math.floor(total * s) for n, s in share.items()}
    # the rounding remainder goes to the largest fractional parts (ties by name: deterministic)
    order = sorted(share, key=lambda n: (-(total * share[n] - counts[n]), n))
    for n in order[:total - sum(counts.values())]:
        if counts[n] < available[n]:
            counts[n] += 1
    return counts


def check_split_size(split: str, asked: int | None, made: int) -> None:
    """A size the worlds cannot fill is refused, not cut without a word (the manifest records the size
    asked), and so is a split left empty (every question dropped as another world's, say)."""
    option = "--train-size" if split == "train" else "--eval-size"
    if made == 0:
        raise InputError(f"the mixture would have no {split} questions at these weights (are the worlds the ones "
                         f"named, and not copies of each other?)")
    if asked is not None and made < asked:
        raise InputError(f"{option} {asked}: at these weights the worlds give at most {made:,} {split} questions "
                         f"without repeating one; leave {option} out for the most")


def check_every_world_drawn(weights: dict[str, float], counts: dict[str, int], split: str) -> None:
    """A world given a weight so small that its share rounds to no question of `split` (train) is
    refused, not mixed in as passages alone: who names a world expects it in the mixture."""
    for name in sorted(counts):
        if counts[name] == 0:
            raise InputError(f"--world {name}={weights[name]:g}: at these weights and sizes {name} draws no {split} "
                             f"question of the {sum(counts.values()):,} in the mixture; give it a larger weight "
                             "or leave it out")


def distinct_pools(worlds: list[WorldData], dropped: Counter[str]) -> dict[str, dict[str, list[dict]]]:
    """Each world's rows per split, less question texts another world (or split) already has.

    Test claims a text first, then dev, then train, so no question is asked in two splits of
    the mixture and evaluation rows are the ones kept.
    """
    seen: set[str] = set()
    pools: dict[str, dict[str, list[dict]]] = {s: {} for s in SPLITS}
    for split in ("test", "dev", "train"):
        for w in worlds:
            kept = []
            for row in w.splits[split]:
                key = normalize_answer(row["question"])
                if key in seen:
                    dropped["question_in_another_world"] += 1
                    continue
                seen.add(key)
                kept.append(row)
            pools[split][w.name] = kept
    return pools


def draw(pools: dict[str, list[dict]], counts: dict[str, int], seed: int, split: str) -> list[tuple[str, dict]]:
    """(world, row) pairs: `counts[world]` rows of each, drawn with the seed, then interleaved."""
    picked = []
    for name in sorted(counts):
        rows = random.Random(f"mix-{seed}-{split}-{name}").sample(pools[name], counts[name])
        picked += [(name, row) for row in rows]
    random.Random(f"mix-{seed}-{split}").shuffle(picked)
    return picked


def mixed_row(world: str, row: dict) -> dict:
    """A world's question row with ids made unique across worlds and the world named."""
    return {**row, "id": f"{world}:{row['id']}", "world": world,
            "evidence": [f"{world}:{pid}" for pid in row["evidence"]]}


# --- oracle trajectories on the union corpus ----------------------------------------------

def resolved_oracle(row: dict, trajectory: dict, index: BM25Index, quote: bool = False) -> dict | None:
    """The trajectory with every search re-run on the union corpus, or None when one misses.

    The turns stay as they were; each information block becomes what the union index returns
    for the same query, so teacher-forced training sees what a rollout on the mixture would.
    `quote`: the answer turn's think first quotes the sentence of the evidence that holds the
    answer (`quoted_answer_turn`).
    """
    t = Transcript(row["question"])
    t.append_prompt(protocol.user_message(row["question"]))
    hop, hits = 0, []
    searches = sum(1 for seg in trajectory["segments"] if seg["kind"] == "information")
    for seg in trajectory["segments"]:
        if seg["kind"] == "turn":
            last = hop == searches   # the answer turn, after the last search (a question may list more
            #                          evidence than it searches: any neighbour's capital answers it)
            t.append_turn(quoted_answer_turn(seg["text"], row, hits) if quote and last else seg["text"])
            continue
        if seg["kind"] != "information" or hop >= len(row["evidence"]):
            return None
        query = seg.get("query", "")
        hits = index.search(query, k=TOP_K)
        if row["evidence"][hop] not in {p.id for p in hits}:
            return None
        t.append_information(query, hits)
        hop += 1
    return {"id": row["id"], "question": row["question"], "golden_answers": row["golden_answers"],
            "response": t.response, "segments": t.to_dict()["segments"][1:]}


_THINK = "<think> "
_CLAUSE = re.compile(r"(?:[^.;\n]|\.(?=\S))+")   # a clause ends at ". ", ";" or a line; 3.5 stays whole


def quoted_answer_turn(text: str, row: dict, hits: list[Passage]) -> str:
    """The answer turn with its think opened by the clause of the evidence that holds the answer:
    '<think> The passage on Tanzen Joinery says "master - Piet Veny". ...'.

    Why: held out of training, a student found the right record and then answered another part of
    it (its kind, its name, another field; docs/worlds.md, "Why held-out answers fail"). A think
    that first copies the line naming the asked field teaches finding that line, in whatever
    layout a corpus writes it. So a quote must be the asked field's clause or nothing: left as
    they are are comparisons (their answer is a name, found in no field's clause), a turn whose
    retrieved evidence has no clause holding the whole answer the turn gives, and one whose
    evidence has several (Aluminium's 13 is its atomic number and its group) unless exactly one
    of them names the question's relation."""
    if row.get("type") == "comparison" or not text.startswith(_THINK):
        return text
    gold = normalize_answer(row["golden_answers"][0])   # the alias the turn answers with
    evidence = set(row["evidence"])
    found = _clauses_holding(gold, [p for p in hits if p.id in evidence])
    if len(found) > 1:
        words = {w for w in normalize_answer(str(row.get("relation") or "")).split() if len(w) > 2}
        found = [(title, c) for title, c in found if words & set(normalize_answer(c).split())]
    if len(found) != 1:
        return text
    title, clause = found[0]
    return f'{_THINK}The passage on {title} says "{clause}". {text[len(_THINK):]}'


def _clauses_holding(gold: str, passages: list[Passage]) -> list[tuple[str, str]]:
    """(title, clause) for each clause of the passages that holds `gold` as whole words. A clause
    with a tag-like "<" is skipped: the student reads passages with such text escaped."""
    if not gold:
        return []
    out = []
    for p in passages:
        title, _, body = p.contents.partition("\n")
        for clause in (c.strip() for c in _CLAUSE.findall(body)):
            if clause and "<" not in clause and f" {gold} " in f" {normalize_answer(clause)} ":
                out.append((title.strip().strip('"'), clause))
    return list(dict.fromkeys(out))


# --- the whole build ----------------------------------------------------------------------

def check_same_mixture(out: str | Path, weights: dict[str, float], worlds_dir: str | Path, held_out: str | None,
                       seed: int, train_size: int | None, eval_size: int | None, quote: bool = False) -> None:
    """An error unless the mixture in `out` is the one these arguments would make: the same settings,
    its files as its manifest lists them, mixed from the worlds under `worlds_dir` as they are now.
    A script that keeps a finished mixture must not keep another one, which runs trained on it would
    not show."""
    check_arguments(weights, held_out, seed, train_size, eval_size)
    out, worlds_dir = Path(out), Path(worlds_dir)
    weights = resolve_entries(weights, seed, worlds_dir)
    path = out / "manifest.json"
    manifest = _read_json(path)
    if manifest.get("kind") != "mixture":
        raise InputError(f"holds {manifest.get('kind') or 'something'}, not a mixture: mix into another --out", out)
    asked = {"held_out": held_out, "seed": seed, "train_size": train_size, "eval_size": eval_size}
    differ = [f"{k} {manifest.get(k)!r} (asked: {v!r})" for k, v in asked.items() if manifest.get(k) != v]
    made = manifest.get("weights")
    # weights are relative: 0.5/1 and 1/2 draw the same questions (the shares are equal to the last bit)
    if not isinstance(made, dict) or set(made) != set(weights) or shares(made) != shares(weights):
        differ.insert(0, f"weights {made!r} (asked: {weights!r})")
    if manifest.get("quote_evidence", False) != quote:   # the key is written only when on
        differ.append(f"quote_evidence {manifest.get('quote_evidence', False)!r} (asked: {quote!r})")
    if differ:
        raise InputError(f"holds another mixture: {'; '.join(differ)}. Remove the folder or mix into another --out",
                         path)
    if (changed := _changed_file(out, manifest)) is not None:
        raise InputError(f"does not match {path}: remove the folder and mix again", changed)
    worlds = {**manifest.get("worlds", {}), **({held_out: manifest.get("held_out_world")} if held_out else {})}
    for name, entry in worlds.items():
        own = worlds_dir / name / "manifest.json"
        if own.is_file() and _read_json(own).get("files") != (entry or {}).get("files"):
            raise InputError(f"was mixed from another build of world {name} than {own}: remove the folder and "
                             f"mix again", path)


def check_not_an_input(out: Path, worlds_dir: Path, names: list[str]) -> None:
    """Refuse an `out` that is (or holds) the folder of a world the mixture reads: the mixture would
    replace that world, and the next mix would read the mixture as the world. Or one inside that
    folder, which the world's build (before the mixture is written) may not have made yet; inside
    a built world, pipeline.check_outside_dataset refuses it."""
    where = out.resolve()
    for name in names:
        folder = (worlds_dir / name).resolve()
        if folder == where or where in folder.parents:
            raise InputError(f"is where the mixture reads world {name} from (--worlds-dir {worlds_dir}); "
                             "mix into another --out", out)
        if folder in where.parents:
            raise InputError(f"is inside {worlds_dir / name}, where the mixture reads world {name} from "
                             f"(--worlds-dir {worlds_dir}), and a rebuild of {name} replaces that folder whole; "
                             "mix into another --out", out)


def check_arguments(weights: dict[str, float], held_out: str | None, seed: int, train_size: int | None,
                    eval_size: int | None) -> None:
    """The mixture's arguments, checked before any world is read."""
    if held_out is not None:
        registry.get(held_out)
        mixed = [n for n in weights if split_entry(n)[0] == held_out]
        if mixed:
            raise InputError(f"--hold-out {held_out} is also given as --world {mixed[0]}: a held-out world gets "
                             f"no weight, at any seed")
    check_distinct(weights, seed)
    for label, size in (("--train-size", train_size), ("--eval-size", eval_size)):
        if size is not None and size < 1:
            raise InputError(f"{label} must be at least 1, got {size}")


def build_mixture(out: str | Path, weights: dict[str, float], worlds_dir: str | Path, held_out: str | None = None,
                  seed: int = 0, train_size: int | None = None, eval_size: int | None = None,
                  say: Callable[[str], None] = lambda msg: None, quote: bool = False) -> dict:
    """Write the mixture of `weights`' worlds (built under `worlds_dir`) into `out`; returns stats.json.
    `quote`: the oracle's answer turns quote the evidence's line that holds the answer
    (`quoted_answer_turn`; recorded in the manifest as quote_evidence).

    The files are written into a folder beside `out` and renamed onto it once complete, so a run
    stopped half way leaves the old mixture (or none), never new files under an old manifest."""
    out, worlds_dir = Path(out), Path(worlds_dir)
    check_arguments(weights, held_out, seed, train_size, eval_size)
    weights = resolve_entries(weights, seed, worlds_dir)
    check_replaceable(out)   # before any world is built or any file written
    check_not_an_input(out, worlds_dir, [*weights, *([held_out] if held_out else [])])
    names = sorted(weights)
    manifests = {n: ensure_world(n, worlds_dir / n, seed, say) for n in names}
    held_manifest = ensure_world(held_out, worlds_dir / held_out, seed, say) if held_out else None
    worlds = [read_world(n, worlds_dir / n, manifests[n]) for n in names]

    dropped: Counter[str] = Counter()
    pools = distinct_pools(worlds, dropped)
    share = shares(weights)
    rows: dict[str, list[dict]] = {}
    for split in SPLITS:
        size = train_size if split == "train" else eval_size
        counts = allocate(share, {n: len(pools[split][n]) for n in names}, size)
        check_split_size(split, size, sum(counts.values()))
        if split == "train":   # dev and test may lack a small world at a small --eval-size
            check_every_world_drawn(weights, counts, split)
        rows[split] = [mixed_row(n, r) for n, r in draw(pools[split], counts, seed, split)]

    corpus = [{**p, "id": f"{w.name}:{p['id']}"} for w in worlds for p in w.corpus]
    say(f"re-searching oracle trajectories on the union corpus ({len(corpus):,} passages)")
    oracle, tried = _oracles(rows["train"], worlds, corpus, dropped, quote)

    say(f"writing {out}")
    stats = _stats(seed, weights, share, held_out, worlds, corpus, rows, oracle, tried, dropped)
    with atomic_dir(out) as tmp:
        jsonio.write_jsonl(tmp / "corpus.jsonl", corpus)
        for split in SPLITS:
            jsonio.write_jsonl(tmp / f"{split}.jsonl", rows[split])
        jsonio.write_jsonl(tmp / "oracle.jsonl", oracle)
        jsonio.write_json(tmp / "stats.json", stats)
        manifest = _manifest(tmp, seed, weights, held_out, manifests, held_manifest, train_size, eval_size)
        if quote:   # only when on, so a mixture made without it stays byte-identical to earlier builds
            manifest = {**manifest, "quote_evidence": True}
        jsonio.write_json(tmp / "manifest.json", manifest)
    return stats


def _oracles(train: list[dict], worlds: list[WorldData], corpus: list[dict],
             dropped: Counter[str], quote: bool = False) -> tuple[list[dict], Counter[str]]:
    """Union-corpus trajectories of the train rows whose world has one; `tried` counts per world."""
    index = BM25Index(Passage(p["id"], p["contents"]) for p in corpus)
    by_world = {w.name: w.oracle for w in worlds}
    out, tried = [], Counter()
    for row in train:
        world, _, original = row["id"].partition(":")
        trajectory = by_world[world].get(original)
        if trajectory is None:
            continue  # the world's own build found no oracle for it (counted in its stats)
        tried[world] += 1
        resolved = resolved_oracle(row, trajectory, index, quote)
        if resolved is None:
            dropped["oracle_missed_in_union_corpus"] += 1
        else:
            out.append(resolved)
    return out, tried


def built_with(manifest: dict) -> dict:
    """The build options a world's manifest records (`{"size": 24, "oracle_search": "asked"}`; none for
    a default build, so a mixture of default builds stays byte for byte what it was before the options)."""
    return {k: manifest[k] for k in OPTIONS if k in manifest}


def _split_stats(rows: list[dict]) -> dict:
    def count(key: str) -> dict:
        return dict(sorted(Counter(str(r[key]) for r in rows).items()))

    return {"questions": len(rows), "worlds": len({r["world"] for r in rows}), "by_hops": count("hops"),
            "by_type": count("type"), "by_relation": count("relation"), "by_world": count("world")}


def _stats(seed, weights, share, held_out, worlds, corpus, rows, oracle, tried, dropped) -> dict:
    kept = Counter(r["id"].partition(":")[0] for r in oracle)
    per_world = {}
    for w in worlds:
        per_world[w.name] = {
            "weight": weights[w.name], "share": round(share[w.name], 4), "passages": len(w.corpus),
            **{s: sum(1 for r in rows[s] if r["world"] == w.name) for s in SPLITS},
            "oracle": kept[w.name], "oracle_hit_share": round(kept[w.name] / max(tried[w.name], 1), 4),
            **built_with(w.manifest)}
    total = sum(len(r) for r in rows.values())
    multi = sum(1 for r in rows.values() for q in r if q["hops"] > 1)
    return {"seed": seed, "kind": "mixture", "held_out": held_out, "worlds": per_world,
            "passages": len(corpus), "questions": total, "multi_hop_share": round(multi / max(total, 1), 4),
            "splits": {s: _split_stats(rows[s]) for s in SPLITS},
            "oracle_trajectories": len(oracle),
            "oracle_hit_share": round(len(oracle) / max(sum(tried.values()), 1), 4),
            "dropped": dict(sorted(dropped.items()))}


def _manifest(out: Path, seed, weights, held_out, manifests, held_manifest, train_size, eval_size) -> dict:
    def world_entry(manifest: dict) -> dict:
        return {"source": manifest.get("source"), "seed": manifest.get("seed"), **built_with(manifest),
                "files": manifest.get("files", {})}

    return {"kind": "mixture", "produced_by": f"dgpo-edge {__version__}", "seed": seed,
            "weights": {n: weights[n] for n in sorted(weights)}, "held_out": held_out,
            "train_size": train_size, "eval_size": eval_size,
            "worlds": {n: world_entry(manifests[n]) for n in sorted(manifests)},
            "held_out_world": world_entry(held_manifest) if held_manifest else None,
            "files": {name: jsonio.file_digest(out / name) for name in FILES}}
