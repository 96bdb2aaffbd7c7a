"""The fictional rowing club behind the club world, drawn from a seeded generator.

Members (side, suburb, locker, the year they joined, their crew; some coach another crew or
keep a boathouse's spare keys), crews (coach, squad, racing boat, water sessions, next race),
boats (class, maker, rack bay in a boathouse, last repair), boathouses (water, door keypad,
keyholder), regattas (race day, course, the crew and boat sent, who tows the trailer, the
line-up), lifts to away regattas (driver, departure, guesthouse) and repairs (damage, who
mended it). Every name is unique within one world. None of it is named like the notes
world's workplace: no first or last name, place or vocabulary is shared (a test checks it).
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field

from ..notebook import roster, slug

# first names used by none of notes, records or catalog (a test checks it)
FIRST = ("Ailsa", "Benedek", "Cormac", "Delyth", "Eamon", "Fionnuala", "Gethin", "Hollis", "Jarrah", "Kerensa",
         "Lachlan", "Morwenna", "Niall", "Oisin", "Perrin", "Rhiannon", "Saoirse", "Tamsin", "Uriel", "Verity",
         "Wynn", "Yestin", "Zinnia", "Anselm", "Bronwen", "Callum", "Dervla", "Elspeth", "Fergus", "Gwilym",
         "Hester", "Iestyn", "Jessamy", "Lowri", "Murdo", "Nesta", "Ossian", "Peregrine", "Rory", "Seren",
         "Tegan", "Ulick", "Vivienne", "Wilf", "Ysolde", "Alasdair", "Briony", "Caradoc", "Dilys", "Eilidh",
         "Fenella", "Griff", "Jago", "Kenna", "Lorcan", "Mairead", "Nye", "Orrin", "Philippa", "Ronan",
         "Sorcha", "Tobias", "Vaughan", "Yvaine", "Ambrose", "Blythe", "Conall", "Dunstan", "Emrys", "Hamish",
         "Isla", "Jory", "Keturah", "Lettice", "Odhran", "Piran", "Roisin", "Struan", "Thora", "Ursula",
         "Wystan", "Alaric", "Clemency", "Dougal", "Euan", "Ffion", "Gawain", "Hebe", "Ivor", "Jocasta",
         "Kester", "Linnet", "Merryn", "Nolan", "Oriel", "Rowena", "Sholto", "Tristram", "Urien", "Wilfred",
         "Aled", "Bryony", "Cerys", "Digby", "Effie", "Finlay", "Gerallt", "Hattie", "Imogen", "Jethro",
         "Keir", "Leofric", "Meriel", "Noel", "Padraig", "Quentin", "Rosalind", "Senan", "Talfryn", "Annwen",
         "Bevis", "Cadell")
LAST = ("Trevithick", "Pengelly", "MacAulay", "Farquhar", "Ogilvie", "Llewellyn", "Prothero", "Tremayne",
        "Abernethy", "Cadwallader", "Dunbar", "Fairweather", "Gilchrist", "Hargreaves", "Inglis", "Jardine",
        "Kilbride", "Lockhart", "Menzies", "Nesbitt", "Ormsby", "Penhaligon", "Quayle", "Rintoul", "Sinclair",
        "Tulloch", "Urquhart", "Vowles", "Wedderburn", "Yeoman", "Ashdown", "Blackwood", "Carrick", "Drummond",
        "Elphick", "Fenwick", "Garside", "Heseltine", "Ibbotson", "Jessop", "Kinnear", "Lindsay", "Moffat",
        "Napier", "Oakes", "Pryce", "Rudd", "Sowerby", "Thewlis", "Venables")
SIDES = ("bow side", "stroke side", "both sides")
SUBURBS = ("Kingsmead", "Saltcote", "Ferrybridge", "Ashgrove", "Thornbury", "Eastwick", "Hollins Cross",
           "Stanwell", "Pennycross", "Brackley Green", "Upper Sowton", "Fallowfield", "Coldharbour", "Spital Hill")
CREWS = ("Ebbtide", "Riptide", "Undertow", "Backwater", "Millrace", "Sandbar", "Whirlpool", "Wavecrest",
         "Slipstream", "Breakwater", "Floodgate", "Headwater", "Crosscurrent", "Tideway", "Moonraker", "Sternway")
BOATS = ("Dauntless", "Perseverance", "Resolute", "Valiant", "Endeavour", "Intrepid", "Tenacity", "Serendipity",
         "Bluebell", "Jubilee", "Tinker", "Old Faithful", "Iron Duke", "Gentle Giant", "Quicksilver", "Thunderbolt",
         "Firefly", "Dragonfly", "Mayfly", "Damselfly", "Nimble", "Steadfast", "Gallant", "Fortitude", "Defiance",
         "Liberty", "Providence", "Harmony", "Clarity", "Bramble", "Thistle", "Foxglove", "Snowdrop", "Celandine",
         "Campion", "Sorrel", "Tansy", "Yarrow", "Meadowsweet", "Speedwell", "Merry Widow", "Second Wind",
         "Water Rat", "Grayling", "Minnow", "Stickleback", "Kingcup", "Harebell", "Coltsfoot", "Ragged Robin")
RACING = ("eight", "coxed four", "coxless four", "quad scull")   # a crew's racing boat
SMALL = ("single scull", "double scull", "pair")
MAKERS = ("Empacher", "Filippi", "Janousek", "WinTech", "Hudson", "Stämpfli", "Aylings", "Burgashell",
          "Vespoli", "Fluidesign")
BOATHOUSES = ("Weir Boathouse", "Tannery Boathouse", "Ferry Steps Boathouse", "Lockside Boathouse",
              "Towpath Boathouse", "Chandlery Boathouse")
WATERS = ("River Wend", "Skell Reservoir", "Brede Canal", "Leven Estuary", "River Fal", "Hollin Cut")
COURSES = ("Long Reach", "Abbey Stretch", "Railway Reach", "Cobbler's Bend", "Lime Kiln Straight",
           "Sluice Straight", "Swan Bend", "Fisherman's Reach", "Tollgate Straight", "Priory Stretch",
           "Pumphouse Bend", "Bargeman's Reach")
PLACES = ("Hollowmere", "Wexcombe", "Abbotsley", "Brackenfold", "Calderbrook", "Dunholm", "Fernhithe",
          "Gallowmoor", "Hartsbridge", "Inchcaple", "Jedburn", "Kelderby", "Langstrothe", "Marchwood", "Netherby",
          "Pitlochie", "Quenby", "Rushmere", "Staveley", "Thurlow", "Ullesthorpe", "Vennford", "Whitstow",
          "Yarnbury", "Aldwick", "Beckhampton", "Cradley", "Dorrington", "Eskdale", "Fordingham", "Grindle",
          "Haverleigh", "Ilsington", "Kirkandrews", "Lythe", "Nunburnholme", "Orleton", "Penwortham", "Quarley",
          "Ravensworth", "Sedbury", "Tidmarsh", "Upwey", "Wendlebury", "Yealand", "Ashperton", "Bilsdale",
          "Coverack", "Dunsop", "Edlingham", "Farndale", "Garsdale", "Ingleby", "Kettlewell", "Lowick",
          "Middleham", "Newbiggin", "Oxenhope", "Pateley", "Reeth", "Sandsend", "Thwaite", "Wensley", "Bardsey")
RACES = ("Regatta", "Head", "Sprints", "Small Boats Head", "Autumn Head")
SESSIONS = ("Tuesdays and Saturdays", "Mondays and Thursdays", "Wednesdays and Sundays", "Fridays and Sundays",
            "Saturday mornings")
GUESTHOUSES = ("Rose Cottage B&B", "Ferryman's Rest", "Swan Cottage", "Kingsbarn B&B", "Old Forge B&B",
               "Bridge End Guesthouse", "Tollkeeper's Cottage", "Riverbank Bunkbarn", "Mrs Pennock's B&B")
DAMAGE = ("cracked rigger", "split fin", "loose footplate", "holed bow", "snapped slide", "bent gate",
          "torn bow canvas", "seized seat wheels")

MIN_MEMBERS = 8   # two crews of four, each with a coach from the other


@dataclass
class Member:
    key: str
    first: str
    last: str
    side: str
    suburb: str
    locker: int
    joined: int
    crew: str = ""        # crew key: the crew they row in
    coaches: str = ""     # crew key: the crew they coach, if any
    keyholder: str = ""   # boathouse key: where they keep spare keys, if any

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


@dataclass
class Crew:
    key: str
    name: str             # "Ebbtide"
    coach: str = ""       # member key
    boat: str = ""        # boat key
    sessions: str = ""
    hour: str = ""
    squad: list[str] = field(default_factory=list)
    next: str = ""        # regatta key: the crew's next race


@dataclass
class Boat:
    key: str
    name: str
    cls: str
    maker: str
    bought: int
    boathouse: str        # boathouse key
    bay: int
    crew: str = ""        # crew key: the crew that races it, if any
    repaired: bool = False


@dataclass
class Boathouse:
    key: str
    name: str
    water: str
    keypad: str
    keyholder: str        # member key
    bays: int = 0


@dataclass
class Regatta:
    key: str
    name: str             # "Hollowmere Head"
    race: dt.date
    course: str
    crew: str             # crew key
    trailer: str          # member key
    lineup: list[str]


@dataclass
class Lift:
    key: str              # the regatta's key
    driver: str           # member key
    depart: str
    guesthouse: str
    nights: int
    deposit: int
    passengers: list[str]


@dataclass
class Repair:
    key: str              # the boat's key
    damage: str
    mender: str           # member key
    done: dt.date
    cost: int


@dataclass
class Club:
    members: dict[str, Member]
    crews: dict[str, Crew]
    boats: dict[str, Boat]
    boathouses: dict[str, Boathouse]
    regattas: dict[str, Regatta]
    lifts: dict[str, Lift]
    repairs: dict[str, Repair]


def generate(seed: int, n_members: int = 100) -> Club:
    """A club of `n_members` members (at most len(FIRST)), the same for a seed."""
    rng = random.Random(f"club-world-{seed}")
    names = roster(rng, FIRST, LAST, n_members, MIN_MEMBERS)
    n = len(names)
    members = {}
    for (first, last), locker in zip(names, rng.sample(range(1, 240), n)):
        members[slug(first)] = Member(slug(first), first, last, rng.choice(SIDES), rng.choice(SUBURBS), locker,
                                      rng.randrange(1998, 2025))
    keys = list(members)
    crews = {slug(c): Crew(slug(c), c, sessions=rng.choice(SESSIONS),
                           hour=f"{rng.randrange(6, 9):02d}:{rng.choice(('00', '15', '30'))}")
             for c in CREWS[: max(2, n // 8)]}
    order = list(crews.values())
    for i, key in enumerate(keys):   # round the crews in turn; a crew's coach rows in the next one
        order[i % len(order)].squad.append(key)
        members[key].crew = order[i % len(order)].key
    for i, c in enumerate(order):
        c.coach = order[(i + 1) % len(order)].squad[0]
        members[c.coach].coaches = c.key
    boathouses = {}
    for name, keyholder in zip(BOATHOUSES[: max(2, min(len(BOATHOUSES), n // 20))], rng.sample(keys, len(BOATHOUSES))):
        boathouses[slug(name)] = Boathouse(slug(name), name, rng.choice(WATERS), str(rng.randrange(1000, 9999)),
                                           keyholder)
        members[keyholder].keyholder = slug(name)
    boats = {}
    for i, name in enumerate(rng.sample(BOATS, max(len(crews) + 2, 2 * n // 5))):
        house = boathouses[rng.choice(sorted(boathouses))]
        house.bays += 1
        crew = order[i] if i < len(order) else None
        boats[slug(name)] = Boat(slug(name), name, rng.choice(RACING if crew else SMALL), rng.choice(MAKERS),
                                 rng.randrange(1995, 2025), house.key, house.bays, crew.key if crew else "")
        if crew:
            crew.boat = slug(name)
    repairs = {}
    for b in rng.sample(sorted(boats), 2 * len(boats) // 3):
        boats[b].repaired = True
        repairs[b] = Repair(b, rng.choice(DAMAGE), rng.choice(keys),
                            dt.date(2025, 1, 2) + dt.timedelta(days=rng.randrange(0, 340)), rng.randrange(20, 400))
    regattas, lifts = {}, {}
    places = iter(rng.sample(PLACES, 4 * len(order)))
    for c in order:   # four races a crew, on Saturdays of 2025; the earliest is its next race
        seats = 8 if boats[c.boat].cls == "eight" else 4
        for week in sorted(rng.sample(range(52), 4)):
            name = f"{next(places)} {rng.choice(RACES)}"
            lineup = rng.sample(c.squad, min(seats, len(c.squad)))
            r = Regatta(slug(name), name, dt.date(2025, 1, 4) + dt.timedelta(weeks=week), rng.choice(COURSES),
                        c.key, rng.choice(keys), lineup)
            regattas[r.key] = r
            c.next = c.next or r.key
            if rng.random() < 0.5:   # an away race: lifts and beds
                lifts[r.key] = Lift(r.key, lineup[0], f"{rng.randrange(4, 8):02d}:{rng.choice(('00', '15', '30', '45'))}",
                                    rng.choice(GUESTHOUSES), rng.randrange(1, 3), rng.randrange(40, 200), lineup[1:])
    return Club(members, crews, boats, boathouses, regattas, lifts, repairs)
