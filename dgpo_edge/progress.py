"""Progress bars for long stages, always on stderr, with units and an ETA.

Stages report `(stage, done, total)`. Byte stages (reading or hashing files)
are shown in MB, the others as counts with their unit ("passages",
"questions"). The ETA: rich's estimate needs two updates inside its 30 s
window, so a stage whose steps are slower than that (one embedding chunk on two
cores) showed `-:--:--` for its whole run. Here the window is an hour and, until
rich has a rate, the ETA comes from the rate since the stage started (not
counting what an interrupted run had already done).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.text import Text

# Stages whose done/total are bytes, and the unit of the others.
BYTE_STAGES = frozenset({"fingerprint", "hash", "verify"})
UNITS = {"store": "passages", "embed": "passages", "add": "vectors", "factbook": "steps", "train": "steps",
         "write": "steps", "model": "steps", "index": "steps", "evaluating": "questions", "tgo": "questions",
         "scan": "files", "student": "steps"}
# Samples kept for the rate: an hour, so slow stages still get an ETA after their second update.
SPEED_WINDOW_S = 3600.0


class AmountColumn(ProgressColumn):
    """`12.3/45.6 MB` for byte stages (kB under a megabyte: a notes folder is not `0.0/0.0 MB`),
    `512/10,303 passages` for the others."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit", "")
        if unit == "bytes":
            scale, name = (1e3, "kB") if task.total is not None and task.total < 1e6 else (1e6, "MB")
            done = f"{task.completed / scale:,.1f}"
            total = "?" if task.total is None else f"{task.total / scale:,.1f}"
            return Text(f"{done}/{total} {name}", style="progress.download")
        total = "?" if task.total is None else f"{int(task.total):,}"
        return Text(f"{int(task.completed):,}/{total} {unit}".rstrip(), style="progress.download")


class EtaColumn(ProgressColumn):
    """`ETA 0:15:00`: rich's windowed estimate, else the average rate since the stage started."""

    max_refresh = 0.5

    def render(self, task: Task) -> Text:
        if task.finished:
            return Text("ETA 0:00:00", style="progress.remaining")
        left = task.time_remaining
        if left is None and task.total is not None and task.elapsed:
            done = task.completed - task.fields.get("base", 0)
            if done > 0:
                left = task.elapsed * (task.total - task.completed) / done
        if left is None:
            return Text("ETA -:--:--", style="progress.remaining")
        return Text(f"ETA {clock_text(left)}", style="progress.remaining")


def clock_text(seconds: float) -> str:
    """`1:02:03` for 3,723 seconds (hours uncapped)."""
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is a terminal. Not rich's `is_terminal`, which FORCE_COLOR makes true in a
    log too: a live display there writes its redraws into the file, and a transient one nothing."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):   # no such method, or a closed stream
        return False


def add_stage(bar: Progress, description: str, stage: str, done: int, total: int | None, **fields: Any) -> TaskID:
    """A task for `stage` starting at `done` (a resumed stage's earlier work is not in its rate)."""
    return bar.add_task(description, total=total, completed=done, unit=fields.pop("unit", unit_of(stage)),
                        base=done, **fields)


def stage_progress(console: Console | None = None, get_time: Callable[[], float] | None = None,
                   transient: bool = False, extra: tuple[ProgressColumn, ...] = ()) -> Progress:
    """A (not yet started) Progress on stderr: description, bar, amount with unit, `extra`, ETA."""
    return Progress(TextColumn("{task.description:<20}"), BarColumn(), AmountColumn(), *extra, EtaColumn(),
                    console=console or Console(stderr=True), transient=transient,
                    speed_estimate_period=SPEED_WINDOW_S, get_time=get_time)


def unit_of(stage: str) -> str:
    return "bytes" if stage in BYTE_STAGES else UNITS.get(stage, "")


class StageBars:
    """A `(stage, done, total)` callback: one bar per stage, drawn from the first call on."""

    def __init__(self, title: str | None = None, console: Console | None = None,
                 descriptions: dict[str, str] | None = None, transient: bool = False):
        self.title = title
        self.console = console
        self.descriptions = descriptions or {}
        self.transient = transient
        self.bar: Any = None
        self._tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        if self.bar is None:
            self.bar = stage_progress(self.console, transient=self.transient)
            if self.title:
                self.bar.console.print(self.title, highlight=False)
            self.bar.start()
        if stage not in self._tasks:
            self._tasks[stage] = add_stage(self.bar, self.descriptions.get(stage, stage), stage, done, total)
        self.bar.update(self._tasks[stage], completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def abandon(self) -> None:
        """Clear the display without Progress.stop(), which also prints a blank line when not on a
        terminal: on bad input the `error:` line then stands alone."""
        if self.bar is not None:
            self.bar.live.transient = True
            self.bar.live.stop()
            self.bar = None
