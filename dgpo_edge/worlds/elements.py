"""The elements world: the 118 chemical elements from mendeleev's elements.db.

The SQLite file ships inside the `mendeleev` wheel; it is read directly
(importing mendeleev would pull pandas, SQLAlchemy and pydantic). Each element
gets four passages — overview, properties, discovery, uses and sources — and
questions ask for its symbol, atomic number, series, discoverer, discovery year
and place, or top producer; bridges go through a unique symbol ("Who discovered
the element with the symbol W?") and comparisons pair neighbouring elements.
"""

from __future__ import annotations

import random
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError
from .base import Question, WorldPassage, pack
from .facts import Fact, Relation, bridge_question, comparison_question, fact_question
from .phrasing import Phraser
from .pipeline import HOLDOUT, WorldSpec, assign_splits, build_options, build_world, check_holdout
from .source import package_file

MENDELEEV_VERSION = "1.3.0"
SPEC = WorldSpec(kind="elements", source=f"mendeleev=={MENDELEEV_VERSION}", prefix="elem",
                 stats_extra={"mendeleev_version": MENDELEEV_VERSION})

RELATIONS = {
    "symbol": Relation("chemical symbol", (
        "What is the chemical symbol for {x}?", "{x} symbol", "symbol of {x}",
        "what's the symbol of {x} on the periodic table?", "How is {x} written in chemical formulas?"),
        ("symbol",)),
    "atomic_number": Relation("atomic number", (
        "What is the atomic number of {x}?", "{x} atomic number", "how many protons does {x} have",
        "Which number does {x} have in the periodic table?"), ("atomic number",)),
    "series": Relation("series", (
        "What kind of element is {x}?", "{x} element category", "Which series does {x} belong to?",
        "is {x} a metal, a nonmetal or something else?"), ("series",)),
    "discoverer": Relation("discoverer", (
        "Who discovered {x}?", "{x} discovered by", "who first isolated {x}",
        "Name the discoverer of {x}."), ("discovered by",)),
    "year": Relation("discovery year", (
        "When was {x} discovered?", "{x} discovery year", "In what year was {x} first discovered?",
        "year {x} was found"), ("discovered in",)),
    "place": Relation("place of discovery", (
        "Where was {x} discovered?", "{x} discovered where", "In which country was {x} discovered?"),
        ("discovered in",)),
    "producer": Relation("top producer", (
        "Which country is the top producer of {x}?", "top producer of {x}",
        "which country produces most of the world's supply of {x}"), ("top producers",)),
    "density": Relation("density", ("How dense is {x}?", "{x} density"), ("density",)),
}
COMPARE = {
    "density": ("Which is denser, {a} or {b}?", "{a} or {b}: which has the higher density",
                "is {a} denser than {b} or the other way round?"),
    "year": ("Which was discovered first, {a} or {b}?", "{a} vs {b} which was found earlier",
             "Was {a} or {b} discovered earlier?"),
}
ONE_HOP = ("symbol", "atomic_number", "series", "discoverer", "year", "place", "producer")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def load_elements() -> list[dict]:
    """Rows of elements.db's `elements` table with the series name, by atomic number."""
    path = package_file("mendeleev", MENDELEEV_VERSION, "mendeleev/elements.db")
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)  # read-only: site-packages may be shared
    db.row_factory = sqlite3.Row
    try:
        rows = db.execute("SELECT e.*, s.name AS series FROM elements e "
                          "LEFT JOIN series s ON s.id = e.series_id ORDER BY e.atomic_number").fetchall()
    except sqlite3.DatabaseError as e:
        raise InputError(f"unreadable elements database ({e})", path) from None
    finally:
        db.close()
    return [{k: r[k] for k in r.keys()} for r in rows]


def element_passages(e: dict, first_id: int) -> tuple[list[WorldPassage], dict[str, str]]:
    """The element's passages and relation -> passage id of the passage stating it."""
    name, out, where = e["name"], [], {}

    def section(title: str, sentences: list[str], rels: dict[str, str]) -> None:
        """Pack one section; each relation's evidence is the passage holding its marker text."""
        ps = pack(f"{name} — {title}", sentences, first_id + len(out))
        for rel, marker in rels.items():
            where[rel] = next((p.id for p in ps if marker in p.text), "")
        out.extend(ps)

    section("Properties", _properties(e), {"symbol": "symbol", "atomic_number": "atomic number",
                                           "series": "Series:", "density": "Density:"})
    discovery = [f"Discovered by {_people(e['discoverers'])}" + (f" in {e['discovery_year']}" if e["discovery_year"] else "")
                 + (f", in {_places(e['discovery_location'])}" if e["discovery_location"] else "") + "."]
    if e["name_origin"]:
        discovery.append(f"Name origin: {e['name_origin'].strip().rstrip('.')}.")
    section("Discovery", discovery, {"discoverer": "Discovered by", "year": "Discovered by", "place": "Discovered by"})
    section("Overview", _sentences(e["description"]), {})
    uses = _sentences(e["uses"]) + _sentences(e["sources"])
    if e["top_3_producers"]:
        uses.append(f"Top producers, largest first: {', '.join(_ranked(e['top_3_producers']))}.")
    section("Uses and sources", uses, {"producer": "Top producers"})
    return out, where


def _properties(e: dict) -> list[str]:
    s = [f"{e['name']} is the chemical element with symbol {e['symbol']} and atomic number {e['atomic_number']}."]
    if e["series"]:
        s.append(f"Series: {e['series']}; period {e['period']}, block {e['block']}"
                 + (f", group {e['group_id']}" if e["group_id"] else "") + ".")
    if e["atomic_weight"]:
        s.append(f"Atomic weight: {e['atomic_weight']:g}.")
    if e["density"]:
        s.append(f"Density: {e['density']:g} g/cm3.")
    if e["electronic_configuration"]:
        s.append(f"Electron configuration: {e['electronic_configuration']}.")
    return s


def _sentences(text: str | None) -> list[str]:
    return [s for s in _SENTENCE.split(" ".join((text or "").split())) if s]


def _people(text: str) -> str:
    return re.sub(r",?\s*et al\.?$", "", text.strip().rstrip(".").replace(";", ","))


def _places(text: str) -> str:
    return " and ".join(p.strip() for p in text.split("/"))


def _ranked(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\d\)", text) if p.strip()]


def element_facts(e: dict, where: dict[str, str]) -> dict[str, Fact]:
    """Facts with clean, short answers; anything vague ("Known to the ancients") is skipped."""
    name, ent = e["name"], e["symbol"]
    values: dict[str, tuple[str, ...]] = {
        "symbol": (e["symbol"],), "atomic_number": (str(e["atomic_number"]),),
        "series": (e["series"],) if e["series"] else (),
        "density": (f"{e['density']:g} g/cm3", f"{e['density']:g}") if e["density"] else (),
    }
    who = _people(e["discoverers"] or "")
    if who and "ancient" not in who.lower() and len(who.split()) <= 9:
        values["discoverer"] = (who, *[p.strip() for p in who.split(",") if p.strip() != who])
        if e["discovery_year"]:
            values["year"] = (str(e["discovery_year"]),)
        if e["discovery_location"]:
            values["place"] = tuple(p.strip() for p in e["discovery_location"].split("/"))
    if e["top_3_producers"]:
        values["producer"] = (_ranked(e["top_3_producers"])[0],)
    return {rel: Fact(ent, name, rel, ans, where[rel]) for rel, ans in values.items() if ans and where.get(rel)}


def questions(elements: list[dict], facts: dict[str, dict[str, Fact]], seed: int) -> list[Question]:
    ph, rng = Phraser(seed, "elements"), random.Random(f"elements-{seed}")
    out: list[Question] = []
    for e in elements:
        f = facts[e["symbol"]]
        out += [fact_question(ph, RELATIONS, f[rel]) for rel in ONE_HOP if rel in f]
        targets = sorted(rel for rel in ("discoverer", "year", "place", "series", "producer") if rel in f)
        for target in rng.sample(targets, min(2, len(targets))):
            via = f["symbol"]
            phrase = ph.pick((f"the element with the symbol {e['symbol']}", f"the element whose symbol is {e['symbol']}"))
            queries = (f"symbol {e['symbol']}", f"chemical element with symbol {e['symbol']}", e["symbol"])
            out.append(bridge_question(ph, RELATIONS, via, f[target], phrase, queries))
    for a, b in zip(elements, elements[1:]):
        fa, fb = facts[a["symbol"]], facts[b["symbol"]]
        for rel in ("density", "year"):
            if rel in fa and rel in fb and fa[rel].answers[0] != fb[rel].answers[0]:
                va, vb = (float(x[rel].answers[0].split()[0]) for x in (fa, fb))
                win = (fa if va > vb else fb) if rel == "density" else (fa if va < vb else fb)
                out.append(comparison_question(ph, RELATIONS, fa[rel], fb[rel], win[rel], COMPARE[rel]))
    return out


def build_elements(out: str | Path, seed: int = 0, holdout: float = HOLDOUT, size: int | None = None,
                   say: Callable[[str], None] = lambda msg: None) -> dict:
    """Build the elements world into `out` (`size`: only the first N elements, for tests)."""
    check_holdout(holdout)
    say("reading mendeleev's elements.db")
    elements = load_elements()
    if size is not None and size > len(elements):   # not a silent 118 for --size 500
        raise InputError(f"--size for elements counts elements: at most {len(elements)}, got {size}")
    options = build_options(holdout, size, len(elements))   # --size 118 is every element: the default
    elements = elements[:size]
    passages, facts = [], {}
    for e in elements:
        ps, where = element_passages(e, len(passages))
        passages += ps
        facts[e["symbol"]] = element_facts(e, where)
    say(f"generating questions from {len(elements)} elements")
    split_of = assign_splits([e["symbol"] for e in elements], seed, holdout)
    return build_world(out, SPEC, passages, questions(elements, facts, seed), split_of, seed, say, options)
