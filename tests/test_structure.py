"""The shape DESIGN.md asks for, checked: imports run one way (smart_app → workers → search →
fhir_ingest), no module imports itself round a circle, and no product function is over 60 lines."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("smart_app", "workers", "search", "fhir_ingest")     # each may import only those after it
MAX_FUNCTION_LINES = 60


def parsed(path: Path) -> ast.Module:
    tree = ast.parse(path.read_text(), str(path))
    tree.is_package = path.name == "__init__.py"
    return tree


def modules(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, ast.Module]:
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            found[name] = parsed(path)
    return found


def imports_of(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """Every product module this one imports, at the top or inside a function. A relative import
    counts from the module's package: a package's __init__ is its own package ("from .care" in
    kinds/__init__.py is kinds.care), any other module's is its parent."""
    package = name if getattr(tree, "is_package", False) else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        out |= {t for t in targets if t in known}
    out.discard(name)
    return out


def test_imports_run_one_way():
    found = modules()
    wrong = []
    for name, tree in found.items():
        rank = PACKAGES.index(name.split(".")[0])
        for target in imports_of(name, tree, set(found)):
            if PACKAGES.index(target.split(".")[0]) < rank:
                wrong.append(f"{name} imports {target}")
    assert not wrong, wrong


def test_the_record_room_never_reaches_for_the_ehr_connection():
    """fhir_ingest has two rooms: the record (files, checks, kinds, chunks) works on any FHIR it is
    given; only the EHR connection talks to EHRs, and it may use the record, not the reverse."""
    found = modules()
    wrong = [f"{name} imports {target}" for name, tree in found.items() if name.startswith("fhir_ingest.record")
             for target in imports_of(name, tree, set(found)) if target.startswith("fhir_ingest.connection")]
    assert not wrong, wrong


def import_circles(found: dict[str, ast.Module]) -> list[str]:
    """Every circle of imports among the modules, each as "a -> b -> a"."""
    graph = {name: imports_of(name, tree, set(found)) for name, tree in found.items()}
    cycles = []

    def visit(node, path, on_path, done):
        if node in on_path:
            cycles.append(" -> ".join(path[path.index(node):] + [node]))
            return
        if node in done:
            return
        on_path.add(node)
        for target in sorted(graph[node]):
            visit(target, path + [node], on_path, done)
        on_path.discard(node)
        done.add(node)

    done: set[str] = set()
    for name in sorted(graph):
        visit(name, [], set(), done)
    return cycles


def test_no_import_circles():
    cycles = import_circles(modules())
    assert not cycles, cycles


def write_package(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_circle_checker_finds_a_circle_through_a_package_init(tmp_path):
    """The shape the record package had: a module imports a subpackage's registry, whose __init__
    imports (relatively) a module that imports the first one back. Resolving the __init__'s
    "from .care" one level too high lost that edge and the circle with it."""
    write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/record/__init__.py": "",
        "pkg/record/normalize.py": "def types():\n    from .kinds import KINDS\n    return KINDS\n",
        "pkg/record/kinds/__init__.py": "from .care import KIND\nKINDS = [KIND]\n",
        "pkg/record/kinds/care.py": "from ..normalize import types\nKIND = 'care'\n",
    })
    found = modules(tmp_path, ("pkg",))
    assert imports_of("pkg.record.kinds", found["pkg.record.kinds"], set(found)) == {"pkg.record.kinds.care"}
    assert import_circles(found) == ["pkg.record.kinds -> pkg.record.kinds.care -> pkg.record.normalize -> pkg.record.kinds"]


def test_the_circle_checker_passes_a_package_without_one(tmp_path):
    """The same package with the check moved to a module of its own: no circle is reported."""
    write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/record/__init__.py": "",
        "pkg/record/normalize.py": "def words():\n    return ''\n",
        "pkg/record/validate.py": "from .kinds import KINDS\nfrom .normalize import words\n",
        "pkg/record/kinds/__init__.py": "from .care import KIND\nKINDS = [KIND]\n",
        "pkg/record/kinds/care.py": "from ..normalize import words\nKIND = 'care'\n",
    })
    assert import_circles(modules(tmp_path, ("pkg",))) == []


def test_no_function_is_over_60_lines():
    long = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert not long, long
