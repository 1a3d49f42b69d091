"""Extractive answers: statements taken from the evidence, each citing where it came from.

No statement is written that the evidence does not contain. When the evidence does not mention
what the question asks about, the answer is the no-evidence sentence and cites nothing.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace

from search.answering.charts import series_chart
from search.answering.facts import Fact, fact_of
from fhir_ingest.record.notes import denies, note_sentences, sentence_context
from search.answering.lead import ALLERGY_WORDS, SUPPORTING, Draft, Lead, first_sentence, note_words
from search.answering.notes import (RULED_OUT_ASKED, Ranked, answer_kinds, best_of_chunk, note_sections, note_units, quote,
                                    rank_note_sentences, states_an_indication, with_its_list, with_section_opening)
from search.answering.types import Answer, Citation, EvidenceItem, Statement
from search.nlp.annotate import RecordTerm, asserted_keys, default_annotator
from search.nlp import terminology
from search.nlp.lexicon import content_tokens, tokens
from search.nlp.vocabulary import clinical_words
from search.retrieval.types import Analysis, Evidence, Retrieval
from search.retrieval.analysis import spans_notes
from search.retrieval.ranking import concept_overlap, holds_asked_section, in_window

log = logging.getLogger(__name__)
NO_EVIDENCE = "I don't have evidence for that in this patient's record."
NEW_PATIENT = "This is a new patient; I have no prior records."
NO_EVIDENCE_YET = "I don't have evidence for that in the part of this patient's record read so far."
# Cosine similarities of all-MiniLM-L6-v2 between the question and a chunk (0-1 in practice):
SEMANTIC_MATCH = 0.35              # with no concept to check, this close is "about the question"
AS_CLOSE_AS_THE_BEST = 0.05        # a chunk this near the best one also earns a statement
HIGH_CONFIDENCE_SIMILARITY = 0.5   # every concept supported and this close: "high" confidence


@dataclass
class Support:
    supported: bool
    coverage: float
    reason: str


def _stem(word: str) -> str:
    return word[:6] if len(word) > 6 else word.rstrip("s")


# Prefixes that build clinical words from a stem: "thyroid" is in "hypothyroidism", "lipid" in
# "hyperlipidemia"; "liver" is not in "delivery", nor "renal" in "adrenal".
MEDICAL_PREFIXES = "hypo|hyper|dys|an|a|peri|para|endo|epi|sub|supra|pre|post|intra|extra|inter|trans|poly|pan|hemi|micro|macro|neo|pseudo|non"


def term_in(term: str, text: str) -> bool:
    return re.search(rf"\b(?:{MEDICAL_PREFIXES})?{re.escape(_stem(term))}", text, re.I) is not None


def names(member: str, text: str) -> bool:
    """The text names the member: each of its words, by its stem ("pulmonary function test" is
    not named by "pulmonary embolism")."""
    words = [w for w in content_tokens(member) if len(w) > 1]
    return bool(words) and all(term_in(w, text) for w in words)


def said_in_notes(analysis: Analysis, evidence: list[Evidence], required: set[str]) -> bool:
    """Every required concept is written in a note of the evidence in the question's own words or
    in a long form ("BNP shows 3788" answers "bnp?" though the note's concepts missed it)."""
    notes = " ".join(e.chunk.text for e in evidence if e.chunk.semantic_type == "note")
    if not notes:
        return False
    forms: dict[str, set[str]] = {}
    for c in analysis.concepts:
        if c["key"] in required:
            forms.setdefault(c["key"], set()).update(f for f in (c.get("text"), c["display"], c.get("via")) if f)
    return all(any(names(f, notes) for f in forms.get(key, ())) for key in required)


def allergy_asserted(evidence, required: set[str], asserted: set[str]) -> set[str] | None:
    """What the evidence asserts for an allergy question, or None when no allergy record names the
    allergen asked: an allergy to X is asserted by an allergy record naming X, not by X in a
    medication list beside an unrelated allergy."""
    allergy = set().union(*(asserted_keys(e.chunk.concepts) for e in evidence if e.chunk.semantic_type == "allergy"))
    allergens = required - {ALLERGY_WORDS}
    if allergens and not allergens & allergy:
        return None
    return allergy | ({ALLERGY_WORDS} & asserted)


# A question about a thing not given or stopped: the record's denial of it is the subject.
HELD_ASKED = re.compile(r"\b(?:held|withheld|hold(?:ing)? off|stopped|discontinued|taken off|not (?:given|started|placed))\b",
                        re.I)


def judge_support(retrieval: Retrieval) -> Support:
    """Does the evidence carry what the question asks about? Concepts absent, only denied, or a
    clinical word of the question that this record never uses all mean: no evidence."""
    analysis, evidence = retrieval.analysis, retrieval.evidence
    if not evidence:
        return Support(False, 0.0, "no evidence retrieved")
    if retrieval.absent_terms:
        return Support(False, 0.0, f"not in this record: {', '.join(sorted(retrieval.absent_terms))}")
    asserted = set().union(*(asserted_keys(e.chunk.concepts) for e in evidence))
    required = analysis.required_keys
    if asked_class(analysis) == "allergy":
        asserted = allergy_asserted(evidence, required, asserted)
        if asserted is None:
            return Support(False, 0.0, "no allergy record names what was asked")
    drug = drug_asked(retrieval)
    if drug is not None:
        return drug
    members = {c["key"] for c in analysis.concepts if c.get("role") == "member"}
    if required:
        hit = required & asserted
        if not hit:
            mentioned = any(c["key"] in required for e in evidence for c in e.chunk.concepts)
            # A note's own words count only where the annotator read no concept at all ("BNP
            # shows 3788"): one it read as denied ("Patient denies chest pain") is a denial.
            if not mentioned and said_in_notes(analysis, evidence, required):
                return Support(True, 0.5, "said in a note in the question's words")
            if mentioned and RULED_OUT_ASKED.search(analysis.question):
                # "Was an MI ruled out?": the record's denial is the answer asked for.
                return Support(True, 0.5, "the record rules it out, as asked")
            if mentioned and HELD_ASKED.search(analysis.question):
                # "Why was Plavix held?": "will not be placed on Plavix" is what was asked about.
                return Support(True, 0.5, "the record says it was not given, as asked")
            return Support(False, 0.0, "the record only denies it" if mentioned else "the question's concepts are not in the record")
        if members and not members & asserted:
            return Support(False, 0.0, "the named medication is not in the record")
        return Support(True, len(hit) / len(required), "concepts found")
    texts = " ".join(f"{e.chunk.label} {e.chunk.text}" for e in evidence)
    residual = analysis.residual
    if residual:
        found = {t for t in residual if term_in(t, texts)}
        missing = missing_qualifier(analysis.question, residual, found)
        if missing:
            return Support(False, 0.0, f"the record has {missing[1]}, but not {missing[0]} {missing[1]}")
        if found:
            return Support(True, len(found) / len(residual), "terms found")
    if analysis.wants_note and retrieval.scope.semantic_types and (retrieval.scope.date_from or retrieval.scope.date_to):
        return Support(True, 1.0, "the note asked for")
    if any(holds_asked_section(e.chunk, analysis) for e in evidence):
        # "What does the social history say?" is answered by the notes that have that section.
        return Support(True, 1.0, "the note section asked for")
    best_dense = max((e.dense for e in evidence if e.dense is not None), default=0.0)
    unsaid = [t for t in residual if t in clinical_words()]
    if unsaid and not analysis.wants_note:
        # The question names a clinical thing ("transplant") that no evidence says: a passage that
        # merely resembles the question is not an answer to it. Other wording ("iron pill" for
        # ferrous sulfate) may still be answered by a close semantic match below.
        return Support(False, 0.0, f"nothing in the record says {', '.join(unsaid[:3])}")
    if best_dense >= SEMANTIC_MATCH:
        return Support(True, 0.5, "semantic match only")
    return Support(False, 0.0, "nothing in the record matches the question")


def top_item_answers(retrieval: Retrieval) -> Support | None:
    """Support from the top evidence item alone, when the words the record was judged to lack are
    in that item after all and its typed fact carries every concept asked about ("point-of-care
    glucose" answered by "POC Glucose 212 mg/dL"). Only a judgement on words is overturned: a
    concept absent, only denied or not the named drug stays no evidence."""
    analysis, evidence = retrieval.analysis, retrieval.evidence
    required = analysis.required_keys
    if not evidence or not required or not retrieval.absent_terms:
        return None
    top = evidence[0]
    if fact_of(top) is None or not required <= asserted_keys(top.chunk.concepts):
        return None
    if drug_asked(retrieval) is not None:
        return None
    text = f"{top.chunk.label} {top.chunk.text}"
    if not all(word_in_item(word, text) for word in retrieval.absent_terms):
        return None
    return Support(True, 1.0, "the top evidence item carries what was asked")


def word_in_item(word: str, text: str) -> bool:
    """The question's word is in the item as written or as its initialism: a record says "POC"
    where the question says "point-of-care" (three letters or more: two letters are too often a
    word of their own, "IV", "OR")."""
    if term_in(word, text):
        return True
    # "fingerstick" where the record says "POC Glucose": another name of that very test.
    if any(re.search(rf"\b{re.escape(name)}\b", text, re.I) for name in terminology.lab_synonyms(word)):
        return True
    parts = [p for p in re.split(r"[\s/-]+", word.lower()) if p]
    initials = "".join(p[0] for p in parts)
    return len(parts) > 1 and len(initials) >= 3 and re.search(rf"\b{initials}\b", text.lower()) is not None


def drug_asked(retrieval: Retrieval) -> Support | None:
    """"Is she on calcium + vit D?", "post-op pain meds?": a question about what the patient takes
    is answered by medication records naming the drug or class (in the asked window), not by a
    calcium result or a vitamin D level. None when the question asks no such thing."""
    analysis = retrieval.analysis
    if "medication" not in analysis.kinds or analysis.names_a_note:
        return None          # "what meds does her last note list" asks what a note says
    asked = [c for c in analysis.concepts if c.get("role") != "context" and c["semantic_type"] != "note"]
    drugs = {c["key"] for c in asked if c["semantic_type"] == "medication"}
    # "On calcium?", "iron pills?": a lab's analyte asked as a drug is named by the order's words.
    analytes = {c["display"] for c in asked if c["semantic_type"] in ("lab", "vital")} if not drugs else set()
    if not drugs and not analytes:
        return None
    orders = [e.chunk for e in retrieval.evidence if e.chunk.semantic_type == "medication"
              and (in_window(e.chunk, analysis) or not (analysis.date_from or analysis.date_to))]
    taken = set().union(*(asserted_keys(c.concepts) for c in orders))
    # The analyte's supplement names it too: "on iron?" is answered by ferrous sulfate.
    names = analytes | {m for a in analytes for m in terminology.members_of(f"{a} supplement")}
    if drugs & taken or any(term_in(name, c.text) for name in names for c in orders):
        return None
    return Support(False, 0.0, "no medication record names what was asked")


def missing_qualifier(question: str, residual: list[str], found: set[str]) -> tuple[str, str] | None:
    """(qualifier, head) when the question qualifies a word the record has with one it lacks:
    asked about a *liver* transplant, a kidney transplant does not answer it."""
    q = " ".join(re.findall(r"[a-z0-9+'-]+", question.lower()))
    for qualifier, head in zip(residual, residual[1:]):
        if qualifier not in found and head in found and qualifier in clinical_words() \
                and re.search(rf"\b{re.escape(qualifier)} {re.escape(head)}\b", q):
            return qualifier, head
    return None


# --- the clinical classes a "no evidence" must never hide ----------------------------------------

CLASSES = {"allergy": "allergies", "problem": "problems and diagnoses", "medication": "medications",
           "procedure": "procedures"}
CLASS_LIST_LIMIT = 8


# "Can I give him amoxicillin?", "ok to start keflex?", "is cipro safe for her?": asked before giving a
# drug, the record's allergies are what answers (the drug, its classes, what cross-reacts).
CAN_GIVE = re.compile(r"\b(?:can|could|should|may)\s+(?:i|we|you|he|she|they)\s+(?:give|start|prescribe|use|order|take|have)\b"
                      r"|\b(?:ok|okay|safe|alright|fine)\s+(?:to\s+)?(?:give|start|prescribe|use|order|take)\b"
                      r"|\bis\s+\S+(?:\s+\S+)?\s+safe\b", re.I)


def asked_class(analysis: Analysis) -> str:
    """The clinical class a question asks within: an allergy question whatever the allergen (a
    question about giving a drug is one); else the class of the first thing asked about; else a
    kind of record the question names."""
    kinds = [c["semantic_type"] for c in analysis.concepts if c.get("role") != "context"] + list(analysis.kinds)
    if "medication" in kinds and CAN_GIVE.search(analysis.question):
        return "allergy"
    if "allergy" in kinds:
        return "allergy"
    return next((kind for kind in kinds if kind in CLASSES), "")


def class_entries_answer(result: Answer, klass: str, entries: list, context=None, related: list | None = None,
                         absent: str = "") -> Answer:
    """An abstention that lists what the record holds of the asked class, each entry cited: first
    what is related to what was asked, said as what it is ("an allergy of the same class as
    amoxicillin"), then the others, closest first. "None of which matches" is said only of a list
    shown whole: a list that is cut makes no claim about what it did not show. A fact the question
    mentioned on the way ("her potassium was low") comes first, as context."""
    related = related or []
    citations, statements = [], []

    def cite(ev, words: str) -> None:
        citations.append(Citation.of(ev, len(citations) + 1))
        statements.append(Statement(words, [len(citations)], context=True))

    if context is not None:
        cite(context, f"For context: {context.chunk.text}")
    for r in related:
        cite(r.ev, f"{entry_words(r.ev)}: {r.why}")
    room = max(CLASS_LIST_LIMIT - len(related), 0)
    for ev in entries[:room]:
        cite(ev, entry_words(ev))
    shown_related = statements[(context is not None):(context is not None) + len(related)]
    listed = statements[(context is not None) + len(related):]
    cut = len(entries) > room
    # What the whole class, read through, lacks is the answer: said first, the listing after it.
    parts = [absent, NO_EVIDENCE] if absent else [NO_EVIDENCE]
    if context is not None:
        parts.append(statements[0].cited_text())
    if shown_related:
        parts.append("Related: " + "; ".join(f"{s.text} [{s.citations[0]}]" for s in shown_related) + ".")
    if listed:
        other = "Other recorded" if shown_related else "Recorded"
        if cut:
            lead = f"{other} {CLASSES[klass]}, closest first ({len(listed)} of {len(entries)}):"
        elif shown_related:
            lead = f"{other} {CLASSES[klass]}:"
        else:
            lead = f"{other} {CLASSES[klass]}, none of which matches what was asked:"
        parts.append(lead + " " + "; ".join(f"{s.text} [{s.citations[0]}]" for s in listed) + ".")
    answer = " ".join(parts)
    shown = ([context] if context is not None else []) + [r.ev for r in related] + entries[:room]
    have = {e.chunk_id for e in result.evidence}
    evidence = result.evidence + [EvidenceItem.of(ev, len(result.evidence) + i + 1)
                                  for i, ev in enumerate(e for e in shown if e.chunk.chunk_id not in have)]
    return replace(result, answer=answer, lead=" ".join(parts[:2]), statements=statements, citations=citations,
                   evidence=evidence, class_entries=len(listed) + len(shown_related))


def while_reading(result: Answer, retrieval: Retrieval) -> Answer:
    """An answer given while the record's first indexing is still embedding: it says so, and an
    abstention says "so far", since the passages not yet read by meaning may hold the answer."""
    pending = retrieval.vectors_pending
    if not pending:
        return result
    read = max(0, retrieval.corpus_size - pending)
    reading = (f"Still reading this record: {read} of its {retrieval.corpus_size} passages are searchable by meaning "
               f"so far, so this answer may be incomplete. Ask again when reading finishes.")
    if not result.abstained:
        return replace(result, reading=reading)
    return replace(result, reading=reading, answer=result.answer.replace(NO_EVIDENCE, NO_EVIDENCE_YET, 1),
                   lead=result.lead.replace(NO_EVIDENCE, NO_EVIDENCE_YET, 1) if result.lead else result.lead)


def context_evidence(retrieval: Retrieval):
    """The newest candidate asserting what the question mentioned as context ("her potassium was
    low" speaks of the latest potassium), if any."""
    keys = retrieval.analysis.context_keys
    ranked = sorted(retrieval.candidates, key=lambda e: (e.chunk.category != "trend", e.chunk.date), reverse=True)
    return next((ev for ev in ranked if asserted_keys(ev.chunk.concepts) & keys), None) if keys else None


def entry_words(ev) -> str:
    """The entry in clinical words ("Penicillin V allergy — anaphylaxis (severe), recorded
    2010-01-01"), else its name from its chip with its date."""
    fact = fact_of(ev)
    if fact is not None:
        return fact.words
    name = ev.chunk.label.split(" · ")[-1]
    return f"{name} ({ev.chunk.date[:10]})" if ev.chunk.date else name


WHOLE_SECTION_CHARS = 400


def _asks_for_section(heading: str, analysis: Analysis) -> bool:
    """The question names this section: "presenting complaints" → Chief Complaint (through the
    lexicon's section concepts), "meds" → Medications (a word the heading begins with)."""
    if not heading:
        return False
    if heading.lower() in analysis.sections_asked:
        return True
    stems = [_stem(t) for t in analysis.terms if len(_stem(t)) >= 3]
    return any(word.lower().startswith(stem) for stem in stems for word in heading.split() if len(word) > 3)


def coded_names(chunk) -> list[RecordTerm]:
    """The record's coded names this chunk mentions, so a passage of it is read as the chunk was
    when indexed ("preservative free" stays part of a vaccine's name)."""
    return [RecordTerm(c["display"].lower(), c["key"], c["display"], c["semantic_type"])
            for c in chunk.concepts if c.get("display") and not c["key"].startswith("lex:")]


def statement_for(ev: Evidence, analysis: Analysis, first: bool = False, ranked: list[Ranked] | None = None) -> str:
    """One or two passages of a chunk: the whole fact for structured data; for a note the section
    the question names when it is short, else the note's sentences that answer best (`ranked`),
    quoted whole, else the lines that assert what was asked, lists kept whole. A note with nothing
    to the point gives "" unless it is the first statement of the answer."""
    text = ev.chunk.text
    if ev.chunk.semantic_type != "note":
        return text
    header, _, body = text.partition(". ")
    sections = note_sections(body, ev.chunk.sections)
    named = [(h, t) for h, t in sections if _asks_for_section(h, analysis)]
    if analysis.sections_asked and not named and not analysis.keys and not first:
        return ""      # another part of the note: the asked-for section is in a different chunk
    if named and not analysis.keys:
        heading, section = named[0]
        if len(section) <= WHOLE_SECTION_CHARS:
            return f"{header}: {heading}: " + " ".join(note_units(section))
        sections = named
    best = with_section_opening(best_of_chunk(ranked or [], ev.chunk.chunk_id), ev.chunk, analysis)
    wants = answer_kinds(analysis)
    # A list asked for, or an operation's reasons: its numbered items together, not one line.
    reasons = "reason" in wants and any(states_an_indication(s.heading) for s in best)
    if best and (analysis.wants_list or "drug" in wants or reasons):
        best = with_its_list(best, ev.chunk)
    if best:
        return f"{header}: {quote(best)}"
    units = [(heading, unit) for heading, section in sections for unit in note_units(section)]
    if not units:
        return text
    # Units carry no heading: a leading "Allergies:" is not an assertion of allergy.
    concepts = (default_annotator().annotate([u for _, u in units], coded_names(ev.chunk)) if analysis.keys
                else [[] for _ in units])
    wanted = set(analysis.terms) | {t for name in analysis.names for t in tokens(name)} | \
        {t for long in analysis.expansions for t in content_tokens(long)}

    def score(i: int) -> tuple:
        asserted = len(asserted_keys(concepts[i]) & analysis.keys)
        denied = any(c["key"] in analysis.keys and c.get("negated") for c in concepts[i])
        return (asserted, 0 if denied else 1, len(wanted & set(tokens(units[i][1]))))

    ranked = sorted(range(len(units)), key=score, reverse=True)
    best = [i for i in ranked[:2] if score(i)[0] or (score(i)[1] and score(i)[2])] or (ranked[:1] if first else [])
    if not best:
        return ""
    passages, previous = [], None
    for i in sorted(best):
        heading, unit = units[i]
        passages.append(f"{heading}: {unit}" if heading and heading != previous else unit)
        previous = heading
    return f"{header}: " + " ".join(passages)


def _passage(ev: Evidence, statement: str) -> str:
    """A note's statement without the note's own header ("History and physical note of 2024-04-25")."""
    if ev.chunk.semantic_type != "note":
        return statement
    return statement.removeprefix(f"{ev.chunk.text.partition('. ')[0]}: ")


def relevant_evidence(retrieval: Retrieval) -> list[Evidence]:
    """The evidence worth a statement: it carries what was asked about, or is as close as the best."""
    analysis, evidence = retrieval.analysis, retrieval.evidence
    best_dense = max((e.dense for e in evidence if e.dense is not None), default=0.0)
    keep = []
    for i, ev in enumerate(evidence):
        if analysis.keys:
            # "What procedures were done at the stroke visit?": the visit's procedures need not
            # name the stroke; being of the asked kind and in the asked window is enough.
            ok = concept_overlap(ev.chunk, analysis) > 0 or (
                ev.chunk.semantic_type in analysis.kinds and bool(analysis.date_from) and in_window(ev.chunk, analysis))
        else:
            ok = any(term_in(t, ev.chunk.text) for t in analysis.residual) or \
                (ev.dense or 0) >= best_dense - AS_CLOSE_AS_THE_BEST
        if ok or i == 0:
            keep.append(ev)
    return keep


def note_conflict(retrieval: Retrieval, cited: list[Evidence]) -> tuple[Evidence, str] | None:
    """A note that denies what the structured record asserts ("No Known Allergies." beside a
    recorded shellfish allergy): surfaced, not silently dropped, and never the answer itself. Two
    cited facts disagree only about the same thing in the same period: the note's own sentence
    denies the concept (a negation right before it, not a "without" a clause away), says it of the
    patient and not of a relative or of what may happen, and was written on or after the
    structured record's date."""
    keys = retrieval.analysis.keys
    since: dict[str, str] = {}
    for ev in cited:
        if ev.chunk.semantic_type != "note":
            for key in asserted_keys(ev.chunk.concepts) & keys:
                since[key] = min(since.get(key, ev.chunk.date), ev.chunk.date)
    if not since:
        return None
    for ev in sorted(retrieval.candidates, key=lambda e: e.chunk.date, reverse=True):
        if ev.chunk.semantic_type != "note":
            continue
        denied = [c for c in ev.chunk.concepts if c["key"] in since and c.get("negated")
                  and ev.chunk.date[:10] >= since[c["key"]][:10]]
        if not denied or asserted_keys(ev.chunk.concepts) & set(since):
            continue
        sentence = denying_sentence(ev, denied)
        if sentence:
            return ev, sentence
    return None


def denying_sentence(ev: Evidence, denied: list[dict]) -> str:
    """The note's sentence that itself denies one of the concepts, if any."""
    surfaces = [c.get("text", "").lower() for c in denied if c.get("text")]
    for sentence in note_sentences(ev.chunk.text.partition(". ")[2]):
        text = sentence.text.strip().split(": ")[-1]
        if not any(surface in text.lower() for surface in surfaces) or sentence_context(text):
            continue
        if any(denies(text, surface) for surface in surfaces):
            return text
    return ""


def compose(retrieval: Retrieval, patient_id: str, question_id: str | None = None) -> Answer:
    """The extractive answer, from the evidence's chunks and their typed facts."""
    evidence = [EvidenceItem.of(e, i + 1) for i, e in enumerate(retrieval.evidence)]
    diagnostics = retrieval_diagnostics(retrieval)

    def abstain(text: str) -> Answer:
        return Answer(question_id, patient_id, retrieval.question, text, [], [], evidence, "low", True, diagnostics)

    if retrieval.corpus_size == 0:
        return replace(abstain(NEW_PATIENT), evidence=[])
    support = judge_support(retrieval)
    best_dense = max((e.dense for e in retrieval.evidence if e.dense is not None), default=0.0)
    diagnostics["support"] = {"supported": support.supported, "coverage": round(support.coverage, 3),
                              "reason": support.reason, "best_dense": round(best_dense, 4)}
    if not support.supported:
        support = top_item_answers(retrieval) or support
        diagnostics["support"]["top_item"] = support.supported
    if not support.supported:
        return abstain(NO_EVIDENCE)
    relevant = relevant_evidence(retrieval)
    statements, citations, chart = clinical_statements(retrieval, relevant)
    evidence += cited_beyond(evidence, citations, retrieval)
    conflict = note_conflict(retrieval, relevant)
    if conflict is not None:
        ev, sentence = conflict
        citations.append(Citation.of(ev, len(citations) + 1))
        statements.append(Statement(f"Note: the note of {ev.chunk.date[:10]} says \"{sentence}\", which conflicts "
                                    f"with the structured record above.", [len(citations)], conflict=True))
        if all(e.chunk_id != ev.chunk.chunk_id for e in evidence):   # found among the candidates
            evidence.append(EvidenceItem.of(ev, len(evidence) + 1))
    answer = " ".join(s.cited_text() for s in statements)
    if support.coverage >= 0.99 and best_dense >= HIGH_CONFIDENCE_SIMILARITY:
        confidence = "high"
    elif support.coverage >= 0.5:
        confidence = "medium"
    else:
        confidence = "low"
    return Answer(question_id, patient_id, retrieval.question, answer, statements, citations, evidence, confidence,
                  False, diagnostics, chart=chart)


def cited_beyond(evidence: list[EvidenceItem], citations: list[Citation], retrieval: Retrieval) -> list[EvidenceItem]:
    """The records the answer cites that its evidence list lacks (the first of a drug's folded
    orders, read from its order history), as evidence items after the list: every [n] must open
    something the clinician sees beside the answer."""
    shown = {ref for item in evidence for ref in [item.ref, *item.refs]}
    pool = {ev.chunk.ref: ev for ev in [*retrieval.histories, *retrieval.candidates, *retrieval.evidence]}
    extra = [pool[ref] for ref in dict.fromkeys(c.ref for c in citations) if ref not in shown and ref in pool]
    return [EvidenceItem.of(ev, len(evidence) + i + 1) for i, ev in enumerate(extra)]


def impossible_date_answer(retrieval: Retrieval, patient_id: str, question_id: str | None = None) -> Answer:
    """A question about a day that does not exist ("labs on 2023-02-30") is not answered with
    other days' records as if it did: the answer says the date does not exist, and cites nothing."""
    said = retrieval.analysis.impossible_dates
    text = " ".join(f"{sentence}." for sentence in said) + \
        f" I have not answered as if {'it were' if len(said) == 1 else 'they were'}: ask again with the date you mean."
    diagnostics = retrieval_diagnostics(retrieval) | {"impossible_dates": said}
    return Answer(question_id, patient_id, retrieval.question, text, [], [], [], "low", True, diagnostics)


def unplaced_window_answer(retrieval: Retrieval, patient_id: str, question_id: str | None = None) -> Answer:
    """"Was she vaccinated this admission?" when the record holds no admission: answering over the
    whole record would pass older entries off as this stay's, so the missing stay is said instead."""
    said = retrieval.analysis.unplaced
    text = f"{said}. I have not answered over the whole record: ask again with the dates you mean."
    diagnostics = retrieval_diagnostics(retrieval) | {"unplaced_window": said}
    return Answer(question_id, patient_id, retrieval.question, text, [], [], [], "low", True, diagnostics)


def retrieval_diagnostics(retrieval: Retrieval) -> dict:
    """What the frame's evidence trail and the audit show of how the answer was found."""
    scope, analysis = retrieval.scope, retrieval.analysis
    return {"pipeline": retrieval.pipeline, "corpus_size": retrieval.corpus_size,
            "stages": [s.to_dict() for s in retrieval.stages],
            "filter": {"semantic_types": list(scope.semantic_types), "date_from": scope.date_from,
                       "date_to": scope.date_to},
            "analysis": {"concepts": analysis.names, "intents": analysis.intents(),
                         "date_from": analysis.date_from, "date_to": analysis.date_to,
                         "corrections": analysis.corrections, "plan": question_plan(retrieval)}}


def question_plan(retrieval: Retrieval) -> dict:
    """Why the question was read as it was: each concept with its role (asked, context, class of
    a named drug, found through the record's own words) and where it came from (the words typed,
    an abbreviation's long form), the asked clause, and the words the record holds in no form."""
    analysis = retrieval.analysis
    concepts = [{"concept": c["display"], "type": c["semantic_type"], "role": c.get("role") or "asked",
                 "from": c.get("text", ""), **({"via": c["via"]} if c.get("via") else {})}
                for c in analysis.concepts]
    return {"concepts": concepts, "asked_clause": analysis.question[analysis.target:].strip(),
            "kinds": list(analysis.kinds), "abbreviations": analysis.abbreviations,
            "absent": sorted(retrieval.absent_terms)}


def clinical_statements(retrieval: Retrieval, relevant: list[Evidence]) -> tuple[list[Statement], list[Citation], dict | None]:
    """The answer first, in clinical words, then a few short supporting sentences; every clause
    cites. Evidence that cannot be put in clinical words keeps its own words."""
    analysis = retrieval.analysis
    ranked = rank_note_sentences(analysis, retrieval.evidence, retrieval.similarity)
    relevant = notes_by_their_best_sentence(relevant, ranked, analysis)
    try:
        lead = first_sentence(analysis, relevant, lambda ev: _passage(ev, statement_for(ev, analysis, True, ranked)),
                              retrieval.histories)
    except Exception:      # a resource shape the sentence writer did not foresee: the record's own words
        log.exception("writing the first sentence failed; the evidence's own words are used")
        lead = Lead(None, [])
    drafts: list[Draft] = [lead.draft] if lead.draft else []
    facts = {ev.chunk.chunk_id: f for f in lead.facts for ev in [f.ev]}
    said = {ev.chunk.chunk_id for d in drafts for ev in d.sources()}
    # A later order of a drug the first sentence names, a test it already charts: said once.
    said_names = {(f.kind, f.series or f.name) for f in (fact_of(ev) for d in drafts for ev in d.sources())
                  if f is not None}
    stated_series = bool(lead.series) and lead.draft is not None
    for ev in relevant:
        if len(drafts) == 1 + SUPPORTING + (0 if lead.draft else 1):
            break
        fact = facts.get(ev.chunk.chunk_id)
        if ev.chunk.chunk_id in said or (stated_series and ev.chunk.semantic_type in ("lab", "vital")) \
                or (fact is not None and (fact.kind, fact.series or fact.name) in said_names):
            continue
        if drafts and ev.chunk.semantic_type == "note" and not another_note_answers(ev, drafts, ranked, analysis):
            continue       # one passage of a note is enough; another note may say what changed
        words = supporting_words(ev, fact, analysis, first=not drafts, ranked=ranked)
        quoted = words.partition(" says")[2]       # the same passage in another note is said once
        if words and all(words != c and (not quoted or c.partition(" says")[2] != quoted) for d in drafts for c, _ in d.clauses):
            drafts.append(Draft([(words, [ev])]))
            said.add(ev.chunk.chunk_id)
    return numbered(drafts) + (series_chart(lead.series[0]) if lead.series else None,)


SUPPORTING_WORDS = 30     # a supporting sentence in the record's own words; the side panel has the rest
FIRST_WORDS = 60


NOTE_MARGIN = 0.12     # a second note is quoted when its best sentence scores this near the best one
NOTES_QUOTED = 2
ACROSS_NOTE_MARGIN = 0.3   # ...and this near when the question compares notes


def names_the_asked(sentence: str, analysis: Analysis) -> bool:
    """The sentence names a concept asked about as the question typed it ("OM, chronic, serous"
    for "what kind of OM"; two letters only in the case typed) or by its full name."""
    for c in analysis.concepts:
        if c.get("role") not in ("", "asked", None) or c["semantic_type"] in ("note", "encounter"):
            continue
        typed, display = (c.get("text") or "").strip(), (c.get("display") or "").strip()
        if len(typed) >= 2 and re.search(rf"\b{re.escape(typed)}\b", sentence, 0 if len(typed) < 3 else re.I):
            return True
        if len(display) >= 3 and re.search(rf"\b{re.escape(display)}\b", sentence, re.I):
            return True
    return False


def notes_by_their_best_sentence(relevant: list[Evidence], ranked: list[Ranked], analysis: Analysis) -> list[Evidence]:
    """The relevant evidence with its notes in the order of their best sentence, the note holding
    the best sentence of all among them even when its chunk was not relevant by its concepts;
    structured records keep their places."""
    if not ranked:
        return relevant
    order: dict[str, int] = {}
    for r in ranked:
        order.setdefault(r.ev.chunk.chunk_id, len(order))
    best = ranked[0].ev
    slots = [i for i, ev in enumerate(relevant) if ev.chunk.semantic_type == "note"]
    if not slots:
        # Answered from coded records, a note is added only where its best sentence of all names
        # what was asked: the clinician then sees the sentence, not only the coded entry.
        named = names_the_asked(ranked[0].sentence.text, analysis) and best not in relevant
        return relevant + [best] if named else relevant
    notes = [relevant[i] for i in slots if relevant[i].chunk.chunk_id != best.chunk.chunk_id]
    notes = [best] + sorted(notes, key=lambda ev: order.get(ev.chunk.chunk_id, len(order)))
    out = list(relevant)
    for i, ev in zip(slots, notes):
        out[i] = ev
    if len(notes) > len(slots):
        out.append(notes[-1])
    return out


def another_note_answers(ev: Evidence, drafts: list[Draft], ranked: list[Ranked], analysis: Analysis) -> bool:
    """A passage of another note is said too when its best sentence is nearly as good as the
    best of all (a cross-note question: "at discharge" and "at follow-up"), at most two notes.
    A question that compares or asks two things ("after the GI bleed and then after the INR of
    12") expects the second note, whose best sentence shares fewer of the question's words."""
    quoted = [d.sources()[0].chunk for d in drafts if d.sources()[0].chunk.semantic_type == "note"]
    if not quoted:
        return True
    if len(quoted) >= NOTES_QUOTED or any(c.ref == ev.chunk.ref for c in quoted) or not ranked:
        return False
    mine = next((r.score for r in ranked if r.ev.chunk.chunk_id == ev.chunk.chunk_id), None)
    margin = ACROSS_NOTE_MARGIN if spans_notes(analysis) else NOTE_MARGIN
    return mine is not None and mine >= ranked[0].score - margin


def supporting_words(ev: Evidence, fact: Fact | None, analysis: Analysis, first: bool,
                     ranked: list[Ranked] | None = None) -> str:
    """The fact in clinical words, else the record's own words, cut short unless they are the
    answer itself (a note passage the question asked for)."""
    if fact is not None:
        return fact.words
    if ev.chunk.semantic_type == "note":
        # Quoted whole: the passage is one or two of the note's sentences, never cut inside one.
        passage = _passage(ev, statement_for(ev, analysis, first, ranked))
        return note_words(ev, passage) if passage else ""
    return shortened(one_sentence(statement_for(ev, analysis, first=first)), FIRST_WORDS if first else SUPPORTING_WORDS)


def one_sentence(text: str) -> str:
    """A record's own words as one cited sentence: its full stops and semicolons become commas."""
    return re.sub(r"[.!?]\s+(?=\S)|;\s+", ", ", text.strip()).rstrip(".")


def shortened(text: str, words: int) -> str:
    """The beginning (what the record is) and the end (a report's impression, a plan's last
    line), the middle left to the side panel."""
    parts = text.split()
    if len(parts) <= words:
        return text
    head, tail = parts[: words * 2 // 3], parts[-(words // 3):]
    return " ".join(head).rstrip(",;:") + " … " + " ".join(tail)


def numbered(drafts: list[Draft]) -> tuple[list[Statement], list[Citation]]:
    citations: list[Citation] = []
    numbers: dict[str, int] = {}

    def number(ev: Evidence) -> int:
        if ev.chunk.chunk_id not in numbers:
            numbers[ev.chunk.chunk_id] = len(citations) + 1
            citations.append(Citation.of(ev, len(citations) + 1))
        return numbers[ev.chunk.chunk_id]

    statements = []
    for draft in drafts:
        text = draft.text(number)
        statements.append(Statement(text, [number(ev) for ev in draft.sources()], lead=draft.lead))
    return statements, citations
