"""FactbookQA question generation: 1-hop facts, bridges, neighbours, comparisons.

Every question records the countries it involves (for held-out splits), its
evidence passages in hop order, and the oracle's search steps. Checking that the
gold answers really occur in the evidence happens in `worlds.pipeline`.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from ..base import Question, Step
from .facts import BRIDGE_PHRASES, ONE_HOP, QUERY_PHRASES, Fact, border_names
from .source import Country


@dataclass
class World:
    """What question generation needs: countries, facts, where each field lives."""

    countries: dict[str, Country]
    facts: dict[str, dict[str, Fact]]
    where: dict[str, dict[tuple[str, str], str]]  # code -> (section, field) -> pid
    by_name: dict[str, str]                        # country name -> code

    def pid(self, code: str, fact: Fact) -> str:
        return self.where[code][(fact.section, fact.field)]


def one_hop(w: World, code: str) -> list[Question]:
    c, out = w.countries[code], []
    for kind, fact in w.facts[code].items():
        template = ONE_HOP[kind][1]
        q = template.format(x=c.name) + "?"
        step = Step(f"I need to find the {_label(kind)} of {c.name}.", _about(c.name, kind),
                    w.pid(code, fact))
        out.append(Question(q, fact.answers, 1, "fact", kind, (code,), [step.evidence], [step],
                            f"The information says the {_label(kind)} of {c.name} is {fact.answer}."))
    return out


def bridges(w: World, code: str, rng: random.Random, per_bridge: int = 2) -> list[Question]:
    """`What is the currency of the country whose capital is Lima?` and friends."""
    c, facts, out = w.countries[code], w.facts[code], []
    for b, phrase in BRIDGE_PHRASES.items():
        if b not in facts or not _unique_value(w, b, facts[b].answer):
            continue
        bf = facts[b]
        targets = sorted(k for k in facts if k != b)
        for t in rng.sample(targets, min(per_bridge, len(targets))):
            x = phrase.format(v=bf.answer)
            q = ONE_HOP[t][1].format(x=x) + "?"
            s1 = Step(f"I need to find {x}.", tuple(f"{ph} {bf.answer}" for ph in QUERY_PHRASES[b]) + (bf.answer,), w.pid(code, bf))
            s2 = Step(f"{x[0].upper() + x[1:]} is {c.name}. Now I need the {_label(t)} of {c.name}.",
                      _about(c.name, t), w.pid(code, facts[t]))
            out.append(Question(q, facts[t].answers, 2, "bridge", t, (code,), [s1.evidence, s2.evidence],
                                [s1, s2], f"The information says the {_label(t)} of {c.name} is "
                                          f"{facts[t].answer}.", bridge=c.name))
    return out


def neighbours(w: World, code: str) -> list[Question]:
    """`Name a country that borders Peru.` (1 hop) and the capital of one (2 hops)."""
    c = w.countries[code]
    names = border_names(c)
    codes = [w.by_name.get(n) for n in names]
    if not names or None in codes or ("Geography", "Land boundaries") not in w.where[code]:
        return []
    border_pid = w.where[code][("Geography", "Land boundaries")]
    involved = tuple(sorted({code, *codes}))  # type: ignore[arg-type]
    s = Step(f"I need to find the countries that border {c.name}.", _about(c.name, "borders"), border_pid)
    out = [Question(f"Name a country that borders {c.name}?", names, 1, "neighbour", "borders", involved,
                    [border_pid], [s], f"The information lists the border countries of {c.name}: "
                                       f"{', '.join(names)}.")]
    caps = [w.facts[n].get("capital") for n in codes]  # type: ignore[index]
    if all(caps):
        first, cap = names[0], caps[0]
        s2 = Step(f"{first} borders {c.name}. Now I need the capital of {first}.", _about(first, "capital"),
                  w.pid(codes[0], cap))  # type: ignore[arg-type]
        answers = [a for f in caps for a in f.answers]  # type: ignore[union-attr]
        evidence = [border_pid] + [w.pid(n, f) for n, f in zip(codes, caps)]  # type: ignore[arg-type]
        out.append(Question(f"What is the capital of a country that borders {c.name}?", answers, 2,
                            "neighbour_bridge", "capital", involved, evidence, [s, s2],
                            f"The information says the capital of {first} is {cap.answer}.",  # type: ignore[union-attr]
                            bridge=first))
    return out


def comparisons(w: World, code: str) -> list[Question]:
    """`Which country has the larger population, Peru or Chile?` for neighbour pairs."""
    c, out = w.countries[code], []
    for name in border_names(c):
        other = w.by_name.get(name)
        if other is None or other <= code:  # each pair once
            continue
        d = w.countries[other]
        for rel, noun in (("population", "the larger population"), ("area", "the larger total area")):
            fa, fb = w.facts[code].get(rel), w.facts[other].get(rel)
            if not fa or not fb:
                continue
            va, vb = _number(fa.answer), _number(fb.answer)
            if va == vb:
                continue
            win = c.name if va > vb else d.name
            s1 = Step(f"I need the {_label(rel)} of {c.name} and of {d.name}.", _about(c.name, rel),
                      w.pid(code, fa))
            s2 = Step(f"The {_label(rel)} of {c.name} is {fa.answer}. Now I need the {_label(rel)} of {d.name}.",
                      _about(d.name, rel), w.pid(other, fb))
            out.append(Question(f"Which country has {noun}, {c.name} or {d.name}?", [win], 2, "comparison",
                                rel, (code, other), [s1.evidence, s2.evidence], [s1, s2],
                                f"{c.name} has {fa.answer} and {d.name} has {fb.answer}, so the answer is {win}."))
    return out


def _about(name: str, kind: str) -> tuple[str, ...]:
    return tuple(f"{name} {ph}" for ph in QUERY_PHRASES[kind])


def _unique_value(w: World, kind: str, value: str) -> bool:
    """A bridge must identify exactly one country (two countries have a Kingston)."""
    return sum(1 for f in w.facts.values() if kind in f and f[kind].answer.lower() == value.lower()) == 1


def _number(text: str) -> float:
    return float(text.split()[0].replace(",", ""))


def _label(kind: str) -> str:
    return {"main_language": "most widely spoken language", "internet_code": "internet country code",
            "independence": "independence date", "highest_point": "highest point",
            "lowest_point": "lowest point", "government_type": "government type",
            "area": "total area"}.get(kind, kind)


def generate(w: World, seed: int) -> list[Question]:
    """All candidate questions, in a deterministic order."""
    rng = random.Random(seed)
    out: list[Question] = []
    for code in sorted(w.facts):
        out += one_hop(w, code) + bridges(w, code, rng) + neighbours(w, code) + comparisons(w, code)
    return out


#: Short forms the Factbook uses in border lists, mapped to entry names.
BORDER_ALIASES = {"US": "United States", "UK": "United Kingdom", "UAE": "United Arab Emirates",
                  "Cote d'Ivoire": "Côte d'Ivoire", "Macedonia": "North Macedonia",
                  "Holy See": "Holy See (Vatican City)"}


def names_index(countries: dict[str, Country]) -> dict[str, str]:
    """Country name -> code, using short and long names; ambiguous names are left out."""
    seen: dict[str, set[str]] = defaultdict(set)
    for code, c in countries.items():
        seen[c.name].add(code)
        long_form = c.field("Government", "Country name", "conventional long form")
        if long_form and long_form.lower() != "none":
            seen[long_form].add(code)
    index = {name: next(iter(codes)) for name, codes in seen.items() if len(codes) == 1}
    for alias, name in BORDER_ALIASES.items():
        if name in index and alias not in index:
            index[alias] = index[name]
    return index
