"""Helpers shared by the CLI tests: a wide, colourless runner and the bad-input check."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from dgpo_edge.cli.main import app

# Wide and colourless, so rich neither wraps nor colours what the assertions read.
runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", "FORCE_COLOR": None})
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def invoke(*args: object):
    result = runner.invoke(app, [str(a) for a in args])
    result.plain = _ANSI.sub("", result.output)  # type: ignore[attr-defined]
    # rich wraps long lines at the console width; `flat` undoes that for substring checks.
    result.flat = " ".join(result.plain.split())  # type: ignore[attr-defined]
    return result


def assert_one_line_error(result, *needles: str) -> str:
    """Bad input: exit status 2 and one `error: ...` line naming the problem; no traceback."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.plain
    lines = [line for line in result.plain.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.plain
    assert result.stdout == "", result.stdout  # the line is on stderr; no progress leftovers on stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
