"""The club as one member's Markdown notes, one file each, cross-referenced with [[links]].

The notes are written in the club's own words, none of the notes world's lines or
labels (a test checks it): `Rows bow side in the [[Ebbtide crew]]`, `Racked in bay 3 of
the [[Weir Boathouse]]`, `Lifts and beds: [[Lifts to Hollowmere Head]]`.
"""

from __future__ import annotations

from ..notebook import Note, collect, day
from .members import Club

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")  # not strftime: locale

def notes(c: Club) -> dict[tuple[str, str], Note]:
    """Every note by (kind, key), in a fixed order: members, crews, boats, boathouses, regattas, lifts, repairs."""
    return collect(c, (("member", c.members, _member), ("crew", c.crews, _crew), ("boat", c.boats, _boat),
                       ("boathouse", c.boathouses, _boathouse), ("regatta", c.regattas, _regatta),
                       ("lift", c.lifts, _lift), ("repair", c.repairs, _repair)))


def crew_title(c: Club, key: str) -> str:
    return f"{c.crews[key].name} crew"


def lift_title(c: Club, key: str) -> str:
    return f"Lifts to {c.regattas[key].name}"


def repair_title(c: Club, key: str) -> str:
    return f"{c.boats[key].name} repair"


def _note(entity: str, path: str, title: str, *lines: str) -> Note:
    """A note of the lines given; a line left out (an empty string, or False) is not written."""
    return Note(entity, path, title, tuple(line for line in lines if line))


def _member(c: Club, key: str) -> Note:
    m = c.members[key]
    return _note(f"member:{key}", f"members/{key}.md", m.name,
                 f"Rows {m.side} in the [[{crew_title(c, m.crew)}]] and lives in {m.suburb}.",
                 f"Locker {m.locker}; a member since {m.joined}.",
                 m.coaches and f"Coaches the [[{crew_title(c, m.coaches)}]] from the launch.",
                 m.keyholder and f"Keeps spare keys to the [[{c.boathouses[m.keyholder].name}]].")


def _crew(c: Club, key: str) -> Note:
    cr = c.crews[key]
    boat = c.boats[cr.boat]
    return _note(f"crew:{key}", f"crews/{key}.md", crew_title(c, key),
                 f"Coached by [[{c.members[cr.coach].name}]]; races the [[{boat.name}]], {with_article(boat.cls)}.",
                 f"Squad: {', '.join(c.members[m].name for m in cr.squad)}.",
                 f"On the water {cr.sessions} at {cr.hour}.",
                 f"Next race: [[{c.regattas[cr.next].name}]].")


def _boat(c: Club, key: str) -> Note:
    b = c.boats[key]
    return _note(f"boat:{key}", f"fleet/{key}.md", b.name,
                 f"{with_article(b.cls).capitalize()} by {b.maker}, bought in {b.bought}.",
                 f"Racked in bay {b.bay} of the [[{c.boathouses[b.boathouse].name}]].",
                 b.crew and f"The [[{crew_title(c, b.crew)}]] race it.",
                 b.repaired and f"Last repair: [[{repair_title(c, key)}]].")


def _boathouse(c: Club, key: str) -> Note:
    h = c.boathouses[key]
    return _note(f"boathouse:{key}", f"boathouses/{key}.md", h.name,
                 f"Sits on the {h.water}, with {h.bays} rack bays.",
                 f"Door keypad {h.keypad}; spare keys with [[{c.members[h.keyholder].name}]].")


def _regatta(c: Club, key: str) -> Note:
    r = c.regattas[key]
    crew = c.crews[r.crew]
    return _note(f"regatta:{key}", f"regattas/{r.race.isoformat()}-{key}.md", r.name,
                 f"{WEEKDAYS[r.race.weekday()]} {day(r.race)}: racing on the {r.course}.",
                 f"We send the [[{crew_title(c, r.crew)}]] in the [[{c.boats[crew.boat].name}]]; "
                 f"[[{c.members[r.trailer].name}]] tows the trailer.",
                 f"In the boat: {', '.join(c.members[m].name for m in r.lineup)}.",
                 key in c.lifts and f"Lifts and beds: [[{lift_title(c, key)}]].")


def _lift(c: Club, key: str) -> Note:
    lift, r = c.lifts[key], c.regattas[key]
    start = c.boats[c.crews[r.crew].boat].boathouse
    nights = "One night" if lift.nights == 1 else f"{('Two', 'Three')[lift.nights - 2]} nights"
    return _note(f"regatta:{key}", f"lifts/{r.race.isoformat()}-{key}.md", lift_title(c, key),
                 f"[[{c.members[lift.driver].name}]] drives, leaving the [[{c.boathouses[start].name}]] at "
                 f"{lift.depart}.",
                 f"Passengers: {', '.join(c.members[m].name for m in lift.passengers) or 'none'}.",
                 f"{nights} at {lift.guesthouse}, a deposit of {lift.deposit} pounds.")


def _repair(c: Club, key: str) -> Note:
    rp = c.repairs[key]
    return _note(f"boat:{key}", f"repairs/{rp.done.isoformat()}-{key}.md", repair_title(c, key),
                 f"[[{c.boats[key].name}]]: {rp.damage}, mended by [[{c.members[rp.mender].name}]] on "
                 f"{day(rp.done)}.",
                 f"Parts and resin came to {rp.cost} pounds.")


def with_article(cls: str) -> str:
    return f"an {cls}" if cls[0] in "aeiou" else f"a {cls}"
