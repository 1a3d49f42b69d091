"""Whether the record holds what was asked, decided over the asked target only.

A "Yes —" must name the thing asked about: "any opioids on board? shes pregnant" is answered by
the opioid orders (found through each drug's class, oxycodone being an opioid), never by the
pregnancy; "is she diabetic" with prediabetes alone is "No diabetes is recorded", the prediabetes
shown after it as context. The target is the first thing the asked clause names, with what it is
joined to by "or" / "and" / "/" ("DVT or PE"); the other concepts of the question (a state it
mentions, an event it anchors on) are context. Whether the target exists is read from the whole
record's entries of the kind that holds it (HELD_BY) in the question's time window: a drug class is held when one of its members is, through
the class concepts each order was annotated with when indexed (search/nlp/terminology).

This step runs after the answer is composed, so the composer's sentence stands whenever it names
the target; it rewrites only an answer that says "Yes" of something else, one that abstains over
a held target of a yes/no question, and one to a yes/no question or a question for a measurement
that answers with neighbours of an absent target without saying it is absent. The absence is
said of the kind of record that would hold the target ("among the patient's problems"): a
diagnosis of diabetes, not a screening test for it or a care plan about it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from search.answering.answer import NO_EVIDENCE, NO_EVIDENCE_YET, asked_class, entry_words
from search.answering.facts import fact_of
from search.answering.lead import ALLERGY_WORDS, PRESENT_TENSE, affirms
from search.answering.types import Answer, Citation, EvidenceItem, Statement
from search.backends.base import Scope
from search.nlp.annotate import asserted_keys
from search.retrieval.types import Analysis, Evidence
from search.retrieval.ranking import fact_key

# The kinds of thing a question asks about, each with the kinds of record whose entries say the
# patient has it: diabetes is held by a diagnosis (or a finding such as "Pregnancy status =
# Pregnant"), not by a screening test for diabetes or a diabetes care plan (those are context); a
# test by a result, whichever kind the record files it as; a procedure by the procedure, its
# imaging study, a vaccine given or a "History of tubal ligation" on the problem list. A question that names a kind of record ("family history of
# kidney disease") is answered by records of that kind.
HELD_BY = {"problem": ("problem", "social", "observation", "exam"), "medication": ("medication",), "allergy": ("allergy",),
           "procedure": ("procedure", "immunization", "imaging", "problem"), "immunization": ("immunization", "procedure"),
           "lab": ("lab", "vital", "exam", "observation", "procedure"), "vital": ("vital", "lab", "exam", "observation"),
           "encounter": ("encounter",)}
FACT_TYPES = tuple(HELD_BY)
CLASS_WORDS = {"problem": "problems and findings", "medication": "medications", "procedure": "procedures",
               "immunization": "immunizations", "allergy": "allergies", "lab": "results", "vital": "vital signs",
               "encounter": "visits"}
COORDINATED = re.compile(r"^\s*(?:,|/|or|and|and/or|&)\s*$", re.I)
AFFIRMED = re.compile(r"^(?:Yes|Not now|No) — ")
HELD_READ = 24            # entries read for the target (the index stores only asserted concepts): a "Yes" names 6
LISTED = 6                # held entries a rebuilt "Yes" names, newest and current first


@dataclass
class Target:
    concepts: list[dict]

    @property
    def keys(self) -> set[str]:
        return {c["key"] for c in self.concepts}

    @property
    def kind(self) -> str:
        return self.concepts[0]["semantic_type"]

    kinds: tuple[str, ...] = ()      # the kinds of record the question names, if any

    @property
    def held_by(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.kinds + HELD_BY[self.kind]))

    @property
    def class_words(self) -> str:
        return " and ".join(CLASS_WORDS.get(k, k.replace("-", " ")) for k in self.kinds) or CLASS_WORDS[self.kind]

    @property
    def display(self) -> str:
        return " or ".join(dict.fromkeys(c["display"] for c in self.concepts))


def asked_target(analysis: Analysis) -> Target | None:
    """The first coded thing the asked clause names, with the things joined to it by "or", "and",
    "/" ("DVT or PE"); None when the question names none (a note, a visit by date, a section)."""
    wanted = analysis.required_keys - {ALLERGY_WORDS}
    asked = sorted((c for c in analysis.concepts if c["key"] in wanted and c["semantic_type"] in FACT_TYPES),
                   key=lambda c: (c.get("start", 0) < analysis.target, c.get("start", 0)))
    if not asked:
        return None
    group = [asked[0]]
    for concept in asked[1:]:
        before = group[-1]
        end = before.get("start", 0) + len(before.get("text") or "")
        # Alternatives are things of one kind: "DVT or PE" read as a clot or a physical exam asks
        # about the clot.
        if concept.get("start", 0) < end or concept["semantic_type"] != group[0]["semantic_type"] \
                or not COORDINATED.match(analysis.question[end:concept.get("start", 0)]):
            break
        group.append(concept)
    return Target(group, tuple(k for k in analysis.kinds if k not in ("note",)))


def held_entries(ctx, target: Target) -> list[Evidence]:
    """The record's coded entries asserting the target in the question's window, one per fact,
    current before the rest, newest first."""
    analysis = ctx.retrieval.analysis
    scope = Scope(ctx.tenant, ctx.patient_id, target.held_by, analysis.date_from, analysis.date_to)
    hits = ctx.backend.search_concepts(scope, sorted(target.keys), HELD_READ)
    chunks = [c for c in ctx.backend.get_chunks(ctx.tenant, [h.chunk_id for h in hits])
              if asserted_keys(c.concepts) & target.keys and c.category != "trend"]
    chunks.sort(key=lambda c: (c.status == "active", c.date), reverse=True)
    seen, entries = set(), []
    for chunk in chunks:
        if fact_key(chunk) not in seen:
            seen.add(fact_key(chunk))
            entries.append(Evidence(chunk, 0.0))
    return entries


def asserting_refs(ctx, target: Target, held: list[Evidence]) -> set[str]:
    """The records that say the patient has the target: the held entries and any retrieved note
    asserting it (a care plan or a goal about it is not the thing itself)."""
    retrieval = ctx.retrieval
    seen = [*retrieval.evidence, *retrieval.candidates, *retrieval.histories]
    says = target.held_by + ("note",)
    # A window asked ("in 2015", "this admission") holds the answer: a retrieved entry from outside
    # it is not the thing asked, however well it ranked.
    return {ev.chunk.ref for ev in held} | {ev.chunk.ref for ev in seen if ev.chunk.semantic_type in says
                                           and asserted_keys(ev.chunk.concepts) & target.keys
                                           and within(ev.chunk.date, retrieval.analysis)}


def within(day: str, analysis: Analysis) -> bool:
    """Whether a record's date lies in the question's window (any date when none was asked; an
    undated note may still say it)."""
    day = (day or "")[:10]
    if not day:
        return True
    return (not analysis.date_from or day >= analysis.date_from[:10]) and \
        (not analysis.date_to or day <= analysis.date_to[:10])


def notes_lead(ctx, lead: set[str]) -> bool:
    """The first sentence quotes notes only ("CT angiography, negative for pulmonary arterial
    embolism"): the composer chose a note's own words as the answer, which stand."""
    retrieval = ctx.retrieval
    kinds = {ev.chunk.ref: ev.chunk.semantic_type for ev in [*retrieval.candidates, *retrieval.evidence]}
    return bool(lead) and all(kinds.get(ref) == "note" for ref in lead)


def lead_refs(result: Answer) -> set[str]:
    """The records the answer's first sentence cites."""
    lead = next((s for s in result.statements if s.lead), result.statements[0] if result.statements else None)
    numbers = set(lead.citations) if lead is not None else set()
    return {c.ref for c in result.citations if c.n in numbers}


def yes_names_the_target(result: Answer, ctx) -> Answer:
    """A "Yes" only of the asked target; an absent target said to be absent before any neighbour."""
    analysis = ctx.retrieval.analysis
    if "record" in result.diagnostics or "operation" in result.diagnostics or result.general \
            or asked_class(analysis) == "allergy":
        return result        # an empty record, an operation's answer over the whole target in its window,
                             # a general question, an allergy (its own rules) stand
    target = asked_target(analysis)
    if target is None:
        return result
    held = held_entries(ctx, target)
    result.diagnostics["exists"] = {"target": target.display, "kind": target.kind, "held": len(held)}
    naming = asserting_refs(ctx, target, held)
    cited = {c.ref for c in result.citations}
    lead = lead_refs(result)
    names_it = bool(lead) and lead <= naming
    if held:
        if result.answer.startswith("Yes") and not names_it:
            return yes_of(result, held, analysis)
        if result.abstained and affirms(analysis.question) and not cited & naming:
            return yes_of(result, held, analysis)
        return result
    if names_it or (notes_lead(ctx, lead) and not result.answer.startswith("Yes")):
        return result         # no coded entry, but a note answers: it says it, or denies it in its own words
    # Only a question that asks whether the record has it, or asks for a measurement (an answer
    # about an A1c cites an A1c), is answered "No X is recorded": another question's answer may
    # rightly rest on records of another kind.
    asks_if = affirms(analysis.question) or target.kind in ("lab", "vital")
    if asks_if or result.answer.startswith("Yes"):
        return absent(result, target, analysis)
    return result


def yes_of(result: Answer, held: list[Evidence], analysis: Analysis) -> Answer:
    """The answer rebuilt on the held entries of the target: "Yes — " and each entry, cited ("Not
    now — " when asked of now and none is current); what the answer said before was about
    something else and is dropped, its evidence kept."""
    shown = held[:LISTED]
    facts = [fact_of(ev) for ev in shown]
    current = any(f is not None and f.current and not f.negative for f in facts)
    prefix = "Not now — " if PRESENT_TENSE.search(analysis.question) and not current else "Yes — "
    citations = [Citation.of(ev, i + 1) for i, ev in enumerate(shown)]
    counted = f"{len(held)}{' or more' if len(held) >= HELD_READ else ''}"
    more = f" ({len(shown)} of {counted} entries, newest first)" if len(held) > len(shown) else ""
    text = prefix + "; ".join(f"{entry_words(ev)} [{i + 1}]" for i, ev in enumerate(shown)) + more + "."
    statements = [Statement(text, [c.n for c in citations], lead=True)]
    have = {ref for item in result.evidence for ref in [item.ref, *item.refs]}
    extra = [ev for ev in shown if ev.chunk.ref not in have]
    evidence = result.evidence + [EvidenceItem.of(ev, len(result.evidence) + i + 1) for i, ev in enumerate(extra)]
    return replace(result, answer=text, statements=statements, citations=citations, evidence=evidence,
                   abstained=False, lead=None, class_entries=None)


def absent(result: Answer, target: Target, analysis: Analysis) -> Answer:
    """No coded entry asserts the target: said first, the answer's statements after it as context
    (an abstention keeps its own listing of the class, the absence said before it)."""
    window = window_words(analysis)
    said = f"No {target.display} is recorded among the patient's {target.class_words}{window}."
    if result.abstained and not (affirms(analysis.question) or target.kind in ("lab", "vital")):
        return result          # an abstention to a question that did not ask whether, nor for a
                               # measurement ("whats the a1c": that none is recorded is the answer)
    if result.abstained:
        opening = next((s for s in (NO_EVIDENCE, NO_EVIDENCE_YET) if result.answer.startswith(s)), None)
        if opening is None or f"No {target.display} is recorded" in result.answer:
            return result      # another kind of abstention (an empty record, a date), or said already
        rest = result.answer[len(opening):]
        opening = absence_opening(opening, said, window)
        return replace(result, answer=f"{opening}{rest}", lead=opening)
    # What the answer said becomes context, without the "Yes — " it wrongly led with.
    context = [replace(s, text=AFFIRMED.sub("", s.text), context=True, lead=False) for s in result.statements]
    opening = absence_opening(NO_EVIDENCE, said, window)
    answer = opening + (" For context: " + " ".join(s.cited_text() for s in context) if context else "")
    return replace(result, answer=answer, statements=context, abstained=True, lead=opening, confidence="low")


def absence_opening(no_evidence: str, said: str, window: str) -> str:
    """Absent from the whole record, the absence is the answer and comes first ("No hemoglobin a1c
    is recorded among the patient's results."), the general no-evidence sentence after it; absent
    from an asked window, the no-evidence sentence leads and the absence says where was looked."""
    return f"{said} {no_evidence}" if not window else f"{no_evidence} {said}"


def window_words(analysis: Analysis) -> str:
    if analysis.date_from and analysis.date_to:
        return f" between {analysis.date_from[:10]} and {analysis.date_to[:10]}"
    if analysis.date_from:
        return f" since {analysis.date_from[:10]}"
    if analysis.date_to:
        return f" until {analysis.date_to[:10]}"
    return ""
