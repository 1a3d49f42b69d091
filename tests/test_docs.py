"""The documentation stays true by test rather than by care.

docs/commands.md is generated from the command line's own declarations and must match them.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


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
