"""Answer policy in one place: after the extractive answer is composed, a list of small steps, each
deciding one thing in order, like the retrieval stages. Each step takes the answer so far and the
question's context and returns the answer to pass on.

1. `empty_record`: a record with nothing indexed says which of "new patient", "being read" or
   "read but not indexed" it is, never the bare no-evidence sentence.
2. `planned_operation`: the question's plan (search/answering/plan.py); a count, a duration, a
   change, a comparison, a window relative to today or a class of visit is answered by its
   operation over every item of the target (search/answering/operations.py).
3. `never_hide_the_class`: an abstention lists what the record holds of the asked class (cited),
   so "no evidence" is never read as "none recorded".
4. `grounded_by_model`: with a configured language model, its verified statements replace the
   extractive ones (identifiers scrubbed before anything is sent).
5. `yes_names_the_target`: a "Yes" names the asked thing, read from whether the whole record
   holds it (search/answering/exists.py); an absent target is said to be absent before anything
   shown as context.
6. `cite_sentences`: a note's citation names the sentences the answer quotes (the panel highlights them).
7. `trend_chart`: an answer that cites a trend gets its chart.
8. `while_reading`: an answer given while the record is still being embedded says so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import date
from typing import Callable

from search.answering.answer import (CLASS_LIST_LIMIT, CLASSES, NEW_PATIENT, NO_EVIDENCE, asked_class,
                                     class_entries_answer, context_evidence, names, while_reading as reading_notice)
from search.answering.notes import (CLASS_SECTIONS, class_mentions, class_sections, quoted_sentences,
                                    stated_text)
from search.answering.lead import ALLERGY_WORDS
from search.answering.operations import planned_operation
from search.answering.related import closest_first
from search.nlp import terminology
from search.nlp.lexicon import content_tokens
from search.answering.charts import trend_chart as chart_of_trend
from search.answering.exists import yes_names_the_target
from search.answering.types import Answer, Citation, EvidenceItem, Statement
from search.backends.base import Backend, Scope
from search.retrieval.types import Evidence, Retrieval
from search.retrieval.ranking import fact_key


@dataclass
class AnswerContext:
    """What the steps may consult: the retrieval, the index, and the service's optional parts."""
    tenant: str
    patient_id: str
    retrieval: Retrieval
    backend: Backend
    summary: Callable[[], dict]                 # the patient's index summary, read when a step needs it
    grounded: Callable[[Answer], Answer] | None = None    # the language-model step, when one is configured
    indexed_types: frozenset[str] = frozenset()
    today: date | None = None                   # what "since last month" counts from; None: the clock's date
    question_id: str | None = None
    general: Callable[[], Answer] | None = None  # the answer to a question about medicine, not this patient
    # Told which chunks (by id) a step reads sentence by sentence beyond the retrieved ones (the
    # class in the notes, the records an answer cites), so what the index keeps of their
    # sentences is loaded first and what is computed of them is kept (search/sentence_readings.py).
    read_chunks: Callable[[list[str]], None] | None = None


AnswerStep = Callable[[Answer, AnswerContext], Answer]


def empty_record(result: Answer, ctx: AnswerContext) -> Answer:
    """"New patient" only when the record holds nothing clinical; records read but not indexed
    are a different situation, and a clinician must not mistake one for the other."""
    corpus = ctx.retrieval.corpus_size
    # One passage may be the Patient's own demographics: an abstention over it alone is still a
    # record with nothing clinical in it (the summary says which).
    if corpus > 1 or (corpus == 1 and not result.abstained):
        return result
    summary = ctx.summary() or {}
    counts = summary.get("resource_counts") or {}
    clinical = sum(n for rt, n in counts.items() if rt in ctx.indexed_types)
    if corpus and clinical:
        return result
    # Said of the whole record, so no later step lists an empty class beside it.
    result.diagnostics["record"] = "reading" if summary.get("vectors_pending") else "empty" if not clinical \
        else "not indexed"
    if summary.get("vectors_pending"):
        return replace(result, answer="This patient's record is being read; ask again in a moment.")
    if not clinical:
        return replace(result, answer=NEW_PATIENT)
    return replace(result, answer=f"{clinical} clinical records were read for this patient, but none could be "
                                  f"indexed; the index report says why. I cannot answer from them.")


def never_hide_the_class(result: Answer, ctx: AnswerContext) -> Answer:
    """An abstention never stands alone when the record holds what was asked about's class
    (allergies, problems, medications, procedures): those entries are listed, cited, with the
    word that none matches; a fact the question mentioned as context is shown as such."""
    if ctx.retrieval.corpus_size == 0 or "record" in result.diagnostics or "operation" in result.diagnostics:
        return result      # an operation's answer counted the whole class in its window itself
    klass = asked_class(ctx.retrieval.analysis)
    result.diagnostics["asked_class"] = {"class": klass}
    if not result.abstained:
        return notes_beside_coded(result, ctx, klass)
    scope = Scope(ctx.tenant, ctx.patient_id, semantic_types=(klass,)) if klass else None
    held = ctx.backend.count(scope) if scope else 0
    result.diagnostics["asked_class"]["records"] = held
    context = context_evidence(ctx.retrieval)
    stated = class_in_notes(ctx, klass) if klass else []
    if stated and (named_in_notes(ctx, stated) or not held and (asks_the_class(ctx, klass) or asked_members(ctx))):
        return notes_class_answer(result, ctx, klass, stated, held)
    if klass and not held:
        return empty_class_answer(result, ctx, klass)
    if not held and context is None:
        return result
    entries = class_entries(ctx.backend, scope) if held else []
    related, others = closest_first(entries, ctx.retrieval.analysis, klass, ctx.retrieval.candidates)
    # The notes state the class too: what the coded entries lack is not said to be absent.
    # No note names what was asked either (else the notes answered above): the absence stands.
    listed = class_entries_answer(result, klass if held else "", others, context, related,
                                  absence(ctx.retrieval.analysis, klass, 0 < held <= CLASS_READ, related))
    return with_note_statements(listed, stated[:SUPPORTING_NOTES], context=True)


NOTES_READ = 50        # note chunks read, newest first, for what they state of a class


def class_in_notes(ctx: AnswerContext, klass: str, mentions: bool = True) -> list[tuple[Evidence, str, str]]:
    """(note chunk, heading, quote) for every section of the patient's notes that states the
    class (an H&P's ALLERGIES, a discharge summary's MEDICATIONS ON DISCHARGE, an operative
    note's PROCEDURE), newest first: a note is evidence of the class as much as a coded entry."""
    if klass not in CLASS_SECTIONS:
        return []
    notes = Scope(ctx.tenant, ctx.patient_id, semantic_types=("note",))
    chunks = ctx.backend.get_chunks(ctx.tenant, [h.chunk_id for h in ctx.backend.latest(notes, NOTES_READ)])
    chunks.sort(key=lambda c: c.date, reverse=True)
    if ctx.read_chunks is not None:
        ctx.read_chunks([c.chunk_id for c in chunks])
    stated = [(Evidence(chunk, 0.0), heading, quote) for chunk in chunks for heading, quote in class_sections(chunk, klass)]
    # No section lists the class: a note that names one of it in its prose still states it.
    if not stated and mentions:
        stated = [(Evidence(chunk, 0.0), heading, sentence) for chunk in chunks
                  for heading, sentence in class_mentions(chunk, klass)][:CLASS_LIST_LIMIT]
    elif stated and mentions and asked_members(ctx) and not named_in_notes(ctx, stated):
        stated = named_only_in_prose(ctx, klass, chunks) + stated
    similarity = ctx.retrieval.similarity
    if similarity is None or len(stated) < 2:
        return stated
    # Closest to the question first ("home meds at discharge" reads the discharge medications),
    # each note's header saying which note it is; newest first among equals.
    scores = similarity([stated_text(ev.chunk, heading, quote) for ev, heading, quote in stated])
    order = sorted(range(len(stated)), key=lambda i: -scores[i])
    return [stated[i] for i in order]


def asked_members(ctx: AnswerContext) -> list[str]:
    """What a class question names ("allergic to sulfa?" names sulfa), as the words to look for."""
    analysis = ctx.retrieval.analysis
    keys = analysis.required_keys - {ALLERGY_WORDS}
    asked = [c for c in analysis.concepts if c["key"] in keys]
    # A drug class is named in a note by its members: "antihypertensive?" by "benazepril".
    return list(dict.fromkeys([c["display"] for c in asked] + [c["text"] for c in asked if c.get("text")]
                              + [m for c in asked for m in sorted(terminology.members_of(c["display"]))]))


def asks_the_class(ctx: AnswerContext, klass: str) -> bool:
    """The question asks for the class itself ("any allergies?", "what surgeries has she had?"),
    not for one thing of it."""
    analysis = ctx.retrieval.analysis
    return klass in analysis.kinds or (klass == "allergy" and not asked_members(ctx))


def named_in_notes(ctx: AnswerContext, stated: list) -> list:
    """The class statements of the notes that name what was asked."""
    members = asked_members(ctx)
    if ctx.retrieval.absent_terms:
        return []       # a word of the question this record never uses: no note names what was asked
    return [s for s in stated if members and any(names(m, s[2]) for m in members)]



def note_statement(ev: Evidence, heading: str, quote: str) -> str:
    where = f" under {heading}" if heading else ""
    return f'the note of {ev.chunk.date[:10]} says{where}: "{quote}"'


def notes_class_answer(result: Answer, ctx: AnswerContext, klass: str, stated: list, held: int) -> Answer:
    """What the notes state of the asked class, each section cited. Asked about one member, the
    statements naming it answer; when none does, the answer is still "no evidence", followed by
    what the notes do state of the class (never "none recorded")."""
    members = asked_members(ctx)
    naming = named_in_notes(ctx, stated)
    shown = newest_first((naming or stated)[:CLASS_LIST_LIMIT])
    citations, statements = [], []
    for i, (ev, heading, quote) in enumerate(shown):
        citations.append(Citation.of(ev, i + 1))
        words = note_statement(ev, heading, quote)
        statements.append(Statement(words[0].upper() + words[1:], [i + 1], lead=i == 0, context=not naming and bool(members)))
    coded = "" if held else f"No {CLASSES[klass]} are coded in this patient's record, and its notes state: "
    answer = " ".join(s.cited_text() for s in statements)
    abstained = bool(members) and not naming
    if abstained:
        answer = f"{NO_EVIDENCE} {coded}{answer}"
    elif coded:
        answer = coded + answer
    have = {e.chunk_id for e in result.evidence}
    extra = list({ev.chunk.chunk_id: ev for ev, _, _ in shown if ev.chunk.chunk_id not in have}.values())
    evidence = result.evidence + [EvidenceItem.of(ev, len(result.evidence) + i + 1) for i, ev in enumerate(extra)]
    return replace(result, answer=answer, statements=statements, citations=citations, evidence=evidence,
                   abstained=abstained, lead=statements[0].text if statements else None,
                   class_entries=len(statements) if abstained else None)


def notes_beside_coded(result: Answer, ctx: AnswerContext, klass: str) -> Answer:
    """A question about a class as such ("any allergies?") answered from coded entries also says
    what the notes state of it (a note's allergy list the coded list lacks), each cited."""
    if not klass or asked_members(ctx) or not asks_the_class(ctx, klass):
        return result
    cited = {c.ref for c in result.citations}
    # Only what the answer lacks: a note's list that repeats the coded entries adds nothing.
    lacking = [s for s in class_in_notes(ctx, klass, mentions=False)
               if s[0].chunk.ref not in cited and lists_more(s[2], result.answer)]
    return with_note_statements(result, newest_first(lacking[:SUPPORTING_NOTES]))


def newest_first(statements: list) -> list:
    """The notes chosen as closest to the question, said newest first: a clinician reads the
    latest note's word first, and the same notes read the same whatever the question's spelling."""
    return sorted(statements, key=lambda s: (s[0].chunk.date or "", s[0].chunk.chunk_id), reverse=True)


def lists_more(quote: str, answer: str) -> bool:
    """A note's class list names something the answer does not (an allergy the coded list lacks)."""
    items = [i for i in re.split(r"\d+\.\s|[,;]|\band\b|\n", quote) if re.search(r"[A-Za-z]{3}", i)]
    words = [[t for t in content_tokens(i) if t.isalpha() and len(t) > 2][:2] for i in items]
    return any(not names(" ".join(w), answer) for w in words if w)


def with_note_statements(result: Answer, extra: list, context: bool = False) -> Answer:
    """The answer with what the notes state of the class after it, each cited."""
    if not extra:
        return result
    citations, statements = list(result.citations), list(result.statements)
    evidence = list(result.evidence)
    for ev, heading, quote in extra:
        n = len(citations) + 1
        citations.append(Citation.of(ev, n))
        words = note_statement(ev, heading, quote)
        ended = words.rstrip('"').endswith((".", "!", "?"))     # a quote that ends its own sentence
        statements.append(Statement(words[0].upper() + words[1:] + ("" if ended else "."), [n], context=context))
        if all(e.chunk_id != ev.chunk.chunk_id for e in evidence):
            evidence.append(EvidenceItem.of(ev, len(evidence) + 1))
    answer = " ".join([result.answer] + [s.cited_text() for s in statements[len(result.statements):]])
    return replace(result, answer=answer, statements=statements, citations=citations, evidence=evidence)


SUPPORTING_NOTES = 3


def named_only_in_prose(ctx: AnswerContext, klass: str, chunks: list) -> list[tuple[Evidence, str, str]]:
    """Sentences of the notes naming what was asked that neither the notes' class sections nor the
    coded entries name ("Medication was adjusted to benazepril" for "bp meds"): "no
    antihypertensive is recorded" would deny what the note says. A drug the coded entries hold
    was judged there already (aspirin 81 mg is no answer to "an NSAID for the knee pain?")."""
    coded = " ".join(f"{e.chunk.label} {e.chunk.text}" for e in
                     class_entries(ctx.backend, Scope(ctx.tenant, ctx.patient_id, semantic_types=(klass,))))
    uncoded = [m for m in asked_members(ctx) if not names(m, coded)]
    said = [(Evidence(chunk, 0.0), heading, sentence) for chunk in chunks
            for heading, sentence in class_mentions(chunk, klass)]
    return [s for s in named_in_notes(ctx, said) if any(names(m, s[2]) for m in uncoded)][:CLASS_LIST_LIMIT]


def absence(analysis, klass: str, read_whole: bool, related: list) -> str:
    """What the whole class, read through, says is absent: "No anticoagulant is recorded." for a
    drug class none of the patient's medications belongs to; "No allergy to amoxicillin or to its
    classes is recorded." when no allergy is related to the drug asked about."""
    if not read_whole:
        return ""
    asked = [c for c in analysis.concepts if c.get("role") not in ("context", "class", "record")
             and c["semantic_type"] == "medication"]
    if klass == "medication" and asked and all(terminology.clinical_class(c["display"]) for c in asked):
        return " ".join(f"No {c['display']} is recorded among the patient's medications." for c in asked[:2])
    if klass == "allergy" and asked and not related:
        return " ".join(f"No allergy to {c['display']} or to a class it belongs to is recorded." for c in asked[:2])
    return ""


EMPTY_CLASS = {"allergy": "No allergies or intolerances are recorded in this patient's record",
               "problem": "No problems or diagnoses are recorded in this patient's record",
               "medication": "No medications are recorded in this patient's record",
               "procedure": "No procedures are recorded in this patient's record"}
# What a note says when a template states the class is empty ("Allergies: No Known Allergies.").
NONE_KNOWN = {"allergy": re.compile(r"\b(no known (?:drug )?allergies|nka|nkda)\b", re.I),
              "medication": re.compile(r"\bno active medications\b", re.I)}


def empty_class_answer(result: Answer, ctx: AnswerContext, klass: str) -> Answer:
    """The record holds nothing of the asked class: say so ("No allergies are recorded"), and cite
    the newest note that says the same ("No Known Allergies.") when there is one. Asked about one
    member of an empty class ("allergic to latex?"), the answer is still that there is no
    evidence for it, with the empty class said after."""
    empty = EMPTY_CLASS[klass]
    note = newest_none_known(ctx, klass)
    members = ctx.retrieval.analysis.required_keys - {ALLERGY_WORDS}
    citations, statements = [], []
    words = f"{empty}." if not members else f"{NO_EVIDENCE} {empty}."
    if note is not None:
        ev, sentence = note
        citations = [Citation.of(ev, 1)]
        # One claim, the note's: split at a semicolon, its first half would be a claim without a citation.
        statements = [Statement(f'{empty}, as the note of {ev.chunk.date[:10]} says: "{sentence}"', [1], lead=True)]
        words = (f"{NO_EVIDENCE} " if members else "") + statements[0].cited_text()
    evidence = result.evidence + ([EvidenceItem.of(note[0], len(result.evidence) + 1)] if note is not None else [])
    return replace(result, answer=words, statements=statements, citations=citations, evidence=evidence,
                   abstained=bool(members) or note is None, lead=empty)


def newest_none_known(ctx: AnswerContext, klass: str) -> tuple[Evidence, str] | None:
    """The newest note chunk stating the class is empty, and that sentence."""
    pattern = NONE_KNOWN.get(klass)
    if pattern is None:
        return None
    notes = Scope(ctx.tenant, ctx.patient_id, semantic_types=("note",))
    for chunk in ctx.backend.get_chunks(ctx.tenant, [h.chunk_id for h in ctx.backend.latest(notes, 50)]):
        for sentence in re.split(r"(?<=[.!?])\s+|\n", chunk.text):
            if pattern.search(sentence):
                return Evidence(chunk, 0.0), sentence.strip().split(": ")[-1]
    return None


CLASS_READ = 500       # entries of a class read to list it; a class this long is not said to lack anything


def class_entries(backend: Backend, scope: Scope) -> list[Evidence]:
    """What the record holds of a class, newest first, one per fact; current entries (active
    problems, allergies and orders) before the rest."""
    chunks = backend.get_chunks(scope.tenant, [h.chunk_id for h in backend.latest(scope, CLASS_READ)])
    ordered = [c for c in chunks if c.status == "active"] + [c for c in chunks if c.status != "active"]
    seen, entries = set(), []
    for chunk in ordered:
        if chunk.category == "trend" or fact_key(chunk) in seen:
            continue
        seen.add(fact_key(chunk))
        entries.append(Evidence(chunk, 0.0))
    return entries


def cite_sentences(result: Answer, ctx: AnswerContext) -> Answer:
    """Each citation of a note says which of its sentences the answer quotes, so the side panel
    opens the note at that sentence, highlighted; records cited whole keep their citation."""
    if not result.citations:
        return result
    texts: dict[str, list[str]] = {}
    for item in result.evidence:
        texts.setdefault(item.ref, []).append(item.text)
    if ctx.read_chunks is not None:
        cited = {c.ref for c in result.citations}
        ctx.read_chunks([item.chunk_id for item in result.evidence if item.ref in cited])
    citations = []
    for citation in result.citations:
        said = " ".join(s.text for s in result.statements if citation.n in s.citations)
        quoted = [q for text in texts.get(citation.ref, []) if text.startswith(citation.snippet)
                  for q in quoted_sentences(text, said)]
        citations.append(replace(citation, quotes=tuple(dict.fromkeys(quoted))) if quoted else citation)
    return replace(result, citations=citations)


def grounded_by_model(result: Answer, ctx: AnswerContext) -> Answer:
    return ctx.grounded(result) if ctx.grounded is not None and not result.abstained else result


def trend_chart(result: Answer, ctx: AnswerContext) -> Answer:
    if result.abstained or result.chart is not None:
        return result
    cited = {c.ref for c in result.citations}
    trend = next((e.chunk for e in ctx.retrieval.evidence if e.chunk.category == "trend" and e.chunk.ref in cited), None)
    return replace(result, chart=chart_of_trend(trend)) if trend is not None else result


def while_reading(result: Answer, ctx: AnswerContext) -> Answer:
    return reading_notice(result, ctx.retrieval)


STEPS: tuple[AnswerStep, ...] = (empty_record, planned_operation, never_hide_the_class, grounded_by_model,
                                  yes_names_the_target,
                                  cite_sentences, trend_chart, while_reading)


def apply_steps(result: Answer, ctx: AnswerContext, steps: tuple[AnswerStep, ...] = STEPS) -> Answer:
    for step in steps:
        result = step(result, ctx)
    return result
