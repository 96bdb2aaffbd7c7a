"""Bundles: assembly, manifest, cheap and full verification, the CLI, the default bundle, load_agent."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from bundle_helpers import build_tiny_index, smollm2_gguf, write_corpus
from cli_helpers import assert_one_line_error, invoke

from dgpo_edge.bundle import (ENV_CORPUS, build_bundle, default_bundle_dir, ensure_default_bundle, load_agent,
                              open_bundle, verify)
from dgpo_edge.bundle.core import MANIFEST, protocol_config
from dgpo_edge.errors import InputError
from dgpo_edge.protocol import PROMPT_TEMPLATE, ProtocolConfig

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}" \
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("idx")
    return build_tiny_index(write_corpus(d / "corpus.jsonl"), d / "index")


@pytest.fixture()
def hf_model(tmp_path: Path) -> Path:
    """A transformers-style folder (never loaded here): config, weights bytes, tokenizer config."""
    d = tmp_path / "student"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    (d / "model.safetensors").write_bytes(os.urandom(4096))
    (d / "tokenizer.json").write_text("{}")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "eos_token": "<|im_end|>"}))
    (tmp_path / "student.parity.json").write_text(json.dumps({"passed": True, "top1_agreement": 0.98}))
    return d


def test_build_bundle_layout_and_manifest(tmp_path: Path, hf_model: Path, index_dir: Path):
    cfg = ProtocolConfig(top_k=5, max_searches=2, max_turn_tokens=300)
    b = build_bundle(hf_model, index_dir, tmp_path / "B", config=cfg)
    m = b.manifest
    assert m["format"] == "dgpo-edge-bundle" and m["format_version"] == 1
    assert m["model"]["format"] == "transformers" and m["model"]["path"] == "model"
    assert m["model"]["chat_template"] == TEMPLATE
    assert m["parity"] == {"passed": True, "top1_agreement": 0.98}       # the *.parity.json beside the model
    assert m["index"]["kind"] == "flat" and m["index"]["count"] == 12
    assert m["encoder"]["format"] == "minilm-int8-onnx"
    assert m["protocol"] == {"template": "search-r1", "prompt_template": PROMPT_TEMPLATE, "top_k": 5,
                             "max_searches": 2, "max_turn_tokens": 300, "max_obs_tokens": 500,
                             "max_total_tokens": 4096, "stop": ["</search>", "</answer>"]}
    assert {"dgpo-edge", "python"} <= set(m["versions"])
    files = set(m["files"])
    assert {"model/config.json", "model/model.safetensors", "model/student.parity.json", "index/manifest.json",
            "index/store.sqlite", "index/vectors.faiss", "encoder/model.onnx", "encoder/tokenizer.json"} <= files
    for name, entry in m["files"].items():
        assert (b.path / name).stat().st_size == entry["bytes"] and len(entry["sha256"]) == 64
    assert not (tmp_path / "B.partial").exists()
    assert b.protocol() == cfg and b.protocol(top_k=1).top_k == 1
    assert verify(b.path).manifest == m


def test_bundle_refuses_to_overwrite(tmp_path: Path, hf_model: Path, index_dir: Path):
    build_bundle(hf_model, index_dir, tmp_path / "B")
    with pytest.raises(InputError, match="already exists"):
        build_bundle(hf_model, index_dir, tmp_path / "B")
    b = build_bundle(hf_model, index_dir, tmp_path / "B", config=ProtocolConfig(top_k=1), overwrite=True)
    assert b.manifest["protocol"]["top_k"] == 1


def test_out_dot_builds_into_the_empty_current_folder(tmp_path: Path, hf_model: Path, index_dir: Path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = here.stat().st_ino
    b = build_bundle(hf_model, index_dir, ".")
    assert b.path == here and verify(here).manifest == b.manifest
    assert here.stat().st_ino == inode   # filled, not deleted and made anew: a shell in it stays in it
    assert not (tmp_path / "here.partial").exists()


def test_a_partial_folder_the_tool_did_not_make_is_refused(tmp_path: Path, hf_model: Path, index_dir: Path):
    """B.partial is where a build assembles B (a rerun after a crash reuses it): someone's folder of
    that name is refused, not taken into the bundle."""
    theirs = tmp_path / "B.partial"
    theirs.mkdir()
    (theirs / "diary.md").write_text("mine\n")
    with pytest.raises(InputError, match="did not make this folder"):
        build_bundle(hf_model, index_dir, tmp_path / "B")
    assert [p.name for p in theirs.iterdir()] == ["diary.md"] and not (tmp_path / "B").exists()
    (theirs / "diary.md").unlink()
    (theirs / "manifest.json").write_text(json.dumps({"format": "dgpo-edge-bundle"}))  # a finished one: reused
    build_bundle(hf_model, index_dir, tmp_path / "B")
    shutil.rmtree(tmp_path / "B")
    theirs.mkdir()   # empty: adopted, and gone once the bundle is in place
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    assert not theirs.exists() and not (b.path / ".dgpo-edge-partial").exists()
    verify(b.path)


def test_a_rerun_with_other_inputs_keeps_nothing_of_the_crashed_build(tmp_path: Path, hf_model: Path,
                                                                      index_dir: Path):
    """A build that crashed left another model's files in B.partial; the rerun with this model
    listed them in the manifest too (a GGUF beside this model, an index file the index lacks)."""
    from dgpo_edge.bundle.core import claim_partial

    work = claim_partial(tmp_path / "B.partial")
    (work / "model").mkdir()
    (work / "model" / "older.gguf").write_bytes(b"GGUF" + os.urandom(64))
    (work / "index").mkdir()
    (work / "index" / "ivfpq.faiss").write_bytes(os.urandom(64))
    (work / "manifest.json").write_text("{}")   # died while finishing: rewritten
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    assert not any("older.gguf" in n or "ivfpq.faiss" in n for n in b.manifest["files"]), b.manifest["files"]
    assert not (b.path / "model" / "older.gguf").exists() and not (b.path / "index" / "ivfpq.faiss").exists()
    assert sorted(b.manifest["files"]) == sorted(
        build_bundle(hf_model, index_dir, tmp_path / "fresh").manifest["files"])
    verify(b.path)


def test_a_rerun_drops_the_folders_its_cleanup_emptied(tmp_path: Path, hf_model: Path, index_dir: Path):
    """drop_unplaced deleted a crashed build's files but kept their folders: the bundle carried an
    empty model/shards/deep and data/."""
    from dgpo_edge.bundle.core import claim_partial

    work = claim_partial(tmp_path / "B.partial")
    (work / "model" / "shards" / "deep").mkdir(parents=True)
    (work / "model" / "shards" / "deep" / "part-2.safetensors").write_bytes(os.urandom(64))
    (work / "data").mkdir()
    (work / "data" / "dev.jsonl").write_text("{}\n")
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    assert not (b.path / "model" / "shards").exists() and not (b.path / "data").exists()
    assert (b.path / "model").is_dir() and (b.path / "index").is_dir()
    verify(b.path)


def test_drop_unplaced_removes_only_the_folders_it_emptied(tmp_path: Path):
    from dgpo_edge.bundle.core import drop_unplaced

    work = tmp_path / "w"
    for name in ("a/b/c/x", "a/y", "h/z", "h/.tmp", "e/f/z"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(name)
    (work / "empty-before").mkdir()
    drop_unplaced(work, {work / "a" / "y"})
    left = sorted(p.relative_to(work).as_posix() for p in work.rglob("*"))
    # a/b/c and a/b emptied, e/f and then e too; a keeps a placed file, h a hidden one
    assert left == ["a", "a/y", "empty-before", "h", "h/.tmp"]


def _e5_index(index_dir: Path, tmp_path: Path) -> Path:
    """A copy of the index whose manifest says it was built with e5 (so --encoder is needed)."""
    e5 = shutil.copytree(index_dir, tmp_path / "e5-index")
    m = json.loads((e5 / "manifest.json").read_text())
    m["encoder"]["name"] = "e5-base-v2"
    (e5 / "manifest.json").write_text(json.dumps(m))
    return e5


def test_a_refused_build_leaves_no_partial_folder(tmp_path: Path, hf_model: Path, index_dir: Path):
    """Bad input found while B.partial was filled (no --encoder for an e5 index, a notes folder as
    --encoder, a missing model, a GGUF llama.cpp cannot read) left B.partial behind, with a copy
    of the model in it; a notes folder given as --encoder was even bundled as the query encoder."""
    e5 = _e5_index(index_dir, tmp_path)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("mine\n")
    bad_gguf = tmp_path / "bad.gguf"
    bad_gguf.write_bytes(b"GGUF" + bytes(60))
    out = tmp_path / "B"
    cases = [(["--model", hf_model, "--index", e5], "pass --encoder DIR"),
             (["--model", hf_model, "--index", e5, "--encoder", notes], "transformers model folder"),
             (["--model", tmp_path / "nope", "--index", index_dir], "no such model"),
             (["--model", hf_model, "--index", tmp_path / "nope"], "no such index folder")]
    if importlib.util.find_spec("llama_cpp") is not None:
        cases.append((["--model", bad_gguf, "--index", index_dir], "llama.cpp cannot read"))
    for args, needle in cases:
        assert_one_line_error(invoke("export", "bundle", *args, "--out", out), needle)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf", "e5-index", "notes", "student",
                                                               "student.parity.json"], needle


@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("holds", ["notes", "index"])
def test_overwrite_never_replaces_a_folder_that_is_not_a_bundle(tmp_path: Path, hf_model: Path, index_dir: Path,
                                                                holds: str, overwrite: bool):
    """The wrong --out (a person's notes, the index itself), with --overwrite or without: refused,
    nothing written, and no hint that --overwrite would replace it."""
    if holds == "notes":
        out = tmp_path / "notes"
        out.mkdir()
        (out / "todo.md").write_text("buy milk\n")
    else:
        out = index_dir   # a dgpo-edge folder with a manifest.json, but no bundle
    before = sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file())
    with pytest.raises(InputError, match="is not a bundle; refusing to replace it"):
        build_bundle(hf_model, index_dir, out, overwrite=overwrite)
    assert sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file()) == before
    assert not out.with_name(out.name + ".partial").exists()


def test_a_bundle_is_replaced_only_with_overwrite(tmp_path: Path, hf_model: Path, index_dir: Path):
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    with pytest.raises(InputError, match="a bundle already exists here; pass --overwrite to replace it"):
        build_bundle(hf_model, index_dir, b.path)
    verify(build_bundle(hf_model, index_dir, b.path, overwrite=True).path)
    # a file someone put in it: --overwrite replaced the bundle whole and deleted it
    (b.path / "notes.txt").write_text("what I asked it\n")
    with pytest.raises(InputError, match=r"holds files its manifest does not list \(notes.txt\)"):
        build_bundle(hf_model, index_dir, b.path, overwrite=True)
    assert (b.path / "notes.txt").is_file()


@pytest.mark.parametrize("damage,word", [("truncate", "truncated"), ("flip", "changed"), ("remove", "missing"),
                                         ("grow", "changed")])
def test_verify_detects_damage(tmp_path: Path, hf_model: Path, index_dir: Path, damage: str, word: str):
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    target = b.path / "index" / "store.sqlite"
    data = target.read_bytes()
    if damage == "truncate":
        target.write_bytes(data[:-100])
    elif damage == "flip":
        target.write_bytes(data[:50] + bytes([data[50] ^ 1]) + data[51:])
    elif damage == "remove":
        target.unlink()
    else:
        target.write_bytes(data + b"x")
    with pytest.raises(InputError, match=word):
        verify(b.path)
    result = invoke("bundle", "verify", b.path)
    line = assert_one_line_error(result, word, "store.sqlite")
    assert str(target) in line
    # loading catches it too: a same-size change is hashed on the first open after it
    with pytest.raises(InputError, match=word):
        open_bundle(b.path)


def test_bundle_cli_info_and_verify(tmp_path: Path, hf_model: Path, index_dir: Path):
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    r = invoke("bundle", "verify", b.path)
    assert r.exit_code == 0 and "ok:" in r.flat and "match the manifest" in r.flat
    r = invoke("bundle", "info", b.path)
    assert r.exit_code == 0, r.output
    assert "transformers: model" in r.flat and "flat, 12 passages" in r.flat and "top-k 3" in r.flat
    assert "top1_agreement" in r.flat
    r = invoke("bundle", "info", b.path, "--json")
    assert json.loads(r.stdout)["index"]["count"] == 12


def test_a_bundle_written_with_the_old_max_turns_key_still_loads(tmp_path: Path, hf_model: Path, index_dir: Path):
    """Bundles made before the rename hold `protocol.max_turns`; they open with the same limits."""
    b = build_bundle(hf_model, index_dir, tmp_path / "B", config=ProtocolConfig(max_searches=2))
    manifest = json.loads((b.path / MANIFEST).read_text())
    manifest["protocol"]["max_turns"] = manifest["protocol"].pop("max_searches")
    (b.path / MANIFEST).write_text(json.dumps(manifest))
    old = open_bundle(b.path)
    assert "max_searches" not in old.manifest["protocol"]
    assert old.protocol() == ProtocolConfig(max_searches=2) and old.protocol(max_searches=0).max_searches == 0
    r = invoke("bundle", "info", b.path)
    assert r.exit_code == 0 and "max searches 2" in r.flat, r.output


@pytest.mark.parametrize("edit, needle", [
    (lambda m: m.update(protocol="x"), '"protocol" must be an object or null'),
    (lambda m: m.update(versions="x"), '"versions" must be an object or null'),
    (lambda m: m.update(source=["x"]), '"source" must be an object or null'),
    (lambda m: m["index"].update(count="12"), '"index.count" must be an integer'),
    (lambda m: m["model"].pop("format"), '"model.format" must be a string'),
])
def test_a_manifest_of_the_wrong_shape_is_one_error_line_everywhere(tmp_path: Path, hf_model: Path,
                                                                   index_dir: Path, edit, needle):
    """Valid JSON of the wrong shape (a manifest edited by hand): `bundle verify` said ok, and
    `bundle info` and `ask` died on it with a traceback."""
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    manifest = json.loads((b.path / MANIFEST).read_text())
    edit(manifest)
    (b.path / MANIFEST).write_text(json.dumps(manifest))
    for args in (("bundle", "verify", b.path), ("bundle", "info", b.path), ("ask", "q", "--bundle", b.path)):
        assert_one_line_error(invoke(*args), str(b.path / MANIFEST), needle)


def test_bad_protocol_settings_name_the_manifest(tmp_path: Path, hf_model: Path, index_dir: Path):
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    manifest = json.loads((b.path / MANIFEST).read_text())
    manifest["protocol"]["top_k"] = "abc"
    (b.path / MANIFEST).write_text(json.dumps(manifest))
    assert_one_line_error(invoke("ask", "q", "--bundle", b.path), str(b.path / MANIFEST), "bad protocol settings")


@pytest.mark.parametrize("key, value", [("top_k", 0), ("top_k", -3), ("top_k", True), ("top_k", 10**9),
                                        ("top_k", 2.5), ("top_k", None), ("max_searches", 17),
                                        ("max_searches", False), ("max_turns", -1)])
def test_search_settings_out_of_range_name_the_manifest_everywhere(tmp_path: Path, hf_model: Path,
                                                                 index_dir: Path, key, value):
    """A manifest's top_k was read with int(): true became 1, and 2.5 became 2, and a billion passed
    into the agent's settings; `bundle verify` and `bundle info` passed 0 and -3 too."""
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    manifest = json.loads((b.path / MANIFEST).read_text())
    if key == "max_turns":   # older bundles' key, alone
        manifest["protocol"].pop("max_searches")
    manifest["protocol"][key] = value
    (b.path / MANIFEST).write_text(json.dumps(manifest))
    for args in (("bundle", "verify", b.path), ("bundle", "info", b.path), ("ask", "q", "--bundle", b.path)):
        assert_one_line_error(invoke(*args), str(b.path / MANIFEST), f'"protocol.{key}" must be an integer in')
    with pytest.raises(InputError, match=f'protocol.{key}'):
        open_bundle(b.path)


def test_bundle_verify_json(tmp_path: Path, hf_model: Path, index_dir: Path):
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    r = invoke("bundle", "verify", b.path, "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)   # nothing but the JSON on stdout: the bar is on stderr
    assert obj == {"ok": True, "path": str(b.path), "files": len(b.manifest["files"]), "bytes": b.total_bytes}
    (b.path / "index" / "store.sqlite").write_bytes(b"x")
    assert_one_line_error(invoke("bundle", "verify", b.path, "--json"), "store.sqlite")


FULL_PARITY = {"tokenizer_match": True, "n_texts": 12, "max_abs_logit_diff": 0.031, "rel_logit_diff": 0.004,
               "n_tokens": 640, "logit_tolerance": 0.05, "top1_agreement": 0.9953, "top1_floor": 0.99,
               "greedy_match": 32, "greedy_n": 32, "passed": True}


def test_bundle_info_shows_parity_as_rows(tmp_path: Path, hf_model: Path, index_dir: Path):
    (hf_model.parent / "student.parity.json").write_text(json.dumps(FULL_PARITY))
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    r = invoke("bundle", "info", b.path)
    assert r.exit_code == 0, r.output
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in r.plain.splitlines()
            if line.count("│") >= 3 and "parity" in line.split("│")[1]}
    assert rows["parity"] == "passed"
    assert rows["parity tokenizer"] == "identical on 12 texts"
    assert rows["parity greedy top-1 agreement"] == "99.53% (floor 99%)"
    assert rows["parity greedy generation"] == "32/32 leading tokens identical"
    assert "{" not in r.plain   # no raw JSON
    # the model row counts the model's own bytes, not the parity JSON bundled beside it
    own = sum(f.stat().st_size for f in hf_model.iterdir())
    assert f"({own:,} bytes)" in r.flat, r.plain


def test_bundle_info_shows_a_shared_bundles_manifest_as_plain_text(tmp_path: Path, hf_model: Path, index_dir: Path):
    """A bundle from someone else: its manifest's strings were read as Rich markup ("[/]" made
    `bundle info` fail) and kept their terminal escapes."""
    b = build_bundle(hf_model, index_dir, tmp_path / "B")
    m = json.loads((b.path / "manifest.json").read_text())
    m["produced_by"] = "[bold]tool[/] \x1b]0;pwned\x07v1"
    (b.path / "manifest.json").write_text(json.dumps(m))
    r = invoke("bundle", "info", b.path)
    assert r.exit_code == 0, r.output
    assert "by [bold]tool[/] v1" in r.flat and "\x1b]0" not in r.output


def test_gpu_layers_recorded_in_the_bundle_and_used_as_the_default(tmp_path: Path, hf_model: Path,
                                                                   index_dir: Path, monkeypatch):
    import dgpo_edge.engines
    from engine_fakes import ScriptedEngine

    seen: list[dict] = []

    def fake_open_engine(path, n_ctx=4096, threads=None, **kw):
        seen.append(kw)
        return ScriptedEngine([], n_ctx=n_ctx)

    monkeypatch.setattr(dgpo_edge.engines, "open_engine", fake_open_engine)
    gguf = smollm2_gguf()   # bundling a GGUF reads its chat template in llama.cpp
    r = invoke("export", "bundle", "--model", gguf, "--index", index_dir, "--out", tmp_path / "B", "--gpu-layers", 12)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "B" / MANIFEST).read_text())["runtime"] == {"gpu_layers": 12}
    with load_agent(bundle=tmp_path / "B", progress=False) as agent:
        assert seen[-1] == {"n_gpu_layers": 12} and agent.info["gpu_layers"] == 12
    with load_agent(bundle=tmp_path / "B", progress=False, gpu_layers=0):
        assert seen[-1] == {"n_gpu_layers": 0}   # --gpu-layers overrides the bundle
    with load_agent(model=gguf, index=index_dir, progress=False):   # no bundle: no offload
        assert seen[-1] == {"n_gpu_layers": 0}
    with load_agent(bundle=tmp_path / "B", model=hf_model, progress=False):
        assert seen[-1] == {}   # the bundle's default is for its own GGUF, not a --model replacing it
    with pytest.raises(InputError, match="GGUF models"):   # other engines have no such option
        load_agent(bundle=tmp_path / "B", model=hf_model, progress=False, gpu_layers=4)
    with pytest.raises(InputError, match=">= -1"):
        load_agent(bundle=tmp_path / "B", progress=False, gpu_layers=-2)


def test_bad_bundles(tmp_path: Path):
    assert_one_line_error(invoke("bundle", "verify", tmp_path / "nope"), "no such bundle folder")
    assert_one_line_error(invoke("bundle", "verify", tmp_path), "not a bundle: no manifest.json")
    (tmp_path / MANIFEST).write_text("{not json")
    assert_one_line_error(invoke("bundle", "info", tmp_path), "malformed bundle manifest")
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "dgpo-edge-bundle", "format_version": 1,
                                                "model": {"path": "m"}, "index": {"path": "i"},
                                                "files": {"../etc/passwd": {"bytes": 1, "sha256": "x"}}}))
    assert_one_line_error(invoke("bundle", "verify", tmp_path), "not a path inside the bundle")
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "dgpo-edge-bundle", "format_version": 99}))
    assert_one_line_error(invoke("bundle", "info", tmp_path), "format version 99")


def test_export_bundle_command(tmp_path: Path, hf_model: Path, index_dir: Path):
    from dgpo_edge.cli.export_bundle import bundle_command
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(bundle_command)
    r = CliRunner().invoke(app, ["--model", str(hf_model), "--index", str(index_dir), "--out", str(tmp_path / "B"),
                                 "--top-k", "2", "--max-searches", "3"])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "B" / MANIFEST).read_text())
    assert m["protocol"]["top_k"] == 2 and m["protocol"]["max_searches"] == 3
    r = CliRunner().invoke(app, ["--model", str(hf_model), "--index", str(index_dir), "--out", str(tmp_path / "B"),
                                 "--max-turns", "1", "--overwrite"])   # the old spelling, hidden, still works
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "B" / MANIFEST).read_text())["protocol"]["max_searches"] == 1
    r = CliRunner().invoke(app, ["--model", str(tmp_path / "missing"), "--index", str(index_dir), "--out",
                                 str(tmp_path / "C")])
    assert r.exit_code == 2 and "no such model" in r.output
    assert not (tmp_path / "C").exists()
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("mine\n")
    r = CliRunner().invoke(app, ["--model", str(hf_model), "--index", str(index_dir), "--out", str(notes), "--overwrite"])
    assert r.exit_code == 2 and "is not a bundle" in r.output
    assert [p.name for p in notes.iterdir()] == ["a.md"]


def test_export_bundle_is_registered():
    r = invoke("export", "bundle", "--help")
    assert r.exit_code == 0 and "--index" in r.flat


def test_protocol_config_from_manifest():
    assert protocol_config(None) == ProtocolConfig()
    assert protocol_config({"top_k": 5, "max_searches": 1}, max_searches=3) == ProtocolConfig(top_k=5, max_searches=3)
    assert protocol_config({"max_searches": 1}) == ProtocolConfig(max_searches=1)
    assert protocol_config({"max_turns": 2}) == ProtocolConfig(max_searches=2)   # older bundles' key
    assert protocol_config({"max_searches": 1, "max_turns": 2}).max_searches == 1
    with pytest.raises(InputError):
        protocol_config({"top_k": 0})


# --- the default bundle and load_agent (the real SmolLM2 GGUF through llama.cpp) ------------------------

@pytest.fixture()
def cache(tmp_path: Path, monkeypatch) -> Path:
    """The default bundle of the base SmolLM2 over a tiny corpus (the shipped student has its own tests,
    test_student_bundle.py)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("DGPO_EDGE_STUDENT", "none")
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    monkeypatch.setenv(ENV_CORPUS, str(corpus))
    return tmp_path / "cache"


def test_default_bundle_builds_once_in_the_xdg_cache(cache: Path):
    gguf = smollm2_gguf()
    stages = []
    b = ensure_default_bundle(progress=lambda stage, done, total: stages.append(stage))
    assert b.path == default_bundle_dir() == cache / "dgpo-edge" / "default-bundle"
    assert {"store", "embed", "model", "index", "hash"} <= set(stages)
    m = b.manifest
    assert m["model"]["format"] == "gguf" and m["model"]["path"] == f"model/{gguf.name}"
    assert "<|im_start|>" in m["model"]["chat_template"]
    assert m["index"]["count"] == 12 and m["source"]["corpus"] == os.environ[ENV_CORPUS]
    assert not (cache / "dgpo-edge" / "default-bundle.build").exists()
    assert not (cache / "dgpo-edge" / "default-bundle.partial").exists()
    verify(b.path)
    stages.clear()
    assert ensure_default_bundle(progress=lambda *a: stages.append(a)).path == b.path and stages == []
    # damaged: rebuilt
    (b.path / "index" / "store.sqlite").write_bytes(b"")
    stages.clear()
    b2 = ensure_default_bundle(progress=lambda stage, done, total: stages.append(stage))
    assert stages and verify(b2.path)
    # damaged past reading its manifest: the cache's own folder is still rebuilt (what --overwrite
    # refuses to replace in a folder the user names)
    (b2.path / "manifest.json").write_text("{")
    # and a B.partial an older version left after a crash, without the marker this one writes
    stale = b2.path.with_name("default-bundle.partial")
    stale.mkdir()
    (stale / "model").mkdir()
    stages.clear()
    b3 = ensure_default_bundle(progress=lambda stage, done, total: stages.append(stage))
    assert stages and verify(b3.path) and not stale.exists()
    r = invoke("bundle", "info")
    assert r.exit_code == 0 and "gguf" in r.flat and "12 passages" in r.flat


def test_bundle_info_before_the_default_bundle_exists(cache: Path):
    r = invoke("bundle", "info")
    assert r.exit_code == 0 and "not built yet" in r.flat


def test_load_agent_from_default_bundle_and_from_an_index(cache: Path, index_dir: Path):
    smollm2_gguf()
    with load_agent(progress=False, top_k=2, max_searches=1, threads=1) as agent:
        assert agent.config.top_k == 2 and agent.config.max_searches == 1
        assert agent.info["bundle"] == str(default_bundle_dir()) and agent.info["engine"] == "llama.cpp"
        assert agent.engine.n_ctx == 4096
        r = agent.answer("What is the capital of Peru?")
        assert r.transcript.prompt.startswith("<|im_start|>system") and r.timings.new_tokens > 0
    # only an index: the default model, no bundle built
    os.environ.pop(ENV_CORPUS)
    with load_agent(index=index_dir, progress=False) as agent:
        assert agent.info["bundle"] is None and agent.info["model_from"] == "default model"
        assert agent.retriever.search(["capital of Kenya"], k=1)[0][0].title == "Kenya"
    with pytest.raises(InputError, match="no such index folder"):
        load_agent(index=cache / "nope", progress=False)


def test_a_bundle_given_as_an_index_is_named_as_a_bundle(tmp_path: Path, hf_model: Path, index_dir: Path):
    """`--index B` (a bundle) said "B/manifest.json: unknown index kind None: expected one of ...";
    it now says what B is and what to give instead."""
    b = build_bundle(hf_model, index_dir, tmp_path / "B").path
    for args in (["index", "info", b], ["index", "search", b, "Kenya"], ["ask", "capital of Kenya?", "--index", b]):
        assert_one_line_error(invoke(*args), f"{b}: is a bundle, not an index folder", "--bundle",
                              str(b / "index"))


def test_an_encoder_that_cannot_embed_the_index_queries_is_refused(tmp_path: Path, hf_model: Path, index_dir: Path):
    """A language model given as --encoder was bundled as the query encoder: `bundle verify` passed
    and the first question failed. An encoder of another width, and any --encoder for a BM25 index
    (copied in and never used), are refused too; nothing is left behind."""
    e5 = _e5_index(index_dir, tmp_path)
    narrow = tmp_path / "narrow"
    narrow.mkdir()
    (narrow / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "hidden_size": 64}))
    bm25 = tmp_path / "bm25"
    assert invoke("index", "build", index_dir.parent / "corpus.jsonl", "--kind", "bm25", "--out", bm25).exit_code == 0
    out = tmp_path / "B"
    for index, encoder, needle in ((e5, hf_model, "is a language model (Qwen2ForCausalLM)"),
                                   (e5, narrow, "embeds in 64 dimensions, but the index's vectors have 384"),
                                   (bm25, narrow, "this index is BM25")):
        assert_one_line_error(invoke("export", "bundle", "--model", hf_model, "--index", index, "--encoder", encoder,
                                     "--out", out), needle)
        assert not out.exists() and not (tmp_path / "B.partial").exists()


def test_token_limits_that_leave_no_room_are_refused(tmp_path: Path, hf_model: Path, index_dir: Path):
    """--max-turn-tokens 5000 with --max-total-tokens 100 made a bundle whose every answer ran out of
    tokens before the first turn ended."""
    out = tmp_path / "B"
    for args, needle in ((["--max-turn-tokens", 5000, "--max-total-tokens", 100], "--max-turn-tokens 5000 must be below"),
                         (["--max-obs-tokens", 4096], "--max-obs-tokens 4096 must be below --max-total-tokens 4096")):
        assert_one_line_error(invoke("export", "bundle", "--model", hf_model, "--index", index_dir, "--out", out, *args),
                              needle)
        assert not out.exists()
