"""Every `dgpo-edge ...` command shown in the README and docs/ names a command that exists and only
options that command takes: a renamed option or a removed command fails here, not in a user's shell."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer

from dgpo_edge.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)
OPERATORS = {"&&", "||", ";", "|", "&", "(", ")"}
LEADERS = {"$", "do", "then", "else", "time", "nohup", "env", "exec", "command", "setsid"}
STARTS = re.compile(r"^(?:\w+=\S*\s+)*(?:\S*/)?dgpo-edge\s")   # [VAR=x ...] [path/]dgpo-edge ...


def _command_lines(text: str) -> list[tuple[int, list[str] | None]]:
    """(line number, words) of each `dgpo-edge` invocation in the fenced code blocks, continuation
    lines joined, comments dropped; words None for a line that starts with `dgpo-edge` but cannot be
    split as a shell line (a quote left open)."""
    out = []
    for block in FENCE.finditer(text):
        first = text.count("\n", 0, block.start(1)) + 1
        joined, start = "", None
        for i, line in enumerate(block.group(1).splitlines()):
            start = first + i if start is None else start
            if line.endswith("\\"):
                joined += line[:-1] + " "
                continue
            out += [(start, words) for words in _invocations(joined + line)]
            joined, start = "", None
    return out


def _invocations(line: str) -> list[list[str] | None]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return [None] if STARTS.match(line.strip()) else []
    found, segment = [], []
    for token in [*tokens, ";"]:
        if token not in OPERATORS:
            segment.append(token)
            continue
        # VAR=value, a shell prompt, or a word that runs the command after it
        while segment and (re.fullmatch(r"\w+=.*", segment[0]) or segment[0] in LEADERS):
            segment.pop(0)
        if segment and (segment[0] == "dgpo-edge" or segment[0].endswith("/dgpo-edge")):
            found.append(["dgpo-edge", *segment[1:]])
        segment = []
    return found


def _check(words: list[str], root) -> str | None:
    """Why `dgpo-edge WORDS` would be refused for its command or an option's name, or None."""
    command, path, i = root, ["dgpo-edge"], 1
    while hasattr(command, "commands") and i < len(words) and not words[i].startswith("-"):
        sub = command.commands.get(words[i])   # a group (typer vendors click: duck-typed)
        if sub is None:
            return f"no command {' '.join(path)} {words[i]}"
        command, path, i = sub, path + [words[i]], i + 1
    names = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
    for word in words[i:]:
        if word == "--":
            break
        name = word.split("=", 1)[0]
        if re.fullmatch(r"--?[A-Za-z][\w-]*", name) and name not in names:
            return f"{' '.join(path)} has no option {name}"
    return None


def test_every_command_in_the_docs_exists_with_its_options():
    root = typer.main.get_command(app)
    bad, seen = [], 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line, words in _command_lines(page.read_text(encoding="utf-8")):
            where = f"{page.relative_to(ROOT)}:{line}"
            if words is None:
                bad.append(f"{where}: a quote is left open")
                continue
            seen += 1
            if why := _check(words, root):
                bad.append(f"{where}: {why}: {' '.join(words)[:120]}")
    assert seen > 100, seen   # the extraction found the commands (README and docs hold well over 100)
    assert bad == [], "\n".join(bad)


def test_the_check_catches_an_unknown_command_and_option():
    root = typer.main.get_command(app)
    assert _check(["dgpo-edge", "index", "build", "notes", "--out", "x"], root) is None
    assert _check(["dgpo-edge", "index", "buidl", "notes"], root) == "no command dgpo-edge index buidl"
    assert _check(["dgpo-edge", "ask", "--top-kk=3", "q"], root) == "dgpo-edge ask has no option --top-kk"
    assert _command_lines("```bash\nFOO=1 .venv/bin/dgpo-edge ask \\\n  --steps 'a; b' && echo ok  # why\n```\n") == \
        [(2, ["dgpo-edge", "ask", "--steps", "a; b"])]
    assert _command_lines("```\nout/x   made by `dgpo-edge train sft`, step\n```\n") == []
    assert _command_lines("```\nfor s in a b; do dgpo-edge eval --out $s; done\n$ dgpo-edge data worlds\n```\n") == \
        [(2, ["dgpo-edge", "eval", "--out", "$s"]), (3, ["dgpo-edge", "data", "worlds"])]


def test_every_script_and_config_the_docs_name_exists():
    """bench/ scripts, train/configs/ files and results files named in the docs are in the tree."""
    named = re.compile(r"\b((?:bench|train/configs)/[\w./-]+?\.(?:py|sh|yaml|json|jsonl)(?:\.gz)?)(?![\w.])")
    bad = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for path in named.findall(line):
                if not (ROOT / path).exists() and not re.search(r"[A-Z]{3,}", path):   # WORLD: a placeholder
                    bad.append(f"{page.relative_to(ROOT)}:{n}: {path}")
    assert bad == [], "\n".join(bad)
