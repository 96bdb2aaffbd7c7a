"""Parity checks: does an exported model behave like the transformers checkpoint it came from?

Three questions, the same for GGUF (llama.cpp) and ONNX (onnxruntime-genai):

1. Tokenization: the runtime and transformers give identical ids on a fixed text set (protocol
   tags, the Search-R1 prompt, unicode, digits, whitespace, special tokens).
2. Logits: on one teacher-forced agent transcript, the largest |logit difference| over all
   positions and the vocabulary. Float exports (f16, bf16, fp32) must stay within a stated
   tolerance (`LOGIT_TOLERANCE`, in units of the reference logits' standard deviation).
3. Top-1 agreement: the share of positions where the runtime's argmax equals transformers'
   (greedy next-token agreement under teacher forcing). Reported for every type; quantized
   types are judged by it (`TOP1_FLOOR`).

The result is one flat dict, printed by the CLI and written as `<file>.parity.json`; the bundle
manifest copies it.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgpo_edge.jsonio import write_json
from dgpo_edge.protocol import Passage, information_block, render_prompt

# |runtime - transformers| logit tolerance per float type, as a multiple of the std of the
# reference logits. Measured (docs/export.md): f16 stays far below; bf16 rounds activations too.
LOGIT_TOLERANCE = {"f16": 0.05, "bf16": 0.25, "fp32": 0.01}
# Below this greedy top-1 agreement a quantized export is reported as failed: 8-bit types stay
# close to the float model, 4-bit ones on a 135M model agree on roughly 70-90% of positions.
TOP1_FLOOR = {"q8_0": 0.90, "q6_k": 0.85, "q5_k_m": 0.80}
TOP1_FLOOR_DEFAULT = 0.60

PARITY_TEXTS: tuple[str, ...] = (
    "The capital of France is Paris.",
    "<think> I need the population of Iceland. </think>\n<search> Iceland population 2024 </search>",
    "\n\n<information>Doc 1(Title: \"Iceland\") Iceland has 364,036 people.\n</information>\n\n",
    "<answer> Reykjavík </answer>",
    "My previous action is invalid. Let me try again.",
    "Digits: 0 7 42 1999 3.14159 -12,345,678 1e-9 ½ ٣",
    "Unicode: café naïve Zürich São Paulo Ελλάδα Россия 日本語 한국어 עברית العربية 🙂🚀",
    "Whitespace:  two  spaces\tand a tab\n\n\nthree newlines   trailing   ",
    "<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x ** 2  # code, with symbols {}[]<>@#$%^&*",
    "",
)


def transcript_text(chat_template: Any | None) -> str:
    """A realistic agent transcript (prompt, search, information, answer) to score logits on."""
    prompt = render_prompt("What is the capital of the country that borders Spain to the north",
                           chat_template)
    docs = [Passage("1", '"France"\nFrance borders Spain. Its capital is Paris.'),
            Passage("2", '"Andorra"\nAndorra lies between France and Spain; capital Andorra la Vella.')]
    return (prompt + "<think> The country north of Spain is France. </think>\n"
            "<search> capital of France </search>" + information_block(docs)
            + "<think> The passages say Paris. </think>\n<answer> Paris </answer>")


@dataclass
class Reference:
    """The transformers side: tokenizer and float32 model of the exported checkpoint."""

    tokenizer: Any
    model: Any
    _memo: dict = field(default_factory=dict, repr=False)  # one reference serves many exports

    @classmethod
    def load(cls, model_dir: str | Path) -> Reference:
        from dgpo_edge.train.models import load_checkpoint

        model, tokenizer = load_checkpoint(model_dir)
        return cls(tokenizer=tokenizer, model=model)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def logits(self, ids: Sequence[int]) -> Any:
        import torch

        key = ("logits", tuple(ids))
        if key not in self._memo:
            with torch.no_grad():
                self._memo[key] = self.model(torch.tensor([list(ids)])).logits[0].float().numpy()
        return self._memo[key]

    def greedy(self, ids: Sequence[int], n: int) -> list[int]:
        key = ("greedy", tuple(ids), n)
        if key not in self._memo:
            self._memo[key] = self._greedy(ids, n)
        return list(self._memo[key])

    def _greedy(self, ids: Sequence[int], n: int) -> list[int]:
        import torch

        # A plain argmax loop: generate() would stop at EOS, the runtimes here do not.
        out, past, step = [], None, torch.tensor([list(ids)])
        with torch.no_grad():
            for _ in range(n):
                res = self.model(step, cache=past, use_cache=True)
                past, tok = res.cache, int(res.logits[0, -1].argmax())
                out.append(tok)
                step = torch.tensor([[tok]])
        return out


def compare_tokenizers(reference: Reference, encode: Callable[[str], list[int]],
                       texts: Sequence[str] = PARITY_TEXTS) -> tuple[bool, str | None]:
    """(all identical, first differing text or None)."""
    for text in texts:
        if reference.encode(text) != list(encode(text)):
            return False, text
    return True, None


def compare_logits(ref_logits: Any, run_logits: Any) -> dict[str, Any]:
    """max |diff|, its size relative to the reference std, and argmax agreement."""
    import numpy as np

    ref, run = np.asarray(ref_logits, np.float32), np.asarray(run_logits, np.float32)
    diff = float(np.abs(ref - run).max())
    scale = float(ref.std()) or 1.0
    agree = float((ref.argmax(-1) == run.argmax(-1)).mean())
    # six significant digits, not decimals: an F16 export's max |diff| of 4e-7 rounded to 0 beside
    # its nonzero ratio to the std
    return {"max_abs_logit_diff": float(f"{diff:.6g}"), "logit_std": float(f"{scale:.6g}"),
            "rel_logit_diff": float(f"{diff / scale:.6g}"), "top1_agreement": round(agree, 6),
            "n_tokens": int(ref.shape[0])}


def judge(result: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Add `logit_tolerance` (float types) and `passed` to a parity result."""
    tol = LOGIT_TOLERANCE.get(dtype)
    result["logit_tolerance"] = tol
    floor = None if tol is not None else TOP1_FLOOR.get(dtype, TOP1_FLOOR_DEFAULT)
    result["top1_floor"] = floor
    numbers_ok = (result["rel_logit_diff"] <= tol if tol is not None
                  else result["top1_agreement"] >= floor)
    result["passed"] = bool(result["tokenizer_match"] and numbers_ok)
    return result


def versions(*packages: str) -> dict[str, str]:
    """Installed versions of the packages that produced and checked an export."""
    out = {}
    for name in ("dgpo-edge", "transformers", "torch", *packages):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def save_parity(result: dict[str, Any], path: str | Path) -> Path:
    """Write the result atomically beside the export (`model.gguf.parity.json`)."""
    write_json(path, result)
    return Path(path)


def parity_path(export_path: str | Path) -> Path:
    """`model.gguf` -> `model.gguf.parity.json`; an ONNX dir `out/` -> `out/onnx.parity.json`
    (the bundle builder picks up `*.parity.json` beside a file or inside a directory)."""
    p = Path(export_path)
    return p / "onnx.parity.json" if p.is_dir() else p.with_name(p.name + ".parity.json")


def format_parity(result: dict[str, Any]) -> str:
    """One human line per fact, for the CLI."""
    if result["tokenizer_match"]:
        lines = [f"tokenizer: identical on {result['n_texts']} texts"]
    else:   # the check stops at the first text that differs: how many more do is not known
        lines = [f"tokenizer: DIFFERENT (of {result['n_texts']} texts, the first that differs: "
                 f"{result['tokenizer_mismatch']!r})"]
    tol = result.get("logit_tolerance")
    lines.append(f"logits: max |diff| {result['max_abs_logit_diff']:.4g} = "
                 f"{result['rel_logit_diff']:.3g} x std over {result['n_tokens']} positions"
                 + (f" (tolerance {tol} x std)" if tol is not None else ""))
    lines.append(f"greedy top-1 agreement: {result['top1_agreement']:.2%}"
                 + (f" (floor {result['top1_floor']:.0%})" if result.get("top1_floor") else ""))
    if "greedy_match" in result:
        lines.append(f"greedy generation: {result['greedy_match']}/{result['greedy_n']} "
                     "leading tokens identical")
    lines.append("parity: " + ("passed" if result["passed"] else "FAILED"))
    return "\n".join(lines)
