"""Build the notes world: the usual world files, and optionally the notes as Markdown files.

    dgpo-edge data build notes --out DIR [--as-folder]

Each note is one corpus passage (its title, then its lines). With `as_folder`
the same notes are also written under DIR/notes/ (people/, teams/, rooms/,
projects/, meetings/, travel/, home/), ready for `dgpo-edge index build
DIR/notes`; every question row names its evidence notes by path (`notes`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ... import jsonio
from ...errors import InputError
from ..base import WorldPassage
from ..phrasing import Phraser
from ..pipeline import WorldSpec, assign_splits, build_world, check_holdout
from .people import FIRST, MIN_PEOPLE, generate as generate_workplace
from .questions import Asker, generate
from .render import notes as render_notes

SPEC = WorldSpec(kind="notes", source="generated", prefix="notes")  # from the seed alone
DEFAULT_PEOPLE = 100


def build_notes(out: str | Path, seed: int = 0, holdout: float = 0.15, size: int | None = None,
                as_folder: bool = False, say: Callable[[str], None] = lambda msg: None) -> dict:
    """Build the notes world into `out` (`size`: how many people, 6 to 118; default 100)."""
    check_holdout(holdout)
    if size is not None and not MIN_PEOPLE <= size <= len(FIRST):
        raise InputError(f"--size for notes counts people: {MIN_PEOPLE} to {len(FIRST)}, got {size}")
    say("generating the workplace")
    w = generate_workplace(seed, size or DEFAULT_PEOPLE)
    notes = render_notes(w)
    passages = [WorldPassage(str(i), n.title, n.text) for i, n in enumerate(notes.values())]
    pid = {n.path: p.id for n, p in zip(notes.values(), passages)}
    say(f"generating questions over {len(notes)} notes")
    candidates = generate(Asker(w, notes, pid, Phraser(seed, "notes")))
    split_of = assign_splits({n.key for n in notes.values()}, seed, holdout)
    stats = build_world(out, SPEC, passages, candidates, split_of, seed, say)
    if as_folder:
        for n in notes.values():
            path = Path(out) / "notes" / n.path
            path.parent.mkdir(parents=True, exist_ok=True)
            jsonio.write_text(path, n.markdown)
    return stats
