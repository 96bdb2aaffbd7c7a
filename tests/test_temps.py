"""What killed writers leave (`dgpo_edge.temps`): temporaries held while written, swept once abandoned."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dgpo_edge import jsonio, temps

from kill_helpers import killed_at

pytestmark = pytest.mark.skipif(temps.fcntl is None, reason="no flock on this system: nothing is swept")


def _age(path: Path, seconds: float = 2 * temps.STALE_AFTER_S) -> Path:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)
    return path


def _old_file(path: Path, text: str) -> Path:
    path.write_text(text)
    return _age(path)


def test_only_abandoned_temporaries_of_that_name_are_swept(tmp_path):
    pattern = temps.temp_pattern(".a.json.", ".tmp")
    _old_file(tmp_path / ".a.json.k2x9_q0z.tmp", "half")
    stale_dir = tmp_path / ".a.json.abcdefgh.tmp"
    (stale_dir / "sub").mkdir(parents=True)
    _age(stale_dir)
    young = tmp_path / ".a.json.youngone.tmp"
    young.write_text("just made: its writer may not hold it yet")
    held = _old_file(tmp_path / ".a.json.heldheld.tmp", "a writer alive")
    kept = {".a.json.youngone.tmp", ".a.json.heldheld.tmp"}
    for name in (".a.json.short.tmp", ".a.json.abcdefgh.tmp.bak", "a.json.abcdefgh.tmp", ".a.json.ABCDEFGH.tmp",
                 ".b.json.abcdefgh.tmp"):   # not a name mkstemp makes for a.json: a person's, or another target's
        _old_file(tmp_path / name, "not ours")
        kept.add(name)
    (tmp_path / ".a.json.linklink.tmp").symlink_to(tmp_path / "elsewhere")
    kept.add(".a.json.linklink.tmp")
    with temps.holding(held):   # another open of the file: flock conflicts within one process too
        removed = temps.sweep(tmp_path, pattern)
    assert sorted(removed) == [".a.json.abcdefgh.tmp", ".a.json.k2x9_q0z.tmp"]
    assert {p.name for p in tmp_path.iterdir()} == kept
    assert temps.sweep(tmp_path, pattern) == [".a.json.heldheld.tmp"]   # let go: its writer is gone
    assert temps.sweep(tmp_path / "missing", pattern) == []


def _killed(code: str, at: int = 1) -> None:
    """Run `code` in a child that dies (os._exit, no cleanup) at its `at`-th os.replace."""
    assert killed_at(code, at) == 137


def test_the_next_write_of_a_file_removes_what_a_killed_one_left(tmp_path):
    target = tmp_path / "report.json"
    _killed(f"from dgpo_edge import jsonio\njsonio.write_json({str(target)!r}, {{'rows': [1] * 1000}})\n")
    [left] = [p for p in tmp_path.iterdir()]
    assert left.name.startswith(".report.json.") and left.name.endswith(".tmp") and not target.exists()
    jsonio.write_json(target, {"rows": []})   # under a minute old: it could be a live writer's
    assert left.exists()
    _age(left)
    jsonio.write_json(target, {"rows": [2]})
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    assert json.loads(target.read_text(encoding="utf-8")) == {"rows": [2]}


def test_the_next_build_of_a_folder_removes_what_a_killed_one_left(tmp_path):
    out = tmp_path / "world"
    _killed("from dgpo_edge import jsonio\n"
            f"with jsonio.atomic_dir({str(out)!r}) as tmp:\n"
            "    (tmp / 'corpus.jsonl').write_text('x' * 10000)\n"
            "    jsonio.write_json(tmp / 'manifest.json', {'produced_by': 'dgpo-edge'})\n", at=2)
    [left] = [p for p in tmp_path.iterdir()]
    assert left.name.startswith(".world.") and (left / "corpus.jsonl").is_file() and not out.exists()
    _age(left)
    with jsonio.atomic_dir(out) as tmp:
        jsonio.write_json(tmp / "manifest.json", {"produced_by": "dgpo-edge"})
        assert sorted(p.name for p in tmp_path.iterdir()) == [tmp.name]   # swept before the new one was made
    assert [p.name for p in tmp_path.iterdir()] == ["world"]


def test_a_live_writers_temporary_is_left_alone(tmp_path):
    """A writer still at work, however long it takes, holds its temporary: a second writer of the
    same file does not remove it."""
    target = tmp_path / "big.gguf"
    with jsonio.atomic_path(target) as tmp:
        tmp.write_bytes(b"part of a model")
        _age(tmp)
        jsonio.write_text(target, "another writer, finished first")
        assert tmp.read_bytes() == b"part of a model"
    assert target.read_bytes() == b"part of a model"
    assert [p.name for p in tmp_path.iterdir()] == ["big.gguf"]


def test_a_work_folder_is_removed_after_its_block_and_swept_after_a_kill(tmp_path):
    """`export gguf` writes an f16 copy of the model in a work folder beside --out (a GB for a 0.5B
    model): gone after the export, and after a killed export, gone at the next one."""
    with temps.work_dir(tmp_path, ".m.gguf.") as work:
        (work / "f16.gguf").write_bytes(b"x")
    assert list(tmp_path.iterdir()) == []
    _killed("from dgpo_edge import temps\n"
            f"with temps.work_dir({str(tmp_path)!r}, '.m.gguf.') as work:\n"
            "    (work / 'f16.gguf').write_bytes(b'x' * 1000)\n"
            "    os.replace(work / 'f16.gguf', work / 'f16.gguf')\n")
    [left] = list(tmp_path.iterdir())
    assert (left / "f16.gguf").is_file()
    _age(left)
    backup = tmp_path / ".m.gguf.20261201"   # a person's, eight characters after the same prefix
    backup.mkdir()
    _age(backup)
    with temps.work_dir(tmp_path, ".m.gguf.") as work:
        assert sorted(tmp_path.iterdir()) == sorted([work, backup]) and work.name.endswith(".tmp")
    assert list(tmp_path.iterdir()) == [backup]


def test_a_sweep_never_opens_a_fifo_or_follows_a_link(tmp_path):
    """A name that matches but is a FIFO would block the open for ever; a link is not ours to judge."""
    fifo = tmp_path / ".a.json.fifofifo.tmp"
    os.mkfifo(fifo)
    _age(fifo)
    (tmp_path / ".a.json.linklink.tmp").symlink_to(fifo)
    assert temps.sweep(tmp_path, temps.temp_pattern(".a.json.", ".tmp")) == []
    assert fifo.exists()


def test_a_filesystem_without_flock_writes_unheld_and_sweeps_nothing(tmp_path, monkeypatch):
    """Some network filesystems answer flock with ENOLCK: writes must go on, and nothing may be
    taken for abandoned there."""
    import errno

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    stale = tmp_path / ".a.json.abcdefgh.tmp"
    stale.write_text("a writer's, or a killed one's: no telling here")
    _age(stale)
    monkeypatch.setattr(temps.fcntl, "flock", no_locks)
    jsonio.write_json(tmp_path / "a.json", {"ok": True})
    assert json.loads((tmp_path / "a.json").read_text(encoding="utf-8")) == {"ok": True}
    assert stale.exists()


def test_a_temporary_whose_block_raises_is_gone_and_a_renamed_one_stays(tmp_path):
    """Every writer makes its temporary with `temps.new` and holds it with `temps.holding`: an
    error in the block removes the file or folder (nothing left for a sweep a minute on), and one
    the block renamed into place before the error is left where it went."""
    for folder in (False, True):
        tmp = temps.new(tmp_path, ".a.", folder=folder)
        assert temps.temp_pattern(".a.", ".tmp").fullmatch(tmp.name)
        with pytest.raises(KeyboardInterrupt), temps.holding(tmp):
            if folder:
                (tmp / "part.bin").write_bytes(b"x")
            assert temps.held(tmp)
            raise KeyboardInterrupt
        assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError), temps.held_file(tmp_path / "marker.json", "{}"):
        assert temps.held(tmp_path / "marker.json")
        raise ValueError
    assert [p.name for p in tmp_path.iterdir()] == ["marker.json"]
    assert not temps.held(tmp_path / "marker.json")
