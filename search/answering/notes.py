"""Notes as evidence, sentence by sentence: a note chunk's sections and sentences (split by the
clinical splitter of `fhir_ingest.record.notes`, so a quote never ends at "Dr." or "p.o."), and what
a note states of a clinical class (its ALLERGIES, MEDICATIONS or PROCEDURE section)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from fhir_ingest.record.notes import note_sentences, section_kind

# The note sections that state each clinical class a question may ask about.
CLASS_SECTIONS = {"allergy": ("allergy",), "medication": ("medication",), "procedure": ("procedure",),
                  "problem": ("problem",)}
CLASS_QUOTE_CHARS = 500      # a section quoted for a class answer: whole sentences up to about this long


@dataclass(frozen=True)
class NoteSentence:
    """One sentence of a note chunk, with the section it is in."""
    heading: str
    kind: str            # section_kind(heading)
    text: str


def note_header(chunk) -> str:
    """The note's own header in its chunk text ("Discharge summary of 2008-03-04")."""
    return chunk.text.partition(". ")[0]


def note_sections(body: str, headings: list[str]) -> list[tuple[str, str]]:
    """(heading, text) pairs of a note chunk's body, split on the headings the chunker recorded
    (Chunk.sections); text before the first heading has none."""
    if not headings:
        return [("", body.strip())]
    names = "|".join(re.escape(h) for h in sorted(headings, key=len, reverse=True))
    parts = re.split(rf"(?:^|(?<=\s))((?:{names})(?: \(continued\))?):\s*", body)
    sections = [("", parts[0].strip())] if parts[0].strip() else []
    sections += [(heading, text.strip()) for heading, text in zip(parts[1::2], parts[2::2])]
    return sections


def chunk_sections(chunk) -> list[tuple[str, str]]:
    return note_sections(chunk.text.partition(". ")[2], chunk.sections)


def sentences_of(chunk) -> list[NoteSentence]:
    """Every sentence of a note chunk, in order, each with its section."""
    out = []
    for heading, text in chunk_sections(chunk):
        base = heading.removesuffix(" (continued)")
        kind = section_kind(base)
        out += [NoteSentence(base, kind, " ".join(s.text.split())) for s in note_sentences(text)]
    return out


def class_sections(chunk, klass: str) -> list[tuple[str, str]]:
    """(heading, quote) for each section of this note chunk that states the class: whole
    sentences, verbatim, up to CLASS_QUOTE_CHARS (a longer list says how much more the note has)."""
    kinds = CLASS_SECTIONS.get(klass, ())
    out = []
    for heading, text in chunk_sections(chunk):
        base = heading.removesuffix(" (continued)")
        if not text or section_kind(base) not in kinds:
            continue
        sentences = [" ".join(s.text.split()) for s in note_sentences(text)]
        quote, shown = "", 0
        for sentence in sentences:
            if quote and len(quote) + len(sentence) > CLASS_QUOTE_CHARS:
                break
            quote, shown = f"{quote} {sentence}".strip(), shown + 1
        if shown < len(sentences):
            quote += f" (and {len(sentences) - shown} more in the note)"
        out.append((base, quote))
    return out
