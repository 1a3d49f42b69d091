"""The shape DESIGN.md asks for, checked: imports run one way (smart_app → workers → search →
fhir_ingest), no module imports itself round a circle, and no product function is over 60 lines."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("smart_app", "workers", "search", "fhir_ingest")     # each may import only those after it
MAX_FUNCTION_LINES = 60


def parsed(path: Path) -> ast.Module:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
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
        path.write_text(text, encoding="utf-8")


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


# Calls that read or write text in the locale's encoding unless told otherwise. A server's locale
# may be C with Python's UTF-8 mode off (ASCII), and FHIR text is UTF-8: every one names it.
BINARY_ONLY_OPENERS = {"os", "tarfile", "zipfile", "webbrowser", "gzip", "io", "lzma", "bz2"}
ENCODING_POSITION = {"read_text": 0, "write_text": 1}


def _constant(node):
    return node.value if isinstance(node, ast.Constant) else None


def _keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _text_mode_open(call: ast.Call) -> bool:
    """`open(...)` or `path.open(...)` in text mode; a mode the code computes counts as text."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in BINARY_ONLY_OPENERS:
        return False
    mode_at = 1 if isinstance(func, ast.Name) else 0
    mode = _keyword(call, "mode") or (call.args[mode_at] if len(call.args) > mode_at else None)
    return "b" not in (_constant(mode) or "") if mode is not None else True


def _says_text_mode(call: ast.Call) -> bool:
    mode = _keyword(call, "mode") or (call.args[1] if len(call.args) > 1 else None)
    return isinstance(_constant(mode), str) and re.fullmatch(r"[rwxa]\+?t\+?|[rwxa]t", _constant(mode)) is not None


def locale_encoded_io(call: ast.Call) -> str | None:
    """The name of a call that would use the locale's encoding, or None."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if _keyword(call, "encoding") is not None or any(k.arg is None for k in call.keywords):
        return None
    if name in ENCODING_POSITION:
        return name if len(call.args) <= ENCODING_POSITION[name] else None
    if _says_text_mode(call):           # gzip.open(p, "rt"), or an opener chosen at run time
        return name or "a call"
    if name == "open" and (isinstance(func, ast.Name) or isinstance(func, ast.Attribute)):
        positional_encoding = 3 if isinstance(func, ast.Name) else 2
        return name if _text_mode_open(call) and len(call.args) <= positional_encoding else None
    if name in ("run", "Popen", "check_output") and isinstance(func, ast.Attribute):
        text = _keyword(call, "text") or _keyword(call, "universal_newlines")
        return f"{name}(text=True)" if _constant(text) is True else None
    return None


def test_every_text_file_and_pipe_names_its_encoding():
    found = []
    for folder in (*PACKAGES, "tests", "bench", "scripts"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(parsed(path)):
                if isinstance(node, ast.Call) and (what := locale_encoded_io(node)):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {what}")
    assert not found, found


def test_the_encoding_check_finds_what_it_should(tmp_path):
    calls = {"open(p)": True, "open(p, 'rb')": False, "open(p, 'w', encoding='utf-8')": False,
             "path.read_text()": True, "path.read_text('utf-8')": False, "path.write_text(t)": True,
             "path.open('wb')": False, "path.open('a')": True, "gzip.open(p)": False,
             "subprocess.run(a, text=True)": True, "subprocess.run(a, text=True, encoding='utf-8')": False,
             "gzip.open(p, 'rt')": True, "opener(p, 'wt')": True, "gzip.open(p, 'rt', encoding='utf-8')": False}
    for source, flagged in calls.items():
        call = ast.parse(source).body[0].value
        assert (locale_encoded_io(call) is not None) is flagged, source
