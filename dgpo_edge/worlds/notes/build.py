"""Build the notes world: the usual world files, and optionally the notes as Markdown files.

    dgpo-edge data build notes --out DIR [--as-folder] [--oracle-search asked]

Each note is one corpus passage (its title, then its lines). With `as_folder`
the same notes are also written under DIR/notes/ (people/, teams/, rooms/,
projects/, meetings/, travel/, home/), ready for `dgpo-edge index build
DIR/notes`; every question row names its evidence notes by path (`notes`).
"""

from __future__ import annotations

from functools import partial

from ..notebook import NoteWorld, build_notebook
from ..pipeline import WorldSpec
from .people import FIRST, MIN_PEOPLE, generate as generate_workplace
from .questions import CHAIN, FACT, generate
from .render import notes as render_notes

SPEC = WorldSpec(kind="notes", source="generated", prefix="notes")  # from the seed alone
DEFAULT_PEOPLE = 100
NOTES = NoteWorld(SPEC, generate_workplace, render_notes, FACT, CHAIN, generate, "the workplace", "people",
                  MIN_PEOPLE, len(FIRST), DEFAULT_PEOPLE)

# (out, seed=0, holdout=0.15, size=None, as_folder=False, oracle_search="title", say)
build_notes = partial(build_notebook, NOTES)
