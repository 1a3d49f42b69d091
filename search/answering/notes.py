"""Notes as evidence, sentence by sentence: a note chunk's sections and sentences (split by the
clinical splitter of `fhir_ingest.record.notes`, so a quote never ends at "Dr." or "p.o."), and what
a note states of a clinical class (its ALLERGIES, MEDICATIONS or PROCEDURE section)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Callable

from fhir_ingest.record.notes import note_sentences, section_kind, section_kinds, sentence_context
from search.retrieval.analysis import asked_things

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
    index: int = 0       # its place in its section (0: the section's first sentence)


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


def note_units(text: str) -> list[str]:
    """A section's sentences, with the items of a list kept with the line that introduces them
    ("The following procedures were conducted: echocardiography; thrombectomy")."""
    units: list[list[str]] = []
    for line in (part.strip() for part in text.split("\n")):
        if line.startswith("- "):
            if units and units[-1][-1].endswith(":") or units and units[-1][-1].startswith("- "):
                units[-1].append(line)
            else:
                units.append([line])
        elif line and not re.fullmatch(r"[A-Z][a-z]+", line):       # a bare subheading ("Plan") says nothing
            units += [[sentence.text] for sentence in note_sentences(line)]
    return [_join_list(unit) for unit in units]


def _join_list(unit: list[str]) -> str:
    lead = [] if unit[0].startswith("- ") else unit[:1]
    items = list(dict.fromkeys(line[2:].strip() for line in unit if line.startswith("- ")))
    return " ".join(lead + (["; ".join(items)] if items else []))


def sentences_of(chunk) -> list[NoteSentence]:
    """Every sentence of a note chunk, in order, each with its section."""
    out = []
    title = _plain(note_header(chunk))
    for heading, text in chunk_sections(chunk):
        base = heading.removesuffix(" (continued)")
        kind = section_kind(base)
        # A section continued from the chunk before does not open here.
        start = CONTINUED if heading.endswith(" (continued)") else 0
        # A list ("- cbc panel") stays with the line that introduces it, as one unit.
        texts = note_units(text) if re.search(r"^- ", text, re.M) else [s.text for s in note_sentences(text)]
        out += [NoteSentence(base, kind, " ".join(t.split()), start + i) for i, t in enumerate(texts)
                if _plain(t) not in title]        # the note's own title line says nothing
    return out


CONTINUED = 10


def _plain(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def class_sections(chunk, klass: str) -> list[tuple[str, str]]:
    """(heading, quote) for each section of this note chunk that states the class: whole
    sentences, verbatim, up to CLASS_QUOTE_CHARS (a longer list says how much more the note has)."""
    kinds = CLASS_SECTIONS.get(klass, ())
    out = []
    for heading, text in chunk_sections(chunk):
        base = heading.removesuffix(" (continued)")
        if not text or section_kind(base) not in kinds:
            continue
        sentences = [" ".join(s.text.split()) for s in note_sentences(text)] or [" ".join(text.split())]
        quote, shown = "", 0
        for sentence in sentences:
            if quote and len(quote) + len(sentence) > CLASS_QUOTE_CHARS:
                break
            quote, shown = f"{quote} {sentence}".strip(), shown + 1
        if shown < len(sentences):
            quote += f" (and {len(sentences) - shown} more in the note)"
        out.append((base, quote))
    return out


def class_mentions(chunk, klass: str) -> list[tuple[str, str]]:
    """(heading, sentence) for each sentence of a note chunk that names a thing of the class
    (a drug in "will not be placed on Plavix"), by the concepts annotation found in it, not denied."""
    names = {c["text"].lower() for c in chunk.concepts
             if c.get("semantic_type") == klass and not c.get("negated") and c.get("text")}
    if not names:
        return []
    return [(s.heading, s.text) for s in sentences_of(chunk)
            if any(re.search(rf"\b{re.escape(name)}\b", s.text.lower()) for name in names)]


# --- the sentences that answer ------------------------------------------------------------------

Similarity = Callable[[list[str]], list[float]]     # texts → cosine similarity of each to the question
NOTE_CHUNKS_READ = 4        # the best note chunks of the evidence whose sentences are ranked
TERM_WEIGHT = 0.06          # a question word the sentence has (by its stem) adds this to the similarity
SECTION_WEIGHT = 0.12       # the sentence is in the section the question names ("plan", "impression")
OPENING_WEIGHT = 0.25       # ...and more for its first sentences
SIDE_WEIGHT = 0.15          # the question's side (left/right) said, or only the other side said
# "Why did she need a C-section?": an operation's reason is its indication or preoperative
# diagnosis ("2. Failure to progress."), a line that shares no word with the question.
INDICATION_WEIGHT = 0.3
PRE_OPERATIVE = re.compile(r"\bpre-?op(?:erative)?\b", re.I)
ASKED_THING_WEIGHT = 0.2   # the sentence names the thing whose result or status is asked ("*path* results")
FAMILY_WEIGHT = 0.3         # a relative's history, asked about the patient
HYPOTHETICAL_WEIGHT = 0.1   # "return if...", asked what happened
SIDES = {"left": "right", "right": "left"}
# What kind of thing the question wants back decides which sentence answers, more than the words
# it shares with the question: "which side" is answered by a sentence that names a side, "what
# dose" by one with a measured amount, "why" by one that gives a reason, "what is she taking for"
# by one that names a drug.
ANSWER_KIND_WEIGHT = 0.15
DRUG_WEIGHT = 0.3
SIDE_ANSWER_WEIGHT = 0.3    # "which side": a sentence naming no side cannot answer, however close it reads
VALUE_WEIGHT = 0.3          # an amount asked, and the sentence gives the asked thing's value
SIDE_ASKED = re.compile(r"\b(?:which|what) side\b|\bleft or right\b|\bright or left\b|\blaterality\b")
AMOUNT_ASKED = re.compile(r"\b(?:doses?|dosages?|dosing|how (?:much|many|big|large|high|low)|amount|quantity|"
                          r"weight|weigh|level|value|size|ejection fraction|ef|blood loss|volume|reading)\b")
RULED_OUT_ASKED = re.compile(r"\brul(?:ed|e|ing)\s+(?:\w+\s+)?out\b|\bexcluded\b|\bnegative\s+for\b", re.I)
RULED_OUT = re.compile(r"\brul(?:ed|e)\s+(?:\w+\s+)?out\b|\bnegative\b|\bno evidence\b|\bexcluded\b", re.I)
REASON_ASKED = re.compile(r"\bwhy\b|\bwhat (?:was|is) the reason\b|\bindications?\b|\bwhat for\b")
# A measured amount: a number with a unit of dose, volume, mass, size or share (not "6-week").
AMOUNT = re.compile(r"\d(?:[\d,./-]*\d)?\s*(?:%|percent|mg|mcg|g|gm|grams?|kg|lbs?|pounds?|ounces?|oz|ml|cc|l|"
                    r"liters?|units?|meq|mmol|iu|cm|mm|mmhg|mg/dl|x\s?\d)\b|\b\d+\.\d+\b", re.I)
REASON = re.compile(r"\b(?:because|due to|secondary to|given (?:his|her|the|their)|owing to|in light of|"
                    r"as a result of|reasons?|indications?|indicated|too risky|risks? of|need for|needs? to|"
                    r"in order to|for (?:further|continued) |working diagnosis|therefore)\b", re.I)
# "What did he go home on", "when she left": the discharge sections answer (DISCHARGE MEDICATIONS,
# MEDICATIONS ON DISCHARGE, DISCHARGE INSTRUCTIONS), whatever else the question names.
DISCHARGE_ASKED = re.compile(r"\b(?:went|go|going|gone|sent|send|discharged)\s+home\b|\bdischarg\w*|"
                             r"\b(?:she|he|they)\s+left\b|\bleaving the hospital\b", re.I)
LIST_NUMBER = re.compile(r"^\s*\d{1,2}[.)]\s+")


@dataclass(frozen=True)
class Ranked:
    """A note sentence scored for how well it answers the question."""
    ev: object               # the Evidence (note chunk) it is in
    sentence: NoteSentence
    score: float


def _stem(word: str) -> str:
    return word[:6] if len(word) > 6 else word.rstrip("s")


def question_words(analysis) -> list[str]:
    """The question's content words and the long forms of its abbreviations, as stems. A word that
    names a section the question asks for ("plan" of "a/p") is not one: the section is scored as
    such, and "in agreement with the plan" is no answer to "what was the plan"."""
    # The full names of the concepts asked about count too: "MI" is written "myocardial infarction".
    names = [c["display"] for c in analysis.concepts if c.get("role") not in ("context", "class", "record")
             and c.get("display") and c["semantic_type"] not in ("note", "encounter")]
    words = list(analysis.terms) + [w for long in [*analysis.expansions, *names] for w in re.findall(r"[a-z0-9]+", long.lower())]
    asked = asked_section_kinds(analysis)
    return list(dict.fromkeys(_stem(w) for w in words if len(w) > 2 and not set(section_kinds(w)) & asked))


def asked_section_kinds(analysis) -> set[str]:
    """The kinds of section the question names: "plan", "impression", "a/p" (assessment and plan)."""
    words = list(analysis.terms) + list(analysis.sections_asked) + list(analysis.expansions)
    return {kind for w in words for kind in section_kinds(w)}


def rank_note_sentences(analysis, evidence: list, similarity: Similarity | None) -> list[Ranked]:
    """Every sentence of the best note chunks, best answer first: its similarity to the question
    (the embedding model's), the question's words it has, the section the question names, and the
    side the question names (a question about the right breast is not answered from the left)."""
    notes = notes_read(analysis, evidence)
    if not notes:
        return []       # nothing to embed: an answer from coded records costs no more than before
    pairs = [(ev, s) for ev in notes for s in sentences_of(ev.chunk) if says_something(s)]
    if not pairs:
        return []
    texts = [ranking_text(s) for _, s in pairs]
    sims = similarity(texts) if similarity is not None else [0.0] * len(pairs)
    stems, kinds = question_words(analysis), asked_section_kinds(analysis)
    things = [[_stem(w) for w in thing.split()] for thing in asked_things(analysis)]
    q = analysis.question.lower()
    sides = {side for side in SIDES if re.search(rf"\b{side}\b", q)}
    asked_context = sentence_context(analysis.question)
    about_drugs = "medication" in analysis.kinds or any(c["semantic_type"] == "medication" for c in analysis.concepts)
    wants = answer_kinds(analysis)
    about_a_procedure = any(c["semantic_type"] == "procedure" for c in analysis.concepts)
    discharge = DISCHARGE_ASKED.search(analysis.question) is not None
    drugs = {ev.chunk.chunk_id: drug_names(ev.chunk) for ev in notes} if "drug" in wants else {}
    ranked = []
    for (ev, sentence), sim, text in zip(pairs, sims, texts):
        low = text.lower()
        score = float(sim) + TERM_WEIGHT * sum(1 for stem in stems if re.search(rf"\b{re.escape(stem)}", low))
        # What the result is of, not where it is from: "path results from the tonsils" is answered
        # by what the pathologist said, not by the operative note's lines about the tonsils.
        score += ASKED_THING_WEIGHT * any(all(re.search(rf"\b{re.escape(stem)}", low) for stem in thing) for thing in things)
        if discharge and "discharge" in sentence.heading.lower():
            score += SECTION_WEIGHT
        if kinds & set(section_kinds(sentence.heading)):
            # The section asked for, its opening sentences first: a plan or an impression leads
            # with what matters most.
            score += SECTION_WEIGHT + OPENING_WEIGHT / (1 + sentence.index)
        # ConText: a relative's history or what may happen does not answer for the patient,
        # unless the question is itself about family or about what to do if.
        context = sentence_context(sentence.text) - asked_context
        score -= FAMILY_WEIGHT * ("family" in context or sentence.kind == "family_history" and "family" not in asked_context)
        score -= HYPOTHETICAL_WEIGHT * ("hypothetical" in context and not about_drugs)
        for side in sides:
            said, other = re.search(rf"\b{side}\b", low), re.search(rf"\b{SIDES[side]}\b", low)
            score += SIDE_WEIGHT if said else (-SIDE_WEIGHT if other else 0.0)
        score += answer_kind_score(sentence.text, wants, drugs.get(ev.chunk.chunk_id, ()))
        if "reason" in wants and about_a_procedure and states_an_indication(sentence.heading):
            score += INDICATION_WEIGHT
        if "amount" in wants and states_a_value_of(sentence.text, stems):
            score += VALUE_WEIGHT
        ranked.append(Ranked(ev, sentence, score))
    return sorted(ranked, key=lambda r: r.score, reverse=True)


def says_something(sentence: NoteSentence) -> bool:
    return re.search(r"[A-Za-z]{2}", sentence.text) is not None


def ranking_text(sentence: NoteSentence) -> str:
    """What is embedded of a sentence to compare it with the question: its section's heading and it."""
    return f"{sentence.heading}: {sentence.text}" if sentence.heading else sentence.text


def notes_read(analysis, evidence: list) -> list:
    """The best note chunks of the evidence, and any further one that holds the section the
    question names: a long PLAN is cut into chunks, and its opening (what matters most) may be in
    the chunk that ranked last."""
    notes = [ev for ev in evidence if ev.chunk.semantic_type == "note"]
    kinds = asked_section_kinds(analysis)
    return notes[:NOTE_CHUNKS_READ] + [ev for ev in notes[NOTE_CHUNKS_READ:]
                                       if kinds & {k for h in ev.chunk.sections for k in section_kinds(h)}]


def answer_kinds(analysis) -> set[str]:
    """What the question wants back: "side", "amount", "reason", "drug" (none, or several)."""
    q = analysis.question.lower()
    wants = set()
    if SIDE_ASKED.search(q):
        wants.add("side")
    # A bare test ("cea?", "bnp?") asks for its value.
    asked = [c for c in analysis.concepts if (c.get("role") or "asked") == "asked"]
    if AMOUNT_ASKED.search(q) or asked and all(c["semantic_type"] in ("lab", "vital") for c in asked):
        wants.add("amount")
    if REASON_ASKED.search(q):
        wants.add("reason")
    if RULED_OUT_ASKED.search(q):
        wants.add("ruled_out")
    if "medication" in analysis.kinds or any(c["semantic_type"] == "medication" and c.get("role") != "context"
                                             for c in analysis.concepts):
        wants.add("drug")
    return wants


def states_an_indication(heading: str) -> bool:
    """A section that gives an operation's reason: INDICATIONS, or the PREOPERATIVE DIAGNOSES."""
    kinds = set(section_kinds(heading))
    return "indication" in kinds or ("problem" in kinds and bool(PRE_OPERATIVE.search(heading)))


def drug_names(chunk) -> set[str]:
    """The drugs a note chunk names and does not deny, as its concepts annotation found them."""
    return {c["text"].lower() for c in chunk.concepts
            if c.get("semantic_type") == "medication" and not c.get("negated") and len(c.get("text") or "") > 2}


def states_a_value_of(text: str, stems: list[str]) -> bool:
    """The sentence gives a number right after a word of the question ("CEA elevated at 8.6" for
    "cea?"): the value of the thing asked, not a line that only names it ("Elevated CEA.")."""
    low = LIST_NUMBER.sub("", text).lower()
    return any(re.search(rf"\b{re.escape(stem)}[a-z]*\W{{1,3}}(?:[a-z]+\W{{1,3}}){{0,3}}\d", low) for stem in stems)


def answer_kind_score(text: str, wants: set[str], drugs) -> float:
    """How far the sentence is the kind of answer the question wants (see ANSWER_KIND_WEIGHT)."""
    low = LIST_NUMBER.sub("", text).lower()
    score = 0.0
    if "side" in wants and re.search(r"\b(?:left|right|bilateral(?:ly)?)\b", low):
        score += SIDE_ANSWER_WEIGHT
    if "amount" in wants and AMOUNT.search(low):
        score += ANSWER_KIND_WEIGHT
    if "reason" in wants and REASON.search(low):
        score += ANSWER_KIND_WEIGHT
    if "ruled_out" in wants and RULED_OUT.search(low):
        score += ANSWER_KIND_WEIGHT
    if "drug" in wants and any(re.search(rf"\b{re.escape(d)}\b", low) for d in drugs):
        score += DRUG_WEIGHT
    return score


def best_of_chunk(ranked: list[Ranked], chunk_id: str, n: int = 2, within: float = 0.08) -> list[NoteSentence]:
    """The chunk's best sentence, and the next best when nearly as good, in the note's order."""
    mine = [r for r in ranked if r.ev.chunk.chunk_id == chunk_id]
    if not mine:
        return []
    chosen = [r for r in mine[:n] if r.score >= mine[0].score - within]
    order = {id(r.sentence): i for i, r in enumerate(mine)}
    everything = sentences_of(mine[0].ev.chunk)
    position = {s: i for i, s in enumerate(everything)}
    return sorted((r.sentence for r in chosen), key=lambda s: position.get(s, order.get(id(s), 0)))


def with_section_opening(chosen: list[NoteSentence], chunk, analysis) -> list[NoteSentence]:
    """Asked for a section by name ("the impression from the ICU note"), the answer leads with
    that section's opening sentence when this chunk holds it: an impression or a plan opens with
    what matters most ("1. Melena secondary to ulcerative esophagitis."), which reads less like
    the question than its later lines do."""
    kinds = asked_section_kinds(analysis)
    if not kinds or not chosen:
        return chosen
    everything = sentences_of(chunk)
    opening = next((s for s in everything if s.index == 0 and kinds & set(section_kinds(s.heading))), None)
    if opening is None or opening in chosen:
        return chosen
    position = {s: i for i, s in enumerate(everything)}
    return sorted([opening, *chosen], key=lambda s: position.get(s, 0))


def with_its_list(chosen: list[NoteSentence], chunk) -> list[NoteSentence]:
    """A numbered item chosen for a question that asks for several things ("meds he went home on")
    brings the other numbered items of its list, in order, up to CLASS_QUOTE_CHARS: one line of a
    discharge medication list is not the list."""
    items = [s for s in chosen if LIST_NUMBER.match(s.text)]
    if not items:
        return chosen
    everything = sentences_of(chunk)
    out, size = list(chosen), sum(len(s.text) for s in chosen)
    for s in everything:
        if s in out or s.heading != items[0].heading or not LIST_NUMBER.match(s.text):
            continue
        if size + len(s.text) > CLASS_QUOTE_CHARS:
            break
        out.append(s)
        size += len(s.text)
    position = {s: i for i, s in enumerate(everything)}
    return sorted(out, key=lambda s: position.get(s, 0))


def quote(sentences: list[NoteSentence]) -> str:
    """Sentences quoted verbatim, each section's heading said once before its first sentence."""
    parts, previous = [], None
    for s in sentences:
        parts.append(f"{s.heading}: {s.text}" if s.heading and s.heading != previous else s.text)
        previous = s.heading
    return " ".join(parts)


def quoted_sentences(note_text: str, statement_text: str) -> list[str]:
    """The sentences of a note chunk's text that a statement quotes, in the note's order (a
    heading the chunk writes before a sentence need not be quoted with it)."""
    said = " ".join(statement_text.split())
    found = []
    for part in _HEADING_IN_CHUNK.split(note_text.partition(". ")[2]):
        units = note_units(part) if re.search(r"^- ", part, re.M) else [s.text for s in note_sentences(part)]
        for unit in units:
            words = " ".join(unit.split())
            if len(words) >= MIN_QUOTE and words in said:
                found.append(words)
    return list(dict.fromkeys(found))


MIN_QUOTE = 4
# The chunker writes each section as "HEADING: text" on one line.
_HEADING_IN_CHUNK = re.compile(r"(?:^|(?<=\s))[A-Z][A-Z0-9 /&,'()#\-]{1,60}(?: \(continued\))?:\s+")


# --- what answering reads of a note chunk, kept by search/sentence_readings.py ----------------------

def stated_text(chunk, heading: str, quote: str) -> str:
    """What is embedded of a note's statement of a class to compare it with the question: which
    note it is, the section and the quote ("home meds at discharge" reads the discharge medications)."""
    return f"{note_header(chunk)}. {heading}: {quote}"


def split_texts(chunk) -> list[str]:
    """Every piece of a note chunk's text that answering splits into sentences: its sections and
    their lines (sentences_of, class_sections, statement_for), the pieces between the headings the
    chunker wrote and their lines (quoted_sentences), and its body (denying_sentence). Found by
    the headings alone: nothing is split to list them."""
    body = chunk.text.partition(". ")[2]
    pieces = [text for _, text in chunk_sections(chunk)] + _HEADING_IN_CHUNK.split(body) + [body]
    lines = [line.strip() for piece in pieces for line in piece.split("\n")]
    return list(dict.fromkeys(p for p in pieces + lines if p.strip()))


def ranked_texts(chunk) -> list[str]:
    """The texts rank_note_sentences embeds of this chunk."""
    return [ranking_text(s) for s in sentences_of(chunk) if says_something(s)]


def stated_texts(chunk, klass: str, in_prose: bool) -> list[str]:
    """The texts class_in_notes embeds of this chunk for a class: its sections stating the class,
    or (in_prose) its sentences naming a thing of the class."""
    stated = class_mentions(chunk, klass) if in_prose else class_sections(chunk, klass)
    return [stated_text(chunk, heading, quote) for heading, quote in stated]


# Each way a note chunk's texts are compared with a question, as texts_of(chunk).
EMBEDDED_TEXTS = (ranked_texts, *(partial(stated_texts, klass=klass, in_prose=in_prose)
                                  for klass in CLASS_SECTIONS for in_prose in (False, True)))

