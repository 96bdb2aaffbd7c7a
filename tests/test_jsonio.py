"""replace_dir: the one way finished folders (checkpoints, exports, bundles) are swapped into place."""

from __future__ import annotations

from pathlib import Path

from dgpo_edge.jsonio import replace_dir


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
    _folder(tmp_path / ".out.old", "stale leftover of an earlier crash")
    replace_dir(_folder(tmp_path / ".build", "new"), tmp_path / "out")
    assert (tmp_path / "out" / "f.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
