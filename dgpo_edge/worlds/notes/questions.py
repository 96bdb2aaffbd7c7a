"""Questions about the notes, typed the way people ask their own notes.

1-hop questions read one note ("priya ext"); chains follow the notes' links
across two or three notes ("Which room is the kickoff of the project that
Priya owns booked in?": Priya's note names her project, the kickoff note names
the room). Each hop's step says what the agent thinks and what it searches;
the oracle keeps the first query that really retrieves the note.
"""

from __future__ import annotations

from ..base import Question, Step
from ..notebook import Asker, day

FACT = {  # relation -> (templates with {x}, label)
    "role": (("What does {x} do?", "{x} role", "what's {x}'s job", "{x} job title"), "role"),
    "city": (("Where does {x} work from?", "{x} location", "which city is {x} based in"), "city"),
    "ext": (("What's {x}'s phone extension?", "{x} ext", "extension for {x}", "how do I call {x}"),
            "phone extension"),
    "team": (("Which team is {x} on?", "{x} team", "what team does {x} belong to"), "team"),
    "lead": (("Who leads the {x} team?", "{x} team lead", "who's the lead of {x}"), "lead"),
    "owner": (("Who owns Project {x}?", "{x} owner", "who is in charge of project {x}"), "owner"),
    "deadline": (("When is Project {x} due?", "{x} deadline", "deadline for {x}"), "deadline"),
    "kickoff_date": (("When was the {x} kickoff?", "{x} kickoff date", "what day is the {x} kickoff"), "date"),
    "kickoff_room": (("Which room is the {x} kickoff in?", "{x} kickoff room", "where is the {x} kickoff"), "room"),
    "floor": (("What floor is {x} on?", "{x} room floor", "which floor is meeting room {x} on"), "floor"),
    "building": (("Which building is {x} in?", "{x} building", "where is meeting room {x}"), "building"),
    "hotel": (("Which hotel is booked for {x}?", "{x} hotel", "hotel for {x}"), "hotel"),
    "flight": (("What's the flight for {x}?", "{x} flight number", "flight number for {x}"), "flight"),
    "code": (("What's the booking code for {x}?", "{x} booking code", "booking reference {x}"), "booking code"),
    "trip_date": (("When does {x} start?", "{x} date", "start date of {x}"), "start date"),
    "attendee": (("Who was at the {x} kickoff?", "{x} kickoff attendees", "name someone who attended the {x} kickoff"),
                 "attendees"),
    "ssid": (("What's the wifi name at {x}?", "{x} ssid", "wifi network at {x}"), "Wi-Fi name"),
    "nas": (("What's the IP of the NAS at {x}?", "nas ip {x}", "NAS address at {x}"), "NAS address"),
}
CHAIN = {  # relation -> templates with {x}
    "project_kickoff_room": ("Which room is the kickoff of the project that {x} owns booked in?",
                             "{x}'s project kickoff room", "where was the kickoff for {x}'s project"),
    "owner_city": ("Where is the owner of Project {x} based?", "city of the {x} owner",
                   "which city does the person who owns {x} work from"),
    "team_lead": ("Who leads {x}'s team?", "{x}'s team lead", "who is the lead of the team {x} is on"),
    "kickoff_floor": ("What floor is the {x} kickoff room on?", "{x} kickoff which floor",
                      "which floor do I go to for the {x} kickoff"),
    "project_deadline": ("When is the project {x} owns due?", "{x}'s project deadline",
                         "deadline of the project owned by {x}"),
    "project_kickoff_building": ("Which building is the kickoff of {x}'s project in?",
                                 "building for {x}'s project kickoff"),
    "owner_ext": ("What's the extension of whoever owns Project {x}?", "{x} owner phone extension",
                  "how do I call the owner of {x}"),
    "owner_trip_hotel": ("Which hotel is the owner of Project {x} staying at on their trip?",
                         "{x} owner trip hotel", "where does the person who owns {x} stay when travelling"),
}


def person_questions(a: Asker, key: str) -> list[Question]:
    p, w = a.w.people[key], a.w
    x = a.ph.pick((p.first, p.name))
    me = a.hop("person", key, f"I need {p.name}'s note.", p.name, p.first)
    team = w.teams[p.team].name
    out = [a.ask("role", x, [p.role], [me], (f"person:{key}",), f"{p.name} is a {p.role}."),
           a.ask("city", x, [p.city], [me], (f"person:{key}",), f"{p.name} works from {p.city}."),
           a.ask("ext", x, [p.ext], [me], (f"person:{key}",), f"{p.name}'s extension is {p.ext}."),
           a.ask("team", x, [f"{team} team", team], [me], (f"person:{key}",), f"{p.name} is on the {team} team.")]
    lead = w.people[w.teams[p.team].lead]
    if lead.key != key:
        s2 = a.hop("team", p.team, f"{p.name} is on the {team} team. Now I need its lead.", f"{team} team", team)
        out.append(a.ask("team_lead", x, [lead.name, lead.first], [me, s2], (f"person:{key}", f"team:{p.team}"),
                         f"The {team} team is led by {lead.name}.", bridge=f"{team} team"))
    if p.project:
        out += owned_project_questions(a, key, x, me)
    return out


def owned_project_questions(a: Asker, key: str, x: str, me: Step) -> list[Question]:
    p, w = a.w.people[key], a.w
    pr = w.projects[p.project]
    room = w.rooms[pr.room]
    found = f"{p.name} owns Project {pr.name}."
    kick = a.hop("kickoff", pr.key, f"{found} Now I need the {pr.name} kickoff note.",
                 f"{pr.name} kickoff", f"{pr.name} kickoff room")
    plan = a.hop("project", pr.key, f"{found} Now I need its deadline.", f"Project {pr.name}", f"{pr.name} deadline")
    at = a.hop("room", room.key, f"The kickoff was in {room.name}. Now I need where {room.name} is.",
               f"{room.name} meeting room", room.name)
    ents = (f"person:{key}", f"project:{pr.key}")
    return [a.ask("project_kickoff_room", x, [room.name], [me, kick], ents + (f"room:{room.key}",),
                  f"The {pr.name} kickoff was booked in {room.name}.", bridge=f"Project {pr.name}"),
            a.ask("project_deadline", x, [day(pr.deadline)], [me, plan], ents,
                  f"Project {pr.name} is due on {day(pr.deadline)}.", bridge=f"Project {pr.name}"),
            a.ask("project_kickoff_building", x, [room.building], [me, kick, at], ents + (f"room:{room.key}",),
                  f"{room.name} is in the {room.building}.", bridge=f"Project {pr.name}")]


def project_questions(a: Asker, key: str) -> list[Question]:
    pr, w = a.w.projects[key], a.w
    owner, room = w.people[pr.owner], w.rooms[pr.room]
    plan = a.hop("project", key, f"I need the note on Project {pr.name}.", f"Project {pr.name}", pr.name)
    kick = a.hop("kickoff", key, f"I need the {pr.name} kickoff note.", f"{pr.name} kickoff", pr.name)
    ents = (f"project:{key}",)
    s2 = a.hop("person", owner.key, f"Project {pr.name} is owned by {owner.name}. Now I need where they work.",
               owner.name, owner.first)
    s3 = a.hop("room", room.key, f"The kickoff is in {room.name}. Now I need its floor.", f"{room.name} meeting room",
               room.name)
    return [a.ask("owner", pr.name, [owner.name, owner.first], [plan], ents, f"{owner.name} owns {pr.name}."),
            a.ask("deadline", pr.name, [day(pr.deadline)], [plan], ents, f"{pr.name} is due {day(pr.deadline)}."),
            a.ask("kickoff_date", pr.name, [day(pr.kickoff)], [kick], ents, f"The kickoff is on {day(pr.kickoff)}."),
            a.ask("kickoff_room", pr.name, [room.name], [kick], ents + (f"room:{room.key}",),
                  f"The kickoff is in {room.name}."),
            a.ask("owner_city", pr.name, [owner.city], [plan, s2], ents + (f"person:{owner.key}",),
                  f"{owner.name} works from {owner.city}.", bridge=owner.name),
            a.ask("kickoff_floor", pr.name, [f"floor {room.floor}", str(room.floor)], [kick, s3],
                  ents + (f"room:{room.key}",), f"{room.name} is on floor {room.floor}.", bridge=room.name),
            a.ask("attendee", pr.name, [w.people[k].name for k in pr.attendees], [kick], ents,
                  f"The attendees were {', '.join(w.people[k].name for k in pr.attendees)}."),
            a.ask("owner_ext", pr.name, [owner.ext], [plan, s2], ents + (f"person:{owner.key}",),
                  f"{owner.name}'s extension is {owner.ext}.", bridge=owner.name)] + owner_trip(a, key, plan)


def owner_trip(a: Asker, key: str, plan: Step) -> list[Question]:
    """The hotel of the project owner's trip: the project note names the owner, the trip note is theirs."""
    pr, w = a.w.projects[key], a.w
    owner = w.people[pr.owner]
    trips = [t for t in w.trips.values() if t.person == owner.key]
    if not trips:
        return []
    t = trips[0]
    s2 = a.hop("trip", t.key, f"Project {pr.name} is owned by {owner.name}. Now I need {owner.first}'s trip note.",
               f"{owner.first} trip", f"{owner.first}'s trip to")
    return [a.ask("owner_trip_hotel", pr.name, [t.hotel], [plan, s2], (f"project:{key}", f"trip:{t.key}"),
                  f"{owner.first} stays at {t.hotel} in {t.city}.", bridge=owner.name)]


def place_questions(a: Asker) -> list[Question]:
    """Teams, rooms, trips and networks: 1-hop questions."""
    w, out = a.w, []
    for key, t in w.teams.items():
        lead = w.people[t.lead]
        s = a.hop("team", key, f"I need the {t.name} team's note.", f"{t.name} team", t.name)
        out.append(a.ask("lead", t.name, [lead.name, lead.first], [s], (f"team:{key}",), f"{lead.name} leads it."))
    for key, r in w.rooms.items():
        s = a.hop("room", key, f"I need the note on room {r.name}.", f"{r.name} meeting room", r.name)
        out += [a.ask("floor", r.name, [f"floor {r.floor}", str(r.floor)], [s], (f"room:{key}",), f"Floor {r.floor}."),
                a.ask("building", r.name, [r.building, r.building.split()[0]], [s], (f"room:{key}",),
                      f"It is in the {r.building}.")]
    for key, t in w.trips.items():
        p = w.people[t.person]
        x = a.ph.pick((f"{p.first}'s trip to {t.city}", f"{p.first}'s {t.city} trip"))
        s = a.hop("trip", key, f"I need {p.first}'s trip note.", f"{p.first} trip {t.city}", f"{p.first}'s trip to {t.city}")
        out += [a.ask(rel, x, [v], [s], (f"trip:{key}",), f"The note says {v}.")
                for rel, v in (("hotel", t.hotel), ("flight", t.flight), ("code", t.code), ("trip_date", day(t.start)))]
    for key, n in w.networks.items():
        s = a.hop("network", key, f"I need the network note for {n.place}.", f"network {n.place}", f"Network at {n.place}")
        out += [a.ask("ssid", n.place, [n.ssid], [s], (f"network:{key}",), f"The Wi-Fi is {n.ssid}."),
                a.ask("nas", n.place, [n.nas], [s], (f"network:{key}",), f"The NAS is at {n.nas}.")]
    return out


def generate(a: Asker) -> list[Question]:
    out: list[Question] = []
    for key in a.w.people:
        out += person_questions(a, key)
    for key in a.w.projects:
        out += project_questions(a, key)
    return out + place_questions(a)
