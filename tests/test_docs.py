"""The documentation stays true by test rather than by care: README.md for users, docs/ for the
rest, CHANGELOG.md for history.

docs/commands.md is generated from the command line's own declarations and must match them;
docs/settings.md must name every setting chartcite reads and nothing it does not.
"""
from __future__ import annotations

import importlib.util
import re
from dataclasses import fields
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
SETTING = re.compile(r"CHARTCITE_[A-Z0-9_]*[A-Z0-9]")


def command_reference():
    spec = importlib.util.spec_from_file_location("command_reference", REPO / "scripts" / "command_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_reference_is_what_the_command_line_declares():
    expected = command_reference().render()
    written = (DOCS / "commands.md").read_text()
    assert written == expected, ("docs/commands.md differs from the command line's declarations: "
                                 "run python scripts/command_reference.py and commit the result")


def test_the_settings_reference_names_every_setting_and_nothing_else():
    from smart_app.settings import Settings

    settings = {f"CHARTCITE_{f.name.upper()}" for f in fields(Settings)}
    documented = set(SETTING.findall((DOCS / "settings.md").read_text()))
    missing = sorted(settings - documented)
    unknown = sorted(documented - settings - {"CHARTCITE_CONFIG"})
    assert not missing, f"docs/settings.md does not document {', '.join(missing)}"
    assert not unknown, f"docs/settings.md documents {', '.join(unknown)}, which smart_app.settings.Settings lacks"
