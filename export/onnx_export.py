"""ONNX export through onnxruntime-genai's model builder, with the same parity checks.

The builder (`python -m onnxruntime_genai.models.builder`) writes model.onnx(+.data),
genai_config.json and the tokenizer files. It imports `onnx_ir` without declaring it (the
`export` extra installs it). It runs in a child process: it prints a line per tensor, and a
failure there must not leave this process half-configured.

    export_onnx("ckpt/", "model-onnx/", precision="int4")
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dgpo_edge.engines.onnx_genai import OnnxGenaiEngine
from dgpo_edge import temps
from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import replace_dir
from dgpo_edge.train.models import check_out, written_here, write_provenance

from .checkpoint import open_checkpoint
from .parity import (PARITY_TEXTS, Reference, compare_logits, compare_tokenizers, judge,
                     transcript_text, versions)

PRECISIONS = ("int4", "fp32")
GREEDY_TOKENS = 24
# k-quant 4-bit body with the lm_head at 8 bits: on SmolLM2-135M greedy top-1 agreement with
# transformers rose from 62% (builder default, all-RTN int4) to 71% (docs/export.md). The plain
# `matmul_mixed_precision=last_matmul:int8` spelling builds a model onnxruntime-genai 0.18 cannot load.
INT4_OPTIONS = ("algo_config=k_quant_last",)


def export_onnx(model: str | Path, out: str | Path, precision: str = "int4",
                threads: int = 2) -> Path:
    """Build an onnxruntime-genai model directory `out` from the checkpoint `model`."""
    if precision not in PRECISIONS:
        raise InputError(f"unknown --precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    ckpt = open_checkpoint(model)  # the same input checks as the GGUF writer
    try:
        import onnx_ir  # noqa: F401  (the builder needs it but does not declare it)
        import onnxruntime_genai  # noqa: F401
    except ImportError as e:
        raise InputError(f"{e.name} is not installed (pip install 'dgpo-edge[export]')") from None
    out = Path(out).absolute()   # `--out .` has no name to put the temp folder beside
    # nor the checkpoint itself (its weights would go with the old folder), nor any folder but an
    # earlier ONNX export: a transformers checkpoint given by mistake would be replaced whole
    check_out(out, ckpt.path, mine=is_onnx_export,
              what="an ONNX export dgpo-edge wrote (genai_config.json and model.onnx), with nothing added")
    out.parent.mkdir(parents=True, exist_ok=True)
    with temps.work_dir(out.parent, f".{out.name}.") as work:   # a killed export's: swept next time
        build = work / "model"
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ckpt.path),
               "-o", str(build), "-p", precision, "-e", "cpu", "-c", str(work / "cache")]
        if precision == "int4":
            cmd += ["--extra_options", *INT4_OPTIONS]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0 or not (build / "genai_config.json").is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise InputError(f"onnxruntime-genai's builder failed: {tail[0]}", ckpt.path)
        write_provenance(build, {"made_by": "dgpo-edge export onnx", "source": str(ckpt.path), "precision": precision})
        _replace_dir(build, out)
    return out


ONNX_PARITY = "onnx.parity.json"   # written into the export by its check (parity.parity_path)


def is_onnx_export(folder: Path) -> bool:
    """An earlier export of ours, holding nothing someone added (what --out may replace)."""
    return ((folder / "genai_config.json").is_file() and next(folder.glob("*.onnx"), None) is not None
            and written_here(folder, also=(ONNX_PARITY,)))


def _replace_dir(src: Path, dst: Path) -> None:
    """Move the finished `src` onto `dst`, replacing an old `dst` only once `src` is complete."""
    os.chmod(src, 0o755)
    replace_dir(src, dst)


def _og_logits(model: Any, ids: list[int]) -> Any:
    """Logits at every position of `ids` from one onnxruntime-genai prefill."""
    import numpy as np
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 1, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([ids], dtype=np.int32))
    return np.asarray(gen.get_output("logits"), dtype=np.float32)[0]


def _og_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    import numpy as np
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + n, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([ids], dtype=np.int32))
    out = []
    for _ in range(n):
        tok = int(np.argmax(np.asarray(gen.get_logits())[0, -1]))
        out.append(tok)
        if len(out) < n:
            gen.append_tokens(np.array([[tok]], dtype=np.int32))
    return out


def verify_onnx(model_dir: str | Path, onnx_dir: str | Path, precision: str,
                reference: Reference | None = None) -> dict[str, Any]:
    """Compare the ONNX model in `onnx_dir` (onnxruntime-genai) with the checkpoint."""
    import onnxruntime_genai as og

    ref = reference or Reference.load(model_dir)
    # The tokenizer judged is the one `OnnxGenaiEngine` encodes with (the folder's tokenizer.json
    # through `tokenizers`). onnxruntime-genai's own tokenizer is only reported: it differs on
    # SmolLM2's digit splitting of non-ASCII numerals ("½", "٣"), which the engine never meets.
    engine = OnnxGenaiEngine(onnx_dir)
    model = engine.model
    match, first_bad = compare_tokenizers(ref, engine.encode)
    genai = og.Tokenizer(model)
    genai_match, genai_bad = compare_tokenizers(ref, lambda t: [int(i) for i in genai.encode(t)])
    ids = ref.encode(transcript_text(ref.tokenizer))
    result: dict[str, Any] = {"format": "onnx", "quant": precision, "tokenizer_match": match,
                              "tokenizer_mismatch": first_bad, "n_texts": len(PARITY_TEXTS),
                              "genai_tokenizer_match": genai_match, "genai_tokenizer_mismatch": genai_bad}
    result.update(compare_logits(ref.logits(ids), _og_logits(model, ids)))
    prompt = ids[: len(ids) // 2]
    ours, theirs = _og_greedy(model, prompt, GREEDY_TOKENS), ref.greedy(prompt, GREEDY_TOKENS)
    result["greedy_n"] = GREEDY_TOKENS
    result["greedy_match"] = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                                  GREEDY_TOKENS)
    result["versions"] = versions("onnxruntime-genai", "onnxruntime")
    return judge(result, precision)
