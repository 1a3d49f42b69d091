"""The documentation stays true by test rather than by care: README.md for users, docs/ for the
rest, CHANGELOG.md for history.

docs/commands.md is generated from the command line's own declarations and must match them;
docs/settings.md must name every setting chartcite reads and nothing it does not; every relative
link between the pages must lead to a file that exists; the README links every page of docs/ and
stays short enough to read.
"""
from __future__ import annotations

import importlib.util
import re
from dataclasses import fields
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]
README_MOST_LINES = 250       # "about 200 lines": reference material belongs in docs/
LINK = re.compile(r"\]\(([^)\s]+)\)")
SETTING = re.compile(r"CHARTCITE_[A-Z0-9_]*[A-Z0-9]")


def command_reference():
    spec = importlib.util.spec_from_file_location("command_reference", REPO / "scripts" / "command_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_reference_is_what_the_command_line_declares():
    expected = command_reference().render()
    written = (DOCS / "commands.md").read_text(encoding="utf-8")
    assert written == expected, ("docs/commands.md differs from the command line's declarations: "
                                 "run python scripts/command_reference.py and commit the result")


def test_the_settings_reference_names_every_setting_and_nothing_else():
    from smart_app.settings import Settings

    settings = {f"CHARTCITE_{f.name.upper()}" for f in fields(Settings)}
    documented = set(SETTING.findall((DOCS / "settings.md").read_text(encoding="utf-8")))
    missing = sorted(settings - documented)
    unknown = sorted(documented - settings - {"CHARTCITE_CONFIG"})
    assert not missing, f"docs/settings.md does not document {', '.join(missing)}"
    assert not unknown, f"docs/settings.md documents {', '.join(unknown)}, which smart_app.settings.Settings lacks"


def relative_links(page: Path) -> list[str]:
    targets = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_every_relative_link_between_the_pages_resolves():
    broken = [f"{page.relative_to(REPO)} → {target}" for page in PAGES for target in relative_links(page)
              if not (page.parent / target).exists()]
    assert not broken, "links to nothing: " + "; ".join(broken)


def test_the_readme_links_every_docs_page_and_stays_short():
    readme = REPO / "README.md"
    linked = {(REPO / target).resolve() for target in relative_links(readme)}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"README.md does not link docs/{', docs/'.join(unlinked)}"
    assert (REPO / "CHANGELOG.md").resolve() in linked, "README.md does not link CHANGELOG.md"
    lines = len(readme.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MOST_LINES, f"README.md has {lines} lines: move reference material to docs/"
