"""Questions from (entity, relation, value) facts, shared by the table-like worlds.

A world states its facts (`Fact`: which entity, which relation, the gold
answers as its passage writes them, which passage) and its relations
(`Relation`: surface templates and search words); the helpers here turn them
into 1-hop questions, 2-hop bridges ("Who discovered the element with the
symbol Fe?") and 2-hop comparisons, each with the oracle's search steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Question, Step
from .phrasing import Phraser


@dataclass(frozen=True)
class Relation:
    label: str                   # "chemical symbol": used in the oracle's thoughts
    templates: tuple[str, ...]   # surface forms with {x} for the entity (or a bridge phrase)
    query: tuple[str, ...]       # search words after the entity's name, best first


@dataclass(frozen=True)
class Fact:
    entity: str                  # entity id (split hold-out)
    name: str                    # how questions and searches name the entity
    relation: str
    answers: tuple[str, ...]     # verbatim from the passage; the first is the main one
    pid: str                     # the passage that states it


def about(name: str, rel: Relation) -> tuple[str, ...]:
    """Search candidates for one fact: the name with the relation's words, then the name."""
    return tuple(f"{name} {q}".strip() for q in rel.query) + (name,)


def fact_question(ph: Phraser, rels: dict[str, Relation], f: Fact, kind: str = "fact") -> Question:
    rel = rels[f.relation]
    step = Step(f"I need to find the {rel.label} of {f.name}.", about(f.name, rel), f.pid)
    return Question(ph.ask(rel.templates, x=f.name), list(f.answers), 1, kind, f.relation, (f.entity,),
                    [f.pid], [step], f"The information says the {rel.label} of {f.name} is {f.answers[0]}.")


def bridge_question(ph: Phraser, rels: dict[str, Relation], via: Fact, target: Fact, phrase: str,
                    queries: tuple[str, ...], kind: str = "bridge", entities: tuple[str, ...] = ()) -> Question:
    """Ask for `target` about the entity that `phrase` describes through `via` (2 hops).

    `phrase` reads like "the element with the symbol Fe"; `queries` find `via`'s passage.
    """
    rel = rels[target.relation]
    s1 = Step(f"I need to find {phrase} first.", queries, via.pid)
    s2 = Step(f"{phrase[0].upper() + phrase[1:]} is {target.name}. Now I need the {rel.label} of "
              f"{target.name}.", about(target.name, rel), target.pid)
    ents = entities or tuple(dict.fromkeys((via.entity, target.entity)))
    # "{x} currency" reads as a keyword search for a name, not for "the country where Gujrat is", and
    # "{x}'s" would hang a possessive on the whole phrase ("the sister ship of the Velmor's skipper").
    templates = tuple(t for t in rel.templates if not t.startswith("{x}") and "{x}'s" not in t) or rel.templates
    return Question(ph.ask(templates, protect=(phrase,), x=phrase), list(target.answers), 2, kind,
                    target.relation, ents, [via.pid, target.pid], [s1, s2],
                    f"The information says the {rel.label} of {target.name} is {target.answers[0]}.",
                    bridge=target.name)


def comparison_question(ph: Phraser, rels: dict[str, Relation], a: Fact, b: Fact, winner: Fact,
                        templates: tuple[str, ...]) -> Question:
    """`Which is denser, iron or gold?`: both values looked up, the winner's name answered."""
    rel = rels[a.relation]
    s1 = Step(f"I need the {rel.label} of {a.name} and of {b.name}.", about(a.name, rel), a.pid)
    s2 = Step(f"The {rel.label} of {a.name} is {a.answers[0]}. Now I need the {rel.label} of {b.name}.",
              about(b.name, rel), b.pid)
    text = ph.ask(templates, a=a.name, b=b.name)
    return Question(text, [winner.name], 2, "comparison", a.relation, tuple(dict.fromkeys((a.entity, b.entity))),
                    [a.pid, b.pid], [s1, s2],
                    f"{a.name} has {a.answers[0]} and {b.name} has {b.answers[0]}, so the answer is "
                    f"{winner.name}.")
