"""The package's dependency direction follows the data: envs -> data, domains -> models -> train, evaluation -> sim
-> agents, cli. A walk over every module's imports fails on a cycle or on a forbidden direction."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rlvr_gym", "envs", "agents")
FORBIDDEN = {
    # importer prefix: imported prefixes it must not reach
    "rlvr_gym.domains": ("rlvr_gym.models", "rlvr_gym.train", "rlvr_gym.evaluation", "rlvr_gym.sim",
                         "rlvr_gym.integrations"),
    "rlvr_gym.data": ("rlvr_gym.models", "rlvr_gym.train", "rlvr_gym.evaluation", "rlvr_gym.sim",
                      "rlvr_gym.integrations"),
    "rlvr_gym.models": ("rlvr_gym.domains", "rlvr_gym.train", "rlvr_gym.evaluation", "rlvr_gym.sim",
                        "rlvr_gym.integrations"),
    "rlvr_gym.train": ("rlvr_gym.evaluation", "rlvr_gym.sim", "rlvr_gym.integrations"),
    "rlvr_gym.evaluation": ("rlvr_gym.train", "rlvr_gym.integrations"),
    "rlvr_gym.integrations": ("rlvr_gym.train",),
    "rlvr_gym.sim": ("rlvr_gym.train", "rlvr_gym.evaluation", "rlvr_gym.integrations"),
    "rlvr_gym": ("agents",),
    "envs": ("rlvr_gym", "agents"),
}
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports(path: Path, known: set[str]) -> set[str]:
    """The project modules a file imports at run time (imports under `if TYPE_CHECKING:` are for type hints only)."""
    tree = ast.parse(path.read_text())
    hints = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
             for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in hints:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import submodule` imports the submodule (its package's __init__ is not a dependency)
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, set(mods)) - {name} for name, path in mods.items()}


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_no_module_imports_against_the_data_flow():
    wrong = []
    for importer, targets in graph().items():
        for prefix, banned in FORBIDDEN.items():
            if under(importer, prefix):
                wrong += [f"{importer} -> {t}" for t in targets if any(under(t, b) for b in banned)]
    assert not wrong, "imports against the dependency direction:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles():
    edges = {m: {t for t in ts if t != "rlvr_gym"} for m, ts in graph().items()}  # the root only registers envs
    state, cycles = {}, []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_modules_stay_short_or_say_why():
    long = [f"{name} ({n} lines)" for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES
            and "longer than 500 lines" not in path.read_text()[:2000].lower()]
    assert not long, f"modules over {MAX_LINES} lines without a reason at the top: {long}"


def test_every_module_opens_with_a_docstring():
    missing = [name for name, path in modules().items()
               if path.read_text().strip() and ast.get_docstring(ast.parse(path.read_text())) is None]
    assert not missing, f"modules without a docstring saying what they are for: {missing}"
