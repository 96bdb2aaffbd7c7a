"""Clean, question-worthy facts pulled out of Factbook fields.

Each extractor reads one field and returns a `Fact` only when the value is
unambiguous (a single capital, a plain date, a named peak). Anything messy is
skipped rather than guessed, so every gold answer is something the passage
states verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .source import Country


@dataclass(frozen=True)
class Fact:
    kind: str                 # e.g. "capital"
    answer: str               # the main gold answer, verbatim from the passage
    aliases: tuple[str, ...]  # other accepted answers, also verbatim
    section: str              # where the evidence lives: (section, field)
    field: str

    @property
    def answers(self) -> list[str]:
        return [self.answer, *[a for a in self.aliases if a != self.answer]]


def _simple(text: str | None, max_words: int = 6) -> bool:
    return bool(text) and ";" not in text and len(text.split()) <= max_words


# Words that make a name a description: "Chisinau in Romanian", "Kurdish for
# 'Black Tent'", "Kiev is the transliteration from Russian".
_DESCRIBING = {"in", "is", "for", "aka", "located", "alternatively", "highest", "lowest"}


def _name_like(text: str) -> bool:
    """A proper name rather than a description: capitalised, no describing words."""
    return text[:1].isupper() and not _DESCRIBING & set(text.lower().split())


def _aliases(parts: list[str], c: Country) -> tuple[str, ...]:
    """Parenthesised other names, minus descriptions ("on Grand Cayman") and the
    country itself ("Mount Paget (South Georgia)")."""
    return tuple(a for a in parts if _name_like(a) and a.lower() not in c.name.lower())


def capital(c: Country) -> Fact | None:
    text = c.field("Government", "Capital", "name")
    if not text or ";" in text or "note" in text.lower():
        return None
    m = re.fullmatch(r"([^(),]+?)\s*(?:\(([^()]*)\))?", text)
    if not m:
        return None
    main, inner = m.group(1).strip(), m.group(2)
    aliases = _aliases([a.strip() for a in inner.split(",")], c) if inner and inner != "city" else ()
    ok = _simple(main, 4) and _name_like(main)
    return Fact("capital", main, aliases, "Government", "Capital") if ok else None


def population(c: Country) -> Fact | None:
    text = c.field("People and Society", "Population", "total") or c.field("People and Society", "Population")
    m = re.match(r"([\d,]{5,}) \(\d{4} est\.\)", text or "")
    return Fact("population", m.group(1), (), "People and Society", "Population") if m else None


def area(c: Country) -> Fact | None:
    m = re.fullmatch(r"([\d,]+ sq km)", c.field("Geography", "Area", "total") or "")
    if not m or m.group(1).startswith("0 "):
        return None
    return Fact("area", m.group(1), (m.group(1)[:-6],), "Geography", "Area")


def currency(c: Country) -> Fact | None:
    text = c.field("Economy", "Exchange rates", "Currency")
    m = re.fullmatch(r"(.+?) \(([A-Z]{3})\) per US dollar -?", text or "")
    if not m or not _simple(m.group(1), 5):
        return None
    return Fact("currency", m.group(1), (m.group(2),), "Economy", "Exchange rates")


def _peak(c: Country, which: str, kind: str) -> Fact | None:
    text = c.field("Geography", "Elevation", which)
    m = re.fullmatch(r"([A-Z][^;\d]*?)\s*(?:\(([^()]+)\))?\s+-?[\d,.]+ m", text or "")
    if not m or not _simple(m.group(1), 5) or m.group(1).lower().startswith("unnamed"):
        return None
    aliases = _aliases([m.group(2).strip()], c) if m.group(2) and _simple(m.group(2), 4) else ()
    return Fact(kind, m.group(1).strip(), aliases, "Geography", "Elevation")


def highest_point(c: Country) -> Fact | None:
    return _peak(c, "highest point", "highest_point")


def lowest_point(c: Country) -> Fact | None:
    return _peak(c, "lowest point", "lowest_point")


def independence(c: Country) -> Fact | None:
    m = re.fullmatch(r"(\d{1,2} [A-Z][a-z]+ (\d{4})) \(from [^()]+\)", c.field("Government", "Independence") or "")
    return Fact("independence", m.group(1), (m.group(2),), "Government", "Independence") if m else None


def government_type(c: Country) -> Fact | None:
    text = c.field("Government", "Government type")
    return Fact("government_type", text, (), "Government", "Government type") if _simple(text, 5) and "," not in text else None


def internet_code(c: Country) -> Fact | None:
    m = re.fullmatch(r"(\.[a-z]{2})", c.field("Communications", "Internet country code") or "")
    return Fact("internet_code", m.group(1), (), "Communications", "Internet country code") if m else None


def main_language(c: Country) -> Fact | None:
    text = c.field("People and Society", "Languages", "Languages") or c.field("People and Society", "Languages")
    m = re.match(r"([A-Z][a-z]+(?: [A-Z][a-z]+)?)(?: \([^()]*\))? [\d.]+%", text or "")
    return Fact("main_language", m.group(1), (), "People and Society", "Languages") if m else None


def coastline(c: Country) -> Fact | None:
    m = re.fullmatch(r"([\d,.]+ km)", c.field("Geography", "Coastline") or "")
    if not m or m.group(1) == "0 km":
        return None
    return Fact("coastline", m.group(1), (), "Geography", "Coastline")


#: kind -> (extractor, question template about a country named {x})
ONE_HOP: dict[str, tuple[Callable[[Country], Fact | None], str]] = {
    "capital": (capital, "What is the capital of {x}"),
    "population": (population, "What is the estimated population of {x}"),
    "area": (area, "What is the total area of {x}"),
    "currency": (currency, "What is the currency of {x}"),
    "highest_point": (highest_point, "What is the highest point in {x}"),
    "lowest_point": (lowest_point, "What is the lowest point in {x}"),
    "independence": (independence, "When did {x} gain independence"),
    "government_type": (government_type, "What type of government does {x} have"),
    "internet_code": (internet_code, "What is the internet country code of {x}"),
    "main_language": (main_language, "What is the most widely spoken language in {x}"),
    "coastline": (coastline, "How long is the coastline of {x}"),
}

#: Phrases that identify a country through one of its facts (for bridge questions).
BRIDGE_PHRASES = {
    "capital": "the country whose capital is {v}",
    "highest_point": "the country whose highest point is {v}",
    "internet_code": "the country with the internet country code {v}",
}

#: Search phrases an oracle tries, in order, until one retrieves the evidence.
QUERY_PHRASES: dict[str, tuple[str, ...]] = {
    "capital": ("capital", "capital name", "government capital name"),
    "population": ("population", "population total male female", "people and society population total",
                   "population total est nationality"),
    "area": ("total area", "area total land water sq km"),
    "currency": ("currency exchange rates", "exchange rates currency per US dollar"),
    "highest_point": ("highest point elevation", "elevation highest point lowest point mean"),
    "lowest_point": ("lowest point elevation", "elevation highest point lowest point mean"),
    "independence": ("independence", "independence from", "government independence national holiday"),
    "government_type": ("government type", "government type capital"),
    "internet_code": ("internet country code", "communications internet country code"),
    "main_language": ("languages", "languages official spoken", "people languages"),
    "coastline": ("coastline", "geography coastline km", "coastline land boundaries"),
    "borders": ("border countries", "land boundaries border countries"),
}


def extract_facts(c: Country) -> dict[str, Fact]:
    facts = {}
    for kind, (fn, _) in ONE_HOP.items():
        fact = fn(c)
        if fact is not None:
            facts[kind] = fact
    return facts


def border_names(c: Country) -> list[str]:
    """Neighbour names as written in `Land boundaries: border countries`."""
    text = c.field("Geography", "Land boundaries", "border countries") or ""
    names = []
    for part in re.split(r";\s*", text):
        m = re.match(r"([A-Z][^\d(]*?)\s+[\d,.]+ km", part.strip())
        if m:
            names.append(m.group(1).strip())
    return names
