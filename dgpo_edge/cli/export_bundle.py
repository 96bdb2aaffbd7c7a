"""`dgpo-edge export bundle`: assemble a self-verifying bundle from a model and an index.

`bundle_command` is a plain function; `cli/export.py` registers it as the
`bundle` command of the `export` sub-app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..errors import InputError
from ..protocol import MAX_SEARCHES, MAX_TOP_K
from .common import (MAX_SEARCHES_HELP, TOP_K_HELP, check_search_options, console, max_searches_of,
                     old_max_turns_option, user_errors)


@user_errors
def bundle_command(
    model: Path = typer.Option(..., "--model", help="A .gguf file, an ONNX folder (genai_config.json) or a "
                                                    "transformers folder."),
    index: Path = typer.Option(..., "--index", help="An index folder (`dgpo-edge index build` or `compact`)."),
    out: Path = typer.Option(..., "--out", help="The bundle folder to write."),
    encoder: Optional[Path] = typer.Option(None, "--encoder", help="Query encoder folder for a non-MiniLM dense "
                                                                   "index (MiniLM indexes get the int8 ONNX)."),
    top_k: int = typer.Option(3, "--top-k", "-k", help=f"{TOP_K_HELP}, 1 to {MAX_TOP_K} (the agent's range)."),
    max_searches: int = typer.Option(4, "--max-searches", help=f"{MAX_SEARCHES_HELP}, 0 to {MAX_SEARCHES}."),
    old_max_turns: Optional[int] = old_max_turns_option(),
    gpu_layers: int = typer.Option(0, "--gpu-layers", min=-1, help="Default llama.cpp GPU offload recorded in the "
                                   "manifest (0 none, -1 all); `--gpu-layers` on ask, eval, chat, serve overrides it."),
    max_turn_tokens: int = typer.Option(500, "--max-turn-tokens", min=1, help="New tokens per turn (the shipped "
                                        "student trained with 128)."),
    max_obs_tokens: int = typer.Option(500, "--max-obs-tokens", min=1, help="Tokens per information block."),
    max_total_tokens: int = typer.Option(4096, "--max-total-tokens", min=1, help="Prompt plus everything appended."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing bundle in --out (never a folder that holds anything else)."),
) -> None:
    """Bundle a model, an index and its query encoder with a manifest (sha256 of every file)."""
    from ..bundle import build_bundle
    from ..bundle.loader import RichProgress
    from ..protocol import ProtocolConfig
    from .bundle import print_info

    # the ranges ask, chat, eval and serve take, so a bundle never records a setting they would refuse
    max_searches = max_searches_of(max_searches, old_max_turns)
    check_search_options(top_k, max_searches)
    for name, value in (("--max-turn-tokens", max_turn_tokens), ("--max-obs-tokens", max_obs_tokens)):
        if value >= max_total_tokens:   # every episode would end on the budget before its first turn ended
            raise InputError(f"{name} {value} must be below --max-total-tokens {max_total_tokens}, which holds "
                             f"the prompt and every turn and information block")
    config = ProtocolConfig(top_k=top_k, max_searches=max_searches,
                            max_turn_tokens=max_turn_tokens,
                            max_obs_tokens=max_obs_tokens, max_total_tokens=max_total_tokens)
    bar = RichProgress()
    try:
        b = build_bundle(model, index, out, config=config, encoder=encoder, progress=bar, overwrite=overwrite,
                         gpu_layers=gpu_layers)
    finally:
        bar.close()
    print_info(b)
    console.print(f"wrote {escape(str(b.path))}; check it any time with `dgpo-edge bundle verify "
                  f"{escape(str(b.path))}`", highlight=False, soft_wrap=True)   # one line, whatever the width
