"""The host's share of an RL rollout at the paper's shape: everything but decoding, on the CPU.

Inside RL a rollout step is the engine's decoding plus the host's work between turns: decoding
each turn's ids to text, parsing the action, encoding feedback and observations, building the next
turn's prompts, and packing the episodes into the step's tensors. On an H200 at commit `37bb02e`
that host work was 2.6 s of the 25.2 s rollout (bench/results/rl_cost_h200_37bb02e.json:
time_rollout_s − time_rollout_decode_s), the gap between the rollout tokens/s inside RL and the
engine's own. Here a stand-in engine returns random token ids instantly (as the paper-shape
benchmark's random-weight model does: no valid action, every turn runs to its budget, feedback
after each), so the wall time left is the host's, measurable on any machine:

    python bench/rollout_host.py --tokenizer QWEN_TOKENIZER_DIR --repeats 5 --out host.json

Prompts: FactbookQA questions (`dgpo-edge data factbook --out out/factbookqa` first). Reported,
median of --repeats: `host_s` (generate_rollouts' wall time less the stand-in engine's), `pack_s`
(train/rl/batch.py `pack`, on the CPU), their sum, and the generated tokens (1.28 M at the
default shape, as in the GPU runs).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import provenance  # noqa: E402
from rollout import _import_train  # noqa: E402  (dgpo_edge.train from this checkout)


class InstantEngine:
    """The engine's interface, answering every turn at once with random ids (no stop, no EOS)."""

    def __init__(self, low: int, high: int, seed: int = 0):
        import numpy as np

        self.rng = np.random.default_rng(seed)
        self.low, self.high = low, high
        self.seconds = 0.0

    def decode(self, prefixes, max_new, sampling, generator, resume=False):
        from dgpo_edge.train.decoding import TurnOutput

        start = time.perf_counter()
        out = [TurnOutput(self.rng.integers(self.low, self.high, n).tolist(), [-1.0] * n, "length")
               for n in max_new]
        self.seconds += time.perf_counter() - start
        return out


def measure(args: argparse.Namespace, tokenizer, questions: list[str]) -> dict:
    import torch

    from dgpo_edge.protocol import ProtocolConfig
    from dgpo_edge.train.rl.batch import pack
    from dgpo_edge.train.rollout import RolloutConfig, generate_rollouts, observation_blocks

    limits = ProtocolConfig(max_turn_tokens=args.turn_tokens, max_obs_tokens=args.obs_tokens,
                            max_total_tokens=args.total_tokens)
    config = RolloutConfig(protocol=limits, temperature=1.0, batch_size=args.batch)
    engine = InstantEngine(1000, len(tokenizer) - 1000)
    model = torch.nn.Linear(1, 1)   # generate_rollouts reads its device and mode only
    blocks = observation_blocks(tokenizer)
    start = time.perf_counter()
    rollouts = generate_rollouts(model, tokenizer, questions, None, None, config, engine=engine, blocks=blocks)
    middle = time.perf_counter()
    pack(rollouts, list(range(len(rollouts))), tokenizer.pad_token_id, torch.device("cpu"))
    end = time.perf_counter()
    return {"host_s": middle - start - engine.seconds, "pack_s": end - middle,
            "generated_tokens": sum(r.n_generated for r in rollouts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True, help="a Qwen2.5 tokenizer folder")
    ap.add_argument("--questions", type=Path, default=ROOT / "out" / "factbookqa" / "train.jsonl")
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256, help="rollout.batch_size")
    ap.add_argument("--turn-tokens", type=int, default=500)
    ap.add_argument("--obs-tokens", type=int, default=500)
    ap.add_argument("--total-tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    _import_train()
    from transformers import AutoTokenizer

    if not args.questions.is_file():
        sys.exit(f"error: {args.questions} is missing (dgpo-edge data factbook --out out/factbookqa)")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    lines = args.questions.read_text().splitlines()
    questions = [json.loads(line)["question"] for line in lines[:args.prompts]]
    runs = [measure(args, tokenizer, questions) for _ in range(args.repeats)]
    med = {k: round(statistics.median(r[k] for r in runs), 3) for k in ("host_s", "pack_s")}
    result = {"card": f"cpu: {platform.processor() or platform.machine()}", "commit": provenance.commit(),
              "prompts": len(questions), "batch": args.batch, "generated_tokens": runs[0]["generated_tokens"],
              **med, "rollout_host_s": round(med["host_s"] + med["pack_s"], 3),
              "runs": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in runs]}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
