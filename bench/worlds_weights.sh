# The every-world mixture the shipped student is trained on (relative weights; `notes@2` adds the notes
# world built with seed 2, other people; seed 1 is notes-s1, never trained on). Sourced by
# bench/worlds_depths.sh and bench/lease/prepare.sh so that both build the same mixture.
SHIPPED_WEIGHTS="factbook=0.5 cities=0.1 dictionary=0.1 elements=0.08 notes=0.074 notes@2=0.074 notes@3=0.074"
# The same plus the records world (docs/worlds.md, "records"): many field names in several layouts,
# to see whether reading the field a question names carries to notes held out. Measured on 2026-11-29
# (docs/worlds.md, "records"): it did not (KD student on held-out notes 0.211, 0.174 without records).
RECORDS_WEIGHTS="$SHIPPED_WEIGHTS records=0.1"
# The shipped mixture plus the catalog world (docs/worlds.md, "catalog"): cards like records' with none
# of their field names, layouts or question forms, so that records held out still test reading cards
# never seen while the skill stays in training. Measured on 2026-11-29 (docs/worlds.md, "Catalog in the
# mixture"): records held out, the 24-layer KD student 0.710 with catalog, 0.337 without.
CATALOG_WEIGHTS="$SHIPPED_WEIGHTS catalog=0.1"
# The shipped mixture plus the club world (docs/worlds.md, "club"): a rowing club member's linked Markdown
# notes, none of the notes world's names, relations, lines, folders or question forms, so that notes held
# out still test notes never seen while searching a person's linked notes stays in training. Measured on 2026-12-01
# (docs/worlds.md, "Club in the mixture"): it did not carry (KD student on held-out notes 0.156, 0.188 without club).
CLUB_WEIGHTS="$SHIPPED_WEIGHTS club=0.1"
# Club built with `data build club --oracle-search asked` (into WORLDS_DIR=out/worlds-asked) under these same
# weights: measured on 2026-12-02 (docs/worlds.md, "Club built `asked`"): no club surnames in the searches
# over held-out notes any more, and the KD student still misreads them (0.133 and 0.115, 0.115 with club's default oracle).
