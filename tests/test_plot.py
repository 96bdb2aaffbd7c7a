"""`dgpo-edge plot`: reading run folders, smoothing, the grid, and one-line errors that write nothing."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from dgpo_edge.errors import InputError
from dgpo_edge.train.plot import grid_shape, panel_values, plot_runs, read_run, smooth_values

from cli_helpers import assert_one_line_error, invoke

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(root: Path, name: str, metrics: str | None = None, evals: str | None = None) -> Path:
    run = root / name
    run.mkdir(parents=True)
    if metrics is not None:
        (run / "metrics.csv").write_text(metrics, encoding="utf-8")
    if evals is not None:
        (run / "eval.csv").write_text(evals, encoding="utf-8")
    return run


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    """Two runs with different columns: an RL-like run with eval.csv, and one with metrics.csv only."""
    alpha = write_run(tmp_path, "alpha",
                      "step,reward,entropy,kl_teacher\n"
                      "1,0.10,2.0,0.5\n"
                      "2,,1.9,nan\n"
                      "3,0.30,1.8,0.4\n",
                      "step,dev_em,dev_f1\n"
                      "0,0.05,0.10\n"
                      "2,0.20,\n")
    beta = write_run(tmp_path, "beta",
                     "step,loss,reward,value_loss\n"
                     "1,3.0,0.0,1.5\n"
                     "2,2.5,0.2,1.0\n")
    return alpha, beta


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk, which follows the 8-byte signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# ------------------------------------------------------------------ reading

def test_read_run_parses_values_and_skips_blanks(runs):
    alpha, beta = runs
    assert read_run(alpha) == {
        "dev_em": [(0, 0.05), (2, 0.20)],
        "dev_f1": [(0, 0.10)],
        "entropy": [(1, 2.0), (2, 1.9), (3, 1.8)],
        "kl_teacher": [(1, 0.5), (3, 0.4)],
        "reward": [(1, 0.10), (3, 0.30)],
    }
    assert read_run(beta) == {"loss": [(1, 3.0), (2, 2.5)], "reward": [(1, 0.0), (2, 0.2)],
                              "value_loss": [(1, 1.5), (2, 1.0)]}


def test_read_run_takes_dev_metrics_from_eval_csv_and_the_rest_from_metrics_csv(tmp_path):
    run = write_run(tmp_path, "both",
                    "step,reward,dev_em,only_train\n1,1.0,0.9,7\n",
                    "step,reward,dev_em,dev_f1\n1,5.0,0.3,0.4\n")
    assert read_run(run) == {"dev_em": [(1, 0.3)], "dev_f1": [(1, 0.4)], "only_train": [(1, 7.0)],
                             "reward": [(1, 1.0)]}


def test_read_run_skips_infinite_values_blank_lines_and_a_short_last_row(tmp_path):
    run = write_run(tmp_path, "torn", "step,loss,lr\n1,inf,0.1\n\n2,2.0\n")
    assert read_run(run) == {"lr": [(1, 0.1)], "loss": [(2, 2.0)]}


def test_read_run_with_only_eval_csv(tmp_path):
    run = write_run(tmp_path, "evalonly", evals="step,dev_em\n5,0.5\n")
    assert read_run(run) == {"dev_em": [(5, 0.5)]}


@pytest.mark.parametrize("text, needles", [
    ("step,loss\n1,0.5\n2,oops\n", ["metrics.csv, line 3", "'oops'"]),
    ("step,loss\n1,0.5,9\n", ["metrics.csv, line 2", "3 fields"]),
    ("step,loss\n1.5,0.5\n", ["metrics.csv, line 2", "'1.5'"]),
    ("loss,step\n0.5,1\n", ["metrics.csv, line 1", "'step'"]),
    ("step,loss,loss\n1,2,3\n", ["metrics.csv, line 1", "repeats"]),
])
def test_read_run_malformed_csv_names_file_and_line(tmp_path, text, needles):
    run = write_run(tmp_path, "bad", text)
    with pytest.raises(InputError) as e:
        read_run(run)
    for needle in needles:
        assert needle in str(e.value)


# ---------------------------------------------------------------- smoothing

def test_panels_smooth_training_metrics_and_draw_evaluations_as_logged():
    assert panel_values("reward", [1.0, 3.0], 2) == [1.0, 2.0]
    assert panel_values("dev_em", [0.78, 0.85, 0.86], 5) == [0.78, 0.85, 0.86]


def test_smooth_values_is_a_trailing_moving_average():
    assert smooth_values([1.0, 2.0, 3.0, 4.0], 1) == [1.0, 2.0, 3.0, 4.0]
    assert smooth_values([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert smooth_values([3.0, 0.0, 3.0, 0.0, 6.0], 3) == [3.0, 1.5, 2.0, 1.0, 3.0]
    assert smooth_values([2.0, 4.0], 10) == [2.0, 3.0]   # a window longer than the series: running mean
    assert smooth_values([], 3) == []
    with pytest.raises(ValueError):
        smooth_values([1.0], 0)


def test_smoothing_changes_the_image(runs, tmp_path):
    raw, smoothed = tmp_path / "raw.png", tmp_path / "smoothed.png"
    assert plot_runs(runs, raw, metrics=["reward"]) == ["reward"]
    plot_runs(runs, smoothed, metrics=["reward"], smooth=2)
    assert raw.read_bytes() != smoothed.read_bytes()


# --------------------------------------------------------------------- grid

@pytest.mark.parametrize("panels, shape", [(1, (1, 1)), (2, (1, 2)), (3, (2, 2)), (4, (2, 2)), (5, (2, 3)),
                                           (6, (2, 3)), (7, (3, 3))])
def test_grid_shape(panels, shape):
    assert grid_shape(panels) == shape


@pytest.mark.parametrize("metrics, size", [(["dev_em"], (500, 350)), (["loss", "dev_f1", "entropy"], (1000, 700))])
def test_image_size_follows_the_grid(runs, tmp_path, metrics, size):
    out = tmp_path / "c.png"
    assert plot_runs(runs, out, metrics=metrics, labels=["a", "b"]) == metrics
    assert png_size(out) == size


# ---------------------------------------------------------------------- CLI

def test_cli_plots_default_panels_into_a_new_folder(runs, tmp_path):
    out = tmp_path / "figs" / "deep" / "curves.png"
    result = invoke("plot", *runs, "--out", out)
    assert result.exit_code == 0, result.output
    # response_length is in no run, so 5 of the 6 default panels: 3 columns x 2 rows of 500x350 pixels.
    assert png_size(out) == (1500, 700)
    assert f"wrote {out}" in result.flat
    assert "panels: reward, dev_em, kl_teacher, entropy, value_loss" in result.flat
    assert sorted(p.name for p in out.parent.iterdir()) == ["curves.png"]   # no temp file left


def test_cli_metrics_labels_and_smooth(runs, tmp_path):
    out = tmp_path / "c.png"
    result = invoke("plot", *runs, "--out", out, "--metrics", "loss, dev_em,loss", "--label", "RL", "--label", "SFT",
                    "--smooth", "3")
    assert result.exit_code == 0, result.output
    assert "panels: loss, dev_em" in result.flat
    assert png_size(out) == (1000, 350)


def test_runs_named_alike_get_their_parent_folder_in_the_legend(tmp_path):
    """plot seed0/dgpo seed1/dgpo: two legend entries both "dgpo" could not be told apart."""
    rows = "step,reward\n1,0.1\n2,0.2\n"
    first, second = write_run(tmp_path / "seed0", "dgpo", rows), write_run(tmp_path / "seed1", "dgpo", rows)
    other = write_run(tmp_path, "ppo", rows)
    out = tmp_path / "curves.svg"
    assert invoke("plot", first, second, other, "--out", out).exit_code == 0
    svg = out.read_text()   # matplotlib's SVG names each text it draws in a comment
    assert "<!-- seed0/dgpo -->" in svg and "<!-- seed1/dgpo -->" in svg and "<!-- ppo -->" in svg


def test_cli_help():
    result = invoke("plot", "--help")
    assert result.exit_code == 0, result.output
    for word in ("Usage:", "RUN_DIR", "--out", "--metrics", "--label", "--smooth"):
        assert word in result.plain, word


def _bad_metric_run(tmp_path: Path) -> Path:
    return write_run(tmp_path, "bad", "step,reward\n1,0.5\n2,x\n")


@pytest.mark.parametrize("case, needles", [
    ("missing", ["nowhere", "no such run folder"]),
    ("empty", ["empty", "neither metrics.csv nor eval.csv"]),
    ("malformed", ["metrics.csv, line 3", "'x'"]),
    ("unknown_metric", ["no run has bogus", "available: dev_em, dev_f1, entropy, kl_teacher, loss, reward"]),
    ("labels", ["1 --label value(s) for 2 run folder(s)"]),
    ("smooth", ["--smooth must be at least 1"]),
    ("no_defaults", ["no metric to plot by default", "pick with --metrics from: epoch, peak_mem_gb"]),
])
def test_cli_errors_exit_2_and_write_nothing(runs, tmp_path, case, needles):
    out = tmp_path / "out" / "c.png"
    args: list[object] = [*runs, "--out", out]
    if case == "missing":
        args = [tmp_path / "nowhere", *args]
    elif case == "empty":
        (tmp_path / "empty").mkdir()
        args = [tmp_path / "empty", *args]
    elif case == "malformed":
        args = [_bad_metric_run(tmp_path), *args]
    elif case == "unknown_metric":
        args += ["--metrics", "reward,bogus"]
    elif case == "labels":
        args += ["--label", "only-one"]
    elif case == "smooth":
        args += ["--smooth", "0"]
    elif case == "no_defaults":
        args = [write_run(tmp_path, "sft", "step,epoch,peak_mem_gb\n1,0,2.0\n"), "--out", out]
    assert_one_line_error(invoke("plot", *args), *needles)
    assert not out.parent.exists()


# An SFT run as train/trainer.py writes it: TRAIN_COLUMNS in metrics.csv, dev_* in eval.csv.
SFT_COLUMNS = ("step", "epoch", "lr", "loss", "grad_norm", "tokens", "loss_tokens", "tokens_per_s", "elapsed_s",
               "peak_mem_gb")


def test_sft_columns_are_the_trainers():
    pytest.importorskip("torch")
    from dgpo_edge.train.trainer import TRAIN_COLUMNS

    assert TRAIN_COLUMNS == SFT_COLUMNS


def test_cli_default_panels_of_an_sft_run(tmp_path):
    rows = ["1,0,2e-05,3.1,1.2,4096,900,1500.0,2.7,0.5", "2,0,2e-05,2.6,1.0,8192,1800,1510.0,5.4,0.5"]
    sft = write_run(tmp_path, "sft", ",".join(SFT_COLUMNS) + "\n" + "\n".join(rows) + "\n",
                    "step,dev_em,dev_answered\n2,0.25,0.5\n")
    out = tmp_path / "sft.png"
    result = invoke("plot", sft, "--out", out)
    assert result.exit_code == 0, result.output
    assert "panels: loss, dev_em, lr, grad_norm" in result.flat
    assert png_size(out) == (1000, 700)


def test_cli_default_panels_of_a_run_with_other_columns(tmp_path):
    run = write_run(tmp_path, "other", "step,epoch,accuracy,margin\n1,0,0.5,1.0\n2,0,0.6,0.9\n")
    result = invoke("plot", run, "--out", tmp_path / "o.png")
    assert result.exit_code == 0, result.output
    assert "panels: accuracy, margin" in result.flat


def test_cli_without_matplotlib_says_what_to_install(runs, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)   # makes `import matplotlib...` raise ImportError
    out = tmp_path / "c.png"
    assert_one_line_error(invoke("plot", *runs, "--out", out), "matplotlib", "pip install 'dgpo-edge[train]'")
    assert not out.exists()


def test_cli_starts_without_importing_matplotlib():
    code = "import sys, dgpo_edge.cli.main; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
