"""Build the club world: the usual world files, and optionally the notes as Markdown files.

    dgpo-edge data build club --out DIR [--as-folder] [--oracle-search asked]

The notes world's sibling: one rowing club member's notes (members/, crews/, fleet/,
boathouses/, regattas/, lifts/, repairs/), cross-referenced with [[links]], asked about in
1-hop facts and 2- and 3-hop chains, with none of the notes world's names, relations, lines,
folders or question forms. With `club` in training, `notes` can be held out and still measure
notes never seen while searching a person's linked notes stays in training. Each note is one
corpus passage; `as_folder` also writes the notes under DIR/notes/, as for the notes world.
"""

from __future__ import annotations

from functools import partial

from ..notebook import NoteWorld, build_notebook
from ..pipeline import WorldSpec
from .members import FIRST, MIN_MEMBERS, generate as generate_club
from .questions import CHAIN, FACT, generate
from .render import notes as render_notes

SPEC = WorldSpec(kind="club", source="generated", prefix="club")  # from the seed alone
DEFAULT_MEMBERS = 100
CLUB = NoteWorld(SPEC, generate_club, render_notes, FACT, CHAIN, generate, "the club", "members",
                 MIN_MEMBERS, len(FIRST), DEFAULT_MEMBERS)

# (out, seed=0, holdout=0.15, size=None, as_folder=False, oracle_search="title", say)
build_club = partial(build_notebook, CLUB)
