"""The workplace as Markdown notes, one file each, cross-referenced with [[links]].

Each note is short (one passage of the corpus) and says what a person would
jot down; links name other notes the way note apps do (`[[Project Heron]]`),
so following a chain means searching for the linked title.
"""

from __future__ import annotations

from ..notebook import Note, collect, day
from .people import Workplace


def kickoff_title(w: Workplace, project: str) -> str:
    return f"{w.projects[project].name} kickoff"


def notes(w: Workplace) -> dict[tuple[str, str], Note]:
    """Every note by (kind, key), in a fixed order: people, teams, rooms, projects, kickoffs, trips, networks."""
    return collect(w, (("person", w.people, _person), ("team", w.teams, _team), ("room", w.rooms, _room),
                       ("project", w.projects, _project), ("kickoff", w.projects, _kickoff), ("trip", w.trips, _trip),
                       ("network", w.networks, _network)))


def _person(w: Workplace, key: str) -> Note:
    p = w.people[key]
    article = "an" if p.role[0] in "aeiouAEIOU" or p.role.startswith("ML") else "a"
    lines = [f"{p.first} is {article} {p.role} on the [[{w.teams[p.team].name} team]], working from {p.city}.",
             f"Phone extension: {p.ext}. Email: {key}@example.org."]
    if p.project:
        lines.append(f"Owns [[Project {w.projects[p.project].name}]].")
    return Note(f"person:{key}", f"people/{key}.md", p.name, tuple(lines))


def _team(w: Workplace, key: str) -> Note:
    t = w.teams[key]
    members = ", ".join(w.people[m].name for m in t.members if m != t.lead)
    lines = [f"Lead: [[{w.people[t.lead].name}]].", f"Members: {members}.",
             f"Chat channel: #team-{key}."]
    return Note(f"team:{key}", f"teams/{key}.md", f"{t.name} team", tuple(lines))


def _room(w: Workplace, key: str) -> Note:
    r = w.rooms[key]
    lines = [f"Meeting room {r.name} is on floor {r.floor} of the {r.building}.",
             f"It seats {r.seats}; book it in the calendar under \"{r.name}\"."]
    return Note(f"room:{key}", f"rooms/{key}.md", f"{r.name} (meeting room)", tuple(lines))


def _project(w: Workplace, key: str) -> Note:
    p = w.projects[key]
    lines = [f"Owner: [[{w.people[p.owner].name}]] ([[{w.teams[p.team].name} team]]).",
             f"Goal: {p.goal}.", f"Deadline: {day(p.deadline)}.",
             f"Kickoff: [[{kickoff_title(w, key)}]] on {day(p.kickoff)}."]
    return Note(f"project:{key}", f"projects/{key}.md", f"Project {p.name}", tuple(lines))


def _kickoff(w: Workplace, key: str) -> Note:
    p = w.projects[key]
    who = ", ".join(w.people[a].name for a in p.attendees)
    lines = [f"Date: {day(p.kickoff)}, {p.time}. Room: [[{w.rooms[p.room].name}]].",
             f"Attendees: {who}.", f"Agreed to {p.goal} by {day(p.deadline)}."]
    return Note(f"project:{key}", f"meetings/{p.kickoff.isoformat()}-{key}-kickoff.md", kickoff_title(w, key), tuple(lines))


def _trip(w: Workplace, key: str) -> Note:
    t = w.trips[key]
    p = w.people[t.person]
    lines = [f"[[{p.name}]] travels to {t.city} on {day(t.start)} for {t.nights} nights.",
             f"Flight: {t.flight}. Hotel: {t.hotel}. Booking code: {t.code}."]
    return Note(f"trip:{key}", f"travel/{t.start.isoformat()}-{key}.md", f"{p.first}'s trip to {t.city}", tuple(lines))


def _network(w: Workplace, key: str) -> Note:
    n = w.networks[key]
    lines = [f"Wi-Fi name (SSID): {n.ssid}. Router: {n.router}.",
             f"NAS at {n.nas}; printer at {n.printer}. The Wi-Fi password is on the router's label."]
    title = f"Network at {n.place}"
    return Note(f"network:{key}", f"home/network-{key}.md", title[0].upper() + title[1:], tuple(lines))
