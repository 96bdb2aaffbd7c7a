"""The records world: generated record cards (clubs, ships, museums, bands, ...) with many field names.

Why it exists: a student trained on the reference worlds searches a corpus it never saw well,
but then answers the wrong field of the passage it found ("what team does lucas belong to" ->
the team's lead; docs/worlds.md, "Leave one world out"). Those worlds ask for a few dozen
relations, so the student can learn them one by one. Records ask for 57 field names over nine
kinds of things, each record written in one of three layouts, so what carries from one record to
the next is reading the field the question names. No field is named like a relation of the
notes world (no owner, room, team, date, ...; a test checks it), so notes stay a world held out
when records are in the mixture.

Everything comes from the seed: invented names, towns and people, one passage per record.
The machinery here makes any world of such cards from a `CardWorld` (its kinds, fields, layouts
and question forms): `records` is one, and `catalog` (worlds/catalog.py) another with none of its
field names, layouts or question forms, so records can be held out while the skill stays in training.
Questions ask for one field (1 hop), for a field of the record another one links to (2 hops:
"Who is the curator of the partner museum of the Orvane Museum?"), or compare a number
field of two records of one kind.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .base import Question, WorldPassage
from .facts import Fact, Relation, bridge_question, comparison_question, fact_question
from .phrasing import Phraser
from .pipeline import HOLDOUT, WorldSpec, assign_splits, build_options, build_world, check_holdout

DEFAULT_RECORDS = 360
MAX_RECORDS = 5000   # names come from 20,360 syllable words, and a build takes about 3 per record

# first names not used by the notes world (a test checks it), surnames made from syllables
FIRST = ("Agnes", "Bertil", "Cosima", "Dorian", "Edda", "Florin", "Gwen", "Horatio", "Imke", "Jasper",
         "Kalle", "Liesel", "Magnus", "Nerys", "Odile", "Piet", "Ragna", "Silas", "Tilde", "Ulrich",
         "Vanja", "Wolfram", "Yvette", "Zeno", "Ansel", "Brigid", "Cedric", "Delphine", "Ewan", "Fenna",
         "Gisela", "Hector", "Isolde", "Jorun", "Kasimir", "Lotte", "Merle", "Niamh", "Osric", "Petra")
SYLLABLES = ("ka", "lo", "ve", "ri", "mor", "tan", "bel", "quin", "dra", "sol", "fen", "ast", "hal",
             "cor", "ny", "el", "tor", "vas", "mir", "zen", "pa", "ul", "gar", "ost", "bri", "dun", "wy")
TOWN_ENDS = ("ford", "by", "mere", "wick", "stead", "haven", "moor", "field")
COLOURS = ("teal", "crimson", "ochre", "navy blue", "emerald", "saffron", "plum", "silver grey",
           "burgundy", "olive", "amber", "cobalt", "ivory", "rust red", "lilac", "charcoal")
POOLS = {
    "specialty": ("oak cabinets", "wrought iron gates", "stained glass", "copper kettles", "violins",
                  "leather saddles", "clock springs", "wooden toys", "ship models", "harpsichords"),
    "star exhibit": ("a brass orrery", "a whale skeleton", "a Roman mosaic", "a steam carriage",
                     "a gold astrolabe", "a meteorite", "a medieval loom", "a diving suit"),
    "signature plant": ("blue poppies", "giant water lilies", "tree ferns", "desert roses", "orchids",
                        "dwarf pines", "carnivorous pitchers", "wild tulips"),
    "mascot": ("a red fox", "a heron", "a badger", "an otter", "a barn owl", "a hare", "a stag beetle"),
    "best seller": ("maps", "fountain pens", "seed packets", "tin soldiers", "jigsaw puzzles",
                    "field guides", "candles", "postcards"),
}


@dataclass(frozen=True)
class Field:
    label: str    # as questions and passages name it, e.g. "club colour"
    kind: str     # person | town | year | colour | pool | number | money | callsign | link
    arg: str = ""  # number: the unit; link: the kind of record it points to; pool: the pool's name


@dataclass(frozen=True)
class Kind:
    name: str
    patterns: tuple[str, ...]   # record names, {n} an invented word
    fields: tuple[Field, ...]


def _of(kind: str) -> Callable[[str], Field]:
    return lambda label: Field(label, kind)


P, T, Y, C = _of("person"), _of("town"), _of("year"), _of("colour")
KINDS = (
    Kind("club", ("{n} Rowing Club", "{n} Chess Club", "{n} Cycling Club"), (
        P("founder"), P("captain"), P("treasurer"), T("clubhouse town"), Y("founding year"),
        C("club colour"), Field("annual fee", "money"), Field("rival club", "link", "club"))),
    Kind("ship", ("the schooner {n}", "the steamer {n}", "the ferry {n}"), (
        P("skipper"), P("ship's cook"), T("home port"), Y("launch year"), C("hull colour"),
        Field("tonnage", "number", "tonnes"), Field("call sign", "callsign"), Field("sister ship", "link", "ship"))),
    Kind("workshop", ("{n} Joinery", "{n} Forge", "{n} Glassworks"), (
        P("master craftsman"), T("workshop town"), Y("year established"), Field("apprentices", "number"),
        Field("specialty", "pool", "specialty"), Field("main buyer", "link", "shop"))),
    Kind("shop", ("{n} Books", "{n} Hardware", "{n} Stationers"), (
        P("proprietor"), P("shop assistant"), T("shop town"), Y("opening year"), C("shopfront colour"),
        Field("best seller", "pool", "best seller"), Field("supplier", "link", "workshop"))),
    Kind("band", ("the {n} Quartet", "{n} and the Lanterns", "the {n} Brass Band"), (
        P("singer"), P("drummer"), T("home town"), Y("formation year"), Field("record label", "link", "label"))),
    Kind("label", ("{n} Records",), (
        P("label founder"), T("headquarters town"), Y("year founded"), C("logo colour"),
        Field("catalogue prefix", "callsign"), Field("biggest act", "link", "band"))),
    Kind("festival", ("the {n} Folk Festival", "the {n} Lantern Fair"), (
        P("artistic director"), T("festival town"), Y("first edition"), Field("ticket price", "money"),
        Field("mascot", "pool", "mascot"), Field("headliner", "link", "band"))),
    Kind("museum", ("the {n} Museum of Clocks", "the {n} Maritime Museum", "the {n} Museum"), (
        P("curator"), P("head of archives"), T("museum town"), Y("opening year"),
        Field("star exhibit", "pool", "star exhibit"), Field("entry fee", "money"), Field("partner museum", "link", "museum"))),
    Kind("garden", ("the {n} Botanic Garden", "the {n} Physic Garden"), (
        P("head gardener"), T("garden town"), Y("year founded"), Field("glasshouses", "number"),
        Field("signature plant", "pool", "signature plant"), Field("twin garden", "link", "garden"))),
)
COMPARE = {"year": ("Which is older, {a} or {b}?", "{a} or {b}: which came first",
                    "was {a} or {b} there earlier"),
           "number": ("Which has more {f}, {a} or {b}?", "{a} vs {b} {f}")}


@dataclass(frozen=True, eq=False)
class CardWorld:
    """A world of generated record cards: what its cards hold and how it writes and asks about them."""

    spec: WorldSpec
    kinds: tuple[Kind, ...]
    first: tuple[str, ...]                 # people's first names (surnames are invented words)
    pools: dict[str, tuple[str, ...]]      # a "pool" field's values, by pool name
    layouts: tuple[str, ...]               # how a field is written ({F} the label capitalised, {f}, {v}); one per card
    intro: str                             # the card's first sentence ({Name}, {kind})
    person_forms: tuple[str, ...]          # question forms of a person field ({f}, {x})
    other_forms: tuple[str, ...]           # ... of any other field
    compare: dict[str, tuple[str, ...]]    # comparison forms by field kind (year, number)
    inverse: dict[str, str]                # link field -> the link it inverts (a label's biggest act)
    unit: str = "records"                  # what --size counts

    @property
    def name(self) -> str:
        return self.spec.kind

    @property
    def symmetric(self) -> tuple[str, ...]:
        """Link fields that point at a card of their own kind: they come in pairs (sister ships)."""
        return tuple(f.label for k in self.kinds for f in k.fields if f.kind == "link" and f.arg == k.name)

    @property
    def field_labels(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.label for k in self.kinds for f in k.fields))


RECORDS = CardWorld(
    WorldSpec(kind="records", source="generated", prefix="rec"), KINDS, FIRST, POOLS,
    layouts=("{F}: {v}.", "Its {f} is {v}.", "{f} - {v};"), intro="{Name} is a {kind}.",
    person_forms=("Who is the {f} of {x}?", "name the {f} of {x}", "who's {x}'s {f}", "{x} {f}", "{f} of {x}"),
    other_forms=("What is the {f} of {x}?", "what's {x}'s {f}", "Tell me the {f} of {x}.", "{x} {f}", "{f} of {x}"),
    compare=COMPARE, inverse={"biggest act": "record label", "main buyer": "supplier"})
# the records world's parts by their old names (tests and scripts read them)
SYMMETRIC, INVERSE, FIELD_LABELS, LAYOUTS = RECORDS.symmetric, RECORDS.inverse, RECORDS.field_labels, RECORDS.layouts


def relations(world: CardWorld = RECORDS) -> dict[str, Relation]:
    """One relation per field label: the world's question forms around the label, person fields as 'who'."""
    out = {}
    for k in world.kinds:
        for f in k.fields:
            forms = world.person_forms if f.kind == "person" else world.other_forms
            out[f.label] = Relation(f.label, tuple(t.replace("{f}", f.label) for t in forms), (f.label,))
    return out


@dataclass
class Record:
    key: str                # "museum:orvane" (split hold-out)
    kind: Kind
    name: str               # "the Orvane Museum"
    values: dict[str, str]  # field label -> value as written

    @property
    def title(self) -> str:
        return self.name[4:] if self.name.startswith("the ") else self.name


def _word(rng: random.Random, used: set[str]) -> str:
    while True:
        w = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
        if w not in used and 4 <= len(w) <= 10:
            used.add(w)
            return w


def make_records(n: int, seed: int, world: CardWorld = RECORDS) -> list[Record]:
    """`n` cards, the kinds in turn; links point at another card of the kind they name."""
    rng, used = random.Random(f"{world.name}-{seed}"), set()
    towns = [_word(rng, used) + rng.choice(TOWN_ENDS) for _ in range(max(12, n // 6))]
    people = [f"{rng.choice(world.first)} {_word(rng, used)}" for _ in range(n * 2)]
    records = []
    for i in range(n):
        kind = world.kinds[i % len(world.kinds)]
        word = _word(rng, used)
        records.append(Record(f"{kind.name}:{word.lower()}", kind, rng.choice(kind.patterns).format(n=word), {}))
    by_kind = {k.name: [r for r in records if r.kind is k] for k in world.kinds}
    symmetric = world.symmetric
    for r in records:
        for f in r.kind.fields:
            if f.label not in symmetric and f.label not in world.inverse:
                r.values[f.label] = _value(f, r, by_kind, rng, towns, people, world.pools)
    _pair(world, by_kind, rng)
    _invert(world, records, by_kind, rng)
    return records


def _pair(world: CardWorld, by_kind: dict[str, list[Record]], rng: random.Random) -> None:
    """Symmetric links come in pairs: two sister ships name each other (an odd one out names any other)."""
    for k in world.kinds:
        for label in (f.label for f in k.fields if f.label in world.symmetric):
            _pair_up(list(by_kind[k.name]), label, rng)


def _pair_up(group: list[Record], label: str, rng: random.Random) -> None:
    rng.shuffle(group)
    for a, b in zip(group[::2], group[1::2]):
        a.values[label], b.values[label] = b.title, a.title
    if len(group) % 2:
        last = group[-1]
        last.values[label] = rng.choice([r for r in group if r is not last]).title


def _invert(world: CardWorld, records: list[Record], by_kind: dict[str, list[Record]], rng: random.Random) -> None:
    """An inverse link agrees with the link it inverts: a label's biggest act is one of its bands,
    a workshop's main buyer one of the shops it supplies, when there is one."""
    for r in records:
        for f in r.kind.fields:
            if f.label in world.inverse:
                others = by_kind[f.arg]
                theirs = [o for o in others if o.values.get(world.inverse[f.label]) == r.title]
                r.values[f.label] = rng.choice(theirs or others).title


def _value(f: Field, r: Record, by_kind: dict[str, list[Record]], rng: random.Random, towns: list[str],
           people: list[str], pools: dict[str, tuple[str, ...]]) -> str:
    if f.kind == "person":
        return rng.choice(people)
    if f.kind == "town":
        return rng.choice(towns)
    if f.kind == "year":
        return str(rng.randrange(1820, 2016))
    if f.kind == "colour":
        return rng.choice(COLOURS)
    if f.kind == "pool":
        return rng.choice(pools[f.arg])
    if f.kind == "number":
        return f"{rng.randrange(2, 900)}" + (f" {f.arg}" if f.arg else "")
    if f.kind == "money":
        return f"{rng.randrange(3, 120)} euros"
    if f.kind == "callsign":
        return f"{rng.choice('BDFKMRTVXZ')}{rng.choice('AEHLNQSUWY')}-{rng.randrange(1000, 9999)}"
    return rng.choice([o for o in by_kind[f.arg] if o is not r]).title


def passage(r: Record, pid: str, layout: str, world: CardWorld = RECORDS) -> WorldPassage:
    lines = [world.intro.format(Name=r.name[0].upper() + r.name[1:], kind=r.kind.name)]
    lines += [layout.format(F=f.label[0].upper() + f.label[1:], f=f.label, v=r.values[f.label]) for f in r.kind.fields]
    return WorldPassage(pid, r.title, " ".join(lines))


def facts(r: Record, pid: str) -> dict[str, Fact]:
    """Every field as a fact; a number's or a price's bare figure is a gold answer too."""
    out = {}
    for f in r.kind.fields:
        v = r.values[f.label]
        answers = (v, v.split()[0]) if f.kind in ("number", "money") and " " in v else (v,)
        out[f.label] = Fact(r.key, r.name, f.label, answers, pid)
    return out


def questions(records: list[Record], fs: dict[str, dict[str, Fact]], seed: int,
              world: CardWorld = RECORDS) -> list[Question]:
    ph, rng, rels = Phraser(seed, world.name), random.Random(f"{world.name}-questions-{seed}"), relations(world)
    by_title = {r.title: r for r in records}
    out: list[Question] = []
    for r in records:
        out += [fact_question(ph, rels, fs[r.key][f.label]) for f in r.kind.fields]
        for link in (f for f in r.kind.fields if f.kind == "link"):
            other = by_title[r.values[link.label]]
            targets = [f.label for f in other.kind.fields if f.kind != "link"]
            for target in rng.sample(targets, 2):
                phrase = f"the {link.label} of {r.name}"
                out.append(bridge_question(ph, rels, fs[r.key][link.label], fs[other.key][target], phrase,
                                           (f"{r.name} {link.label}", r.name)))
    for kind in world.kinds:   # neighbours of one kind, each pair once, on a year or a number field
        group = [r for r in records if r.kind is kind]
        for a, b in zip(group, group[1:]):
            f = rng.choice([f for f in kind.fields if f.kind in ("year", "number")])
            va, vb = (int(x.values[f.label].split()[0]) for x in (a, b))
            if va == vb:
                continue
            win = (a if va < vb else b) if f.kind == "year" else (a if va > vb else b)
            templates = tuple(t.replace("{f}", f.label) for t in world.compare[f.kind])
            out.append(comparison_question(ph, rels, fs[a.key][f.label], fs[b.key][f.label],
                                           fs[win.key][f.label], templates))
    return out


def build_records(out: str | Path, seed: int = 0, holdout: float = HOLDOUT, size: int | None = None,
                  say: Callable[[str], None] = lambda msg: None) -> dict:
    """Build the records world into `out` (`size`: how many records; default 360)."""
    return build_cards(RECORDS, out, seed, holdout, size, say)


def build_cards(world: CardWorld, out: str | Path, seed: int = 0, holdout: float = HOLDOUT, size: int | None = None,
                say: Callable[[str], None] = lambda msg: None) -> dict:
    """Build a world of cards into `out` (`size`: how many cards; default 360)."""
    check_holdout(holdout)
    n = size or DEFAULT_RECORDS
    least = 2 * len(world.kinds)   # two of each kind, so every link has somewhere to point
    if not least <= n <= MAX_RECORDS:
        raise InputError(f"--size for {world.name} counts {world.unit}: {least} to {MAX_RECORDS:,}, got {n}")
    say(f"generating {n} {world.unit}")
    records = make_records(n, seed, world)
    layout = random.Random(f"{world.name}-layout-{seed}")
    passages, fs = [], {}
    for r in records:
        passages.append(passage(r, str(len(passages)), layout.choice(world.layouts), world))
        fs[r.key] = facts(r, passages[-1].id)
    split_of = assign_splits([r.key for r in records], seed, holdout)
    options = build_options(holdout, n, DEFAULT_RECORDS)
    return build_world(out, world.spec, passages, questions(records, fs, seed, world), split_of, seed, say, options)
