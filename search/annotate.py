"""Clinical annotation of chunks and questions: which concepts they mention, of which semantic type.

This first version annotates from the shipped lexicon and the record's own codings; the spaCy /
scispacy pipeline with negation (see the retrieval issue) plugs in behind the same function.
"""
from __future__ import annotations

from fhir_ingest.contract import Chunk

from .lexicon import Lexicon, default_lexicon


def annotate_chunk(chunk: Chunk, lexicon: Lexicon | None = None) -> Chunk:
    lexicon = lexicon or default_lexicon()
    concepts = {}
    for m in lexicon.find(chunk.text, in_question=False):
        concepts.setdefault(m.canonical, {"code": "", "display": m.canonical, "semantic_type": m.semantic_type,
                                          "negated": False})
        if m.drug_class:
            concepts.setdefault(m.drug_class, {"code": "", "display": m.drug_class, "semantic_type": "medication",
                                               "negated": False})
    for key in chunk.codes:
        system, code, display = (key.split("|") + ["", ""])[:3]
        concepts.setdefault(f"{system}|{code}", {"code": f"{system}|{code}", "display": display,
                                                 "semantic_type": chunk.semantic_type, "negated": False})
    chunk.concepts = list(concepts.values())
    return chunk
