"""Bundle and index integrity: every file the loader opens is listed, hashed and inside the bundle;
a same-size corruption is caught on the first open after it (verified digests cached)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from bundle_helpers import build_tiny_index, write_corpus
from cli_helpers import assert_one_line_error, invoke

from dgpo_edge import digests
from dgpo_edge.bundle import build_bundle, open_bundle, verify
from dgpo_edge.errors import InputError


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("idx")
    return build_tiny_index(write_corpus(d / "corpus.jsonl"), d / "index")


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "digests.json"
    monkeypatch.setenv(digests.ENV_CACHE, str(path))
    return path


@pytest.fixture()
def bundle(tmp_path: Path, index_dir: Path, cache: Path) -> Path:
    """A bundle of a transformers-style folder (never loaded here), the MiniLM index and its encoder."""
    d = tmp_path / "student"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    (d / "model.safetensors").write_bytes(os.urandom(4096))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (tmp_path / "student.parity.json").write_text(json.dumps({"passed": True}))
    return build_bundle(d, index_dir, tmp_path / "B").path


def edit_manifest(b: Path, change) -> None:
    m = json.loads((b / "manifest.json").read_text())
    change(m)
    (b / "manifest.json").write_text(json.dumps(m))


def refused(b: Path, *needles: str) -> None:
    """Both `bundle verify` and loading (`open_bundle`, `ask --bundle`) refuse, naming the problem."""
    assert_one_line_error(invoke("bundle", "verify", b), *needles)
    with pytest.raises(InputError) as e:
        open_bundle(b)
    assert all(n in str(e.value) for n in needles), str(e.value)
    assert_one_line_error(invoke("ask", "q", "--bundle", b), *needles)


def flip(path: Path, at: int = 200) -> None:
    """Change one byte in place: same size (mtime changes, as with any write)."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------- every opened file is listed

def test_a_model_file_left_out_of_the_manifest_then_altered_is_refused(bundle: Path):
    edit_manifest(bundle, lambda m: m["files"].pop("model/model.safetensors"))
    flip(bundle / "model" / "model.safetensors")
    refused(bundle, "model.safetensors", "not listed in the bundle manifest")


def test_a_gguf_model_path_must_be_listed(bundle: Path):
    def change(m):
        m["model"].update(format="gguf", path="model/model.safetensors")
        m["files"].pop("model/model.safetensors")
    edit_manifest(bundle, change)
    refused(bundle, "model.path names 'model/model.safetensors'", "do not list")


@pytest.mark.parametrize("key,value", [("encoder", "../student"), ("encoder", "/etc"),
                                       ("parity_file", "../student.parity.json"), ("parity_file", "/etc/passwd")])
def test_encoder_and_parity_paths_must_stay_inside(bundle: Path, key: str, value: str):
    def change(m):
        if key == "encoder":
            m["encoder"]["path"] = value
        else:
            m["model"]["parity_file"] = value
    edit_manifest(bundle, change)
    refused(bundle, "not a path inside the bundle", repr(value))


def test_a_parity_file_not_listed_is_refused(bundle: Path):
    edit_manifest(bundle, lambda m: m["files"].pop("model/student.parity.json"))
    refused(bundle, "model.parity_file", "do not list")


def test_an_unlisted_file_beside_the_store_is_refused(bundle: Path):
    (bundle / "index" / "store.sqlite-wal").write_bytes(b"\0" * 64)  # SQLite would read it
    refused(bundle, "store.sqlite-wal", "not listed")


def test_links_out_of_the_bundle_are_refused(bundle: Path, tmp_path: Path):
    store = bundle / "index" / "store.sqlite"
    outside = tmp_path / "elsewhere.sqlite"
    shutil.copyfile(store, outside)          # identical bytes: only the link gives it away
    store.unlink()
    store.symlink_to(outside)
    refused(bundle, "link out of the bundle", "store.sqlite")


def test_a_linked_encoder_folder_is_refused(bundle: Path, tmp_path: Path):
    enc = bundle / "encoder"
    shutil.copytree(enc, tmp_path / "enc-copy")
    shutil.rmtree(enc)
    enc.symlink_to(tmp_path / "enc-copy", target_is_directory=True)
    refused(bundle, "link out of the bundle")


def test_a_link_inside_the_bundle_is_fine(bundle: Path):
    parity = bundle / "model" / "student.parity.json"
    (bundle / "data").mkdir()
    shutil.move(parity, bundle / "data" / "p.json")
    parity.symlink_to(bundle / "data" / "p.json")
    edit_manifest(bundle, lambda m: m["files"].update({"data/p.json": m["files"]["model/student.parity.json"]}))
    assert verify(bundle).path == bundle and open_bundle(bundle).path == bundle


# --------------------------------------------------------------------------- same-size corruption

@pytest.mark.parametrize("target", ["index/vectors.faiss", "model/model.safetensors"])
def test_a_same_size_corruption_is_caught_when_loading(bundle: Path, target: str):
    open_bundle(bundle)
    flip(bundle / target)
    refused(bundle, target.split("/")[-1], "sha256 does not match")


def test_loading_hashes_only_what_changed_since_it_was_verified(bundle: Path, cache: Path, monkeypatch):
    hashed: list[str] = []
    real = digests.file_digest
    monkeypatch.setattr(digests, "file_digest", lambda p: hashed.append(Path(p).name) or real(p))
    open_bundle(bundle)   # build_bundle recorded every digest: nothing to hash
    assert hashed == [] and cache.is_file()
    os.utime(bundle / "index" / "vectors.faiss")   # touched (same bytes): hashed once more, then remembered
    open_bundle(bundle)
    open_bundle(bundle)
    assert hashed == ["vectors.faiss"]
    cache.unlink()        # safe to delete: the next open hashes everything again
    open_bundle(bundle)
    assert len(hashed) == 1 + len(json.loads((bundle / "manifest.json").read_text())["files"])
    cache.write_text("{not json")   # damaged: ignored, rewritten
    open_bundle(bundle)
    assert json.loads(cache.read_text())


def test_an_index_with_a_same_size_corrupt_vectors_file_is_refused_on_open(index_dir: Path, tmp_path: Path,
                                                                          cache: Path):
    from dgpo_edge.retrieval.retrievers import open_index

    idx = tmp_path / "idx"
    shutil.copytree(index_dir, idx)
    with open_index(idx):
        pass
    flip(idx / "vectors.faiss", at=-200)
    with pytest.raises(InputError, match="corrupt: its sha256 does not match"):
        open_index(idx)
    assert_one_line_error(invoke("index", "search", idx, "capital of Peru"), "vectors.faiss", "corrupt")


def test_the_digest_cache_lives_in_the_default_bundles_cache_folder(monkeypatch, tmp_path: Path):
    from dgpo_edge.bundle import cache_root

    monkeypatch.delenv(digests.ENV_CACHE, raising=False)
    for xdg in (str(tmp_path), "relative/ignored", ""):
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert digests.cache_path() == cache_root() / "verified-digests.json"
