"""Every command: one spelling per option, -h, a usage example, --json, and friendly missing extras."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typing import Any

import pytest
import typer

from cli_helpers import invoke
from dgpo_edge.errors import InputError
from dgpo_edge.cli.main import app

ROOT = typer.main.get_command(app)


def leaf_commands(group: Any = ROOT, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """{"index search": command, ...} for every runnable command (Typer's click objects: duck-typed,
    since Typer may bring its own copy of click)."""
    found: dict[str, Any] = {}
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            found.update(leaf_commands(cmd, (*path, name)))
        else:
            found[" ".join((*path, name))] = cmd
    return found


COMMANDS = leaf_commands()


def visible_options(cmd: Any) -> dict[str, Any]:
    """{option string: its option} for options shown in --help."""
    return {o: p for p in cmd.params if p.param_type_name == "option" and not p.hidden for o in p.opts}


# The commands that take each shared option: same spelling (and short form) everywhere.
TOP_K = {"ask", "eval", "chat", "serve", "index search", "index serve", "export bundle", "train tgo"}
MAX_SEARCHES = {"ask", "eval", "chat", "serve", "export bundle", "train tgo"}
GPU_LAYERS = {"ask", "eval", "chat", "serve", "export bundle"}
JSON = {"ask", "eval", "index search", "index info", "index update", "bundle info", "bundle verify", "data inspect",
        "export gguf", "export onnx"}


def test_the_walk_finds_every_command():
    assert {"ask", "index search", "train tgo", "bundle verify", "export bundle"} <= set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_option_names(path):
    opts = visible_options(COMMANDS[path])
    assert not {"--topk", "--max-turns", "--k"} & set(opts), (path, sorted(opts))
    assert ("--top-k" in opts) == (path in TOP_K), path
    if path in TOP_K:
        assert opts["--top-k"].opts == ["--top-k", "-k"], opts["--top-k"].opts
    if "-k" in opts:
        assert opts["-k"].name in ("top_k", "k", "topk"), path
    assert ("--max-searches" in opts) == (path in MAX_SEARCHES), path
    assert ("--gpu-layers" in opts) == (path in GPU_LAYERS), path
    assert ("--json" in opts) == (path in JSON), path
    if path in MAX_SEARCHES:
        assert "final" in (opts["--max-searches"].help or ""), "the help says the answer turn comes on top"


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_short_help_and_a_usage_example(path):
    r = invoke(*path.split(), "-h")
    assert r.exit_code == 0, r.output
    assert "Usage:" in r.plain
    assert "Example" in r.plain and f"dgpo-edge {path} " in r.flat, r.plain[-600:]


def test_groups_take_short_help_and_completion_is_on():
    assert invoke("-h").exit_code == 0 and invoke("index", "-h").exit_code == 0
    r = invoke("--help")
    assert "--install-completion" in r.plain and "--show-completion" in r.plain


def test_deprecated_spellings_still_parse_but_are_hidden():
    serve = COMMANDS["index serve"]
    ctx = serve.make_context("serve", ["idx", "--topk", "5"])
    assert ctx.params["old_topk"] == 5
    assert "--topk" not in invoke("index", "serve", "-h").plain


REQUIRED = {"ask": ["q"], "eval": ["--data", "d"], "export bundle": ["--model", "m", "--index", "i", "--out", "o"],
            "train tgo": ["--teacher", "t", "--data", "d", "--index", "i", "--out", "o"]}


@pytest.mark.parametrize("path", sorted(MAX_SEARCHES))
def test_the_old_max_turns_still_parses_but_is_hidden(path):
    """`--max-turns` was the name of `--max-searches`; scripts that use it keep working."""
    from dgpo_edge.cli.common import max_searches_of

    args = [*REQUIRED.get(path, []), "--max-turns", "2"]
    ctx = COMMANDS[path].make_context(path, args)
    assert ctx.params["old_max_turns"] == 2
    assert max_searches_of(ctx.params["max_searches"], ctx.params["old_max_turns"]) == 2
    assert "--max-turns" not in invoke(*path.split(), "-h").plain


# ------------------------------------------------------------------- the agent's search options

AGENT = {"ask": ["q"], "chat": [], "eval": ["--data", "DATA"], "serve": ["--port", "0"]}


def agent_args(path: str, tmp_path: Path, *extra: str) -> list[str]:
    """`path`'s required arguments, a missing --model and --index (so that options the check lets
    through end at once in "no such model", not in building the default bundle) and `extra`."""
    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "q", "golden_answers": ["a"]}\n')
    args = [str(data) if a == "DATA" else a for a in AGENT[path]]
    return [*path.split(), *args, "--model", str(tmp_path / "no-model.gguf"), "--index", str(tmp_path / "no-index"),
            *extra]


@pytest.mark.parametrize("path", sorted(AGENT))
@pytest.mark.parametrize("extra, needle", [
    (["-k", "0"], "--top-k must be in 1..20, got 0"),
    (["--top-k", "21"], "--top-k must be in 1..20, got 21"),
    (["--max-searches", "-1"], "--max-searches must be in 0..16, got -1"),
    (["--max-searches", "17"], "--max-searches must be in 0..16, got 17"),
    (["--max-turns", "17"], "--max-turns must be in 0..16, got 17"),   # the old spelling, the same range, its name
])
def test_the_agent_commands_share_one_range_for_the_search_options(path, extra, needle, tmp_path, monkeypatch):
    """ask, chat, eval and serve: one check (chat alone capped --top-k at 20, with a Rich box)."""
    from cli_helpers import assert_one_line_error

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert_one_line_error(invoke(*agent_args(path, tmp_path, *extra)), needle)


@pytest.mark.parametrize("path", sorted(AGENT))
def test_the_ends_of_the_ranges_are_taken(path, tmp_path, monkeypatch):
    from cli_helpers import assert_one_line_error

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for extra in (["-k", "20", "--max-searches", "16"], ["-k", "1", "--max-searches", "0"]):
        assert_one_line_error(invoke(*agent_args(path, tmp_path, *extra)), "no such model", "no-model.gguf")


@pytest.mark.parametrize("extra, needle", [(["-k", "21"], "--top-k must be in 1..20, got 21"),
                                           (["--max-searches", "17"], "--max-searches must be in 0..16, got 17")])
def test_a_bundle_records_only_search_settings_the_agent_commands_take(extra, needle, tmp_path):
    """export bundle: a bundle made with -k 50 would give ask and chat a setting they refuse."""
    from cli_helpers import assert_one_line_error

    out = tmp_path / "b"
    assert_one_line_error(invoke("export", "bundle", "--model", tmp_path / "m.gguf", "--index", tmp_path / "idx",
                                 "--out", out, *extra), needle)
    assert not out.exists() and not (tmp_path / "b.partial").exists()


def test_the_ranges_are_the_chat_settings_screens():
    """A chat started with -k 20 opens a settings screen that can save it."""
    pytest.importorskip("textual")
    from textual.validation import Integer

    from dgpo_edge.apps.chat import screens
    from dgpo_edge.protocol import MAX_SEARCHES, MAX_TOP_K

    assert (screens.MAX_TOP_K, screens.MAX_SEARCHES) == (MAX_TOP_K, MAX_SEARCHES) == (20, 16)
    assert Integer(1, screens.MAX_TOP_K).validate("20").is_valid
    assert not Integer(1, screens.MAX_TOP_K).validate("21").is_valid


# ------------------------------------------------------------------- empty paths

def path_params() -> list[tuple[str, Any]]:
    """(command, parameter) for every parameter that names a file or folder."""
    from dgpo_edge.cli.common import _names_a_path

    return [(path, p) for path, cmd in sorted(COMMANDS.items()) for p in cmd.params if _names_a_path(p)]


def args_with_empty(cmd: Any, target: Any) -> list[str]:
    """`cmd`'s arguments with "" for `target` and "1" for every other required parameter."""
    args: list[str] = []
    for p in cmd.params:
        if p is target or p.required:
            value = "" if p is target else "1"
            args += [value] if p.param_type_name == "argument" else [p.opts[0], value]
    return args


def test_the_parameters_that_name_paths():
    names = {(path, p.name) for path, p in path_params()}
    assert {("index build", "corpus"), ("index build", "out"), ("ask", "index"), ("eval", "data"),
            ("plot", "run_dirs"), ("export gguf", "model"), ("index build", "encoder"),
            ("bundle info", "bundle")} <= names
    # text where "" means something (`serve --host ""`: every interface) or is checked on its own
    assert not {("serve", "host"), ("plot", "label"), ("ask", "question"), ("export gguf", "pre")} & names


@pytest.mark.parametrize("path, param", path_params(), ids=lambda x: x if isinstance(x, str) else x.name)
def test_an_empty_path_is_refused_everywhere(path, param, tmp_path, monkeypatch):
    """Typer turns "" into Path("."), so `index build ""` indexed the folder it ran in and
    `--out ""` wrote into it; Path("") == Path(".") afterwards, so only the raw value can tell."""
    from cli_helpers import assert_one_line_error

    monkeypatch.chdir(tmp_path)   # the old code's current folder: nothing of the repository is read or written
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    r = invoke(*path.split(), *args_with_empty(COMMANDS[path], param))
    assert_one_line_error(r, "an empty path names no file or folder")
    assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())   # nothing half-written


def test_bundle_info_json_before_the_default_bundle_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    r = invoke("bundle", "info", "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["built"] is False and obj["path"].startswith(str(tmp_path / "cache"))


# ------------------------------------------------------------------- missing extras

# Block one module in a fresh interpreter, as on a laptop install without the extra.
BLOCK = ("import sys; sys.modules[{mod!r}] = None; sys.argv = ['dgpo-edge', *{args!r}]; "
         "from dgpo_edge.cli.main import main; main()")


def run_without(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-c", BLOCK.format(mod=module, args=list(args))],
                          capture_output=True, text=True, timeout=120, env=env)


def train_config() -> str:
    return str(Path(__file__).resolve().parents[1] / "train" / "configs" / "tiny-cpu-sft.yaml")


@pytest.mark.parametrize("module, args, extra", [
    ("gguf", ["export", "gguf", "model-dir", "--out", "m.gguf"], "pip install 'dgpo-edge[export]'"),
    # torch comes with neither extra: the line says to install it (it said pip install 'dgpo-edge[export]'
    # alone, after transformers' own "PyTorch was not found" line)
    ("torch", ["export", "gguf", "model-dir", "--out", "m.gguf"], "pip install torch && pip install"),
    ("torch", ["export", "onnx", "model-dir", "--out", "o"], "pip install torch && pip install"),
    # the check in llama.cpp (or a K-quant) needs llama_cpp: said before the GGUF is written, not after
    ("llama_cpp", ["export", "gguf", "model-dir", "--out", "m.gguf"], "pip install 'dgpo-edge[export]'"),
    ("llama_cpp", ["export", "gguf", "model-dir", "--out", "m.gguf", "--no-verify", "--quant", "q4_k_m"],
     "pip install 'dgpo-edge[export]'"),
    ("torch", ["model", "from-gguf", "m.gguf", "--out", "ckpt"], "pip install 'dgpo-edge[train]'"),
    ("torch", ["train", "sft", "--config", "CONFIG"], "pip install 'dgpo-edge[train]'"),
    ("torch", ["train", "tgo", "--teacher", "t", "--data", "d", "--index", "i", "--out", "o"],
     "pip install 'dgpo-edge[train]'"),
])
def test_a_missing_extra_is_one_error_line_and_exit_2(tmp_path, module, args, extra):
    args = [train_config() if a == "CONFIG" else a for a in args]
    done = run_without(module, *args)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert f"{module} is not installed" in lines[0] and extra in lines[0], lines[0]


def test_a_long_step_gets_one_line_in_a_log_and_a_quick_one_none(monkeypatch, capsys):
    """Off a terminal (a log, a pipe) a spinner draws nothing: a step still running after a moment
    says so on one line, while a quick one (the input checks that end in an error) prints nothing."""
    import time

    from dgpo_edge.cli import common

    monkeypatch.setenv("FORCE_COLOR", "1")   # colour asked for, yet a log gets no spinner
    monkeypatch.setenv("DGPO_EDGE_PROGRESS_AFTER", "0.05")
    with common.working("writing model.gguf (q8_0)"):
        time.sleep(0.5)
    monkeypatch.setenv("DGPO_EDGE_PROGRESS_AFTER", "0.1")
    with common.working("cut short"):
        pass
    time.sleep(0.3)   # a timer cancelled when its step ended does not fire afterwards
    assert capsys.readouterr().err.splitlines() == ["writing model.gguf (q8_0) ..."]
    monkeypatch.setenv("DGPO_EDGE_PROGRESS_AFTER", "2s")
    with pytest.raises(InputError, match="DGPO_EDGE_PROGRESS_AFTER must be seconds"):
        with common.working("never"):
            pass

