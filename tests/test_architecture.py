"""The rooms of the package and the imports allowed between them (docs/architecture.md).

Static, so nothing is imported and no optional dependency is needed: every .py
file of the four source folders is parsed with `ast`, relative imports are
resolved against the module's package, and imports inside functions count as
much as those at the top of a file (a lazy import still runs when the function
does). Two rules tell them apart: the CLI may import a stage, and the laptop
side torch, only inside a function. The last tests keep the repository
standing alone: no citation of a design document it does not hold, and every
link to a doc heading names one that exists.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> installed package name (pyproject.toml, [tool.setuptools.package-dir]).
PACKAGES = {"dgpo_edge": "dgpo_edge", "train": "dgpo_edge.train", "export": "dgpo_edge.export",
            "apps": "dgpo_edge.apps"}
STAGES = ("dgpo_edge.train", "dgpo_edge.export", "dgpo_edge.apps")
SUBPACKAGE_ROOMS = ("cli", "retrieval", "engines", "agent", "bundle", "worlds", "train", "export", "apps")

# Which rooms each room may import (docs/architecture.md, "Imports allowed between rooms").
# A room may always import itself; `cli` may import every room, stages only inside functions.
LAPTOP_BELOW_BUNDLE = {"core", "retrieval", "engines", "worlds", "agent"}
ALLOWED = {
    "core": {"core"},
    "retrieval": {"core"},
    "engines": {"core"},
    "worlds": {"core"},
    "agent": {"core", "retrieval", "engines"},
    "bundle": LAPTOP_BELOW_BUNDLE,
    "apps": LAPTOP_BELOW_BUNDLE | {"bundle"},
    "train": LAPTOP_BELOW_BUNDLE | {"bundle"},
    "export": LAPTOP_BELOW_BUNDLE | {"bundle", "train"},
    "cli": set(SUBPACKAGE_ROOMS) | {"core"},
}
# Export reads checkpoints, not trainers: the one training module it may import is the model
# loader (`load_checkpoint`, `check_replaceable` in train/models.py, where all loading lives).
EXPORT_MAY_IMPORT_FROM_TRAIN = {"dgpo_edge.train.models"}
# The training commands' modules: each puts the library rooms of train/ together for one command.
# Only the CLI imports them (tests and bench/ may too); a helper another module needs moves down into
# a library module (models, evaluation, plumbing, ...) instead.
COMMAND_MODULES = {"dgpo_edge.train.sft", "dgpo_edge.train.kd", "dgpo_edge.train.tgo", "dgpo_edge.train.rl.loop"}


@dataclass(frozen=True)
class Import:
    """One imported name, resolved to an absolute dotted path."""

    module: str      # the importing module
    target: str      # what it imports: a module, or `package.name` for `from package import name`
    line: int
    lazy: bool       # inside a function body (runs only when the function is called)

    def where(self) -> str:
        return f"{self.module}:{self.line} imports {self.target}"


def module_name(source: str, path: Path) -> tuple[str, bool]:
    """(dotted module name, is it a package's __init__) of a file under a source folder."""
    parts = list(path.relative_to(ROOT / source).with_suffix("").parts)
    package = path.name == "__init__.py"
    if package:
        parts = parts[:-1]
    return ".".join([PACKAGES[source], *parts]), package


def resolve(node: ast.ImportFrom, module: str, package: bool) -> str:
    """The absolute module a `from X import ...` reads, relative levels resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class _Collector(ast.NodeVisitor):
    """Every import of one file, with whether it sits inside a function."""

    def __init__(self, module: str, package: bool):
        self.module, self.package, self.depth = module, package, 0
        self.found: list[Import] = []

    def _nested(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _nested

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = resolve(node, self.module, self.package)
        self._add(base, node)
        # `from dgpo_edge import train` imports the subpackage: record `base.name` too.
        for alias in node.names:
            self._add(f"{base}.{alias.name}", node)

    def _add(self, target: str, node: ast.stmt) -> None:
        self.found.append(Import(self.module, target, node.lineno, self.depth > 0))


def imports_in(text: str, module: str, package: bool = False) -> list[Import]:
    collector = _Collector(module, package)
    collector.visit(ast.parse(text))
    return collector.found


def scan(source: str) -> list[Import]:
    """The imports of every module under one source folder."""
    found = []
    for path in sorted((ROOT / source).rglob("*.py")):
        module, package = module_name(source, path)
        found += imports_in(path.read_text(encoding="utf-8"), module, package)
    return found


ALL = [imp for source in PACKAGES for imp in scan(source)]


def room_of(module: str) -> str | None:
    """The room of a dgpo_edge module (None outside the package): a subpackage, `cli`, or `core`."""
    parts = module.split(".")
    if parts[0] != "dgpo_edge":
        return None
    if len(parts) > 1 and parts[1] in SUBPACKAGE_ROOMS:
        return parts[1]
    return "cli" if parts[1:2] == ["__main__"] else "core"   # __main__ only starts the CLI


def within(target: str, packages: tuple[str, ...] | set[str]) -> bool:
    """Is `target` one of `packages` or inside one of them?"""
    return any(target == p or target.startswith(p + ".") for p in packages)


def is_stage(target: str) -> bool:
    return within(target, STAGES)


# --- the scanner finds what it must (a checker that finds nothing proves nothing) -------------------

SAMPLE = """\
import os
import dgpo_edge.export.parity
from dgpo_edge import apps
from .. import protocol

def later():
    from ..train.rl import run_rl
    from ..train import models
"""


def test_scanner_resolves_relative_lazy_and_package_imports():
    found = imports_in(SAMPLE, "dgpo_edge.agent.loop")
    pairs = {(i.target, i.lazy) for i in found}
    assert {("os", False), ("dgpo_edge.export.parity", False), ("dgpo_edge.apps", False),
            ("dgpo_edge.protocol", False), ("dgpo_edge.train.rl", True), ("dgpo_edge.train.models", True)} <= pairs
    assert {i.target for i in found if is_stage(i.target)} == {
        "dgpo_edge.export.parity", "dgpo_edge.apps", "dgpo_edge.train", "dgpo_edge.train.rl",
        "dgpo_edge.train.models", "dgpo_edge.train.rl.run_rl"}
    assert not is_stage("dgpo_edge.trainer") and room_of("dgpo_edge.protocol") == "core"


def test_scanner_resolves_imports_in_a_package_init():
    found = {i.target for i in imports_in("from .agent import Agent\n", "dgpo_edge.agent", package=True)}
    assert "dgpo_edge.agent.agent" in found


def test_scanner_reads_the_whole_tree():
    modules = {i.module for i in ALL}
    assert {"dgpo_edge.cli.main", "dgpo_edge.retrieval.dense", "dgpo_edge.train.rl.loop",
            "dgpo_edge.export.onnx_export", "dgpo_edge.apps.chat.app"} <= modules
    assert len(modules) > 80
    # a known lazy import, resolved from `from ..train.sft import run_sft` inside a command
    assert any(i.module == "dgpo_edge.cli.train" and i.target == "dgpo_edge.train.sft" and i.lazy for i in ALL)


# --- the rules -----------------------------------------------------------------------------------------

def test_core_never_imports_a_stage():
    """No module under dgpo_edge/ outside cli/ imports dgpo_edge.train, .export or .apps, even lazily."""
    bad = [i.where() for i in ALL if room_of(i.module) not in (None, "cli", "train", "export", "apps")
           and is_stage(i.target)]
    assert bad == [], "the laptop side and the core must not import a stage:\n" + "\n".join(bad)


def test_cli_imports_stages_only_inside_commands():
    """`dgpo-edge ask` must start without loading training, export or TUI code."""
    bad = [i.where() for i in ALL if room_of(i.module) == "cli" and is_stage(i.target) and not i.lazy]
    assert bad == [], "import these inside the command function:\n" + "\n".join(bad)


def test_laptop_side_never_imports_torch_at_module_level():
    """The core, the CLI and the chat app import torch only inside the functions that need it."""
    bad = [i.where() for i in ALL if room_of(i.module) not in ("train", "export")
           and not i.lazy and within(i.target, ("torch",))]
    assert bad == [], "import torch inside the function that needs it:\n" + "\n".join(bad)


def test_export_reads_checkpoints_not_trainers():
    bad = [i.where() for i in ALL if room_of(i.module) == "export" and room_of(i.target) == "train"
           and not within(i.target, EXPORT_MAY_IMPORT_FROM_TRAIN)]
    assert bad == [], "export may load models, not import training code:\n" + "\n".join(bad)


def test_no_module_imports_a_training_command():
    bad = [i.where() for i in ALL if room_of(i.module) != "cli" and i.module not in COMMAND_MODULES
           and within(i.target, COMMAND_MODULES)]
    assert bad == [], "move what is shared into a library module of train/:\n" + "\n".join(bad)


def test_training_commands_are_named_right():
    """COMMAND_MODULES names modules that exist, and the CLI starts each of them."""
    modules = {i.module for i in ALL}
    assert COMMAND_MODULES <= modules
    assert {i.target.rsplit(".", 1)[0] for i in ALL if room_of(i.module) == "cli"} >= COMMAND_MODULES


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_imports_between_rooms_point_down(room):
    bad = [f"{i.where()} ({room_of(i.target)})" for i in ALL if room_of(i.module) == room
           and room_of(i.target) not in (None, room, *ALLOWED[room])]
    assert bad == [], f"{room} may import only {sorted(ALLOWED[room])}:\n" + "\n".join(bad)


# --- the repository stands alone -------------------------------------------------------------------

TEXT_FOLDERS = ("dgpo_edge", "train", "export", "apps", "docs", "tests", "bench")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".json"}
OUTSIDE_DOCUMENT = re.compile("DESIGN" + r"(\.md)?\s*§")     # split so this file does not match itself
DOC_LINK = re.compile(r"(?:docs/|\()([\w.-]+\.md)#([\w-]+)")  # docs/<page>.md#<anchor>, or (<page>.md#<anchor>)


def text_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in TEXT_FOLDERS:
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in TEXT_SUFFIXES
                  and "__snapshots__" not in p.parts and p.is_file()]
    return files


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a markdown page's headings: lower case, punctuation dropped, spaces -> '-'."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_nothing_cites_a_design_document_outside_the_repository():
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in text_files()
           for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE_DOCUMENT.search(line)]
    assert bad == [], "point to docs/architecture.md instead:\n" + "\n".join(bad)


def test_links_to_doc_sections_name_headings_that_exist():
    bad = []
    for p in text_files():
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            for page, anchor in DOC_LINK.findall(line):
                target = ROOT / "docs" / page
                if not target.is_file() or anchor not in anchors(target):
                    bad.append(f"{p.relative_to(ROOT)}:{n} links to docs/{page}#{anchor}")
    assert bad == [], "no such page or heading:\n" + "\n".join(bad)
