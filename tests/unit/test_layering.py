"""The layers import one way, subpackage by subpackage (the order of LAYERS, which the packages'
docstrings give), and no module imports itself back.

Every import statement counts, a function's or a TYPE_CHECKING block's too: the graph is read
from the source (AST), not from what happens to be imported at run time.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("nodes", "emulator", "analysis")
# lowest first: a layer imports only itself and those before it; a package's __init__ is its lowest layer
LAYERS = (
    "nodes",
    "nodes.contracts",
    "nodes.data",
    "nodes.training",
    "nodes.worker",
    "nodes.transport",
    "emulator",
    "emulator.formats",
    "emulator.privacy",
    "emulator.timemodel",
    "emulator.energy",
    "emulator.aggregate",
    "emulator.policies",
    "emulator.rounds",
    "emulator.hooks",
    "emulator.config",
    "emulator.output",
    "emulator.run",
    "emulator.cli",
    "emulator.__main__",
    "analysis",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def imports_of(path: Path) -> set[str]:
    """The project modules `path` imports: `from a.b import c` is a.b.c if that is a module, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module for a in node.names
            }
    return {m for m in found if m in MODULES}


GRAPH = {m: imports_of(p) for m, p in MODULES.items()}


def layer(module: str) -> int:
    """The index in LAYERS of the longest entry that is `module` or a package above it."""
    parts = module.split(".")
    return max(LAYERS.index(".".join(parts[:n])) for n in range(1, len(parts) + 1) if ".".join(parts[:n]) in LAYERS)


def test_the_walk_sees_every_layer_and_function_level_imports():
    assert {layer(m) for m in MODULES} == set(range(len(LAYERS)))
    assert "emulator.run.lifecycle" in GRAPH["emulator.__main__"]  # imported inside main()


def test_every_subpackage_is_a_layer_whose_docstring_says_its_job():
    subpackages = {m for m, p in MODULES.items() if p.name == "__init__.py" and m.count(".") == 1}
    top_modules = {m for m, p in MODULES.items() if p.name != "__init__.py" and m.count(".") == 1}
    assert subpackages | top_modules - {"analysis." + p.stem for p in (ROOT / "analysis").glob("*.py")} <= set(LAYERS)
    for package in subpackages | set(PACKAGES):
        assert ast.get_docstring(ast.parse(MODULES[package].read_text())), f"{package} has no docstring"


def test_no_layer_imports_a_higher_one():
    upward = sorted(f"{m} -> {dep}" for m, deps in GRAPH.items() for dep in deps if layer(dep) > layer(m))
    assert not upward, f"imports against the layering {' -> '.join(reversed(LAYERS))}: {upward}"


def test_no_import_cycles():
    cycles, done = [], set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            cycles.append(" -> ".join(path[path.index(m) :] + [m]))
            return
        if m in done:
            return
        for dep in sorted(GRAPH[m]):
            visit(dep, path + [m])
        done.add(m)

    for m in sorted(GRAPH):
        visit(m, [])
    assert not cycles, f"import cycles: {cycles}"
