"""The catalog world: generated catalogue cards (recipes, wines, locomotives, theatres, ...), a
second world of record cards beside `records`, made by the same machinery (worlds/records.py).

Why it exists: held out of training, the records world is answered poorly. Half the misses name
the record itself instead of the field asked for (docs/worlds.md, "Why held-out answers fail"):
reading a field by its name is learned from records alone. This world asks for that skill with
nothing of records' own: no field name, no kind, no layout, no question form and no first name is
shared (tests check it), nor any word of a notes relation. With catalog in the mixture, records
can be held out and still measure reading cards the student never saw, written in ways it never saw.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .pipeline import HOLDOUT, WorldSpec
from .records import C, P, T, Y, CardWorld, Field, Kind, build_cards

# first names used by neither the notes world nor records (a test checks it)
FIRST = ("Aurelio", "Bettina", "Corentin", "Domenica", "Eilif", "Fredrika", "Gaspard", "Henrike", "Isidor",
         "Jolanda", "Konrad", "Leontine", "Matthias", "Nadine", "Osvald", "Perpetua", "Quirin", "Reinhold",
         "Sigrun", "Torvald", "Ursina", "Valerian", "Walburga", "Xenia", "Yorick", "Zenobia", "Adalbert",
         "Berenike", "Cyprian", "Dietlind", "Eberhard", "Friedhelm", "Gundula", "Hannelore", "Ilsabe", "Jobst",
         "Kunigunde", "Lambert", "Mechthild", "Notburga")
POOLS = {
    "key ingredient": ("wild garlic", "smoked trout", "chestnuts", "sour cherries", "juniper berries",
                       "buckwheat", "fennel", "quince"),
    "main crop": ("barley", "rapeseed", "apples", "hops", "lavender", "potatoes", "flax", "pears"),
    "signature loaf": ("rye sourdough", "seeded spelt", "walnut bread", "potato bread", "olive fougasse",
                       "oat loaf", "milk bread"),
}


KINDS = (
    Kind("recipe", ("{n} Stew", "{n} Tart", "{n} Dumplings"), (
        P("head chef"), T("village of origin"), Y("year first cooked"), Field("portions", "number"),
        Field("key ingredient", "pool", "key ingredient"), Field("cooking time", "number", "minutes"),
        Field("paired wine", "link", "wine"))),
    Kind("wine", ("Chateau {n}", "{n} Reserve", "{n} Riesling"), (
        P("winemaker"), T("vineyard village"), Y("vintage"), Field("bottles made", "number"),
        Field("price per bottle", "money"), C("label colour"), Field("matching dish", "link", "recipe"))),
    Kind("locomotive", ("the {n} Express", "the {n} Flyer"), (
        P("engine driver"), P("fireman"), T("engine shed"), Y("year built"), Field("top speed", "number", "km/h"),
        C("livery"), Field("running number", "callsign"), Field("sister engine", "link", "locomotive"))),
    Kind("observatory", ("the {n} Observatory", "the {n} Star Station"), (
        P("chief astronomer"), T("hilltop village"), Y("first light"), Field("telescopes", "number"),
        Field("mirror width", "number", "cm"), Field("sister observatory", "link", "observatory"))),
    Kind("theatre", ("the {n} Playhouse", "the {n} Opera House"), (
        P("stage manager"), P("box office clerk"), T("theatre quarter"), Y("premiere year"),
        Field("seats", "number"), C("curtain colour"), Field("touring company", "link", "troupe"))),
    Kind("troupe", ("the {n} Players", "the {n} Dance Company"), (
        P("choreographer"), P("principal dancer"), T("rehearsal village"), Y("debut year"),
        Field("home stage", "link", "theatre"))),
    Kind("lighthouse", ("the {n} Light", "{n} Point Lighthouse"), (
        P("keeper"), T("nearest harbour"), Y("year lit"), Field("tower height", "number", "metres"),
        C("lamp colour"), Field("light signal", "callsign"), Field("neighbour light", "link", "lighthouse"))),
    Kind("farm", ("{n} Farm", "{n} Orchard"), (
        P("farmer"), T("farm village"), Y("year settled"), Field("hectares", "number"),
        Field("main crop", "pool", "main crop"), Field("market stall", "link", "bakery"))),
    Kind("bakery", ("{n} Bakery", "{n} Patisserie"), (
        P("head baker"), P("apprentice baker"), T("bakery village"), Y("first bake"), Field("daily loaves", "number"),
        Field("signature loaf", "pool", "signature loaf"), Field("flour supplier", "link", "farm"))),
)

CATALOG = CardWorld(
    WorldSpec(kind="catalog", source="generated", prefix="cat"), KINDS, FIRST, POOLS,
    # the value before its label in one of them: records always name the field first
    layouts=("{F} = {v};", "{v} ({f}).", "[{f}] {v}"), intro="Catalogue card: {Name}, {kind}.",
    person_forms=("Who is {x}'s {f}?", "the {f} at {x}?", "{f} for {x}", "who serves as {f} of {x}", "{x}: {f}?"),
    other_forms=("What is {x}'s {f}?", "give the {f} for {x}", "{x}: {f}?", "look up the {f} of {x}", "{f} for {x}"),
    compare={"year": ("Which was first, {a} or {b}?", "earlier one: {a} or {b}", "{a} or {b}, which dates back further"),
             "number": ("Which one has the bigger {f}, {a} or {b}?", "{a} or {b}: bigger {f}?")},
    inverse={"matching dish": "paired wine", "home stage": "touring company", "flour supplier": "market stall"},
    unit="cards")


def build_catalog(out: str | Path, seed: int = 0, holdout: float = HOLDOUT, size: int | None = None,
                  say: Callable[[str], None] = lambda msg: None) -> dict:
    """Build the catalog world into `out` (`size`: how many cards; default 360)."""
    return build_cards(CATALOG, out, seed, holdout, size, say)
