"""Progress bars: on stderr, bytes shown in MB, counts with their unit, and an ETA on slow stages."""

from __future__ import annotations

import io

from rich.console import Console

from dgpo_edge.progress import StageBars, add_stage, stage_progress, unit_of


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def render(bar) -> str:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(bar.make_tasks_table(bar.tasks))
    return out.getvalue()


def test_a_slow_stage_gets_an_eta_after_its_first_step():
    # One embedding chunk every 100 s: rich's own estimate (two updates within 30 s) never comes.
    clock = Clock()
    bar = stage_progress(Console(file=io.StringIO()), get_time=clock)
    task = add_stage(bar, "embedding passages", "embed", 0, 10_240)
    assert "ETA -:--:--" in render(bar)
    clock.now = 100.0
    bar.update(task, completed=1024)
    text = render(bar)
    assert "1,024/10,240 passages" in text and "ETA 0:15:00" in text


def test_a_resumed_stage_does_not_count_earlier_work_in_its_rate():
    clock = Clock()
    bar = stage_progress(Console(file=io.StringIO()), get_time=clock)
    task = add_stage(bar, "embedding passages", "embed", 5120, 10_240)   # half done by an earlier run
    clock.now = 100.0
    bar.update(task, completed=6144)
    assert "ETA 0:06:40" in render(bar)   # 4,096 left at 1,024 per 100 s


def test_rich_rate_takes_over_once_it_has_samples():
    clock = Clock()
    bar = stage_progress(Console(file=io.StringIO()), get_time=clock)
    task = add_stage(bar, "storing passages", "store", 0, 1000)
    for t in range(1, 6):
        clock.now = float(t)
        bar.update(task, completed=100 * t)
    assert "500/1,000 passages" in render(bar) and "ETA 0:00:05" in render(bar)


def test_byte_stages_are_shown_in_megabytes():
    bar = stage_progress(Console(file=io.StringIO()))
    task = bar.add_task("reading corpus", total=45_600_000, unit=unit_of("fingerprint"))
    bar.update(task, completed=12_300_000)
    assert "12.3/45.6 MB" in render(bar)
    assert unit_of("hash") == unit_of("verify") == "bytes"
    small = bar.add_task("reading corpus", total=52_400, unit=unit_of("fingerprint"))   # 260 notes
    bar.update(small, completed=52_400)
    assert "52.4/52.4 kB" in render(bar)
    assert unit_of("scan") == "files" and unit_of("student") == "steps"


def test_stage_bars_draw_on_stderr_only(capsys):
    bars = StageBars(descriptions={"store": "storing passages"})
    bars("store", 0, 10)
    bars("store", 10, 10)
    bars.close()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "storing passages" in captured.err and "10/10 passages" in captured.err
