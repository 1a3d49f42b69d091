"""The answer, typed once: what the composer, the verified-LLM path and the service build, and the
one place it becomes the JSON the HTTP API and the command line emit (`Answer.to_dict`)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

SNIPPET_CHARS = 240
MARK = re.compile(r"\[\d+\]")


@dataclass
class Citation:
    """[n] in the answer: the record it opens and how the chip shows it."""
    n: int
    ref: str
    resource_type: str
    date: str
    label: str
    snippet: str
    quotes: tuple[str, ...] = ()   # a note's sentences the answer quotes: the side panel scrolls to them, highlighted

    @classmethod
    def of(cls, ev, n: int) -> "Citation":
        chunk = ev.chunk
        return cls(n, chunk.ref, chunk.resource_type, chunk.date[:10], chunk.label, chunk.text[:SNIPPET_CHARS])

    def renumbered(self, n: int) -> "Citation":
        return Citation(n, self.ref, self.resource_type, self.date, self.label, self.snippet, self.quotes)

    def to_dict(self) -> dict:
        out = {"n": self.n, "ref": self.ref, "resource_type": self.resource_type, "date": self.date,
               "label": self.label, "snippet": self.snippet}
        if self.quotes:
            out["quotes"] = list(self.quotes)
        return out


@dataclass
class Statement:
    """One sentence of the answer and the citations that support it. `context`: said for context
    (an entry of the asked class, a fact the question mentioned), not as the answer; `conflict`: a
    note that contradicts the structured record."""
    text: str
    citations: list[int]
    context: bool = False
    conflict: bool = False
    lead: bool = False      # the answer's first sentence, its clauses carrying their own [n] marks

    def cited_text(self) -> str:
        """The sentence with its marks: inline where each clause cites its own, else at the end."""
        if MARK.search(self.text):
            return self.text
        return f"{self.text} " + " ".join(f"[{n}]" for n in self.citations)

    def to_dict(self) -> dict:
        out = {"text": self.text, "citations": list(self.citations)}
        for name in ("context", "conflict", "lead"):
            if getattr(self, name):
                out[name] = True
        return out


@dataclass
class EvidenceItem:
    """A retrieved chunk, as the evidence trail and the evaluation see it."""
    rank: int
    ref: str
    refs: list[str]
    chunk_id: str
    score: float
    label: str
    text: str

    @classmethod
    def of(cls, ev, rank: int) -> "EvidenceItem":
        chunk = ev.chunk
        return cls(rank, chunk.ref, chunk.refs, chunk.chunk_id, round(ev.score, 4), chunk.label, chunk.text)

    def to_dict(self) -> dict:
        return {"rank": self.rank, "ref": self.ref, "refs": self.refs, "chunk_id": self.chunk_id,
                "score": self.score, "label": self.label, "text": self.text}


@dataclass
class Answer:
    id: str | None
    patient_id: str
    question: str
    answer: str
    statements: list[Statement]
    citations: list[Citation]
    evidence: list[EvidenceItem]
    confidence: str                      # high | medium | low
    abstained: bool
    diagnostics: dict = field(default_factory=dict)
    generator: str = "extractive"        # or the language model's name, or "none"
    generator_note: str | None = None    # why a configured model's answer was not used
    removed_statements: int = 0          # statements verification took out of a model's draft
    removed: list[dict] | None = None    # which, and why (the verified-LLM path only)
    chart: dict | None = None            # a trend the answer cites, for the frame's chart
    lead: str | None = None              # an abstention listing the asked class: its first sentence
    class_entries: int | None = None     # how many entries of the asked class it lists
    general: bool = False                # a question about medicine, not this patient
    banner: str | None = None            # shown above a general answer
    reading: str | None = None           # the record is still being read: what that means for this answer

    def to_dict(self) -> dict:
        out = {"id": self.id, "patient_id": self.patient_id, "question": self.question, "answer": self.answer,
               "statements": [s.to_dict() for s in self.statements],
               "citations": [c.to_dict() for c in self.citations],
               "evidence": [e.to_dict() for e in self.evidence], "confidence": self.confidence,
               "abstained": self.abstained, "diagnostics": self.diagnostics, "generator": self.generator,
               "removed_statements": self.removed_statements, "chart": self.chart}
        for name in ("generator_note", "removed", "lead", "class_entries", "banner", "reading"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.general:
            out["general"] = True
        return out
