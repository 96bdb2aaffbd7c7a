"""A usage example for every command, shown at the end of its `--help` (the epilog).

Kept in one table so a new command gets its example in one place; `attach` puts them
on the Typer apps before the CLI runs, and tests/test_cli_options.py checks that no
command is left without one.
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape

EXAMPLES: dict[str, list[str]] = {
    "ask": ['dgpo-edge ask "Which country has Quito as its capital?" --steps',
            'dgpo-edge ask "when is the meeting with Alice" --index ~/notes-index --top-k 5 --json'],
    "eval": ["dgpo-edge eval --data out/factbookqa/dev.jsonl --limit 50 --out out/eval-dev --json"],
    "chat": ["dgpo-edge chat", "dgpo-edge chat --index ~/notes-index --gpu-layers -1"],
    "plot": ["dgpo-edge plot out/runs/dgpo out/runs/ppo --out curves.png --smooth 5"],
    "data factbook": ["dgpo-edge data factbook --out out/factbookqa"],
    "data inspect": ["dgpo-edge data inspect nq_dev.jsonl --json"],
    "data build": ["dgpo-edge data build notes --out out/notes --as-folder",
                   "dgpo-edge data build elements --out out/elements --seed 1"],
    "data worlds": ["dgpo-edge data worlds"],
    "data mix": ["dgpo-edge data mix --world factbook=0.35 --world cities=0.2 --world dictionary=0.15 "
                 "--world elements=0.15 --hold-out notes --out out/worlds-mix/notes-out"],
    "serve": ["dgpo-edge serve --engines 2",
              "dgpo-edge serve --index ~/notes-index --port 8080 --top-k 5 --gpu-layers -1"],
    "index update": ["dgpo-edge index update ~/notes --out ~/notes-index"],
    "index build": ["dgpo-edge index build ~/notes --out ~/notes-index",
                    "dgpo-edge index build out/factbookqa --out out/fb-index --kind hybrid"],
    "index compact": ["dgpo-edge index compact --flat e5_Flat.index --corpus wiki-18.jsonl --out wiki-ivfpq"],
    "index search": ['dgpo-edge index search ~/notes-index "when is the meeting with Alice" --top-k 5'],
    "index info": ["dgpo-edge index info ~/notes-index --verify --json"],
    "index serve": ["dgpo-edge index serve ~/notes-index --port 8000 --top-k 3"],
    "train sft": ["dgpo-edge train sft --config train/configs/tiny-cpu-sft.yaml optim.lr=2e-5"],
    "train kd": ["dgpo-edge train kd --config train/configs/tiny-cpu-kd.yaml"],
    "train tgo": ["dgpo-edge train tgo --teacher out/teacher --data out/factbookqa/train.jsonl "
                  "--index out/fb-index --out out/tgo.jsonl --n 4 --top-k 3 --max-searches 4"],
    "train ppo": ["dgpo-edge train ppo --config train/configs/factbook-ppo.yaml"],
    "train dgpo": ["dgpo-edge train dgpo --config train/configs/tiny-cpu-dgpo.yaml run.out_dir=out/runs/dgpo"],
    "train grpo": ["dgpo-edge train grpo --config train/configs/tiny-cpu-dgpo.yaml rollout.samples_per_prompt=4"],
    "export gguf": ["dgpo-edge export gguf out/student --out student-q8_0.gguf --quant q8_0"],
    "export onnx": ["dgpo-edge export onnx out/student --out student-onnx --precision int4"],
    "export bundle": ["dgpo-edge export bundle --model student-q8_0.gguf --index out/fb-index --out my-bundle "
                      "--top-k 3 --max-searches 4"],
    "model from-gguf": ["dgpo-edge model from-gguf SmolLM2-135M-Instruct.gguf --out out/smollm2 --as qwen2"],
    "model prune": ["dgpo-edge model prune out/teacher --out out/student --keep-layers 12"],
    "model merge": ["dgpo-edge model merge out/student --adapter out/runs/kd/checkpoints/best/adapter --out out/student-kd"],
    "bundle info": ["dgpo-edge bundle info --json", "dgpo-edge bundle info my-bundle"],
    "bundle verify": ["dgpo-edge bundle verify my-bundle --json"],
}


def epilog(path: str) -> str | None:
    lines = EXAMPLES.get(path)
    if not lines:
        return None
    # Typer's rich help keeps single line breaks; brackets are escaped so rich leaves them alone.
    return "Example" + ("s" if len(lines) > 1 else "") + ":\n" + "\n".join(f"  {escape(x)}" for x in lines)


def attach(app: Any, prefix: str = "") -> None:
    """Set each registered command's epilog from EXAMPLES, sub-apps included (by their path)."""
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        text = epilog(f"{prefix}{name}")
        if text and not info.epilog:
            info.epilog = text
    for group in app.registered_groups:
        attach(group.typer_instance, f"{prefix}{group.name} ")
