"""Questions about the club's notes, typed the way a member asks their own notes.

1-hop questions read one note ("tamsin locker"); chains follow the notes' links across two or
three notes ("Which boathouse holds the boat Tamsin's crew races?": Tamsin's note names her
crew, the crew note its boat, the boat note the boathouse). No relation, label or question
form is the notes world's (a test checks it), so notes can be held out while this world keeps
the skill in training.
"""

from __future__ import annotations

from ..base import Question, Step
from ..notebook import Asker, day
from .render import crew_title, lift_title, repair_title, with_article

FACT = {  # relation -> (templates with {x}, label)
    "side": (("Which side does {x} row?", "{x} side", "is {x} bow or stroke side", "{x} rowing side"), "side"),
    "suburb": (("Which suburb does {x} live in?", "{x} suburb", "whereabouts does {x} live", "{x} lives where"), "suburb"),
    "locker": (("Which locker is {x}'s?", "{x} locker", "locker number for {x}", "{x}'s locker number"), "locker"),
    "crew": (("Which crew does {x} row in?", "{x} crew", "what crew is {x} in", "crew of {x}"), "crew"),
    "joined": (("When did {x} join the club?", "{x} joined", "year {x} joined", "since when is {x} a member"),
               "joined"),
    "coach": (("Who coaches the {x} crew?", "{x} coach", "coach for {x}", "who's coaching {x}"), "coach"),
    "boat": (("Which boat do the {x} crew race?", "{x} boat", "racing boat of {x}", "what boat does {x} race in"),
             "boat"),
    "sessions": (("What days do the {x} crew row?", "{x} sessions", "{x} outings", "water sessions for {x}"),
                 "sessions"),
    "maker": (("Who made the {x}?", "{x} maker", "which boatbuilder made {x}", "builder of the {x}"), "maker"),
    "class": (("What kind of boat is the {x}?", "{x} boat class", "is the {x} a four or an eight", "class of {x}"),
              "boat class"),
    "bay": (("Which bay is the {x} racked in?", "{x} rack bay", "rack for the {x}", "bay of {x}"), "rack bay"),
    "boathouse": (("Which boathouse keeps the {x}?", "{x} boathouse", "where's the {x} stored"), "boathouse"),
    "water": (("Which water is the {x} on?", "{x} water", "what river or lake is the {x} on"), "water"),
    "keypad": (("Keypad combination for the {x}?", "{x} keypad", "door combination at the {x}"), "keypad"),
    "keyholder": (("Who has spare keys to the {x}?", "{x} keyholder", "spare keys for the {x}"), "keyholder"),
    "race_day": (("When do we race at the {x}?", "{x} race day", "which day is the {x}", "day of the {x}"),
                 "race day"),
    "course": (("Which course is the {x} raced on?", "{x} course", "on what stretch is the {x} rowed"), "course"),
    "entrant": (("Which crew are we sending to the {x}?", "{x} crew entered", "our crew at the {x}"),
                "crew entered"),
    "trailer": (("Who tows the trailer to the {x}?", "{x} trailer", "trailer tow for the {x}"), "trailer"),
    "lineup": (("Who's rowing at the {x}?", "{x} line-up", "name a rower racing at the {x}"), "line-up"),
    "drives": (("Who drives us to the {x}?", "{x} lifts", "lift to the {x} with whom"), "lifts"),
    "departure": (("What time do the lifts leave for the {x}?", "{x} departure", "leaving time for the {x}"),
                  "departure"),
    "guesthouse": (("Where do we sleep for the {x}?", "{x} guesthouse", "{x} accommodation", "B&B for the {x}"),
                   "guesthouse"),
    "mended_by": (("Who mended the {x}?", "{x} mended by", "who fixed the {x}"), "mended by"),
    "damage": (("What was wrong with the {x}?", "{x} damage", "what broke on the {x}"), "damage"),
}
CHAIN = {  # relation -> templates with {x}
    "crew_coach": ("Who coaches {x}'s crew?", "{x}'s coach", "coach of the crew {x} rows in"),
    "crew_boat": ("Which boat does {x}'s crew race?", "{x}'s crew boat", "boat of the crew {x} rows in"),
    "crew_boat_boathouse": ("Which boathouse holds the boat {x}'s crew races?", "boathouse for {x}'s crew boat",
                            "where's the boat {x} races in kept"),
    "next_course": ("Which course does {x}'s crew race on next?", "{x}'s next race course",
                    "where's {x} racing next"),
    "coached_race_day": ("When does the crew {x} coaches race next?", "next race day of the crew {x} coaches",
                         "{x} coaching, next race day"),
    "entrant_coach": ("Who coaches the crew racing at the {x}?", "{x} crew coach", "coach of our {x} crew"),
    "trailer_suburb": ("Which suburb does whoever tows the trailer to the {x} live in?", "{x} trailer suburb",
                       "suburb of whoever tows to the {x}"),
    "boat_water": ("Which water is the {x} rowed on?", "{x} boathouse water", "what river or lake is the {x} kept by"),
    "boat_keypad": ("Keypad combination of the boathouse where the {x} is racked?", "{x} boathouse keypad",
                    "door combination for the boathouse with the {x}"),
    "crew_boat_mender": ("Who mended the boat the {x} crew race?", "{x} boat mended by",
                         "who fixed the boat {x} race in"),
}


def member_questions(a: Asker, key: str) -> list[Question]:
    m, c = a.w.members[key], a.w
    x = a.ph.pick((m.first, m.name))
    me = a.hop("member", key, f"I need {m.name}'s note.", m.name, m.first)
    crew = c.crews[m.crew]
    ents = (f"member:{key}",)
    out = [a.ask("side", x, [m.side], [me], ents, f"{m.name} rows {m.side}."),
           a.ask("suburb", x, [m.suburb], [me], ents, f"{m.name} lives in {m.suburb}."),
           a.ask("locker", x, [f"locker {m.locker}", str(m.locker)], [me], ents, f"{m.name} has locker {m.locker}."),
           a.ask("crew", x, [crew_title(c, crew.key), crew.name], [me], ents, f"{m.name} rows in the {crew.name} crew."),
           a.ask("joined", x, [str(m.joined)], [me], ents, f"{m.name} has been a member since {m.joined}.")]
    out += crew_chains(a, key, x, me)
    if m.coaches:
        coached = c.crews[m.coaches]
        r = c.regattas[coached.next]
        found = f"{m.name} coaches the {coached.name} crew."
        s2 = a.hop("crew", coached.key, f"{found} Now I need that crew's note.", crew_title(c, coached.key), coached.name)
        s3 = a.hop("regatta", r.key, f"Their next race is the {r.name}. Now I need its note.", r.name,
                   f"{r.name} race day")
        out.append(a.ask("coached_race_day", x, [day(r.race)], [me, s2, s3],
                         ents + (f"crew:{coached.key}", f"regatta:{r.key}"), f"The {r.name} is on {day(r.race)}.",
                         bridge=crew_title(c, coached.key)))
    return out


def crew_chains(a: Asker, key: str, x: str, me: Step) -> list[Question]:
    """From a member's note to their crew's, and on to its boat or its next race."""
    m, c = a.w.members[key], a.w
    crew = c.crews[m.crew]
    coach, boat, r = c.members[crew.coach], c.boats[crew.boat], c.regattas[crew.next]
    found = f"{m.name} rows in the {crew.name} crew."
    s2 = a.hop("crew", crew.key, f"{found} Now I need the {crew.name} crew note.", crew_title(c, crew.key), crew.name)
    boat_hop = a.hop("boat", boat.key, f"The {crew.name} crew race the {boat.name}. Now I need where it is racked.",
                     boat.name, f"{boat.name} boat")
    race_hop = a.hop("regatta", r.key, f"Their next race is the {r.name}. Now I need its course.", r.name,
                     f"{r.name} course")
    house = c.boathouses[boat.boathouse]
    ents, bridge = (f"member:{key}", f"crew:{crew.key}"), crew_title(c, crew.key)
    return [a.ask("crew_coach", x, [coach.name, coach.first], [me, s2], ents,
                  f"The {crew.name} crew is coached by {coach.name}.", bridge=bridge),
            a.ask("crew_boat", x, [boat.name], [me, s2], ents, f"The {crew.name} crew race the {boat.name}.",
                  bridge=bridge),
            a.ask("crew_boat_boathouse", x, [house.name], [me, s2, boat_hop], ents + (f"boat:{boat.key}",),
                  f"The {boat.name} is racked in the {house.name}.", bridge=bridge),
            a.ask("next_course", x, [r.course], [me, s2, race_hop], ents + (f"regatta:{r.key}",),
                  f"The {r.name} is raced on the {r.course}.", bridge=bridge)]


def crew_questions(a: Asker, key: str) -> list[Question]:
    cr, c = a.w.crews[key], a.w
    coach, boat = c.members[cr.coach], c.boats[cr.boat]
    s = a.hop("crew", key, f"I need the {cr.name} crew note.", crew_title(c, key), cr.name)
    ents = (f"crew:{key}",)
    out = [a.ask("coach", cr.name, [coach.name, coach.first], [s], ents, f"{coach.name} coaches them."),
           a.ask("boat", cr.name, [boat.name], [s], ents, f"They race the {boat.name}."),
           a.ask("sessions", cr.name, [cr.sessions], [s], ents, f"They are on the water {cr.sessions}.")]
    if boat.repaired:
        rp = c.repairs[boat.key]
        mender = c.members[rp.mender]
        s2 = a.hop("boat", boat.key, f"The {cr.name} crew race the {boat.name}. Now I need its note.",
                   boat.name, f"{boat.name} boat")
        s3 = a.hop("repair", boat.key, f"The {boat.name} has a repair note. Now I need it.",
                   repair_title(c, boat.key), f"{boat.name} mended")
        out.append(a.ask("crew_boat_mender", cr.name, [mender.name, mender.first], [s, s2, s3],
                         ents + (f"boat:{boat.key}",), f"{mender.name} mended the {boat.name}.", bridge=boat.name))
    return out


def boat_questions(a: Asker, key: str) -> list[Question]:
    b, c = a.w.boats[key], a.w
    house = c.boathouses[b.boathouse]
    s = a.hop("boat", key, f"I need the note on the {b.name}.", b.name, f"{b.name} boat")
    at = a.hop("boathouse", house.key, f"The {b.name} is racked in the {house.name}. Now I need its note.",
               house.name, f"{house.name} keypad")
    ents = (f"boat:{key}",)
    out = [a.ask("maker", b.name, [b.maker], [s], ents, f"The {b.name} was made by {b.maker}."),
           a.ask("class", b.name, [b.cls], [s], ents, f"The {b.name} is {with_article(b.cls)}."),
           a.ask("bay", b.name, [f"bay {b.bay}", str(b.bay)], [s], ents, f"It is racked in bay {b.bay}."),
           a.ask("boathouse", b.name, [house.name], [s], ents + (f"boathouse:{house.key}",),
                 f"It is kept in the {house.name}."),
           a.ask("boat_water", b.name, [house.water], [s, at], ents + (f"boathouse:{house.key}",),
                 f"The {house.name} sits on the {house.water}.", bridge=house.name),
           a.ask("boat_keypad", b.name, [house.keypad], [s, at], ents + (f"boathouse:{house.key}",),
                 f"The {house.name} keypad is {house.keypad}.", bridge=house.name)]
    if b.repaired:
        rp = c.repairs[key]
        mender = c.members[rp.mender]
        fix = a.hop("repair", key, f"I need the {b.name} repair note.", repair_title(c, key), f"{b.name} mended")
        out += [a.ask("mended_by", b.name, [mender.name, mender.first], [fix], ents, f"{mender.name} mended it."),
                a.ask("damage", b.name, [rp.damage], [fix], ents, f"It had a {rp.damage}.")]
    return out


def regatta_questions(a: Asker, key: str) -> list[Question]:
    r, c = a.w.regattas[key], a.w
    crew = c.crews[r.crew]
    coach, tower = c.members[crew.coach], c.members[r.trailer]
    s = a.hop("regatta", key, f"I need the note on the {r.name}.", r.name, f"{r.name} race day")
    ents = (f"regatta:{key}",)
    s2 = a.hop("crew", crew.key, f"We send the {crew.name} crew to the {r.name}. Now I need their note.",
               crew_title(c, crew.key), crew.name)
    s3 = a.hop("member", tower.key, f"{tower.name} tows the trailer. Now I need {tower.first}'s note.",
               tower.name, tower.first)
    out = [a.ask("race_day", r.name, [day(r.race)], [s], ents, f"The {r.name} is on {day(r.race)}."),
           a.ask("course", r.name, [r.course], [s], ents, f"It is raced on the {r.course}."),
           a.ask("entrant", r.name, [crew_title(c, crew.key), crew.name], [s], ents + (f"crew:{crew.key}",),
                 f"We send the {crew.name} crew."),
           a.ask("trailer", r.name, [tower.name, tower.first], [s], ents, f"{tower.name} tows the trailer."),
           a.ask("lineup", r.name, [c.members[m].name for m in r.lineup], [s], ents,
                 f"In the boat: {', '.join(c.members[m].name for m in r.lineup)}."),
           a.ask("entrant_coach", r.name, [coach.name, coach.first], [s, s2], ents + (f"crew:{crew.key}",),
                 f"The {crew.name} crew is coached by {coach.name}.", bridge=crew_title(c, crew.key)),
           a.ask("trailer_suburb", r.name, [tower.suburb], [s, s3], ents + (f"member:{tower.key}",),
                 f"{tower.name} lives in {tower.suburb}.", bridge=tower.name)]
    if key in c.lifts:
        lift = c.lifts[key]
        driver = c.members[lift.driver]
        s = a.hop("lift", key, f"I need the lifts note for the {r.name}.", lift_title(c, key), f"{r.name} lifts")
        out += [a.ask("drives", r.name, [driver.name, driver.first], [s], ents, f"{driver.name} drives."),
                a.ask("departure", r.name, [lift.depart], [s], ents, f"The lifts leave at {lift.depart}."),
                a.ask("guesthouse", r.name, [lift.guesthouse], [s], ents, f"We sleep at {lift.guesthouse}.")]
    return out


def boathouse_questions(a: Asker, key: str) -> list[Question]:
    h, c = a.w.boathouses[key], a.w
    holder = c.members[h.keyholder]
    s = a.hop("boathouse", key, f"I need the note on the {h.name}.", h.name, f"{h.name} keypad")
    ents = (f"boathouse:{key}",)
    return [a.ask("water", h.name, [h.water], [s], ents, f"The {h.name} sits on the {h.water}."),
            a.ask("keypad", h.name, [h.keypad], [s], ents, f"The door keypad is {h.keypad}."),
            a.ask("keyholder", h.name, [holder.name, holder.first], [s], ents, f"{holder.name} has spare keys.")]


def generate(a: Asker) -> list[Question]:
    """Every question, subject by subject: members, crews, boats, regattas, boathouses."""
    w = a.w
    return [q for table, ask in ((w.members, member_questions), (w.crews, crew_questions), (w.boats, boat_questions),
                                 (w.regattas, regatta_questions), (w.boathouses, boathouse_questions))
            for key in table for q in ask(a, key)]
