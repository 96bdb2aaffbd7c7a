"""The `dgpo-edge` command line: version, help, `data inspect`, `data factbook`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from dgpo_edge import __version__
from dgpo_edge.cli.main import app

from cli_helpers import assert_one_line_error, invoke




def write_flashrag(path: Path) -> Path:
    rows = [{"id": "q1", "question": "Who wrote Hamlet?", "golden_answers": ["William Shakespeare", "Shakespeare"]},
            {"id": "q2", "question": "What is the capital of Peru", "golden_answers": ["Lima"]},
            {"id": "q3", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --------------------------------------------------------------- root app

def test_version():
    assert __version__ == "0.1.0"
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.plain == f"dgpo-edge {__version__}\n"


@pytest.mark.parametrize("args, expected", [
    (["--help"], ["--version", "--help", "data"]),
    (["data", "--help"], ["factbook", "inspect"]),
    (["data", "factbook", "--help"], ["--out", "--seed", "--holdout", "--samples"]),
    (["data", "inspect", "--help"], ["--format", "--json", "FILES"]),
])
def test_help(args, expected):
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.plain
    for word in expected:
        assert word.lower() in result.plain.lower(), (args, word)


def test_only_built_commands_are_registered():
    root = typer.main.get_command(app)
    assert sorted(root.commands) == ["ask", "bundle", "chat", "data", "eval", "export", "index", "model", "plot", "serve", "train"]
    assert {"factbook", "inspect"} <= set(root.commands["data"].commands)


def test_installed_entry_point():
    script = shutil.which("dgpo-edge", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "dgpo_edge"]
    done = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"dgpo-edge {__version__}\n"
    module = subprocess.run([sys.executable, "-m", "dgpo_edge", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert module.returncode == 0 and module.stdout == done.stdout, module.stderr


@pytest.mark.parametrize("args, needles", [
    (["serve", "--port", "70000"], ["'--port'", "65535", "(see 'dgpo-edge serve -h')"]),   # a Typer range
    (["index", "search", "IDX", "q", "-k", "101"], ["'--top-k'", "100", "(see 'dgpo-edge index search -h')"]),
    (["ask"], ["Missing argument", "(see 'dgpo-edge ask -h')"]),
    (["ask", "q", "--bogus"], ["No such option: --bogus"]),
    (["train", "sft"], ["Missing option '--config'"]),
    (["index", "serch"], ["No such command 'serch'. Did you mean 'search'"]),
    (["--bogus"], ["No such option: --bogus", "(see 'dgpo-edge -h')"]),
])
def test_usage_errors_are_one_line_and_exit_2(args, needles, tmp_path):
    """As other bad input: one `error:` line naming the option, not click's usage lines and a Rich box."""
    assert_one_line_error(invoke(*[str(tmp_path) if a == "IDX" else a for a in args]), *needles)


def test_a_usage_error_in_a_real_process_is_one_line_on_stderr():
    done = subprocess.run([sys.executable, "-m", "dgpo_edge", "serve", "--port", "70000"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: Invalid value for '--port'") and done.stderr.count("\n") == 1, done.stderr


def test_a_group_without_a_command_still_shows_its_help():
    result = invoke("index")
    assert result.exit_code == 2 and "Usage:" in result.plain and "error:" not in result.plain


# ------------------------------------------------------------ data inspect

def test_inspect_shared_deepresearcher_dev(shared_dir):
    path = shared_dir / "data" / "qa" / "deepresearcher_dev.parquet"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    result = invoke("data", "inspect", path, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert list(report) == [str(path)]
    assert report[str(path)]["count"] == 875
    assert sum(report[str(path)]["per_source"].values()) == 875


def test_inspect_flashrag_jsonl(tmp_path):
    path = write_flashrag(tmp_path / "mini.jsonl")
    result = invoke("data", "inspect", path, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)[str(path)]
    assert report["count"] == 3
    assert sum(report["per_source"].values()) == 3
    assert report["mean_answers"] == round(4 / 3, 3)
    assert report["duplicate_groups"] == [["q1", "q3"]]


def test_inspect_table(tmp_path):
    first = write_flashrag(tmp_path / "first.jsonl")
    second = write_flashrag(tmp_path / "second.jsonl")
    result = invoke("data", "inspect", first, second)
    assert result.exit_code == 0, result.output
    for needle in ("first.jsonl", "second.jsonl", "3 questions", "1 group(s)", "q1, q3"):
        assert needle in result.flat, needle


def test_inspect_malformed_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "q1", "question": "Who?", "golden_answers": ["X"]}\n'
                    '{"id": "q2", "question": "What?", "golden_answers": ["Y"\n', encoding="utf-8")
    assert_one_line_error(invoke("data", "inspect", path), str(path), "line 2")


def test_inspect_missing_file(tmp_path):
    path = tmp_path / "nowhere.jsonl"
    assert_one_line_error(invoke("data", "inspect", path), str(path), "no such file")


def test_inspect_non_utf8(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "q1", "question": "Who?", "golden_answers": ["X"]}\n'
                     b'{"id": "q2", "question": "caf\xe9?", "golden_answers": ["Y"]}\n')
    assert_one_line_error(invoke("data", "inspect", path), str(path), "line 2", "UTF-8")


def test_inspect_unknown_format(tmp_path):
    path = write_flashrag(tmp_path / "mini.jsonl")
    assert_one_line_error(invoke("data", "inspect", path, "--format", "bogus"), str(path), "bogus")


def test_inspect_error_keeps_brackets_in_paths(tmp_path):
    path = tmp_path / "data[v1].jsonl"
    assert_one_line_error(invoke("data", "inspect", path), str(path))


# ------------------------------------------------------------ data factbook

@pytest.fixture(scope="module")
def factbook_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "factbookqa"  # does not exist yet: the command creates it
    return out, invoke("data", "factbook", "--out", out, "--samples", "2")


def test_factbook_builds_and_reports(factbook_run):
    out, result = factbook_run
    assert result.exit_code == 0, result.output
    for name in ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "oracle.jsonl", "stats.json",
                 "manifest.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    text = result.flat
    assert f"FactbookQA (seed 0, {stats['passages']:,} passages)" in text
    for name, split in stats["splits"].items():
        row = next(line for line in result.plain.splitlines() if re.match(rf"\W*{name}\b", line))
        cells = [c.strip() for c in re.split(r"[│┃|]", row.strip(" │┃|"))]
        assert cells[:5] == [name, str(split["countries"]), str(split["questions"]),
                             str(split["by_hops"].get("1", 0)), str(split["by_hops"].get("2", 0))], row
    assert f"multi-hop share {stats['multi_hop_share']:.1%}" in text
    assert f"oracle trajectories {stats['oracle_trajectories']:,}" in text
    assert f"wrote {out}/" in text


def test_factbook_prints_sample_questions(factbook_run):
    out, result = factbook_run
    assert result.exit_code == 0, result.output
    dev = {row["id"]: row for row in map(json.loads, (out / "dev.jsonl").read_text(encoding="utf-8").splitlines())}
    shown = re.findall(r"(fbqa-dev-\d{5}) · (\w+) · (\d) hop\(s\)", result.plain)
    assert len(shown) == 2
    assert len({kind for _, kind, _ in shown}) == 2  # one of each type first
    for qid, kind, hops in shown:
        row = dev[qid]
        assert (row["type"], str(row["hops"])) == (kind, hops)
        assert " ".join(f"Q: {row['question']}".split()) in result.flat
        assert " ".join(f"gold: {' | '.join(row['golden_answers'])}".split()) in result.flat
        for pid in row["evidence"]:
            assert f"passage {pid} " in result.flat


def test_factbook_requires_out():
    result = invoke("data", "factbook")
    assert result.exit_code == 2
    assert "--out" in result.plain


@pytest.mark.parametrize("command", [["data", "factbook"], ["data", "build", "records", "--size", "20"]])
def test_negative_samples_is_a_one_line_error(tmp_path, command):
    """`--samples -1` printed every dev question but the last (rows[:n]), after building the world."""
    assert_one_line_error(invoke(*command, "--out", tmp_path / "x", "--samples", "-1"), "'--samples'")
    assert not (tmp_path / "x").exists()


def test_factbook_bad_holdout_is_a_one_line_error(tmp_path):
    result = invoke("data", "factbook", "--out", tmp_path / "x", "--holdout", "0.7")
    assert result.exit_code == 2 and "Traceback" not in result.plain
    assert "holdout" in result.plain
