"""`dgpo-edge plot RUN_DIR [RUN_DIR ...] --out curves.png`: training curves of several runs overlaid.

One panel per metric (from each run's metrics.csv and eval.csv), one line and colour per run.
See `dgpo_edge/train/plot.py`; matplotlib is imported only when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .common import console, user_errors


@user_errors
def plot(
    run_dirs: list[Path] = typer.Argument(..., metavar="RUN_DIR...",
                                          help="Run folders written by `dgpo-edge train` (metrics.csv, eval.csv)."),
    out: Path = typer.Option(..., "--out", "-o", help="Image to write (.png; .pdf and .svg work too)."),
    metrics: Optional[str] = typer.Option(
        None, "--metrics",
        help="Comma-separated panels, e.g. reward,dev_em,kl_teacher "
             "(default, from the columns the runs have: RL runs reward, dev_em, response_length, kl_teacher, "
             "entropy, value_loss; SFT/KD runs loss, dev_em, dev_f1, dev_loss, lr, grad_norm)."),
    label: Optional[list[str]] = typer.Option(None, "--label",
                                              help="Legend label of a run, once per run in order (default: folder names, "
                                                   "with the parent folder where two are alike)."),
    smooth: int = typer.Option(1, "--smooth", help="Moving average over N logged training steps (1 = raw); "
                                                   "dev evaluations are drawn as logged."),
) -> None:
    """Plot the training curves of one or more runs, overlaid, into one image."""
    from ..train.plot import plot_runs

    panels = plot_runs(run_dirs, out, metrics=metrics.split(",") if metrics is not None else None,
                       labels=label or None, smooth=smooth)
    console.print(f"wrote {escape(str(out))}", highlight=False)
    console.print(f"panels: {escape(', '.join(panels))}", highlight=False)
