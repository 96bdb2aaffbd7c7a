"""The fictional workplace behind the notes world, drawn from a seeded generator.

People (role, city, phone extension, team), teams (lead), meeting rooms
(building, floor, seats), projects (owner, deadline, kickoff meeting in a
room), trips (hotel, flight, booking code) and network notes (Wi-Fi name,
router, NAS address). Every name is unique within one world, so a question
naming a person or a project names exactly one.
"""

from __future__ import annotations

import datetime as dt
import random
import string
from dataclasses import dataclass, field

from ..notebook import roster, slug

FIRST = ("Priya", "Tomás", "Amara", "Kenji", "Lena", "Mateo", "Ingrid", "Yusuf", "Chloé", "Ravi", "Sofia",
         "Dmitri", "Aisha", "Jonas", "Mei", "Oskar", "Nadia", "Hugo", "Zainab", "Felix", "Rosa", "Arjun",
         "Elif", "Malik", "Hana", "Lucas", "Noor", "Emil", "Ayumi", "Bruno", "Clara", "Diego", "Esther",
         "Farid", "Greta", "Hamza", "Iris", "Jakob", "Kavya", "Leon", "Marta", "Nikolai", "Olga", "Pablo",
         "Quinn", "Rahel", "Samir", "Tara", "Umar", "Vera", "Wanjiru", "Xavier", "Yara", "Zoltan", "Abebe",
         "Beatriz", "Caio", "Dalia", "Eitan", "Fatima", "Goran", "Helga", "Idris", "Jana", "Kofi", "Laila",
         "Marek", "Nia", "Orla", "Pavel", "Rania", "Stefan", "Thandi", "Ugo", "Vikram", "Wiebke", "Yosef",
         "Zuzana", "Anouk", "Bilal", "Carmen", "Dario", "Eun-ji", "Fiona", "Gustavo", "Hiro", "Ilse",
         "Joaquín", "Kirra", "Lorenzo", "Maya", "Nils", "Oren", "Paulina", "Rafael", "Sanna", "Teodor",
         "Ulla", "Valentina", "Wen", "Ximena", "Yannick", "Zara", "Alba", "Bjorn", "Cyrus", "Daphne",
         "Erik", "Freya", "Gideon", "Halima", "Ivo", "Jun", "Keziah", "Linus", "Mirela", "Nico", "Ottilie")
LAST = ("Raman", "Ferreira", "Okafor", "Watanabe", "Lindqvist", "Rossi", "Haugen", "Demir", "Moreau",
        "Iyer", "Costa", "Volkov", "Bello", "Becker", "Chen", "Nowak", "Haddad", "Laurent", "Sadiq",
        "Brandt", "Navarro", "Mehta", "Yilmaz", "Mensah", "Sato", "Almeida", "Karimi", "Sorensen",
        "Kobayashi", "Ricci", "Fischer", "Herrera", "Levi", "Rahimi", "Eriksson", "Qureshi", "Duarte",
        "Novak", "Kariuki", "Andersen", "Petrov", "Gallo", "Osei", "Tanaka", "Romero", "Kowalski",
        "Nakamura", "Bianchi", "Adeyemi", "Lund", "Pereira", "Horvat", "Zhou", "Kaplan", "Weber")
ROLES = ("data engineer", "product designer", "backend developer", "site reliability engineer",
         "product manager", "research scientist", "frontend developer", "security analyst",
         "technical writer", "QA engineer", "data analyst", "engineering manager", "UX researcher",
         "mobile developer", "ML engineer", "support lead")
CITIES = ("Lisbon", "Nairobi", "Osaka", "Tallinn", "Montreal", "Porto", "Bergen", "Izmir", "Lyon",
          "Pune", "Valencia", "Kraków", "Accra", "Sapporo", "Ghent", "Tampere", "Bogotá", "Brisbane")
TEAMS = ("Kestrel", "Atlas", "Lighthouse", "Basalt", "Orchard", "Northwind", "Quartz", "Harbor",
         "Meridian", "Tundra", "Sparrow", "Cobalt", "Juniper Labs", "Redwood", "Beacon")
ROOMS = ("Juniper", "Cedar", "Alder", "Birch", "Maple", "Rowan", "Willow", "Hazel", "Aspen", "Linden",
         "Elm", "Spruce", "Larch", "Poplar", "Yew", "Olive")
BUILDINGS = ("Harbour building", "Mill building", "North annex", "Foundry")
PROJECTS = ("Heron", "Falcon", "Osprey", "Puffin", "Lynx", "Otter", "Badger", "Marten", "Ibis", "Condor",
            "Gecko", "Narwhal", "Pelican", "Tapir", "Wombat", "Zebu", "Bison", "Coyote", "Dingo", "Egret",
            "Ferret", "Gannet", "Hoopoe", "Impala", "Jackal", "Koala", "Lemur", "Macaw", "Newt", "Okapi",
            "Panda", "Quokka", "Raven", "Stork", "Toucan", "Urchin", "Vole", "Walrus", "Yak", "Zorilla",
            "Auk", "Bongo", "Caracal", "Dormouse", "Eland", "Fossa", "Gibbon", "Hyrax", "Ocelot", "Serval")
GOALS = ("move the billing reports to the new warehouse", "rebuild the onboarding flow",
         "cut the nightly batch time in half", "ship offline mode for the field app",
         "replace the legacy search service", "add single sign-on for partners",
         "translate the help centre into four languages", "set up the new on-call rota",
         "retire the old metrics cluster", "launch the customer feedback portal")
HOTELS = ("Casa Azul", "Hotel Lumen", "The Granary", "Hotel Aurora", "Pension Vogel", "Seaview Inn",
          "Hotel Kastell", "The Linden House", "Hotel Miramar", "Station Lodge")
AIRLINES = ("TP", "KL", "LH", "SK", "AY", "IB", "OS", "LX")
PLACES = ("home", "the cabin", "the studio", "my parents' flat", "the office lab")
ROUTERS = ("Fritz!Box 7590", "TP-Link Archer AX55", "Ubiquiti Dream Router", "Netgear Orbi RBR750",
           "ASUS RT-AX58U", "Linksys Velop MX4200")
WIFI = ("maple-house", "cabin-net", "studio-5G", "oma-wlan", "lab-guest", "otter-den", "blue-attic")


MIN_PEOPLE = 6  # enough for two teams, a few projects and a trip


@dataclass
class Person:
    key: str
    first: str
    last: str
    role: str
    city: str
    ext: str
    team: str = ""
    project: str = ""    # key of the project the person owns, if any

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


@dataclass
class Team:
    key: str
    name: str
    lead: str            # person key
    members: list[str] = field(default_factory=list)


@dataclass
class Room:
    key: str
    name: str
    building: str
    floor: int
    seats: int


@dataclass
class Project:
    key: str
    name: str            # "Heron"
    owner: str           # person key
    team: str
    goal: str
    deadline: dt.date
    kickoff: dt.date
    time: str
    room: str            # room key
    attendees: list[str]


@dataclass
class Trip:
    key: str
    person: str
    city: str
    hotel: str
    flight: str
    code: str
    start: dt.date
    nights: int


@dataclass
class Network:
    key: str
    place: str
    ssid: str
    router: str
    nas: str
    printer: str


@dataclass
class Workplace:
    people: dict[str, Person]
    teams: dict[str, Team]
    rooms: dict[str, Room]
    projects: dict[str, Project]
    trips: dict[str, Trip]
    networks: dict[str, Network]


def generate(seed: int, n_people: int = 100) -> Workplace:
    """A workplace of `n_people` people (at most len(FIRST)), the same for a seed."""
    rng = random.Random(f"notes-world-{seed}")
    people = {}
    for first, last in roster(rng, FIRST, LAST, n_people, MIN_PEOPLE):
        key = slug(first)
        people[key] = Person(key, first, last, rng.choice(ROLES), rng.choice(CITIES), str(rng.randrange(1000, 9999)))
    keys, n_people = list(people), len(people)
    teams = {}
    for i, name in enumerate(TEAMS[: max(2, n_people // 8)]):
        teams[slug(name)] = Team(slug(name), name, keys[i])
    for i, key in enumerate(keys):  # the first len(teams) people lead their own team
        team = teams[list(teams)[i % len(teams)]]
        people[key].team = team.key
        team.members.append(key)
    n_rooms = max(4, min(len(ROOMS), n_people // 6))
    rooms = {slug(r): Room(slug(r), r, rng.choice(BUILDINGS), rng.randrange(1, 7), rng.choice((4, 6, 8, 10, 12, 16, 20)))
             for r in ROOMS[:n_rooms]}
    projects = {}
    owners = rng.sample(keys, min(len(PROJECTS), n_people // 2))
    for name, owner in zip(rng.sample(PROJECTS, len(owners)), owners):
        kickoff = dt.date(2025, 1, 6) + dt.timedelta(days=rng.randrange(0, 300))
        team = people[owner].team
        others = [k for k in teams[team].members if k != owner]
        projects[slug(name)] = Project(
            slug(name), name, owner, team, rng.choice(GOALS), kickoff + dt.timedelta(days=rng.randrange(40, 200)),
            kickoff, f"{rng.randrange(9, 17):02d}:{rng.choice(('00', '30'))}", rng.choice(sorted(rooms)),
            [owner] + rng.sample(others, min(3, len(others))))
        people[owner].project = slug(name)
    trips = {}
    for key in rng.sample(keys, n_people // 4):
        city = rng.choice([c for c in CITIES if c != people[key].city])
        code = "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(6))
        trips[f"{key}-{slug(city)}"] = Trip(f"{key}-{slug(city)}", key, city, rng.choice(HOTELS),
                                             f"{rng.choice(AIRLINES)} {rng.randrange(100, 9999)}", code,
                                             dt.date(2025, 1, 6) + dt.timedelta(days=rng.randrange(0, 330)),
                                             rng.randrange(2, 6))
    networks = {}
    for place, ssid in zip(PLACES[: max(2, min(len(PLACES), n_people // 20))], rng.sample(WIFI, len(PLACES))):
        subnet = rng.choice((0, 1, 2, 10, 178))
        networks[slug(place)] = Network(slug(place), place, ssid, rng.choice(ROUTERS),
                                         f"192.168.{subnet}.{rng.randrange(2, 60)}",
                                         f"192.168.{subnet}.{rng.randrange(60, 250)}")
    return Workplace(people, teams, rooms, projects, trips, networks)
