"""Training curves of several runs overlaid: one panel per metric, one line per run.

A run folder is what the trainers write (see `Loggers` in train/plumbing.py):
`metrics.csv` (one row per logged step) and `eval.csv` (one row per evaluation, `dev_*`
columns). Columns differ between trainers and runs, so every column is read and a panel
shows whichever runs have that metric. matplotlib is imported only when a figure is drawn,
so the CLI starts without it.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import atomic_path

Series = list[tuple[int, float]]

# Panels drawn when --metrics is not given (those that at least one run has): RL runs get the RL
# set; supervised runs (SFT, KD: no reward column) the loss set; anything else its own columns.
DEFAULT_METRICS = ("reward", "dev_em", "response_length", "kl_teacher", "entropy", "value_loss")
RL_ONLY = ("reward", "response_length", "kl_teacher", "entropy", "value_loss")
SUPERVISED_METRICS = ("loss", "dev_em", "dev_f1", "dev_loss", "lr", "grad_norm")
# Trainer bookkeeping columns, never a default panel (see TRAIN_COLUMNS in train/trainer.py).
BOOKKEEPING = frozenset({"epoch", "tokens", "loss_tokens", "tokens_per_s", "elapsed_s", "peak_mem_gb"})
MAX_DEFAULT_PANELS = 6
TRAIN_CSV, EVAL_CSV = "metrics.csv", "eval.csv"
# Each panel is PANEL_INCHES at DPI, so the image size follows from the grid alone.
PANEL_INCHES = (5.0, 3.5)
DPI = 100
MARKER_MAX_POINTS = 30


def read_run(run_dir: str | Path) -> dict[str, Series]:
    """Every metric of a run folder as [(step, value), ...] in file order.

    `dev_*` metrics are taken from eval.csv and the others from metrics.csv; a metric
    only found in the other file is taken from there. Blank, missing and non-finite
    (nan, inf) values are skipped; a metric with no value at all is left out.
    Raises InputError for a missing folder, a folder with neither CSV, or a malformed CSV.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise InputError("no such run folder", run_dir)
    if not run_dir.is_dir():
        raise InputError("not a folder, expected a run folder", run_dir)
    train_path, eval_path = run_dir / TRAIN_CSV, run_dir / EVAL_CSV
    if not train_path.is_file() and not eval_path.is_file():
        raise InputError(f"neither {TRAIN_CSV} nor {EVAL_CSV} in this run folder", run_dir)
    train = read_csv(train_path) if train_path.is_file() else {}
    dev = read_csv(eval_path) if eval_path.is_file() else {}
    merged: dict[str, Series] = {}
    for name in sorted(train.keys() | dev.keys()):
        first, second = (dev, train) if name.startswith("dev_") else (train, dev)
        merged[name] = first.get(name) or second[name]
    return merged


def read_csv(path: Path) -> dict[str, Series]:
    """One trainer CSV as {column: [(step, value), ...]}; InputError names the file and line."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return _parse_rows(csv.reader(f), path)
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 ({e.reason} at byte {e.start})", path) from None
    except csv.Error as e:
        raise InputError(f"malformed CSV ({e})", path) from None


def _parse_rows(reader: Any, path: Path) -> dict[str, Series]:
    header = next(reader, None)
    if header is None:
        return {}   # an empty file: a run that has not logged yet
    if not header or header[0] != "step":
        raise InputError(f"malformed CSV: the first column must be 'step', got {header[:1]}", path, 1)
    if len(set(header)) != len(header):
        raise InputError("malformed CSV: a column name repeats in the header", path, 1)
    series: dict[str, Series] = {name: [] for name in header[1:]}
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) > len(header):
            raise InputError(f"malformed CSV: {len(row)} fields, the header has {len(header)}", path, line)
        try:
            step = int(row[0])
        except ValueError:
            raise InputError(f"malformed CSV: step {row[0]!r} is not an integer", path, line) from None
        for name, cell in zip(header[1:], row[1:]):   # a short (torn) row just lacks its last values
            value = _number(cell, name, path, line)
            if value is not None:
                series[name].append((step, value))
    return {name: points for name, points in series.items() if points}


def _number(cell: str, column: str, path: Path, line: int) -> float | None:
    """The cell as a finite float, None when blank or non-finite; InputError when not a number."""
    cell = cell.strip()
    if not cell:
        return None
    try:
        value = float(cell)
    except ValueError:
        raise InputError(f"malformed CSV: {column} {cell!r} is not a number", path, line) from None
    return value if math.isfinite(value) else None


def smooth_values(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over `window` points (fewer at the start); window 1 returns the values.

    Trailing, so a point never mixes in later steps: the curve at step s shows only what was
    known at step s.
    """
    if window < 1:
        raise ValueError(f"smoothing window must be at least 1, got {window}")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def panel_values(metric: str, values: Sequence[float], window: int) -> list[float]:
    """What a panel draws: training metrics smoothed over `window` logged steps; dev evaluations
    (`dev_*`) as logged, since each is already a mean over the dev set at one checkpoint and a
    moving average would mix checkpoints 50 or more steps apart."""
    return list(values) if metric.startswith("dev_") else smooth_values(values, window)


def grid_shape(panels: int) -> tuple[int, int]:
    """(rows, columns): 2 columns up to 4 panels, 3 beyond; a single panel gets one column."""
    cols = min(panels, 2 if panels <= 4 else 3)
    return math.ceil(panels / cols), cols


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path, metrics: Sequence[str] | None = None,
              labels: Sequence[str] | None = None, smooth: int = 1) -> list[str]:
    """Draw the runs' curves into `out` (atomically) and return the metrics drawn, one per panel.

    Everything is checked before anything is written, so bad input leaves no file behind.
    The image format follows `out`'s suffix (png when it has none).
    """
    out = Path(out)
    if not run_dirs:
        raise InputError("give at least one run folder")
    if labels is not None and len(labels) != len(run_dirs):
        raise InputError(f"{len(labels)} --label value(s) for {len(run_dirs)} run folder(s); give one per run")
    if smooth < 1:
        raise InputError(f"--smooth must be at least 1, got {smooth}")
    if out.is_dir():
        raise InputError("is a directory, expected an image file name", out)
    runs = [read_run(d) for d in run_dirs]
    labels = list(labels) if labels is not None else default_labels(run_dirs)
    panels = _choose_metrics(runs, metrics)
    Figure, FigureCanvasAgg, Line2D, MaxNLocator = _matplotlib()
    fmt = out.suffix.lstrip(".").lower() or "png"
    if fmt not in FigureCanvasAgg.get_supported_filetypes():
        raise InputError(f"cannot write .{fmt} images; use .png, .pdf or .svg", out)

    rows, cols = grid_shape(len(panels))
    fig = Figure(figsize=(cols * PANEL_INCHES[0], rows * PANEL_INCHES[1]), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, metric in zip(axes, panels):
        for i, run in enumerate(runs):
            points = run.get(metric)
            if points:
                steps = [s for s, _ in points]
                # Markers on short series, so a run with a single evaluation still shows a dot.
                ax.plot(steps, panel_values(metric, [v for _, v in points], smooth), color=f"C{i}", linewidth=1.2,
                        marker="o" if len(points) <= MARKER_MAX_POINTS else None, markersize=3)
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # steps are whole numbers
        ax.grid(True, alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=f"C{i}", label=label) for i, label in enumerate(labels)]
    fig.legend(handles=handles, loc="outside upper center", ncols=min(len(labels), 4), frameon=False)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format=fmt, dpi=DPI)
    return panels


def default_labels(run_dirs: Sequence[str | Path]) -> list[str]:
    """Each run's folder name; runs named alike (seed0/dgpo, seed1/dgpo) get their parent folder's
    name too, so the legend tells them apart."""
    paths = [Path(d).resolve() for d in run_dirs]
    names = [p.name for p in paths]
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in paths]


def _choose_metrics(runs: list[dict[str, Series]], metrics: Sequence[str] | None) -> list[str]:
    """The panels: the named metrics (each must be in some run) or the defaults that some run has."""
    available = sorted(set().union(*runs))
    if metrics is None:
        return default_metrics(available)
    chosen = list(dict.fromkeys(m.strip() for m in metrics if m.strip()))
    if not chosen:
        raise InputError("--metrics names no metric")
    unknown = [m for m in chosen if m not in available]
    if unknown:
        raise InputError(f"no run has {', '.join(unknown)}; available: {', '.join(available) or 'none'}")
    return chosen


def default_metrics(available: Sequence[str]) -> list[str]:
    """Panels for the columns the runs have: the RL set, else the supervised set, else their own."""
    if any(m in available for m in RL_ONLY):
        chosen = [m for m in DEFAULT_METRICS if m in available]
    else:
        chosen = [m for m in SUPERVISED_METRICS if m in available]
    if not chosen:
        chosen = [m for m in available if m not in BOOKKEEPING][:MAX_DEFAULT_PANELS]
    if not chosen:
        raise InputError("no metric to plot by default in these runs (only bookkeeping columns); "
                         f"pick with --metrics from: {', '.join(available) or 'none'}")
    return chosen


def _matplotlib() -> tuple[Any, Any, Any, Any]:
    """Figure, the Agg canvas, Line2D and MaxNLocator, imported here so nothing else needs matplotlib."""
    try:
        import matplotlib  # noqa: F401  (first, so a missing package is reported as such)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:
        raise InputError(f"plotting needs matplotlib ({e}): pip install 'dgpo-edge[train]'") from None
    return Figure, FigureCanvasAgg, Line2D, MaxNLocator
