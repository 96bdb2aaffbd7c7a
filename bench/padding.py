"""How much of an RL step's forward passes is padding, with rows in step order or grouped by length.

The RL trainer runs its passes (old log-probs, critic, reference, teacher, and the update) over
micro-batches of rows, each cut to its own longest row (`StepBatch.rows`). This counts, for real
episode lengths, the positions those passes compute when micro-batches take the rows as they
come (a step's shuffled order) and when they take them sorted by length (`rl.batch.by_length`,
what the trainer does now); the difference is compute spent on padding. No GPU: it needs only
the episodes' token counts, here from oracle trajectories (prompt + response, SmolLM2 tokenizer).

    python bench/padding.py --trajectories out/factbookqa/oracle.jsonl --tokenizer PATH_OR_GGUF \
        --rows 128 --micro-batch 8 --steps 50
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def episode_lengths(path: Path, tokenizer) -> list[int]:
    from dgpo_edge import protocol
    from dgpo_edge.jsonio import read_jsonl

    out = []
    for _, row in read_jsonl(path):
        text = protocol.render_prompt(row["question"], tokenizer) + row["response"]
        out.append(len(tokenizer.encode(text, add_special_tokens=False)))
    return out


def positions(lengths: list[int], micro: int, bucketed: bool) -> int:
    import torch

    from dgpo_edge.train.rl.batch import by_length, computed_positions

    width = max(lengths) + 1
    attn = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
    index = torch.arange(len(lengths))
    if bucketed:
        index = by_length(index, attn)
    return computed_positions(index, attn, micro)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trajectories", type=Path, required=True)
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder, or a GGUF (dgpo-edge model from-gguf)")
    p.add_argument("--rows", type=int, default=128, help="rollouts per step on one process")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=50, help="random steps drawn from the trajectories")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    lengths = episode_lengths(args.trajectories, tokenizer)
    rng = random.Random(args.seed)
    real = plain = bucketed = 0
    for _ in range(args.steps):
        step = rng.sample(lengths, args.rows)
        real += sum(step)
        plain += positions(step, args.micro_batch, False)
        bucketed += positions(step, args.micro_batch, True)
    print(json.dumps({"episodes": len(lengths), "rows": args.rows, "micro_batch": args.micro_batch,
                      "steps": args.steps, "tokens": real, "positions_step_order": plain,
                      "positions_by_length": bucketed, "padding_share_step_order": round(1 - real / plain, 4),
                      "padding_share_by_length": round(1 - real / bucketed, 4),
                      "positions_saved": round(1 - bucketed / plain, 4)}, indent=1))


if __name__ == "__main__":
    main()
