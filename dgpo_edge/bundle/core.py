"""Bundle layout, manifest, assembly and verification.

A bundle is one folder that runs offline:

```
B/
  manifest.json          what is here, with the sha256 and size of every file
  model/                 a .gguf file, or an ONNX (genai_config.json) or transformers folder's files;
                         a `*.parity.json` beside the source model is copied here too
  index/                 an index folder as `dgpo-edge index build` writes it (manifest.json,
                         store.sqlite, vectors.faiss)
  encoder/               the query encoder of a dense MiniLM index: model.onnx (int8) + tokenizer.json;
                         a transformers encoder folder for other dense indexes; absent for BM25
  data/                  optional question files (the default bundle keeps FactbookQA dev and test)
```

`manifest.json`:

| key | content |
|---|---|
| `format`, `format_version` | "dgpo-edge-bundle", 1 |
| `created`, `produced_by`, `versions` | when, which dgpo-edge, and the versions of the libraries that wrote it |
| `model` | `format` (gguf / onnx / transformers), `path` (relative), `source`, `chat_template` |
| `parity` | the export's parity results (`*.parity.json` beside the model), or null |
| `index` | `path`, `kind`, `count`, `encoder` (the index's EncoderSpec) |
| `encoder` | `format` (minilm-int8-onnx / transformers), `path`, or null for BM25 |
| `protocol` | `template` ("search-r1"), `prompt_template` (the instruction text), `top_k`, `max_searches` (searches before the final, search-free turn: Search-R1's max_turns; older bundles call it `max_turns`, still read), `max_turn_tokens`, `max_obs_tokens`, `max_total_tokens`, `stop` |
| `runtime` | `gpu_layers`: layers llama.cpp offloads to a GPU unless `--gpu-layers` says otherwise (0 none, -1 all) |
| `files` | {relative path: {bytes, sha256}} for every file but manifest.json |

Loading a bundle checks its layout (every file the loader opens is listed and
inside the bundle: `integrity.py`) and sizes (cheap: catches truncation and
partial copies), and hashes each file changed since it was last verified
(`dgpo_edge.digests`); `verify(bundle)` reads every byte and compares hashes.
Bundles are assembled in `B.partial/` and renamed into place, so a bundle
folder with a manifest is always complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import __version__, digests, protocol
from ..errors import InputError
from ..jsonio import BUNDLE_FORMAT, check_replaceable, file_digest, replace_dir, settle, visible_files, write_json
from ..protocol import ProtocolConfig
from .integrity import check_layout

FORMAT = BUNDLE_FORMAT
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PARITY_SUFFIX = ".parity.json"
#: What the manifest's `protocol.max_searches` was called before (Search-R1's name): still read.
OLD_MAX_SEARCHES_KEY = "max_turns"

#: Distributions whose versions a manifest records when installed.
VERSIONED = ("llama-cpp-python", "onnxruntime", "onnxruntime-genai", "faiss-cpu", "tokenizers",
             "transformers", "torch", "numpy", "gguf")

Progress = Callable[[str, int, "int | None"], None]


def _no_progress(stage: str, done: int, total: int | None) -> None:
    pass


# --- the manifest ------------------------------------------------------------------------------------

def versions() -> dict[str, str]:
    out = {"dgpo-edge": __version__, "python": platform.python_version()}
    for dist in VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


def protocol_settings(config: ProtocolConfig) -> dict[str, Any]:
    return {"template": "search-r1", "prompt_template": protocol.PROMPT_TEMPLATE, "top_k": config.top_k,
            "max_searches": config.max_searches, "max_turn_tokens": config.max_turn_tokens,
            "max_obs_tokens": config.max_obs_tokens, "max_total_tokens": config.max_total_tokens,
            "stop": list(protocol.STOP_STRINGS)}


def protocol_config(settings: dict[str, Any] | None, top_k: int | None = None,
                    max_searches: int | None = None) -> ProtocolConfig:
    """The ProtocolConfig a manifest's `protocol` section describes, with overrides."""
    s = settings or {}
    d = ProtocolConfig()
    if max_searches is None:
        max_searches = manifest_max_searches(s, d.max_searches)
    try:
        return ProtocolConfig(
            top_k=int(top_k if top_k is not None else s.get("top_k", d.top_k)),
            max_searches=int(max_searches),
            max_turn_tokens=int(s.get("max_turn_tokens", d.max_turn_tokens)),
            max_obs_tokens=int(s.get("max_obs_tokens", d.max_obs_tokens)),
            max_total_tokens=int(s.get("max_total_tokens", d.max_total_tokens)))
    except (TypeError, ValueError) as e:
        raise InputError(f"bad protocol settings: {e}") from None


def manifest_max_searches(settings: dict[str, Any], default: Any = None) -> Any:
    """A `protocol` section's search budget: `max_searches`, or `max_turns`, the key older bundles wrote."""
    return settings.get("max_searches", settings.get(OLD_MAX_SEARCHES_KEY, default))


@dataclass
class Bundle:
    """A bundle folder and its manifest (checked when opened with `open_bundle`)."""

    path: Path
    manifest: dict[str, Any]

    @property
    def model_path(self) -> Path:
        return self.path / self.manifest["model"]["path"]

    @property
    def index_path(self) -> Path:
        return self.path / self.manifest["index"]["path"]

    @property
    def encoder_path(self) -> Path | None:
        enc = self.manifest.get("encoder")
        return None if not enc else self.path / enc["path"]

    @property
    def model_format(self) -> str:
        return self.manifest["model"]["format"]

    def protocol(self, top_k: int | None = None, max_searches: int | None = None) -> ProtocolConfig:
        try:
            return protocol_config(self.manifest.get("protocol"), top_k, max_searches)
        except InputError as e:   # the settings are the manifest's: name it
            raise InputError(e.message, self.path / MANIFEST) from None

    @property
    def gpu_layers(self) -> int:
        """Layers llama.cpp offloads to a GPU by default (`runtime.gpu_layers`; 0 in older bundles)."""
        try:
            return int((self.manifest.get("runtime") or {}).get("gpu_layers", 0))
        except (TypeError, ValueError, AttributeError):
            raise InputError("bad runtime.gpu_layers in the manifest", self.path / MANIFEST) from None

    @property
    def total_bytes(self) -> int:
        return sum(f["bytes"] for f in self.manifest["files"].values())


def read_manifest(path: str | Path) -> dict[str, Any]:
    """A bundle's manifest, checked for the fields loaders rely on (InputError otherwise)."""
    d = Path(path).expanduser()
    settle(d)   # an `export bundle --overwrite` killed part way: the old bundle back, or the new one kept
    if d.is_file():
        raise InputError("is a file, not a bundle folder", d)
    if not d.is_dir():
        raise InputError("no such bundle folder", d)
    mpath = d / MANIFEST
    if not mpath.is_file():
        raise InputError("not a bundle: no manifest.json (make one with `dgpo-edge export bundle`)", d)
    try:
        m = json.loads(mpath.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError(f"malformed bundle manifest ({e})", mpath) from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise InputError(f'not a bundle manifest (expected "format": "{FORMAT}")', mpath)
    if m.get("format_version") != FORMAT_VERSION:
        raise InputError(f"bundle format version {m.get('format_version')!r} is not supported "
                         f"(this dgpo-edge reads {FORMAT_VERSION})", mpath)
    for key in ("model", "index", "files"):
        if not isinstance(m.get(key), dict):
            raise InputError(f'malformed bundle manifest: "{key}" must be an object', mpath)
    if not isinstance(m["model"].get("path"), str) or not isinstance(m["index"].get("path"), str):
        raise InputError('malformed bundle manifest: "model" and "index" need a "path"', mpath)
    for name, entry in m["files"].items():
        if not _safe_relative(name):
            raise InputError(f"malformed bundle manifest: {name!r} is not a path inside the bundle", mpath)
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) \
                or not isinstance(entry.get("sha256"), str):
            raise InputError(f'malformed bundle manifest: files[{name!r}] needs "bytes" and "sha256"', mpath)
    enc = m.get("encoder")
    if enc is not None and not (isinstance(enc, dict) and isinstance(enc.get("path"), str)):
        raise InputError('malformed bundle manifest: "encoder" must be null or an object with a "path"', mpath)
    parity = m["model"].get("parity_file")
    if parity is not None and not isinstance(parity, str):
        raise InputError('malformed bundle manifest: "model.parity_file" must be a path or null', mpath)
    for part in (m["model"]["path"], m["index"]["path"], enc and enc["path"], parity):
        if part is not None and not _safe_relative(part):
            raise InputError(f"malformed bundle manifest: {part!r} is not a path inside the bundle", mpath)
    _check_shapes(m, mpath)
    return m


#: Sections a manifest may leave out (or set to null), and the fields of the required ones that
#: loading and `bundle info` read, with the type each must have.
_OPTIONAL_OBJECTS = ("protocol", "runtime", "parity", "source", "versions")
_FIELDS = {("model", "format"): str, ("index", "kind"): str, ("index", "count"): int}


def _check_shapes(m: dict[str, Any], mpath: Path) -> None:
    """A manifest edited by hand can hold valid JSON of the wrong shape ("protocol": "x"), which
    `bundle verify` passed and `ask` or `bundle info` then died on with a traceback."""
    for key in _OPTIONAL_OBJECTS:
        if m.get(key) is not None and not isinstance(m[key], dict):
            raise InputError(f'malformed bundle manifest: "{key}" must be an object or null', mpath)
    for (section, key), kind in _FIELDS.items():
        value = m[section].get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InputError(f'malformed bundle manifest: "{section}.{key}" must be '
                             f'{"a string" if kind is str else "an integer"}', mpath)
    check_search_settings(m.get("protocol") or {}, mpath)


#: The ranges of the agent's --top-k and --max-searches (protocol.MAX_TOP_K, MAX_SEARCHES), in which
#: `export bundle` records them.
_SEARCH_RANGES = {"top_k": (1, protocol.MAX_TOP_K), "max_searches": (0, protocol.MAX_SEARCHES),
                  OLD_MAX_SEARCHES_KEY: (0, protocol.MAX_SEARCHES)}


def check_search_settings(settings: dict[str, Any], mpath: Path) -> None:
    """A manifest's top_k and max_searches, in the agent commands' ranges: int() took true as 1, 2.5
    as 2 and any huge count, and `bundle verify` passed what the agent commands refuse as options."""
    for key, (low, high) in _SEARCH_RANGES.items():
        value = settings.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InputError(f'bad protocol settings: "protocol.{key}" must be an integer in {low}..{high}, '
                             f'got {json.dumps(value)[:40]}', mpath)


def _safe_relative(name: str) -> bool:
    p = Path(name)
    return bool(name) and not p.is_absolute() and ".." not in p.parts and "\\" not in name


def check_files(bundle: str | Path, full: bool = False, progress: Progress | None = None, *,
                cached: bool = False) -> Bundle:
    """Open a bundle: its layout (`integrity.check_layout`), every listed file's size, and
    with `full` its sha256 (with `cached`, only for files changed since last verified).

    InputError naming the first missing, truncated, changed or corrupt file.
    """
    d = Path(bundle).expanduser()
    if full:  # sizes first: a missing or truncated file is reported before minutes of hashing
        check_files(d, full=False)
    m = read_manifest(d)
    check_layout(d, m)
    emit = progress or _no_progress
    total = sum(f["bytes"] for f in m["files"].values())
    done = 0
    verified = []
    for name, entry in sorted(m["files"].items()):
        path = d / name
        if not path.is_file():
            raise InputError("missing: the bundle manifest lists this file", path)
        size = path.stat().st_size
        if size != entry["bytes"]:
            what = "truncated" if size < entry["bytes"] else "changed"
            raise InputError(f"{what}: {size:,} bytes, the bundle manifest says {entry['bytes']:,}", path)
        if full:
            if cached:
                ok = digests.matches(path, entry["sha256"])
            else:
                ok = file_digest(path)["sha256"] == entry["sha256"]
            if not ok:
                raise InputError("changed: its sha256 does not match the bundle manifest", path)
            verified.append((path, entry["sha256"]))
            done += size
            emit("verify", done, total)
    if full and not cached:
        digests.record_many(verified)
    return Bundle(d, m)


def open_bundle(bundle: str | Path) -> Bundle:
    """A bundle checked for use: layout and sizes, and the sha256 of every file changed since it
    was last verified (the first open after a change reads it whole; see `dgpo_edge.digests`)."""
    return check_files(bundle, full=True, cached=True)


def verify(bundle: str | Path, progress: Progress | None = None) -> Bundle:
    """A bundle with every file's sha256 checked (reads every byte)."""
    return check_files(bundle, full=True, progress=progress)


# --- assembling a bundle ------------------------------------------------------------------------------

def find_parity(model: Path) -> Path | None:
    """A `*.parity.json` written by the exporter beside (or, for a folder, inside) the model."""
    candidates = [model.with_name(model.name + PARITY_SUFFIX)]
    if model.suffix:
        candidates.append(model.with_name(model.stem + PARITY_SUFFIX))
    if model.is_dir():
        candidates += sorted(model.glob("*" + PARITY_SUFFIX))
    return next((c for c in candidates if c.is_file()), None)


def place(src: Path, dst: Path, placed: set[Path] | None = None) -> None:
    """Put a copy of `src` at `dst`, atomically; `dst` is added to `placed`.

    A copy, not a hard link: a link would share the bytes, so damage to the
    bundle (or an edit in place) would also change the model or index it was
    made from, and `verify` could not tell the two apart.
    """
    if placed is not None:
        placed.add(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    st = src.stat()
    if dst.is_file() and (dst.stat().st_size, dst.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns):
        return  # a resumed build placed it already
    tmp = dst.with_name(f".{dst.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        shutil.copyfile(src, tmp)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    os.replace(tmp, dst)


def _tree_files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file() and not any(part.startswith(".")
                                                                      for part in p.relative_to(d).parts))


def add_model(model: str | Path, work: Path, placed: set[Path] | None = None) -> dict[str, Any]:
    """Place a model (GGUF file, ONNX or transformers folder) under work/model; its manifest entry."""
    from ..engines import gguf_file, model_kind

    src = Path(model).expanduser()
    kind = model_kind(src)
    dst = work / "model"
    if kind == "gguf":
        f = gguf_file(src)
        place(f, dst / f.name, placed)
        entry = {"format": "gguf", "path": f"model/{f.name}", "source": f.name,
                 "chat_template": gguf_chat_template(f)}
    else:
        for f in _tree_files(src):
            place(f, dst / f.relative_to(src), placed)
        from ..engines.onnx_genai import template_from_folder

        t = template_from_folder(src)
        entry = {"format": kind, "path": "model", "source": src.name, "chat_template": t.source if t else None}
    parity = find_parity(src if kind != "gguf" else gguf_file(src))
    entry["parity_file"] = None
    if parity is not None:
        place(parity, dst / parity.name, placed)
        entry["parity_file"] = f"model/{parity.name}"
    return entry


def read_parity(work: Path, model_entry: dict[str, Any]) -> Any:
    name = model_entry.get("parity_file")
    if not name:
        return None
    try:
        return json.loads((work / name).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError(f"malformed parity file ({e})", work / name) from None


def gguf_chat_template(path: Path) -> str | None:
    """The chat template in a GGUF's metadata, read by llama.cpp with the vocabulary only."""
    from ..engines.llama_cpp import import_llama_cpp

    llama_cpp = import_llama_cpp()
    try:
        from llama_cpp._utils import suppress_stdout_stderr
    except ImportError:  # pragma: no cover - older/newer layouts
        def suppress_stdout_stderr(disable: bool = True) -> Any:  # type: ignore[misc]
            return contextlib.nullcontext()
    try:
        with suppress_stdout_stderr(disable=False):  # llama.cpp logs a context warning even for vocab_only
            llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    except (ValueError, RuntimeError) as e:
        raise InputError(f"llama.cpp cannot read this GGUF model ({e})", path) from None
    try:
        return llm.metadata.get("tokenizer.chat_template")
    finally:
        llm.close()


def add_index(index: str | Path, work: Path, placed: set[Path] | None = None) -> dict[str, Any]:
    """Place an index folder (sizes checked) under work/index; its manifest entry."""
    from ..retrieval.build import verify_files
    from ..retrieval.compact import MANIFEST_FILE

    src = Path(index).expanduser()
    m = verify_files(src, full=False)
    for name in [*m["files"], MANIFEST_FILE]:
        place(src / name, work / "index" / name, placed)
    return {"path": "index", "kind": m["kind"], "count": m["count"], "encoder": m.get("encoder"),
            "params": m.get("params") or {}}


def add_encoder(index_entry: dict[str, Any], work: Path, encoder: str | Path | None = None,
                placed: set[Path] | None = None) -> dict[str, Any] | None:
    """Place the query encoder a dense index needs under work/encoder; its manifest entry (None: BM25)."""
    from ..retrieval.encoders import MINILM_NAME, minilm_dir, minilm_int8_path

    spec = index_entry.get("encoder")
    if not spec:
        return None
    dst = work / "encoder"
    src = encoder_source(spec, encoder)
    if src is None:
        place(minilm_int8_path(), dst / "model.onnx", placed)
        place(minilm_dir() / "tokenizer.json", dst / "tokenizer.json", placed)
        return {"format": "minilm-int8-onnx", "path": "encoder", "name": MINILM_NAME}
    for f in _tree_files(src):
        place(f, dst / f.relative_to(src), placed)
    return {"format": "transformers", "path": "encoder", "name": spec.get("name")}


def encoder_source(spec: dict[str, Any] | None, encoder: str | Path | None) -> Path | None:
    """The folder of the query encoder for a dense index's encoder `spec`; None for the int8 MiniLM
    (or a BM25 index). InputError: a non-MiniLM index without --encoder, or an --encoder that is not
    a transformers model folder (the bundle's loader would refuse it)."""
    from ..retrieval.encoders import MINILM_NAME

    if not spec and encoder is not None:   # copied in, it would be checked by nothing and used by nothing
        raise InputError("--encoder embeds the queries of a dense index, and this index is BM25 (no vectors): "
                         "leave it out")
    if not spec or (encoder is None and spec.get("name") == MINILM_NAME):
        return None
    if encoder is None:
        raise InputError(f"the index was built with encoder {spec.get('name')!r}; pass --encoder DIR with "
                         f"that model's folder so the bundle can embed queries")
    src = Path(encoder).expanduser()
    if not src.is_dir():
        raise InputError("the query encoder must be a model folder", src)
    if not (src / "config.json").is_file():
        raise InputError("the query encoder must be a transformers model folder (no config.json)", src)
    try:
        config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError(f"malformed config.json ({e})", src) from None
    # the bundle would pass `bundle verify` and fail at the first question: refuse it now
    if any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or []):
        raise InputError(f"is a language model ({', '.join(config['architectures'])}), not the sentence encoder "
                         f"the index was built with ({spec.get('name')!r})", src)
    if spec.get("dim") is not None and config.get("hidden_size") not in (None, spec["dim"]):
        raise InputError(f"embeds in {config['hidden_size']} dimensions, but the index's vectors have "
                         f"{spec['dim']} (built with {spec.get('name')!r})", src)
    return src


def check_inputs(model: str | Path, index: str | Path, encoder: str | Path | None) -> None:
    """What add_model, add_index and add_encoder would refuse, found before B.partial is made: a
    missing or unreadable model, an index with a missing or cut-short file, a dense index without
    its query encoder. A refused build then leaves nothing behind (B.partial would hold a copy of
    the model, gigabytes for a large one)."""
    from ..engines import gguf_file, model_kind
    from ..retrieval.build import verify_files

    src = Path(model).expanduser()
    if model_kind(src) == "gguf":
        gguf_chat_template(gguf_file(src))   # a file llama.cpp cannot read (vocabulary only: cheap)
    encoder_source(verify_files(Path(index).expanduser(), full=False).get("encoder"), encoder)


def finish(work: Path, out: Path, fields: dict[str, Any], progress: Progress | None = None,
           overwrite: bool = False) -> Bundle:
    """Hash every file under `work`, write the manifest, and rename `work` onto `out`."""
    emit = progress or _no_progress
    files = [p for p in _tree_files(work) if p != work / MANIFEST]
    total = sum(p.stat().st_size for p in files)
    done = 0
    listing = {}
    for p in files:
        listing[p.relative_to(work).as_posix()] = file_digest(p)
        done += listing[p.relative_to(work).as_posix()]["bytes"]
        emit("hash", done, total)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "produced_by": f"dgpo-edge {__version__}", "versions": versions(), **fields,
                "files": listing}
    write_json(work / MANIFEST, manifest)
    check_replaceable(out, is_own_bundle, "a bundle")   # again: the folder may have changed while this one was built
    if out.exists() and any(out.iterdir()) and not overwrite:   # an empty one is filled (`--out .`), not replaced
        raise InputError("a bundle appeared here while this one was built; pass --overwrite to replace it", out)
    (work / PARTIAL_MARKER).unlink(missing_ok=True)   # last: until the rename, a rerun may reuse the folder
    replace_dir(work, out)
    # Just hashed: the first open need not read every byte again.
    digests.record_many([(out / name, entry["sha256"]) for name, entry in listing.items()])
    return Bundle(out, manifest)


PARTIAL_MARKER = ".dgpo-edge-partial"


def claim_partial(work: Path) -> Path:
    """B.partial: made and marked here, or found marked (a crashed build's, reused) or empty.
    A folder of that name holding anyone else's files is refused: the build would take them in."""
    try:
        work.mkdir(parents=True)
    except FileExistsError:
        if work.is_symlink() or not work.is_dir() or (
                any(work.iterdir()) and not (work / PARTIAL_MARKER).is_file() and not is_bundle(work)):
            raise InputError(f"dgpo-edge did not make this folder (no {PARTIAL_MARKER} marker) and a bundle "
                             "build would take in what it holds; move it out of the way", work) from None
    (work / PARTIAL_MARKER).write_text("made by dgpo-edge's bundle build: a bundle being assembled\n")
    return work


def _bundle_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of the bundle in `folder`, unchecked, or None when it holds none."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def is_bundle(folder: Path) -> bool:
    """Whether `folder` holds a bundle's manifest."""
    return _bundle_manifest(folder) is not None


def is_own_bundle(folder: Path) -> bool:
    """A bundle that holds only its manifest and the files it lists: what --overwrite may replace
    whole. A bundle with a file someone added (notes beside the model) is refused, naming the file,
    not deleted with it."""
    manifest = _bundle_manifest(folder)
    if manifest is None:
        return False
    listed = manifest.get("files")
    added = sorted(visible_files(folder) - {*(listed if isinstance(listed, dict) else ()), MANIFEST})
    if added:
        raise InputError(f"holds files its manifest does not list ({', '.join(added[:3])}"
                         f"{', ...' if len(added) > 3 else ''}), which replacing it would delete; "
                         "refusing to replace it", folder)
    return True


def build_bundle(model: str | Path, index: str | Path, out: str | Path, config: ProtocolConfig | None = None,
                 encoder: str | Path | None = None, extra: dict[str, Path] | None = None,
                 progress: Progress | None = None, overwrite: bool = False,
                 source: dict[str, Any] | None = None, gpu_layers: int = 0) -> Bundle:
    """Assemble a bundle in `out` from a model, an index folder and (for dense indexes) a query encoder.

    `extra`: more files to carry, {relative path in the bundle: source file}
    (e.g. {"data/dev.jsonl": ...}). `gpu_layers`: the default llama.cpp GPU offload
    (`runtime.gpu_layers`; -1 all layers). Work happens in `out.partial/` (kept
    after a crash and reused by a rerun); `out` appears only when complete.
    """
    out = Path(out).expanduser().absolute()   # `--out .` has no name to put B.partial beside
    if out.exists() and not out.is_dir():
        raise InputError("the output path exists and is not a folder", out)
    # --overwrite replaces a bundle, never another folder (a home or notes folder given by mistake), so
    # only a bundle is told about --overwrite
    check_replaceable(out, is_own_bundle, "a bundle")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise InputError("a bundle already exists here; pass --overwrite to replace it", out)
    check_inputs(model, index, encoder)
    emit = progress or _no_progress
    work = claim_partial(out.with_name(out.name + ".partial"))
    placed: set[Path] = set()
    emit("model", 0, 1)
    model_entry = add_model(model, work, placed)
    emit("model", 1, 1)
    emit("index", 0, 1)
    index_entry = add_index(index, work, placed)
    enc_entry = add_encoder(index_entry, work, encoder, placed)
    emit("index", 1, 1)
    for rel, src in (extra or {}).items():
        if not _safe_relative(rel):
            raise ValueError(f"{rel!r} is not a relative path")
        place(Path(src), work / rel, placed)
    drop_unplaced(work, placed)
    fields = {"model": model_entry, "parity": read_parity(work, model_entry), "index": index_entry,
              "encoder": enc_entry, "protocol": protocol_settings(config or ProtocolConfig()),
              "runtime": {"gpu_layers": int(gpu_layers)},
              "source": source or {"model": str(Path(model).expanduser().resolve()),
                                   "index": str(Path(index).expanduser().resolve())}}
    return finish(work, out, fields, emit, overwrite=overwrite)


def drop_unplaced(work: Path, placed: set[Path]) -> None:
    """Delete what a crashed earlier build left in B.partial that this one did not place: a rerun
    with another model or index would otherwise list the old one's files in the manifest too
    (the old GGUF beside the new, a dense index's vectors under a BM25 one, a shard of another
    checkpoint in the model folder, where an engine would open it). The folders that leaves empty go
    too, and only those: the bundle would otherwise carry an empty `encoder/` of a dense index under
    a BM25 one, or an older checkpoint's subfolder."""
    emptied: set[Path] = set()
    for f in _tree_files(work):
        if f not in placed:
            f.unlink()
            emptied.update(work / up for up in f.relative_to(work).parents if up != Path("."))
    for folder in sorted(emptied, key=lambda p: len(p.parts), reverse=True):   # the deepest first
        with contextlib.suppress(OSError):   # not empty (a placed file, a hidden one): kept
            folder.rmdir()


def describe_files(names: Iterable[str]) -> dict[str, int]:
    """Files per top-level folder (model, index, encoder, data)."""
    counts: dict[str, int] = {}
    for n in names:
        top = n.split("/", 1)[0]
        counts[top] = counts.get(top, 0) + 1
    return counts
