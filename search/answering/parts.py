"""Questions of several parts, answered part by part.

"h/o kidney transplant? still on tacro?", "her ldl is sky high - what was it in nov 2023, and what
statin dose is she on": each part is read and retrieved on its own (its own concepts, its own
dates), and answered or said absent in its own clause, so a part the record lacks never vetoes
the part it holds, and a date one part names never narrows the other. Words before a dash that
ask nothing ("her ldl is sky high") are context for every part; a part that says "it" or "that"
means what the part before it (or that context) was about.
"""
from __future__ import annotations

import re
from dataclasses import replace

from search.answering.answer import NO_EVIDENCE
from search.nlp.lexicon import content_tokens
from search.retrieval.types import QUESTION_WORDS
from search.answering.types import MARK, Answer, EvidenceItem, Statement

# Where one question ends and the next begins: a question mark with more after it, a semicolon,
# or ", and what ..." / " and is ..." joining a second question.
PART_BREAK = re.compile(
    r"\?\s+(?=\S)|;\s+|,?\s+(?:and|also|plus)\s+(?=(?:what|when|which|how|is|was|are|were|did|does|do|has|have|any|"
    r"who|where|why|still)\b)|,\s+(?=(?:what|when|which|how|is|was|are|were|did|does|do|has|have|any|who|"
    r"where|why)\b)", re.I)
# A lead-in that asks nothing ("her ldl is sky high -", "osteoporosis -"): context for each part.
CONTEXT_HEAD = re.compile(r"^(?P<head>[^?]{2,80}?)\s+[—–-]+\s+(?P<body>.+)$")
ASKS = re.compile(r"^\s*(?:is|was|are|were|does|did|do|has|have|had|any|what|which|when|why|how|should|could|can|who|"
                  r"where|list|show|tell|still|first|last)\b|\?\s*$", re.I)
PRONOUN = re.compile(r"\b(it|that|them|this one|that one)\b", re.I)
MOST_PARTS = 4
QUESTION_LEAD = re.compile(r"^(?:(?:what|which|when|how)(?:'s|\s+(?:is|was|are|were|does|did|do))?|is|was|are|were|does|"
                           r"did|do|has|have|had)\s+(?:(?:he|she|they|the patient|pt|his|her|their|the)\s+)?"
                           r"(?:(?:allergic|taking|on|having|had|got)\s+(?:to\s+)?)?", re.I)


def question_parts(question: str) -> list[str]:
    """The question's parts, each readable alone; one part for a question of one part."""
    head, body = "", question.strip()
    m = CONTEXT_HEAD.match(body)
    if m and not ASKS.search(m.group("head")):
        head, body = m.group("head").strip(), m.group("body").strip()
    pieces = standalone([p.strip(" ,?") for p in PART_BREAK.split(body) if p and p.strip(" ,?")])
    if len(pieces) < 2 or len(pieces) > MOST_PARTS:
        return [question]
    # "it" means the lead-in's subject when there is one ("wrist fx - imaging? how was it
    # managed"), else what the part before was about ("etoh use disorder on his list? tx plan for it").
    parts, topic = [], topic_of(head) if head else ""
    for piece in pieces:
        if topic and PRONOUN.search(piece):
            piece = PRONOUN.sub(topic, piece, count=1)
        parts.append(f"{head} - {piece}?" if head else f"{piece}?")
        topic = topic if head else (topic_of(piece) or topic)
    return parts


BARE = 3       # words of a piece that only names things ("metformin? insulin?"): options, not a question


def standalone(pieces: list[str]) -> list[str]:
    """Pieces that name nothing of their own ("when", "last 3 values", "since 2023") belong to the
    question before them ("CRAFFT done? when" is one question), and so do bare names that only
    offer options ("what's he taking for the diabetes? metformin? insulin?")."""
    out: list[str] = []
    leading = ""        # a time phrase before the first question ("since last month, any rx?") is its window
    for piece in pieces:
        named = [w for w in content_tokens(piece) if w not in QUESTION_WORDS and w not in TIME_WORDS
                 and w not in ATTRIBUTE_WORDS and not w.isdigit()]
        options = len(piece.split()) <= BARE and not ASKS.search(piece)
        if out and (not named or options):
            out[-1] = f"{out[-1]}? {piece}"
        elif not out and not named and TIME_WORDS & set(content_tokens(piece)):
            leading = f"{leading}{piece}, "
        else:
            out.append(f"{leading}{piece}" if not out else piece)
    return out or [leading.rstrip(", ")]


# "how much albuterol and how often?": a piece that asks only an attribute of a dose names nothing
# of its own; alone it would be searched for the word "often" and answered "no evidence".
ATTRIBUTE_WORDS = frozenset("often frequently frequency dose doses dosage dosing strength route".split())
TIME_WORDS = frozenset("day days week weeks wk month months mo year years yr yrs ago since until till last past "
                       "previous prior this".split())


def topic_of(piece: str) -> str:
    """What a part is about, to stand in for "it" in the next: its words before a verb-like cut
    ("etoh use disorder on his problem list" -> "etoh use disorder")."""
    # A part that asks ("what was her axillary temperature") is about what it asks of.
    piece = QUESTION_LEAD.sub("", piece.strip())
    words = re.split(r"\s+(?:on|in|at|from|for|per|since|after|before|during|is|was|were|are)\s+", piece.strip(), 1)[0]
    words = re.sub(r"^(?:any|h/o|hx of|history of|the|his|her|their)\s+", "", words, flags=re.I)
    return words if 2 <= len(words) <= 60 and not ASKS.match(words) else ""


def combined(question: str, question_id: str | None, parts: list[str], answers: list[Answer]) -> Answer:
    """One answer of the parts' answers: each part's statements (or the sentence that the record
    has nothing for it), their citations numbered in one series, the evidence interleaved so each
    part's best records come first."""
    statements, citations, numbers = [], [], {}
    for part, answer in zip(parts, answers):
        if answer.abstained:
            statements.append(Statement(f"{NO_EVIDENCE.rstrip('.')} for “{part.rstrip('?')}”.", [],
                                        lead=not statements))
            continue
        renumber = {}
        for c in answer.citations:
            if c.ref not in numbers:
                numbers[c.ref] = len(citations) + 1
                citations.append(replace(c, n=numbers[c.ref]))
            renumber[c.n] = numbers[c.ref]
        earlier = {n for st in statements for n in st.citations}
        for s in answer.statements:
            cited = [renumber[n] for n in s.citations if n in renumber]
            if cited and set(cited) <= earlier:
                continue        # an earlier part already said it, citing the same records
            text = MARK.sub(lambda m: f"[{renumber.get(int(m.group(0)[1:-1]), m.group(0)[1:-1])}]", s.text)
            statements.append(replace(s, text=text, citations=cited, lead=s.lead and not statements))
    text = " ".join(s.cited_text() if s.citations else s.text for s in statements)
    evidence = interleaved([a.evidence for a in answers])
    abstained = all(a.abstained for a in answers)
    levels = ("low", "medium", "high")
    confidence = levels[min(levels.index(a.confidence) for a in answers)]
    diagnostics = dict(answers[0].diagnostics, parts=[{"part": p, "abstained": a.abstained,
                                                      "analysis": a.diagnostics.get("analysis"),
                                                      "question_plan": a.diagnostics.get("question_plan")}
                                                     for p, a in zip(parts, answers)])
    chart = next((a.chart for a in answers if a.chart), None)
    # A part the language model could not write says so for the whole answer.
    unwritten = next((a for a in answers if a.generator_note), None)
    return Answer(question_id, answers[0].patient_id, question, NO_EVIDENCE if abstained else text,
                  [] if abstained else statements, [] if abstained else citations, evidence, confidence, abstained,
                  diagnostics, chart=chart,
                  generator_note=unwritten.generator_note if unwritten else None,
                  banner=unwritten.banner if unwritten else None)


def interleaved(lists: list[list[EvidenceItem]]) -> list[EvidenceItem]:
    """The parts' evidence taken in turn (each part's first, then each part's second...), once each."""
    out, seen = [], set()
    for rank in range(max((len(items) for items in lists), default=0)):
        for items in lists:
            if rank < len(items) and items[rank].chunk_id not in seen:
                seen.add(items[rank].chunk_id)
                out.append(replace(items[rank], rank=len(out) + 1))
    return out
