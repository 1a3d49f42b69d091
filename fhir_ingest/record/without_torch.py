"""Importing spaCy (and what is built on it, as PyRuSH is) without PyTorch.

spaCy's thinc imports PyTorch whenever it is installed, for neural layers the rule-based
pipelines here never use: 450 MB of memory and 1.2 s in every process, and the int8 embedder does
not need PyTorch either (only the fp32 one and the one-time int8 build do, and they import it as
usual: other threads, and this one afterwards, are unaffected). Whichever comes first in a process
(the note sentence splitter when a record is chunked, the annotation pipeline after it) imports
spaCy inside `torch_hidden()`: once thinc is imported without it, it stays so.
"""
from __future__ import annotations

import importlib.abc
import sys
import threading
from contextlib import contextmanager
from typing import Iterator


class _TorchHiddenFromThisThread(importlib.abc.MetaPathFinder):
    """Makes `import torch` fail in the thread that installed it, and only there."""

    def __init__(self):
        self.thread = threading.get_ident()

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch" and threading.get_ident() == self.thread:
            raise ModuleNotFoundError("PyTorch is not needed by the rule-based spaCy pipelines", name=name)
        return None


@contextmanager
def torch_hidden() -> Iterator[None]:
    """`import torch` fails in this thread within the block (see the module's docstring)."""
    finder = _TorchHiddenFromThisThread()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
