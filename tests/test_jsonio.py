"""jsonio: replace_dir (the one way finished folders are swapped into place) and the JSON-lines reader."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from dgpo_edge import jsonio
from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import cut_torn_last_line, iter_lines, read_jsonl, replace_dir
from dgpo_edge.worlds.mixture import _changed_file

from cli_helpers import invoke
from kill_helpers import KILL_AT_NTH_REPLACE


def _folder(path: Path, text: str) -> Path:
    path.mkdir()
    (path / "f.txt").write_text(text)
    return path


def test_replace_dir_moves_a_new_folder_into_place(tmp_path: Path):
    src = _folder(tmp_path / ".build", "new")
    replace_dir(src, tmp_path / "out")
    assert (tmp_path / "out" / "f.txt").read_text() == "new" and not src.exists()


def test_replace_dir_replaces_an_old_folder_and_leaves_no_trash(tmp_path: Path):
    _folder(tmp_path / "out", "old")
    _folder(tmp_path / ".out.old", "leftover of a swap killed after its renames")
    (tmp_path / ".out.dgpo-edge-swap").write_text('{"replacing": ".out.old"}')   # which its journal vouches for
    replace_dir(_folder(tmp_path / ".build", "new"), tmp_path / "out")
    assert (tmp_path / "out" / "f.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_dot_old_folder_no_journal_vouches_for_is_never_deleted(tmp_path: Path):
    """`.out.old` was deleted before every replacing of `out`, whoever made it (a person's backup
    `mv out .out.old`): it is now refused, before the work and at the swap, and left as it is."""
    out = _folder(tmp_path / "out", "old")
    (out / "manifest.json").write_text('{"produced_by": "dgpo-edge 0.1.0"}')
    backup = _folder(tmp_path / ".out.old", "my backup")
    with pytest.raises(InputError, match=r"\.out\.old: is in the way: out is renamed there while it is replaced"):
        jsonio.check_replaceable(out)
    with pytest.raises(InputError, match="is in the way"):
        replace_dir(_folder(tmp_path / ".build", "new"), out)
    assert (backup / "f.txt").read_text() == "my backup" and (out / "f.txt").read_text() == "old"
    replace_dir(tmp_path / ".build", tmp_path / "new")   # a new folder needs no room beside it
    assert (tmp_path / "new" / "f.txt").read_text() == "new" and (backup / "f.txt").read_text() == "my backup"


def test_atomic_dir_refuses_a_folder_it_did_not_write(tmp_path: Path):
    """An --out given by mistake keeps every file; a folder with dgpo-edge's manifest is replaced."""
    mine = _folder(tmp_path / "thesis", "three years of work")
    with pytest.raises(InputError, match="is not a folder dgpo-edge wrote; refusing to replace it"):
        with jsonio.atomic_dir(mine) as tmp:
            (tmp / "corpus.jsonl").write_text("{}")
    assert [p.name for p in mine.iterdir()] == ["f.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis"]        # nothing written beside it either
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="exists and is not a directory"):
        with jsonio.atomic_dir(tmp_path / "file"):
            pass

    ours = tmp_path / "world"
    ours.mkdir()
    (ours / "manifest.json").write_text('{"kind": "notes", "produced_by": "dgpo-edge 0.1.0"}')
    with jsonio.atomic_dir(ours) as tmp:
        (tmp / "corpus.jsonl").write_text("{}")
    assert [p.name for p in ours.iterdir()] == ["corpus.jsonl"]
    with jsonio.atomic_dir(mine, lambda d: (d / "f.txt").is_file(), "a folder with f.txt") as tmp:
        (tmp / "g.txt").write_text("new")                                  # a caller's own test of what it wrote
    assert [p.name for p in mine.iterdir()] == ["g.txt"]


def _bundle(path: Path) -> Path:
    """A folder with a bundle's manifest (all `bundle_holding` reads) and a model file in it."""
    (path / "model").mkdir(parents=True)
    (path / "manifest.json").write_text('{"format": "dgpo-edge-bundle", "produced_by": "dgpo-edge 0.1.0"}')
    (path / "model" / "m.gguf").write_bytes(b"GGUF")
    return path


def test_outputs_inside_a_bundle_are_refused(tmp_path: Path):
    """A folder written inside a bundle (`--out B/model`, `--out B/index`) replaced or added files
    its manifest lists with their sha256, or does not list: the bundle then failed its own check."""
    b = _bundle(tmp_path / "B")
    checks = [jsonio.check_replaceable,
              lambda out: jsonio.check_holds_only(out, {"m.gguf"}, "a model's", "elsewhere")]
    for check in checks:
        for out in (b / "model", b / "index", b / "model" / "new" / "deeper"):
            with pytest.raises(InputError, match=r"is inside the bundle .*B, whose manifest lists every file"):
                check(out)
        check(tmp_path / "elsewhere")                # beside the bundle: fine
    jsonio.check_replaceable(b, lambda d: True)      # the bundle itself: `export bundle --overwrite` replaces it
    (tmp_path / "link").symlink_to(b / "model")
    assert jsonio.bundle_holding(tmp_path / "link" / "m.gguf") == b.resolve()   # through a link too
    assert jsonio.bundle_holding(b) is None and jsonio.bundle_holding(tmp_path / "elsewhere") is None
    assert (b / "model" / "m.gguf").read_bytes() == b"GGUF" and not (b / "index").exists()


# --- reading JSON lines: bounded lines, a byte-order mark --------------------------------------------

def test_read_jsonl_accepts_a_utf8_byte_order_mark(tmp_path: Path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n{"a": 2}\n')
    assert list(read_jsonl(path)) == [(1, {"a": 1}), (2, {"a": 2})]


def test_a_byte_order_mark_is_only_skipped_at_the_start(tmp_path: Path):
    path = tmp_path / "bom2.jsonl"
    path.write_bytes(b'{"a": 1}\n\xef\xbb\xbf{"a": 2}\n')
    with pytest.raises(InputError, match="line 2: malformed JSON"):
        list(read_jsonl(path))


def test_an_over_long_line_is_refused_naming_file_and_line(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(jsonio, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "long.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "' + b"x" * 1000 + b'"}\n')
    with pytest.raises(InputError) as info:
        list(read_jsonl(path))
    assert f"{path}, line 2: " in str(info.value) and "1,000 bytes" in str(info.value)
    path.write_bytes(b'{"a": "' + b"x" * 991 + b'"}\n')   # exactly 1,000 bytes before the newline
    assert len(list(read_jsonl(path))) == 1


def test_a_long_line_without_newline_is_read_in_bounded_memory(tmp_path: Path, monkeypatch):
    """The 2 GB single-line file, scaled down: the cap is hit before the line is held in memory."""
    monkeypatch.setattr(jsonio, "MAX_LINE_BYTES", 1 << 20)
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"a": "')
        for _ in range(32):
            f.write(b"x" * (1 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="line 1: .*longer than"):
            list(read_jsonl(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak   # 32 MiB on disk, a few MiB at most in memory


def test_iter_lines_says_whether_a_line_is_complete(tmp_path: Path):
    path = tmp_path / "torn.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n{"a"')
    assert list(iter_lines(path)) == [(1, b'{"a": 1}\n'), (2, b"\n"), (3, b'{"a"')]


def test_cut_torn_last_line_cuts_only_a_torn_record(tmp_path: Path, monkeypatch):
    path = tmp_path / "progress.jsonl"
    path.write_bytes(b'{"id": 1}\n{"id": 2}\n{"id": 3, "q')
    assert cut_torn_last_line(path) == len(b'{"id": 3, "q')
    assert path.read_bytes() == b'{"id": 1}\n{"id": 2}\n'
    assert cut_torn_last_line(path) == 0 and path.read_bytes() == b'{"id": 1}\n{"id": 2}\n'
    # a file that is one huge line is not a torn record: refused, not truncated to nothing
    monkeypatch.setattr(jsonio, "MAX_LINE_BYTES", 1000)
    other = tmp_path / "not-ours.jsonl"
    other.write_bytes(b"x" * 5000)
    with pytest.raises(InputError, match="line 1: line longer than 1,000 bytes"):
        cut_torn_last_line(other)
    assert other.stat().st_size == 5000


# --- a swap interrupted at any step, with a real command: data build, data mix -----------------------

def _build(out: Path, seed: int):
    return invoke("data", "build", "elements", "--size", 10, "--seed", seed, "--out", out)


def _world_seed(out: Path) -> int:
    """The seed of the world in `out`, which must be whole: the files its manifest lists, as it lists them."""
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert sorted(p.name for p in out.iterdir()) == sorted([*manifest["files"], "manifest.json"])
    assert _changed_file(out, manifest) is None
    return manifest["seed"]


def _failing_at(monkeypatch, name: str, at: int, error: BaseException, sticky: bool = False) -> list[int]:
    """Make os.NAME (replace, or shutil's rmtree) raise `error` at its `at`-th call (and after, `sticky`)."""
    owner = shutil if name == "rmtree" else os
    real, calls = getattr(owner, name), [0]

    def failing(*args, **kw):
        calls[0] += 1
        if calls[0] == at or (sticky and calls[0] > at):
            raise error
        return real(*args, **kw)

    monkeypatch.setattr(owner, name, failing)
    return calls


def _interrupted_build(monkeypatch, out: Path, name: str, at: int, error: BaseException,
                       sticky: bool = False) -> bool:
    """`data build` of seed 1 onto `out`, `name` failing at its `at`-th call: whether it completed."""
    _failing_at(monkeypatch, name, at, error, sticky)
    try:
        result = _build(out, 1)
    except type(error):
        return False
    finally:
        monkeypatch.undo()
    stopped = 130 if isinstance(error, KeyboardInterrupt) else None   # the CLI's exit status for Ctrl-C
    assert result.exit_code in (0, stopped) or isinstance(result.exception, type(error)), result.output
    return result.exit_code == 0


@pytest.mark.parametrize("fill", [False, True], ids=["replacing", "filling an empty folder"])
def test_a_build_interrupted_at_any_step_leaves_the_old_world_or_the_new(tmp_path: Path, monkeypatch, fill: bool):
    """Ctrl-C at any rename of `data build` (the build's own files, the two renames that put a world
    in the place of another, or one of those filling an empty `--out`) leaves the old folder (an old
    world, or the empty folder) or the new world, whole, and nothing beside it. Filling an empty
    folder used to leave files without their manifest, which every rerun refused ("is not a world or
    mixture folder"); a Ctrl-C between the two renames, no world at all and the old one hidden."""
    out = tmp_path / "w"
    seen = set()
    for at in range(1, 60):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir() if fill else _build(out, 0)
        done = _interrupted_build(monkeypatch, out, "replace", at, KeyboardInterrupt())
        assert sorted(p.name for p in tmp_path.iterdir()) == ["w"], at
        state = _world_seed(out) if any(out.iterdir()) else "empty"
        assert state in ({1} if done else {1, "empty" if fill else 0}), (at, state)
        seen.add(state)
        assert _build(out, 1).exit_code == 0 and _world_seed(out) == 1
        if done:
            break
    assert done and seen == {1, "empty" if fill else 0}


def test_renames_that_keep_failing_leave_what_the_rerun_settles(tmp_path: Path, monkeypatch):
    """Renames failing from one on (a disk gone away) cannot put the old world back either: the
    journal stays beside `.w.old`, and the rerun puts it back and replaces it. A failure to delete
    `.w.old` once the new world is in leaves it for the rerun to delete."""
    stuck = 0
    for at in range(1, 40):
        done, left = _settled_after(tmp_path, monkeypatch, "replace", at, sticky=True)
        stuck += left
        if done:
            break
    assert done and stuck == 1   # failing at the rename in: the old world cannot be renamed back
    assert _settled_after(tmp_path, monkeypatch, "rmtree", 1) == (True, True)   # done, but for deleting .w.old


def _settled_after(tmp_path: Path, monkeypatch, name: str, at: int, sticky: bool = False) -> bool:
    """An old world w, a `data build` of another failing at the `at`-th call of `name`; the folder
    checked, and checked again after the rerun. Whether the failing build completed, and whether it
    left the journal."""
    out = tmp_path / "w"
    shutil.rmtree(out, ignore_errors=True)
    _build(out, 0)
    done = _interrupted_build(monkeypatch, out, name, at, OSError(5, "Input/output error"), sticky)
    left = (tmp_path / ".w.dgpo-edge-swap").exists()
    if left:
        assert _world_seed(out if out.exists() else tmp_path / ".w.old") in (0, 1)
    else:
        assert _world_seed(out) in ({1} if done else {0, 1}) and not (tmp_path / ".w.old").exists()
    assert _build(out, 1).exit_code == 0 and _world_seed(out) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]
    return done, left


KILLED_BUILD = KILL_AT_NTH_REPLACE + "from dgpo_edge.cli.main import app\napp(sys.argv[2:])\n"


def _killed_build(out: Path, seed: int, at: int, cwd: Path | None = None) -> bool:
    """`data build` of `seed` onto `out` in a child killed (no cleanup) at its `at`-th os.replace:
    whether it completed."""
    args = ["data", "build", "elements", "--size", "10", "--seed", str(seed), "--out", str(out)]
    run = subprocess.run([sys.executable, "-c", KILLED_BUILD, str(at), *args], capture_output=True, text=True,
                         cwd=cwd)
    assert run.returncode in (0, 137), run.stderr
    return run.returncode == 0


@pytest.mark.parametrize("fill", [False, True], ids=["replacing", "filling the current folder"])
def test_a_build_killed_at_any_rename_is_settled_by_the_next_command(tmp_path: Path, fill: bool, monkeypatch):
    """kill -9 runs no cleanup. Killed between the two renames, no world was left at all, the old one
    hidden as `.w.old`, which the rerun deleted; killed while filling `--out .`, files without their
    manifest, which every rerun refused. Now the folder holds the old world or the new one, or the
    journal beside it, by which the rerun (or `data mix` reading the world) puts the old one back,
    or removes what was half moved in."""
    out, journal = tmp_path / "w", tmp_path / ".w.dgpo-edge-swap"
    seen = set()
    for at in range(1, 60):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir() if fill else _build(out, 0)
        done = _killed_build(Path(".") if fill else out, 1, at, cwd=out if fill else tmp_path)
        if not out.exists():   # between the two renames: the old world is whole where the journal says
            assert journal.is_file() and _world_seed(tmp_path / ".w.old") == 0
            seen.add("hidden")
        elif not journal.exists():   # the old folder or the new one, as they were
            seen.add(_world_seed(out) if any(out.iterdir()) else "empty")
        monkeypatch.chdir(out if fill else tmp_path)
        rerun = _build(Path(".") if fill else out, 1)
        if fill and rerun.exit_code == 2:   # filled whole before the kill: not replaced from inside it
            assert "is the folder this command runs in" in rerun.flat
        else:
            assert rerun.exit_code == 0, rerun.output
        assert _world_seed(out) == 1
        leftovers = [p.name for p in tmp_path.iterdir() if p.name != "w" and not p.name.endswith(".tmp")]
        assert leftovers == [], (at, leftovers)   # a killed build's temp folder aside (.w.XXXX.tmp)
        if done:
            break
    assert done and seen == ({"empty", 1} if fill else {0, "hidden", 1}), seen


def test_data_mix_reads_the_world_a_killed_rebuild_hid(tmp_path: Path):
    """A `data build` of WORLDS_DIR/elements killed between its renames left no world there, the old
    one hidden as `.elements.old`: `data mix` then built another. It now puts the old one back."""
    worlds = tmp_path / "worlds"
    world = worlds / "elements"
    for at in range(1, 60):   # kill a rebuild at each rename in turn, until one is between the two
        _build(world, 2)
        if not _killed_build(world, 1, at) and not world.exists():
            break
    assert not world.exists() and (worlds / ".elements.old").is_dir(), at
    result = invoke("data", "mix", "--world", "elements=1", "--worlds-dir", worlds, "--out", tmp_path / "mix")
    assert result.exit_code == 0, result.output
    assert "building world" not in result.plain and _world_seed(world) == 2
    assert sorted(p.name for p in worlds.iterdir() if not p.name.endswith(".tmp")) == ["elements"]


@pytest.mark.skipif(jsonio.temps.fcntl is None, reason="no flock on this system")
def test_a_reader_leaves_a_live_replacing_alone(tmp_path: Path, monkeypatch):
    """A reader that settles (`data mix` reading a world, a bundle's reader) found the journal of a
    `data build` still at work between its two renames, `w` missing, and put `.w.old` back: the
    build's second rename then failed. The writer holds its journal now; a reader leaves it alone."""
    dst, src, other = tmp_path / "w", tmp_path / ".w.new", tmp_path / "other"
    umask = os.umask(0)
    os.umask(umask)
    modes = []
    for folder, seed in ((dst, 0), (src, 1), (other, 2)):
        folder.mkdir()
        (folder / "seed").write_text(str(seed))
    real, seen = os.replace, []

    def replace(a, b, **kw):
        real(a, b, **kw)
        if Path(b) == jsonio.aside(dst):   # between the two renames: another command settles `w`
            jsonio.settle_dir(dst)
            seen.append(sorted(p.name for p in tmp_path.iterdir()))
            modes.append(stat.S_IMODE((tmp_path / ".w.dgpo-edge-swap").stat().st_mode))
            with pytest.raises(InputError, match="another dgpo-edge command is replacing w right now"):
                replace_dir(other, dst)   # and another writer is told so, not that .w.old is in the way

    monkeypatch.setattr(os, "replace", replace)
    replace_dir(src, dst)
    assert seen == [[".w.dgpo-edge-swap", ".w.new", ".w.old", "other"]]   # nothing put back while the writer lived
    assert modes == [0o666 & ~umask]   # readable by other users' readers, as open() would make it
    assert (dst / "seed").read_text() == "1" and sorted(p.name for p in tmp_path.iterdir()) == ["other", "w"]
